"""Agent certificate renewal over mTLS (AgentService.RenewAgentCertificate, our addition to the API).

Responsible for when to renew (2/3 of the certificate's lifetime; ``renewal_due`` and ``warning_due``
are pure), the call itself with the current identity public key, checking and atomically storing the
new certificate, and what to do when it fails: UNIMPLEMENTED (a Go server) is logged once and the old
certificate kept; other failures retry with backoff; at 90% of the lifetime and at expiry it logs
loudly. It does not reconnect the streams itself: ``Renewer.run`` returns the new certificate and the
caller (run.py) rebuilds the channel.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta

import grpc
from cryptography import x509

from nstance.agent.config import AgentConfig
from nstance.agent.identity import certificate_problem, store_certificate
from nstance.core.backoff import Backoff
from nstance.core.clock import Clock
from nstance.pki.ca import parse_certificate
from nstance.pki.keys import PrivateKey, public_key_to_pem
from nstance.rpc import agent_pb2, agent_pb2_grpc

log = logging.getLogger("nstance.agent.renewal")

Sleep = Callable[[float], Awaitable[None]]
RENEW_FRACTION = 2 / 3
WARN_FRACTION = 0.9
#: Longest single sleep, so a changed wall clock (suspend, NTP step) is noticed.
MAX_NAP = 300.0
#: Never renew twice within this many seconds, even if a renewed certificate is already "due".
MIN_GAP = 60.0
CALL_TIMEOUT = 30.0


def _point(cert: x509.Certificate, fraction: float) -> datetime:
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    return start + (end - start) * fraction


def renewal_due(cert: x509.Certificate) -> datetime:
    """When renewal starts: 2/3 of the way from not-before to not-after."""
    return _point(cert, RENEW_FRACTION)


def warning_due(cert: x509.Certificate) -> datetime:
    """When a certificate that could not be renewed is worth a loud warning: 90% of its lifetime."""
    return _point(cert, WARN_FRACTION)


class Renewer:
    """Renews the identity certificate when due; one object for the whole agent run."""

    def __init__(
        self,
        config: AgentConfig,
        key: PrivateKey,
        ca_pem: bytes,
        *,
        clock: Clock,
        sleep: Sleep = asyncio.sleep,
        backoff: Backoff | None = None,
    ) -> None:
        self._config = config
        self._key = key
        self._ca_pem = ca_pem
        self._clock = clock
        self._sleep = sleep
        self._backoff = backoff or Backoff(base=5.0, cap=1800.0)
        self._unimplemented = False
        self._warned_serial: int | None = None
        self._last_renewal: float | None = None

    @property
    def unsupported_by_server(self) -> bool:
        return self._unimplemented

    async def _sleep_until(self, moment: datetime) -> None:
        while True:
            remaining = (moment - self._clock.now()).total_seconds()
            if remaining <= 0:
                return
            await self._sleep(min(remaining, MAX_NAP))

    def _warn_if_late(self, cert: x509.Certificate) -> None:
        now = self._clock.now()
        if now >= cert.not_valid_after_utc:
            log.error(
                "identity certificate EXPIRED at %s; the server will refuse this agent until the instance "
                "is replaced",
                cert.not_valid_after_utc.isoformat(),
            )
        elif now >= warning_due(cert) and self._warned_serial != cert.serial_number:
            self._warned_serial = cert.serial_number
            log.error(
                "identity certificate expires at %s (90%% of its lifetime has passed) and has not been "
                "renewed%s",
                cert.not_valid_after_utc.isoformat(),
                " (the server does not implement RenewAgentCertificate)" if self._unimplemented else "",
            )

    async def run(self, channel: grpc.aio.Channel, cert_pem: bytes) -> bytes:
        """Wait until ``cert_pem`` is due, renew it, store and return the new PEM.

        Never returns while renewal is impossible (UNIMPLEMENTED): it only keeps warning until expiry.
        """
        cert = parse_certificate(cert_pem, what="identity.crt")
        due = renewal_due(cert)
        if self._last_renewal is not None:
            earliest = self._last_renewal + MIN_GAP - self._clock.monotonic()
            if earliest > 0:
                due = max(due, self._clock.now() + timedelta(seconds=earliest))
        if self._unimplemented:
            await self._wait_out(cert)
        await self._sleep_until(due)
        stub = agent_pb2_grpc.AgentServiceStub(channel)
        attempt = 0
        while True:
            self._warn_if_late(cert)
            try:
                response = await stub.RenewAgentCertificate(
                    agent_pb2.RenewAgentCertificateRequest(public_key_pem=public_key_to_pem(self._key)),
                    timeout=CALL_TIMEOUT,
                )
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                    self._unimplemented = True
                    log.warning(
                        "the server does not implement RenewAgentCertificate; keeping the current "
                        "certificate (expires %s) until the instance is rotated",
                        cert.not_valid_after_utc.isoformat(),
                    )
                    await self._wait_out(cert)
                delay = self._backoff.delay(attempt)
                attempt += 1
                log.warning(
                    "certificate renewal failed (%s: %s); retrying in %.0fs",
                    exc.code().name,
                    exc.details(),
                    delay,
                )
                await self._sleep(delay)
                continue
            new_pem = bytes(response.client_certificate_pem)
            problem = certificate_problem(
                new_pem,
                ca_pem=self._ca_pem,
                key=self._key,
                instance_id=self._config.instance_id,
                now=self._clock.now(),
            )
            if problem is not None:
                delay = self._backoff.delay(attempt)
                attempt += 1
                log.error("renewed certificate is unusable (%s); retrying in %.0fs", problem, delay)
                await self._sleep(delay)
                continue
            store_certificate(self._config.cert_path, new_pem, mode=self._config.identity_mode)
            self._last_renewal = self._clock.monotonic()
            new_cert = parse_certificate(new_pem, what="renewed identity.crt")
            log.info(
                "renewed identity certificate (serial %x, expires %s)",
                new_cert.serial_number,
                new_cert.not_valid_after_utc.isoformat(),
            )
            return new_pem

    async def _wait_out(self, cert: x509.Certificate) -> None:
        """Renewal is unsupported: warn at 90% and at expiry, then wait forever."""
        await self._sleep_until(warning_due(cert))
        self._warn_if_late(cert)
        await self._sleep_until(cert.not_valid_after_utc)
        self._warn_if_late(cert)
        while True:
            await self._sleep(3600)
