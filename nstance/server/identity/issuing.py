"""What every registration flow shares: signing a client certificate, and finishing a step regardless.

``issue`` checks the presented public key (ECDSA P-256 or Ed25519, SubjectPublicKeyInfo PEM) and
signs a client certificate with the cluster CA for the role's configured lifetime
(``certificates.<role>.ttl``); ``canonical_pem`` is the one spelling of the certified key that every
stored copy uses; ``uncancellable`` runs the step that must finish once begun (claim and record the
registration, or undo the claim) even when the RPC that started it goes away, and has what it did
undone when it succeeded for a caller that had left. No storage here.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Coroutine
from datetime import timedelta
from typing import Any, TypeVar

from nstance.core.errors import InvalidArgument
from nstance.pki.certs import DEFAULT_CLIENT_TTL, IssuedCertificate, issue_client_certificate
from nstance.pki.keys import public_key_to_pem
from nstance.server.state.context import ShardContext

log = logging.getLogger(__name__)

T = TypeVar("T")


def client_ttl(ctx: ShardContext, name: str) -> timedelta:
    """``certificates.<name>.ttl`` hours from the shard config, else 8760 h."""
    snapshot = ctx.config.snapshot()
    if snapshot is not None:
        entry = snapshot.config.certificates.get(name)
        if entry is not None:
            return timedelta(hours=entry.ttl)
    return DEFAULT_CLIENT_TTL


def issue(
    ctx: ShardContext, public_key_pem: bytes, *, client_id: str, tenant: str, role: str
) -> IssuedCertificate:
    """Check the key (ECDSA P-256 or Ed25519 PEM, InvalidArgument otherwise) and sign a certificate."""
    if not public_key_pem:
        raise InvalidArgument(
            "public_key_pem is empty; send the ECDSA P-256 or Ed25519 public key (SubjectPublicKeyInfo PEM)"
        )
    try:
        return issue_client_certificate(
            ctx.ca,
            public_key_pem,
            client_id=client_id,
            tenant=tenant,
            role=role,
            ttl=client_ttl(ctx, role),
            clock=ctx.clock,
        )
    except InvalidArgument as exc:
        if "ECDSA P-256" in str(exc):
            raise
        raise InvalidArgument(
            f"{exc}; an ECDSA P-256 or Ed25519 public key (SubjectPublicKeyInfo PEM) is required"
        ) from None


def canonical_pem(issued: IssuedCertificate) -> str:
    """The certified public key as SubjectPublicKeyInfo PEM (one spelling for every stored copy)."""
    return public_key_to_pem(issued.certificate.public_key()).decode("ascii")  # type: ignore[arg-type]


#: Undoing steps whose callers left (``uncancellable``), referenced until they finish.
_LEFT_BEHIND: set[asyncio.Task[None]] = set()


async def uncancellable(step: Coroutine[Any, Any, T], *, undo_if_left: Callable[[], Awaitable[None]]) -> T:
    """Run ``step`` to completion even if the awaiting RPC is cancelled, and return its result.

    When the caller went away first and ``step`` then succeeds, ``undo_if_left()`` runs in the
    background: what the step did was for an answer nobody received (a certificate never handed out).
    A step that fails undoes its own work; its error is only logged then.
    """
    task = asyncio.ensure_future(step)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        task.add_done_callback(functools.partial(_after_caller_left, undo_if_left))
        raise


def _after_caller_left(undo: Callable[[], Awaitable[None]], task: asyncio.Future[Any]) -> None:
    if task.cancelled():
        return
    if task.exception() is not None:
        log.debug("registration step finished after its caller left: %s", task.exception())
        return
    undoing = asyncio.ensure_future(undo())
    _LEFT_BEHIND.add(undoing)
    undoing.add_done_callback(_LEFT_BEHIND.discard)
