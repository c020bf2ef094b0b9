"""The gRPC server interceptor: who is calling (mTLS identity), may they, and what went wrong.

``ServerInterceptor`` wraps every method handler (unary and streaming, in both directions) of a
``grpc.aio`` server and, for each call:

1. **Authenticates** the caller when the service requires a role (``roles``: service full name ->
   required role, or ``None`` for no client certificate, e.g. RegistrationService). The peer
   certificate from the TLS handshake (``auth_context()["x509_pem_cert"]``) is verified against the
   cluster CA with ``verify_client_certificate``. Behind the OpenSSL front of the mTLS ports
   (``tlsfront``) grpc sees a plain Unix-socket connection: the certificate is then looked up by
   ``context.peer()`` with ``peer_certificates``, and a peer it does not know has no certificate.
   A serial on the deny list (``is_revoked``) is
   refused with UNAUTHENTICATED; a wrong role with PERMISSION_DENIED. A service with no entry in
   ``roles`` is refused (deny by default). The verified ``PeerIdentity`` is put in a context variable
   for the handler: ``current_peer()``.
2. **Maps errors**: ``nstance.core.errors`` exceptions become their gRPC status code (by MRO, so a
   subclass such as ``ProviderThrottled`` maps like ``ResourceExhausted``) with the exception message
   as details (cut to ``MAX_DETAILS_BYTES``, since messages may quote client input). Any other
   exception becomes INTERNAL with ``internal error (ref <id>); see the server log`` and is logged
   with its traceback under the same ref, so no exception text leaks to clients.
   ``asyncio.CancelledError`` and handler-initiated aborts propagate untouched.
3. **Counts** each finished call in ``Metrics.record_rpc(method, code)`` when metrics are given.

Handlers must be ``async def`` functions or async generator functions (a synchronous unary handler is
called inline on the event loop; synchronous *streaming* handlers are not supported). This module
decides nothing about business rules and never builds responses itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from types import MappingProxyType
from typing import Any, Final

import grpc
import grpc.aio

from nstance.core.clock import Clock
from nstance.core.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
)
from nstance.pki.ca import CertificateAuthority
from nstance.pki.peer import PeerIdentity, VerifiedCertificates, require_role, verify_client_certificate
from nstance.server.state.metrics import Metrics

logger = logging.getLogger(__name__)

#: Service full name -> role a client certificate must carry (None: no client certificate needed).
DEFAULT_ROLES: Final[Mapping[str, str | None]] = MappingProxyType(
    {
        "nstance.v1.OperatorService": "operator",
        "nstance.v1.AgentService": "agent",
        "nstance.v1.RegistrationService": None,
        "grpc.health.v1.Health": None,
    }
)

_ERROR_CODES: Final[Mapping[type[BaseException], grpc.StatusCode]] = MappingProxyType(
    {
        InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
        NotFound: grpc.StatusCode.NOT_FOUND,
        AlreadyExists: grpc.StatusCode.ALREADY_EXISTS,
        FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
        PermissionDenied: grpc.StatusCode.PERMISSION_DENIED,
        Unauthenticated: grpc.StatusCode.UNAUTHENTICATED,
        Unavailable: grpc.StatusCode.UNAVAILABLE,
        ResourceExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
        NotImplementedError: grpc.StatusCode.UNIMPLEMENTED,
        asyncio.CancelledError: grpc.StatusCode.CANCELLED,
    }
)

#: Longest status message sent, in UTF-8 bytes. Messages quote client input (names, ids), grpc sends
#: the message as a header (percent-encoding every byte outside printable ASCII) and clients drop a
#: call whose headers exceed 16 KiB, so an unbounded echo would turn, say, NOT_FOUND into
#: RESOURCE_EXHAUSTED on the client. 2 KiB stays under the 8 KiB soft limit even fully encoded.
MAX_DETAILS_BYTES: Final = 2048
_TRUNCATED = " … (message truncated)"

_PEER: contextvars.ContextVar[PeerIdentity | None] = contextvars.ContextVar("nstance_peer", default=None)

Behaviour = Callable[..., Any]


def code_for(exc: BaseException) -> grpc.StatusCode:
    """The gRPC status code for ``exc``: its nearest mapped class in the MRO, else INTERNAL."""
    for cls in type(exc).__mro__:
        code = _ERROR_CODES.get(cls)
        if code is not None:
            return code
    return grpc.StatusCode.INTERNAL


def current_peer() -> PeerIdentity:
    """The verified identity of the caller of the RPC being handled.

    Raises Unauthenticated when the call carries no verified client certificate (a service whose
    role is ``None``, or code running outside an RPC).
    """
    peer = _PEER.get()
    if peer is None:
        raise Unauthenticated("this call carries no verified client certificate")
    return peer


def _bounded_details(details: str) -> str:
    """``details`` cut to at most MAX_DETAILS_BYTES of UTF-8 (at a character boundary), marked if cut."""
    raw = details.encode("utf-8")
    if len(raw) <= MAX_DETAILS_BYTES:
        return details
    keep = MAX_DETAILS_BYTES - len(_TRUNCATED.encode("utf-8"))
    return raw[:keep].decode("utf-8", "ignore") + _TRUNCATED


def _never_revoked(serial: str) -> bool:
    return False


def _code_name(value: object) -> str:
    if isinstance(value, grpc.StatusCode):
        return str(value.name)
    if isinstance(value, int):
        for code in grpc.StatusCode:
            if code.value[0] == value:
                return str(code.name)
    return "UNKNOWN"


def _method_name(raw: str | bytes) -> str:
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    return text.lstrip("/")


class ServerInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]  # grpc ships no types
    """Authentication, authorisation, error mapping and RPC counting for every method."""

    def __init__(
        self,
        *,
        ca: CertificateAuthority | Callable[[], CertificateAuthority],
        clock: Clock,
        is_revoked: Callable[[str], bool] = _never_revoked,
        roles: Mapping[str, str | None] = DEFAULT_ROLES,
        metrics: Metrics | None = None,
        peer_certificates: Callable[[str], bytes | None] | None = None,
    ) -> None:
        self._ca = ca
        self._peer_certificates = peer_certificates
        self._clock = clock
        self._is_revoked = is_revoked
        self._roles = dict(roles)
        self._metrics = metrics
        # A caller's certificate is verified once (per CA); later calls check its time and revocation.
        self._verified = VerifiedCertificates()

    # --- grpc.aio hook ------------------------------------------------------------------------

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:  # unknown method: grpc answers UNIMPLEMENTED
            return None
        method = _method_name(handler_call_details.method)
        if handler.request_streaming and handler.response_streaming:
            field = "stream_stream"
        elif handler.request_streaming:
            field = "stream_unary"
        elif handler.response_streaming:
            field = "unary_stream"
        else:
            field = "unary_unary"
        behaviour: Behaviour | None = getattr(handler, field)
        if behaviour is None:
            return handler
        if inspect.isasyncgenfunction(behaviour):
            wrapped: Behaviour = self._wrap_stream(behaviour, method)
        else:
            wrapped = self._wrap_call(behaviour, method)
        return handler._replace(**{field: wrapped})

    # --- per-call steps -----------------------------------------------------------------------

    def _authority(self) -> CertificateAuthority:
        return self._ca if isinstance(self._ca, CertificateAuthority) else self._ca()

    def _authenticate(self, context: grpc.aio.ServicerContext, method: str) -> PeerIdentity | None:
        service = method.partition("/")[0]
        if service not in self._roles:
            raise PermissionDenied(f"service {service} has no access rule on this server; call refused")
        role = self._roles[service]
        if role is None:
            return None
        pems = context.auth_context().get("x509_pem_cert") or []
        cert: bytes | None = pems[0] if pems else None
        if cert is None and self._peer_certificates is not None:
            cert = self._peer_certificates(context.peer())
        if cert is None:
            raise Unauthenticated(
                f"{service} requires a client certificate issued by this cluster's CA; none was presented"
            )
        identity = verify_client_certificate(
            cert, self._authority(), clock=self._clock, verified=self._verified
        )
        if self._is_revoked(identity.serial):
            raise Unauthenticated(f"certificate serial {identity.serial} has been revoked")
        require_role(identity, role)
        return identity

    def _record(self, method: str, code: str) -> None:
        if self._metrics is not None:
            self._metrics.record_rpc(method, code)

    async def _abort_for(self, exc: Exception, context: grpc.aio.ServicerContext, method: str) -> None:
        """Log ``exc``, count the call and abort it with the mapped status (raises grpc.aio.AbortError)."""
        code = code_for(exc)
        if code is grpc.StatusCode.INTERNAL:
            ref = secrets.token_hex(4)
            logger.error("internal error (ref %s) in %s", ref, method, exc_info=exc)
            details = f"internal error (ref {ref}); see the server log"
        elif code is grpc.StatusCode.UNIMPLEMENTED:
            details = f"{method} is not implemented by this server"
        else:
            details = _bounded_details(str(exc) or code.name)
            if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
                logger.warning("refused %s from %s: %s", method, context.peer(), details)
            else:
                logger.debug("%s failed with %s: %s", method, code.name, details)
        self._record(method, str(code.name))
        await context.abort(code, details)

    def _finished(self, context: grpc.aio.ServicerContext, method: str) -> None:
        self._record(method, _code_name(context.code()) if context.code() is not None else "OK")

    def _wrap_call(self, behaviour: Behaviour, method: str) -> Behaviour:
        async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
            try:
                identity = self._authenticate(context, method)
                token = _PEER.set(identity)
                try:
                    result = behaviour(request, context)
                    if inspect.isawaitable(result):
                        result = await result
                finally:
                    with contextlib.suppress(ValueError):
                        _PEER.reset(token)
            except asyncio.CancelledError:
                self._record(method, "CANCELLED")
                raise
            except grpc.aio.AbortError:  # the handler aborted with its own status
                self._finished(context, method)
                raise
            except Exception as exc:
                await self._abort_for(exc, context, method)
                raise  # pragma: no cover - abort raised already
            self._finished(context, method)
            return result

        return call

    def _wrap_stream(self, behaviour: Behaviour, method: str) -> Behaviour:
        async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            try:
                identity = self._authenticate(context, method)
                token = _PEER.set(identity)
                responses = behaviour(request, context)
                try:
                    async for response in responses:
                        yield response
                finally:
                    with contextlib.suppress(ValueError):
                        _PEER.reset(token)
                    await responses.aclose()
            except (asyncio.CancelledError, GeneratorExit):
                self._record(method, "CANCELLED")
                raise
            except grpc.aio.AbortError:
                self._finished(context, method)
                raise
            except Exception as exc:
                await self._abort_for(exc, context, method)
                raise  # pragma: no cover - abort raised already
            self._finished(context, method)

        return stream
