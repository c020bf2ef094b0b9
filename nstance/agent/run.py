"""One agent run: identity, registration, then the mTLS session (streams + renewal), spot and /healthz.

Responsible for wiring the pieces in order (upstream §6b lifecycle) and for rebuilding the mTLS channel
after a certificate renewal. Everything it waits on goes through the injected clock and sleep. It does
not parse the environment (config.py), handle signals or exit codes (cli.py).
"""

from __future__ import annotations

import asyncio
import logging

from nstance.agent.channels import agent_channel
from nstance.agent.config import NO_SPOT_PROVIDERS, AgentConfig
from nstance.agent.files import FileReceiver
from nstance.agent.healthz import serve_healthz
from nstance.agent.identity import (
    certificate_problem,
    ensure_identity_key,
    identity_key_type,
    read_bootstrap,
)
from nstance.agent.keys import KeyStore
from nstance.agent.metrics import MetricsReader
from nstance.agent.register import Sleep, register_until_done
from nstance.agent.renewal import Renewer
from nstance.agent.spot import SpotPoller
from nstance.agent.state import AgentState, TerminationNotice
from nstance.agent.streams import HealthReporter, keep_open, receive_files_once, receive_key_requests_once
from nstance.core.backoff import Backoff
from nstance.core.clock import Clock, SystemClock
from nstance.core.listener import Listener
from nstance.pki.keys import private_key_to_pem
from nstance.rpc import agent_pb2_grpc

log = logging.getLogger("nstance.agent")


class Agent:
    """The nstance-agent; ``await Agent(config).run()`` runs until cancelled."""

    def __init__(
        self,
        config: AgentConfig,
        *,
        clock: Clock | None = None,
        sleep: Sleep = asyncio.sleep,
        stream_backoff: Backoff | None = None,
        register_backoff: Backoff | None = None,
        renew_backoff: Backoff | None = None,
        idle_check: float = 60.0,
        metrics: MetricsReader | None = None,
        spot_timeout: float = 1.0,
    ) -> None:
        self.config = config
        self.state = AgentState(reports_enabled=config.report_interval > 0)
        self._clock = clock or SystemClock()
        self._sleep = sleep
        self._stream_backoff = stream_backoff or Backoff(base=5.0, cap=120.0)
        self._register_backoff = register_backoff or Backoff(base=1.0, cap=60.0)
        self._renew_backoff = renew_backoff or Backoff(base=5.0, cap=1800.0)
        self._idle_check = idle_check
        self._metrics = metrics
        self._spot_timeout = spot_timeout
        self.receiver = FileReceiver(
            config.recv_dir,
            config.config_hash_path,
            mode=config.recv_mode,
            hash_mode=config.identity_mode,
        )
        self.keys = KeyStore(config.keys_dir, mode=config.keys_mode)
        self.sessions = 0

    async def run(self) -> None:
        config = self.config
        bootstrap = read_bootstrap(config.identity_dir, nonce_required=False)
        key_type = identity_key_type(bootstrap.ca_pem)
        key = ensure_identity_key(config.key_path, mode=config.identity_mode, key_type=key_type)
        self.keys.key_type = key_type  # workload key pairs too: a Go server certifies Ed25519 keys only
        background: list[asyncio.Task[object]] = []
        healthz: Listener | None = None
        try:
            if config.health_addr:
                healthz = await serve_healthz(config.health_addr, self.state)
            if config.provider not in NO_SPOT_PROVIDERS:
                poller = SpotPoller(
                    provider=config.provider,
                    metadata_url=config.metadata_url,
                    interval=config.spot_poll_interval,
                    on_notice=self._on_notice,
                    sleep=self._sleep,
                    timeout=self._spot_timeout,
                )
                background.append(asyncio.create_task(poller.run(), name="spot"))

            cert_pem = b""
            if config.cert_path.is_file():
                cert_pem = config.cert_path.read_bytes()
                problem = certificate_problem(
                    cert_pem,
                    ca_pem=bootstrap.ca_pem,
                    key=key,
                    instance_id=config.instance_id,
                    now=self._clock.now(),
                )
                if problem is None:
                    log.info("reusing identity certificate %s; not registering again", config.cert_path)
                else:
                    log.info("stored identity certificate not usable (%s); registering", problem)
                    cert_pem = b""
            if not cert_pem:
                self.state.problem = "registering"
                cert_pem = await register_until_done(
                    config,
                    key,
                    self.state,
                    sleep=self._sleep,
                    backoff=self._register_backoff,
                    idle_check=self._idle_check,
                )
            self.state.registered = True
            self.state.problem = "connecting"
            reporter = HealthReporter(
                config,
                self.state,
                self.receiver,
                clock=self._clock,
                nonce=bootstrap.nonce,
                metrics=self._metrics,
            )
            renewer = Renewer(
                config,
                key,
                bootstrap.ca_pem,
                clock=self._clock,
                sleep=self._sleep,
                backoff=self._renew_backoff,
            )
            key_pem = private_key_to_pem(key)
            while True:
                cert_pem = await self._session(bootstrap.ca_pem, key_pem, cert_pem, reporter, renewer)
                log.info("reconnecting with the renewed certificate")
        finally:
            for task in background:
                task.cancel()
            if background:
                # asyncio.wait, not "await task": awaiting a cancelled child would swallow our own
                # cancellation if it arrives meanwhile.
                await asyncio.wait(background)
                for task in background:
                    if not task.cancelled() and task.exception() is not None:
                        log.error("%s task failed: %s", task.get_name(), task.exception())
            if healthz is not None:
                await healthz.close()

    def _on_notice(self, notice: TerminationNotice) -> None:
        self.state.termination_notice = notice
        self.state.nudge()

    def _stream_down(self, reason: str) -> None:
        self.state.problem = reason

    async def _session(
        self, ca_pem: bytes, key_pem: bytes, cert_pem: bytes, reporter: HealthReporter, renewer: Renewer
    ) -> bytes:
        """Run the streams over one mTLS channel until a renewal produced a new certificate."""
        self.sessions += 1
        channel = agent_channel(self.config.agent_addr, ca_pem, key_pem, cert_pem)
        stub = agent_pb2_grpc.AgentServiceStub(channel)
        tasks: list[asyncio.Task[None]] = []
        if self.config.report_interval > 0:
            tasks.append(
                asyncio.create_task(
                    keep_open(
                        "health",
                        lambda: reporter.stream_once(stub),
                        on_down=self._stream_down,
                        clock=self._clock,
                        sleep=self._sleep,
                        backoff=self._stream_backoff,
                    ),
                    name="health-stream",
                )
            )
        tasks.append(
            asyncio.create_task(
                keep_open(
                    "files",
                    lambda: receive_files_once(stub, self.receiver, self.state),
                    clock=self._clock,
                    sleep=self._sleep,
                    backoff=self._stream_backoff,
                ),
                name="files-stream",
            )
        )
        tasks.append(
            asyncio.create_task(
                keep_open(
                    "key requests",
                    lambda: receive_key_requests_once(stub, self.keys, self.config.instance_id),
                    clock=self._clock,
                    sleep=self._sleep,
                    backoff=self._stream_backoff,
                ),
                name="keys-stream",
            )
        )
        try:
            return await renewer.run(channel, cert_pem)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.wait(tasks)  # see run(): never "await task" on a cancelled child here
            await channel.close()
