"""Renewal of the operator's client certificate, without restarting the process.

``CertificateRenewer.run`` sleeps until half of the certificate's remaining lifetime has passed, then
calls ``RenewCertificate`` (Operator API, mTLS) with the current public key. Only the cluster leader
renews: other shards answer FAILED_PRECONDITION naming the cluster leader's address, so every shard is
tried, the named one first next time. A renewed certificate is verified, stored in the cert Secret
(``IdentityManager.store_certificate``) and handed to ``ShardSet.set_credentials``, which swaps the
channels while calls in flight finish. Failures are retried with backoff: 1 min doubling, capped at
half the remaining lifetime (and at 30 min), never less than 1 s — all injectable for tests.

Upstream exits the process after every renewal and when the certificate expires (reference §10-19);
this never exits. If the certificate does expire, mTLS cannot work any more, so the renewer falls back
to registering again, which succeeds once an admin puts a new nonce in the nonce Secret.

Must not: decide which shards exist or open connections of its own.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Final

import grpc
import grpc.aio

from nstance.core.clock import Clock, SystemClock
from nstance.operator.context import RPC_TIMEOUT, ShardNotConfigured
from nstance.operator.health import OperatorMetrics
from nstance.operator.identity import (
    KEY_TYPES,
    Identity,
    IdentityManager,
    IdentityProblem,
    describe_rpc_error,
)
from nstance.operator.kube import KubeError
from nstance.operator.shards import ShardSet
from nstance.pki.keys import load_private_key_pem, public_key_to_pem
from nstance.rpc import operator_pb2

log = logging.getLogger(__name__)

Sleep = Callable[[float], Awaitable[None]]
_LEADER_AT: Final = re.compile(r"cluster leader is at (\S+)")
_TRANSPORT: Final = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})


class RenewalFailed(Exception):
    """No shard renewed the certificate; the message has every shard's answer."""


def leader_address(details: str) -> str:
    """The address in "... the cluster leader is at ADDR ..." ("" when absent)."""
    match = _LEADER_AT.search(details)
    return match.group(1).rstrip(";,.") if match else ""


def retry_delay(attempt: int, remaining: float, *, base: float, cap: float, minimum: float) -> float:
    """Wait before retry ``attempt``: ``base * 2**attempt`` capped at ``cap`` and half the remaining life."""
    delay: float = min(base * 2.0 ** min(attempt, 32), cap, max(remaining / 2, 0.0))
    return max(delay, minimum)


class CertificateRenewer:
    """Keeps the operator certificate fresh for as long as the runtime leads."""

    def __init__(
        self,
        identity: IdentityManager,
        shards: ShardSet,
        *,
        metrics: OperatorMetrics | None = None,
        clock: Clock | None = None,
        retry_base: float = 60.0,
        retry_cap: float = 1800.0,
        min_delay: float = 1.0,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self.identity = identity
        self.shards = shards
        self.metrics = metrics or identity.metrics
        self.clock: Clock = clock or identity.clock or SystemClock()
        self.retry_base = retry_base
        self.retry_cap = retry_cap
        self.min_delay = min_delay
        self._sleep = sleep
        self._preferred = ""
        self.last_error = ""

    def _remaining(self, identity: Identity) -> float:
        return (identity.not_after - self.clock.now()).total_seconds()

    def _order(self) -> list[str]:
        shards = list(self.shards.configured())
        if self._preferred in shards:
            shards.remove(self._preferred)
            shards.insert(0, self._preferred)
        return shards

    def _shard_at(self, address: str) -> str:
        for shard in self.shards.configured():
            endpoint = self.shards.endpoint(shard)
            if address in (endpoint.operator_addr, endpoint.registration_addr):
                return shard
        return ""

    async def renew_once(self) -> Identity:
        """Ask each shard (the cluster leader first when known) until one renews; store and use it."""
        current = self.identity.current
        if current is None:
            raise RenewalFailed("no identity is loaded")
        public_pem = public_key_to_pem(load_private_key_pem(current.key_pem, KEY_TYPES))
        request = operator_pb2.RenewCertificateRequest(public_key_pem=public_pem)
        answers: list[str] = []
        for shard in self._order():
            try:
                stub = self.shards.stub(shard)
                response = await stub.RenewCertificate(request, timeout=RPC_TIMEOUT)
            except ShardNotConfigured:
                continue
            except grpc.aio.AioRpcError as exc:
                text = describe_rpc_error(exc)
                self.shards.report(
                    shard, exc.code() not in _TRANSPORT, "" if exc.code() not in _TRANSPORT else text
                )
                answers.append(f"{shard}: {text}")
                if exc.code() == grpc.StatusCode.FAILED_PRECONDITION:
                    named = self._shard_at(leader_address(exc.details() or ""))
                    if named:
                        self._preferred = named
                continue
            self.shards.report(shard, True)
            try:
                renewed = await self.identity.store_certificate(bytes(response.client_certificate_pem))
            except (IdentityProblem, KubeError) as exc:
                answers.append(f"{shard}: renewed, but the certificate could not be stored: {exc}")
                continue
            self._preferred = shard
            self.shards.set_credentials(renewed.cert_pem, renewed.key_pem)
            self.metrics.renewals.labels("ok").inc()
            log.info(
                "renewed the operator certificate through shard %s (serial %s, valid until %s)",
                shard,
                renewed.serial,
                renewed.not_after.isoformat(),
            )
            return renewed
        self.metrics.renewals.labels("error").inc()
        raise RenewalFailed("; ".join(answers) or "no shard is configured")

    async def _register_again(self) -> bool:
        """After expiry: the registration path (needs a new nonce); True when a new identity is in use."""
        config = self.identity.config
        if config is None:
            return False
        try:
            identity = await self.identity.attempt(config)
        except (IdentityProblem, KubeError) as exc:
            self.last_error = f"the operator certificate expired and registering again failed: {exc}"
            log.error("%s", self.last_error)
            return False
        self.shards.set_credentials(identity.cert_pem, identity.key_pem)
        return True

    async def run(self) -> None:
        """Renew for ever; never raises for shard or API trouble (cancellation ends it)."""
        attempt = 0
        due = False
        while True:
            current = self.identity.current
            if current is None:
                await self._sleep(self.min_delay)
                continue
            remaining = self._remaining(current)
            if not due:
                wait = max(remaining / 2, 0.0)
                log.info(
                    "next certificate renewal in %.0fs (certificate valid until %s)", wait, current.not_after
                )
                await self._sleep(wait)
                due = True
                continue
            try:
                if remaining <= 0:
                    if not await self._register_again():
                        raise RenewalFailed(self.last_error)
                else:
                    await self.renew_once()
            except RenewalFailed as exc:
                self.last_error = str(exc)
                delay = retry_delay(
                    attempt,
                    self._remaining(current),
                    base=self.retry_base,
                    cap=self.retry_cap,
                    minimum=self.min_delay,
                )
                attempt += 1
                log.warning("certificate renewal failed (%s); retrying in %.0fs", exc, delay)
                await self._sleep(delay)
                continue
            self.last_error = ""
            attempt = 0
            due = False
