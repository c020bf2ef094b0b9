"""Agent-side load for ``registration.py`` and ``health_ingest.py``: the client process and its control.

Run as a script (``python bench/_agents.py PLAN.json``) this file *is* the client process: a grpc.aio
program that plays many agents against one target address, driven over stdin/stdout so the parent
(which hosts the server under test on its own event loop) can time the steady state. The plan file
(JSON, written by the parent with ``write_plan``) says what to do:

* ``mode: "health"`` - one mTLS channel per agent (its own key and certificate, as real agents each
  have; ``grpc.use_local_subchannel_pool`` so no two agents share a TCP connection), one
  ``SubmitHealthReport`` stream per agent, and on every stream a loop that writes the next report as
  soon as the previous ``write`` returned (grpc's HTTP/2 flow control is the only pacing). Printed
  events: ``ready`` once every stream has written its first report; ``marked`` after the parent's
  ``mark`` command (the per-agent counts at that moment are remembered); ``result`` after ``stop``:
  reports written in total and between mark and stop (sum, minimum and median per agent) and the
  error codes seen.
* ``mode: "register"`` - ``workers`` server-auth TLS channels (as ``nstance.agent.channels`` builds
  them), connected before ``ready``; a fresh ECDSA P-256 key per registration, generated before
  ``ready``. On ``go`` the workers take the registrations from a shared queue and call
  ``RegisterAgent`` one at a time each; ``result`` gives the elapsed time from ``go`` to the last
  answer, the successes with the serial and common name of each certificate received (checked to be
  for the right key), latencies and error codes.

Imported, it gives the parent ``write_plan``, ``ClientProcess`` (start, wait for an event, send a
command, collect the result) and ``bare_server`` (a grpc.aio server on loopback with the cluster CA's
server certificate, for the baselines).

Must not: import server code in the client process (it talks gRPC only), measure server-side
counts itself, or outlive its parent (it exits on ``stop`` or when stdin closes).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from cryptography import x509
from cryptography.x509.oid import NameOID

from nstance.pki.keys import (
    generate_private_key,
    load_any_public_key_pem,
    private_key_to_pem,
    public_key_to_der,
    public_key_to_pem,
)
from nstance.rpc import agent_pb2, agent_pb2_grpc, registration_pb2, registration_pb2_grpc

SERVER_NAME = "nstance-server"  # every server certificate carries it (nstance.pki.certs)
#: How many agents open their channel (TLS handshake) at once.
OPEN_CONCURRENCY = 100
CONNECT_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
AGENT_VERSION = "0.1.0"
CLIENT_SCRIPT = str(Path(__file__).resolve())
#: Reconnect backoff of a stream refused while opening (the agent's: 0.5 s doubling, jittered).
RECONNECT_FIRST_S = 0.5
RECONNECT_MAX_S = 8.0


# --- parent side ------------------------------------------------------------------------------


def write_plan(path: Path, plan: dict[str, Any]) -> Path:
    """Write the client's plan (see the module docstring) as JSON and return its path."""
    path.write_text(json.dumps(plan), encoding="utf-8")
    return path


