"""The agent's three long-lived AgentService streams, each kept open with reconnect and backoff.

Responsible for SubmitHealthReport (one report on connect, then one every REPORT_INTERVAL or sooner
when nudged), ReceiveFiles (messages handed to FileReceiver) and ReceiveKeyRequests (keys created by
KeyStore, then SubmitPublicKeys with every public key; existing keys are submitted once per connect).
``keep_open`` is the reconnect loop shared by all three. Channel creation, registration and renewal
live elsewhere (channels.py, register.py, renewal.py); validation lives in files.py and keys.py.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, timedelta

import grpc
from google.protobuf.empty_pb2 import Empty

from nstance.agent.config import AgentConfig
from nstance.agent.files import Delivery, FileReceiver
from nstance.agent.health import ReportInputs, build_report
from nstance.agent.identity import read_config_hash
from nstance.agent.keys import KeyStore
from nstance.agent.metrics import MetricsReader
from nstance.agent.state import AgentState
from nstance.core.backoff import Backoff
from nstance.core.clock import Clock
from nstance.core.errors import InvalidArgument
from nstance.pki.keys import load_public_key_pem, public_key_to_wire
from nstance.rpc import agent_pb2, agent_pb2_grpc

log = logging.getLogger("nstance.agent.streams")

Sleep = Callable[[float], Awaitable[None]]
#: A stream that stayed open this long resets its backoff when it ends.
STABLE_AFTER = 10.0
SUBMIT_TIMEOUT = 30.0


class StreamEnded(Exception):
    """The server closed a stream without an error; it is reopened like a failure."""


async def keep_open(
    name: str,
    open_once: Callable[[], Awaitable[None]],
    *,
    clock: Clock,
    sleep: Sleep,
    backoff: Backoff,
    on_down: Callable[[str], None] | None = None,
) -> None:
    """Run ``open_once`` forever; after each end or failure wait ``backoff`` (reset after a stable run)."""
    attempt = 0
    while True:
        started = clock.monotonic()
        try:
            await open_once()
            reason = "closed by the server"
        except grpc.aio.AioRpcError as exc:
            reason = f"{exc.code().name}: {exc.details()}"
        except StreamEnded as exc:
            reason = str(exc)
        except Exception as exc:  # a bug or a disk error must not end the agent; log and reconnect
            log.exception("%s stream failed", name)
            reason = f"{type(exc).__name__}: {exc}"
        if on_down is not None:
            on_down(reason)
        if clock.monotonic() - started >= STABLE_AFTER:
            attempt = 0
        delay = backoff.delay(attempt)
        attempt += 1
        log.warning("%s stream %s; reconnecting in %.1fs", name, reason, delay)
        await sleep(delay)


class HealthReporter:
    """Builds reports and sends them on SubmitHealthReport."""

    def __init__(
        self,
        config: AgentConfig,
        state: AgentState,
        receiver: FileReceiver,
        *,
        clock: Clock,
        nonce: str,
        metrics: MetricsReader | None = None,
    ) -> None:
        self._config = config
        self._state = state
        self._receiver = receiver
        self._clock = clock
        self._nonce = nonce
        self._metrics = metrics or MetricsReader()
        self._metrics.prime()
        self._started = clock.monotonic()
        self.count = 0

    def next_report(self) -> agent_pb2.HealthReportRequest:
        """The next report (its count is one more than the last one's)."""
        self.count += 1
        return build_report(
            ReportInputs(
                instance_id=self._config.instance_id,
                now=self._clock.now(),
                count=self.count,
                uptime=timedelta(seconds=self._clock.monotonic() - self._started),
                usage=self._metrics.read(),
                files=self._receiver.statuses(),
                termination_notice=self._state.termination_notice,
                config_hash=read_config_hash(self._config.config_hash_path, self._nonce),
            )
        )

    async def stream_once(self, stub: agent_pb2_grpc.AgentServiceStub) -> None:
        """One SubmitHealthReport stream: report now, then every interval or when nudged."""
        call = stub.SubmitHealthReport()
        response: asyncio.Future[None] = asyncio.ensure_future(_await_call(call))
        try:
            await call.wait_for_connection()
            while True:
                self._state.report_now.clear()
                await call.write(self.next_report())
                if not self._state.health_stream_up:
                    self._state.health_stream_up = True
                    log.info("health stream up")
                nudge: asyncio.Future[None] = asyncio.ensure_future(_wait_event(self._state.report_now))
                try:
                    await asyncio.wait(
                        {response, nudge},
                        timeout=self._config.report_interval,
                        return_when=asyncio.FIRST_COMPLETED,
                    )
                finally:
                    nudge.cancel()
                if response.done():
                    response.result()  # raises the call's error, if any
                    raise StreamEnded("closed by the server")
        finally:
            self._state.health_stream_up = False
            call.cancel()
            response.cancel()
            await asyncio.wait({response})  # not "await response": that could swallow our own cancel
            if not response.cancelled():
                response.exception()  # retrieved, so asyncio does not log it as never retrieved


async def _await_call(call: grpc.aio.StreamUnaryCall[agent_pb2.HealthReportRequest, Empty]) -> None:
    await call


async def _wait_event(event: asyncio.Event) -> None:
    await event.wait()


async def receive_files_once(
    stub: agent_pb2_grpc.AgentServiceStub, receiver: FileReceiver, state: AgentState
) -> None:
    """One ReceiveFiles stream: stage files, commit on a commit message, nudge the reporter after both."""
    call = stub.ReceiveFiles(Empty())
    await call.wait_for_connection()
    log.info("file stream up")
    async for message in call:
        delivery = Delivery(
            filename=message.filename,
            content=bytes(message.content),
            last_modified=(
                message.last_modified.ToDatetime(tzinfo=UTC) if message.HasField("last_modified") else None
            ),
            config_hash=message.config_hash,
        )
        result = await asyncio.to_thread(receiver.receive, delivery)
        refused = bool(delivery.filename) and delivery.filename not in receiver.staged
        if result is not None or refused:
            state.nudge()  # the server hears about a commit or a refused file without waiting an interval


async def receive_key_requests_once(
    stub: agent_pb2_grpc.AgentServiceStub, store: KeyStore, instance_id: str
) -> None:
    """One ReceiveKeyRequests stream: submit existing public keys, then serve each request."""
    call = stub.ReceiveKeyRequests(Empty())
    await call.wait_for_connection()
    log.info("key request stream up")
    if store.public_keys():
        await submit_public_keys(stub, store, instance_id)
    async for request in call:
        names = list(request.key_names)
        ready = await asyncio.to_thread(store.ensure, names)
        log.info("key request for %s: %d ready", ", ".join(names) or "(none)", len(ready))
        await submit_public_keys(stub, store, instance_id)


async def submit_public_keys(
    stub: agent_pb2_grpc.AgentServiceStub, store: KeyStore, instance_id: str
) -> None:
    keys = store.public_keys()
    submissions = []
    for k in keys:
        try:
            key = load_public_key_pem(k.public_key_pem, what=f"{k.name}.pub")
        except InvalidArgument as exc:
            log.warning("not submitting %s.pub: %s", k.name, exc)
            continue
        # base64 of the DER, as upstream's agents send it: a Go server decodes the field so and skips a PEM
        wire = public_key_to_wire(key)
        submissions.append(agent_pb2.PublicKeySubmission(filename=k.name, public_key_pem=wire))
    request = agent_pb2.PublicKeysRequest(instance_id=instance_id, keys=submissions)
    await stub.SubmitPublicKeys(request, timeout=SUBMIT_TIMEOUT)
    log.info("submitted %d public key(s)", len(keys))
