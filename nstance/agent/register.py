"""Registration: exchange the nonce JWT and the identity public key for a client certificate.

Responsible for the RegisterAgent call over server-authenticated TLS, for sorting failures into
permanent (log clearly, then idle without calling again until ``nonce.jwt`` changes) and transient
(retry with exponential backoff and jitter), and for storing ``identity.crt``. The decision
(``classify_registration_error``) is a pure function. It does not open the agent streams.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Awaitable, Callable
from enum import Enum

import grpc

from nstance.agent.channels import registration_channel
from nstance.agent.config import AgentConfig
from nstance.agent.identity import read_bootstrap, store_certificate
from nstance.agent.state import AgentState
from nstance.core.backoff import Backoff
from nstance.pki.keys import PrivateKey, public_key_to_pem
from nstance.rpc import registration_pb2, registration_pb2_grpc

log = logging.getLogger("nstance.agent.register")

Sleep = Callable[[float], Awaitable[None]]
REGISTER_TIMEOUT = 30.0

_PERMANENT = frozenset(
    {
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.ALREADY_EXISTS,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.NOT_FOUND,
    }
)


class Outcome(Enum):
    PERMANENT = "permanent"
    TRANSIENT = "transient"


def classify_registration_error(code: grpc.StatusCode, details: str) -> Outcome:
    """Permanent refusals will fail again with the same nonce; everything else may pass later.

    FAILED_PRECONDITION saying the server is "not the leader" is transient (leadership moves).
    """
    if code == grpc.StatusCode.FAILED_PRECONDITION and "not the leader" in details.lower():
        return Outcome.TRANSIENT
    return Outcome.PERMANENT if code in _PERMANENT else Outcome.TRANSIENT


def local_addresses(config: AgentConfig) -> tuple[str, str, str]:
    """(ipv4, ipv6, hostname) to report: the configured values, else what the machine shows."""
    hostname = config.hostname or socket.gethostname()
    ipv4 = config.ipv4
    if not ipv4:
        host = config.registration_addr.rpartition(":")[0].strip("[]") or "127.0.0.1"
        with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((host, 9))  # UDP connect sends nothing; it picks the outgoing address
            ipv4 = str(probe.getsockname()[0])
    return ipv4, config.ipv6, hostname


async def register_once(config: AgentConfig, ca_pem: bytes, nonce: str, key: PrivateKey) -> bytes:
    """One RegisterAgent call; returns the certificate PEM or raises grpc.aio.AioRpcError."""
    ipv4, ipv6, hostname = await asyncio.to_thread(local_addresses, config)
    request = registration_pb2.RegisterClientRequest(
        registration_nonce_jwt=nonce,
        public_key_pem=public_key_to_pem(key),
        private_ipv4=ipv4,
        private_ipv6=ipv6,
        hostname=hostname,
    )
    async with registration_channel(config.registration_addr, ca_pem) as channel:
        stub = registration_pb2_grpc.RegistrationServiceStub(channel)
        response = await stub.RegisterAgent(request, timeout=REGISTER_TIMEOUT)
    return bytes(response.client_certificate_pem)


async def register_until_done(
    config: AgentConfig,
    key: PrivateKey,
    state: AgentState,
    *,
    sleep: Sleep = asyncio.sleep,
    backoff: Backoff | None = None,
    idle_check: float = 60.0,
) -> bytes:
    """Register, retrying transient failures; after a permanent refusal wait for a new nonce.

    Returns the stored certificate PEM. Only cancellation ends it otherwise.
    """
    backoff = backoff or Backoff(base=1.0, cap=60.0)
    attempt = 0
    while True:
        bootstrap = read_bootstrap(config.identity_dir)
        try:
            cert_pem = await register_once(config, bootstrap.ca_pem, bootstrap.nonce, key)
        except grpc.aio.AioRpcError as exc:
            details = exc.details() or ""
            outcome = classify_registration_error(exc.code(), details)
            state.problem = f"registration {exc.code().name}: {details}"
            if outcome is Outcome.TRANSIENT:
                delay = backoff.delay(attempt)
                attempt += 1
                log.warning(
                    "registration with %s failed (%s: %s); retrying in %.1fs",
                    config.registration_addr,
                    exc.code().name,
                    details,
                    delay,
                )
                await sleep(delay)
                continue
            log.error(
                "registration refused by %s: %s: %s. This nonce will not work again; the agent stays up "
                "idle and retries only when %s changes (the instance will be replaced by its server).",
                config.registration_addr,
                exc.code().name,
                details,
                config.nonce_path,
            )
            await _wait_for_new_nonce(config, bootstrap.nonce, sleep, idle_check)
            attempt = 0
            continue
        store_certificate(config.cert_path, cert_pem, mode=config.identity_mode)
        log.info("registered with %s as %s", config.registration_addr, config.instance_id)
        return cert_pem


async def _wait_for_new_nonce(config: AgentConfig, old: str, sleep: Sleep, every: float) -> None:
    while True:
        await sleep(every)
        try:
            current = read_bootstrap(config.identity_dir).nonce
        except Exception as exc:  # noqa: BLE001 - any unreadable state means "not yet"
            log.debug("waiting for a new nonce: %s", exc)
            continue
        if current != old:
            log.info("%s changed; registering again", config.nonce_path)
            return