class ClientProcess:
    """The client process (this file run as a script), seen from the parent."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self._proc = proc

    @classmethod
    async def start(cls, plan: Path) -> ClientProcess:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            CLIENT_SCRIPT,
            str(plan),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            limit=64 * 1024 * 1024,
        )
        return cls(proc)

    @property
    def pid(self) -> int:
        return self._proc.pid

    async def event(self, name: str, limit_s: float) -> dict[str, Any]:
        """The next event line called ``name`` (earlier lines of other names are skipped)."""
        assert self._proc.stdout is not None
        deadline = time.monotonic() + limit_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"the client process sent no {name!r} event within {limit_s:.0f}s")
            line = await asyncio.wait_for(self._proc.stdout.readline(), remaining)
            if not line:
                code = await self._proc.wait()
                raise RuntimeError(f"the client process exited (code {code}) before its {name!r} event")
            doc: dict[str, Any] = json.loads(line)
            if doc.get("event") == name:
                return doc

    async def send(self, command: str) -> None:
        assert self._proc.stdin is not None
        self._proc.stdin.write(command.encode("ascii") + b"\n")
        await self._proc.stdin.drain()

    async def close(self) -> None:
        """Close stdin (the client exits), wait; kill it if it does not go within STOP_TIMEOUT_S."""
        if self._proc.stdin is not None and not self._proc.stdin.is_closing():
            self._proc.stdin.close()
        try:
            await asyncio.wait_for(self._proc.wait(), STOP_TIMEOUT_S)
        except TimeoutError:
            self._proc.kill()
            await self._proc.wait()


def cpu_seconds(pid: int | str = "self") -> float:
    """User + system CPU seconds used so far by process ``pid`` (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text(encoding="ascii").rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def bare_server(
    add: Callable[[grpc.aio.Server], None],
    credentials: grpc.ServerCredentials,
    options: Sequence[tuple[str, Any]],
) -> tuple[grpc.aio.Server, str]:
    """Start a plain grpc.aio server (no interceptor) on a free loopback port; (server, address)."""
    server = grpc.aio.server(options=list(options))
    add(server)
    port = server.add_secure_port("127.0.0.1:0", credentials)
    await server.start()
    return server, f"127.0.0.1:{port}"


# --- client side ------------------------------------------------------------------------------


def emit(event: str, **fields: Any) -> None:
    sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
    sys.stdout.flush()


class Commands:
    """Lines from stdin, one at a time; end of input reads as ``stop``."""

    def __init__(self) -> None:
        self._reader: asyncio.StreamReader | None = None

    async def next(self) -> str:
        if self._reader is None:
            loop = asyncio.get_running_loop()
            self._reader = asyncio.StreamReader()
            await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(self._reader), sys.stdin)  # type: ignore[arg-type]
        line = await self._reader.readline()
        return line.decode("ascii").strip() or "stop"


def channel_options(*, keepalive: bool) -> list[tuple[str, int | str]]:
    """The agent's channel options (as ``nstance.agent.channels``), each channel its own connection."""
    options: list[tuple[str, int | str]] = [
        ("grpc.ssl_target_name_override", SERVER_NAME),
        ("grpc.use_local_subchannel_pool", 1),
        ("grpc.max_receive_message_length", 4 * 1024 * 1024),
        ("grpc.max_send_message_length", 4 * 1024 * 1024),
    ]
    if keepalive:
        options += [
            ("grpc.keepalive_time_ms", 20_000),
            ("grpc.keepalive_timeout_ms", 10_000),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
        ]
    return options


def report(instance_id: str, config_hash: str) -> agent_pb2.HealthReportRequest:
    """A report as ``nstance.agent.health.build_report`` makes it (metrics, no files, applied hash)."""
    msg = agent_pb2.HealthReportRequest(
        version=AGENT_VERSION, instance_id=instance_id, count=0, uptime="1h2m3s", config_hash=config_hash
    )
    msg.timestamp.GetCurrentTime()
    msg.metrics.cpu_usage = 12.5
    msg.metrics.cpu_core_usage.extend([10.0, 15.0])
    msg.metrics.memory_usage = 41.0
    return msg


@dataclass
class HealthAgent:
    instance_id: str
    sent: int = 0
    at_mark: int = 0
    at_stop: int = 0
    error: str | None = None
    reconnects: int = 0
    refused_sent: int = 0


class Health:
    """The health client: one channel and one report stream per agent (see the module docstring)."""

    def __init__(self, plan: dict[str, Any]) -> None:
        self.target: str = plan["target"]
        self.ca = plan["ca_pem"].encode("ascii")
        self.config_hash: str = plan.get("config_hash", "")
        self.keepalive: bool = plan.get("keepalive", True)
        self.entries: list[dict[str, str]] = plan["agents"]
        self.agents = [HealthAgent(e["id"]) for e in self.entries]
        self.gate = asyncio.Semaphore(OPEN_CONCURRENCY)
        self.going = asyncio.Event()
        self.stopping = asyncio.Event()
        self.opened = 0
        self.all_open = asyncio.Event()
        self.open_failures: Counter[str] = Counter()
        self.details: dict[str, str] = {}

    async def _open(self, stub: agent_pb2_grpc.AgentServiceStub, msg: agent_pb2.HealthReportRequest,
                    state: HealthAgent) -> Any:  # fmt: skip
        """Open the stream and write the first report; reopen (with backoff) while it ends before ``go``.

        A real agent reconnects with backoff too; a server that cannot accept a burst of new streams
        fast enough refuses some (grpc's pending-call limit), and those retries are counted.
        """
        delay = RECONNECT_FIRST_S
        first = True
        while True:
            call = stub.SubmitHealthReport()
            try:
                msg.count += 1
                await call.write(msg)
                state.sent += 1
                if first:
                    first = False
                    self.opened += 1
                    if self.opened == len(self.agents):
                        self.all_open.set()
                ended = asyncio.ensure_future(call.code())
                go = asyncio.ensure_future(self.going.wait())
                await asyncio.wait({ended, go}, return_when=asyncio.FIRST_COMPLETED)
                go.cancel()
                if not ended.done():
                    ended.cancel()
                    return call
                code = ended.result().name
            except grpc.aio.AioRpcError as exc:
                code = exc.code().name
            if self.going.is_set():
                raise RuntimeError(f"stream of {state.instance_id} ended ({code}) as the load started")
            self.open_failures[code] += 1
            state.reconnects += 1
            state.refused_sent = state.sent  # written on streams the server refused: never processed
            await asyncio.sleep(delay * random.uniform(0.8, 1.2))
            delay = min(delay * 2, RECONNECT_MAX_S)

    async def agent(self, state: HealthAgent, entry: dict[str, str]) -> None:
        credentials = grpc.ssl_channel_credentials(
            root_certificates=self.ca,
            private_key=entry["key_pem"].encode("ascii"),
            certificate_chain=entry["cert_pem"].encode("ascii"),
        )
        channel = grpc.aio.secure_channel(
            self.target, credentials, options=channel_options(keepalive=self.keepalive)
        )
        try:
            async with self.gate:
                await asyncio.wait_for(channel.channel_ready(), CONNECT_TIMEOUT_S)
            stub = agent_pb2_grpc.AgentServiceStub(channel)
            msg = report(state.instance_id, self.config_hash)
            call = await self._open(stub, msg, state)
            while not self.stopping.is_set():
                msg.count += 1
                await call.write(msg)
                state.sent += 1
            await call.done_writing()
            await call
        except grpc.aio.AioRpcError as exc:
            state.error = exc.code().name
            self.details.setdefault(state.error, exc.details() or "")
        except (TimeoutError, grpc.aio.UsageError, RuntimeError) as exc:
            state.error = type(exc).__name__
            self.details.setdefault(state.error, str(exc))
        finally:
            await channel.close()

    async def run(self) -> None:
        tasks = [
            asyncio.create_task(self.agent(s, e)) for s, e in zip(self.agents, self.entries, strict=True)
        ]
        started = time.monotonic()
        waiter = asyncio.create_task(self.all_open.wait())
        await asyncio.wait([waiter, *tasks], return_when=asyncio.FIRST_COMPLETED)
        if not self.all_open.is_set():  # an agent failed for good: give the others their time, then report
            await asyncio.wait([waiter], timeout=CONNECT_TIMEOUT_S)
        emit(
            "ready",
            opened=self.opened,
            seconds=round(time.monotonic() - started, 3),
            errors=dict(Counter(a.error for a in self.agents if a.error)),
            error_details=self.details,
        )
        commands = Commands()
        while True:
            command = await commands.next()
            if command == "go":
                self.going.set()
                emit("going", reconnects=sum(a.reconnects for a in self.agents))
            elif command == "mark":
                for a in self.agents:
                    a.at_mark = a.sent
                emit("marked")
            elif command == "stop":
                for a in self.agents:
                    a.at_stop = a.sent
                self.stopping.set()
                self.going.set()
                break
        _, pending = await asyncio.wait(tasks, timeout=STOP_TIMEOUT_S)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        window = [a.at_stop - a.at_mark for a in self.agents]
        emit(
            "result",
            streams=len(self.agents),
            sent_total=sum(a.sent - a.refused_sent for a in self.agents),
            sent_in_window=sum(window),
            per_agent_min=min(window),
            per_agent_median=statistics.median(window),
            per_agent_max=max(window),
            errors=dict(Counter(a.error for a in self.agents if a.error)),
            error_details=self.details,
            reconnects=sum(a.reconnects for a in self.agents),
            open_failures=dict(self.open_failures),
            unfinished=len(pending),
        )


async def run_health(plan: dict[str, Any]) -> None:
    await Health(plan).run()


@dataclass
class Registration:
    instance_id: str
    nonce: str
    key_pem: bytes
    public_key_pem: bytes


def _certificate_facts(cert_pem: bytes, public_key_pem: bytes) -> tuple[str, str]:
    """(common name, serial hex) of a received certificate; ValueError unless it certifies the key."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    if public_key_to_der(cert.public_key()) != public_key_to_der(load_any_public_key_pem(public_key_pem)):  # type: ignore[arg-type]
        raise ValueError("the certificate does not certify the key that was sent")
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    cn = names[0].value if names else ""
    return str(cn), format(cert.serial_number, "x")


async def run_register(plan: dict[str, Any]) -> None:
    target: str = plan["target"]
    ca = plan["ca_pem"].encode("ascii")
    workers: int = plan["workers"]
    repeat: int = plan.get("repeat", 1)
    registrations = []
    for item in plan["registrations"]:
        key = generate_private_key("ecdsa-p256")
        registrations.append(
            Registration(
                item["id"], item["nonce"], private_key_to_pem(key), public_key_to_pem(key.public_key())
            )
        )
    credentials = grpc.ssl_channel_credentials(root_certificates=ca)
    channels = [
        grpc.aio.secure_channel(target, credentials, options=channel_options(keepalive=False))
        for _ in range(workers)
    ]
    await asyncio.gather(*(asyncio.wait_for(c.channel_ready(), CONNECT_TIMEOUT_S) for c in channels))
    emit("ready", workers=workers, registrations=len(registrations) * repeat)
    commands = Commands()
    if await commands.next() != "go":
        return
    queue: list[Registration] = [r for _ in range(repeat) for r in registrations]
    queue.reverse()
    received: list[tuple[Registration, bytes]] = []
    latencies: list[float] = []
    errors: Counter[str] = Counter()
    messages: dict[str, str] = {}

    async def worker(channel: grpc.aio.Channel) -> None:
        stub = registration_pb2_grpc.RegistrationServiceStub(channel)
        while queue:
            reg = queue.pop()
            request = registration_pb2.RegisterClientRequest(
                registration_nonce_jwt=reg.nonce,
                public_key_pem=reg.public_key_pem,
                private_ipv4="10.0.0.10",
                hostname=f"ip-{reg.instance_id[-8:]}",
            )
            start = time.perf_counter()
            try:
                response = await stub.RegisterAgent(request, timeout=60)
            except grpc.aio.AioRpcError as exc:
                errors[exc.code().name] += 1
                messages.setdefault(exc.code().name, exc.details() or "")
                continue
            latencies.append(time.perf_counter() - start)
            received.append((reg, response.client_certificate_pem))

    start, cpu_start = time.perf_counter(), cpu_seconds()
    await asyncio.gather(*(worker(c) for c in channels))
    elapsed = time.perf_counter() - start
    cpu_used = cpu_seconds() - cpu_start  # measured here: the process may be gone when the parent looks
    for channel in channels:
        await channel.close()
    certificates: dict[str, str] = {}
    wrong: list[str] = []
    check = plan.get("check_certificates", True)
    for reg, pem in received:
        if not check:
            continue
        try:
            cn, serial = _certificate_facts(pem, reg.public_key_pem)
        except ValueError as exc:
            wrong.append(f"{reg.instance_id}: {exc}")
            continue
        if cn != reg.instance_id:
            wrong.append(f"{reg.instance_id}: certificate CN is {cn!r}")
        certificates[reg.instance_id] = serial
    ordered = sorted(latencies)
    emit(
        "result",
        seconds=elapsed,
        cpu_seconds=cpu_used,
        ok=len(received),
        errors=dict(errors),
        error_messages=messages,
        wrong=wrong[:10],
        wrong_count=len(wrong),
        certificates=certificates,
        latency_p50_s=statistics.median(ordered) if ordered else None,
        latency_p99_s=ordered[max(0, int(len(ordered) * 0.99) - 1)] if ordered else None,
    )


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python bench/_agents.py PLAN.json (run by registration.py / health_ingest.py)")
        return 2
    plan: dict[str, Any] = json.loads(Path(argv[1]).read_text(encoding="utf-8"))
    mode = plan["mode"]
    runner = {"health": run_health, "register": run_register}[mode]
    asyncio.run(runner(plan))
    sys.stdout.flush()
    os._exit(0)  # skip grpc's slow teardown of thousands of channels at interpreter exit


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))


_T0 = time.monotonic()


def progress(what: str) -> None:
    """A progress line on stderr, timed from import (stdout carries the JSON lines)."""
    print(f"[{time.monotonic() - _T0:6.1f}s] {what}", file=sys.stderr, flush=True)
