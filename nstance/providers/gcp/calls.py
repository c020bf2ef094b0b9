"""Calling the Compute API: worker threads, bounded retries, error mapping and zone-operation waits.

``GceCalls`` is shared by every part of the ``gcp`` provider (instances, network endpoint groups, the
leader alias IP). ``call`` runs one blocking SDK call in a worker thread and retries 429 and 403
``rateLimitExceeded`` (then ``ProviderThrottled``) and 500/502/503/504, connection and credential
refresh failures (then ``ProviderUnavailable``) with ``Backoff`` and the injected ``sleep``.
``map_error`` turns any other API error into the provider error a caller acts on. ``wait`` waits a
zone operation with ``zoneOperations.wait`` on the provider's own endpoint, bounded by the operation
timeout; ``ExtendedOperation.result()``/``done()`` are never used because their internal operations
client ignores ``client_options`` and would poll ``compute.googleapis.com``. ``raise_op_error`` reports
a finished operation's error (stockouts as unavailable, rate limits as throttled).

This module decides nothing about VMs or load balancers and makes no call on its own.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Mapping
from typing import TypeVar

from google.api_core import exceptions as gexc
from google.auth import exceptions as gauth_exceptions
from google.cloud import compute_v1

from nstance.core.backoff import Backoff
from nstance.core.clock import Clock
from nstance.providers.base import (
    InstanceNotFound,
    ProviderInvalidRequest,
    ProviderThrottled,
    ProviderUnavailable,
)

T = TypeVar("T")
Sleep = Callable[[float], Awaitable[None]]

_THROTTLE_REASONS = frozenset({"rateLimitExceeded", "userRateLimitExceeded"})
_CAPACITY_CODES = frozenset(
    {
        "ZONE_RESOURCE_POOL_EXHAUSTED",
        "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
        "RESOURCE_POOL_EXHAUSTED",
        "QUOTA_EXCEEDED",
        "RESOURCE_NOT_READY",
    }
)
#: The longest a single ``zoneOperations.wait`` blocks on the server side is about two minutes.
_MAX_WAIT_SECONDS = 130.0
_MAX_WAIT_CALLS = 30


class _Retryable(Exception):
    def __init__(self, throttled: bool, message: str) -> None:
        super().__init__(message)
        self.throttled = throttled


class GceCalls:
    """Retries, error mapping and operation waits for one project and zone; see the module docstring."""

    def __init__(
        self,
        *,
        project: str,
        zone: str,
        clock: Clock,
        operations: compute_v1.ZoneOperationsClient,
        max_attempts: int,
        backoff: Backoff,
        sleep: Sleep,
        request_timeout: float,
        operation_timeout: float,
    ) -> None:
        self.project = project
        self.zone = zone
        self.request_timeout = request_timeout
        self._clock = clock
        self._operations = operations
        self._max_attempts = max(1, max_attempts)
        self._backoff = backoff
        self._sleep = sleep
        self._operation_timeout = operation_timeout

    async def call(self, what: str, fn: Callable[[], T]) -> T:
        """Run ``fn`` in a thread; retry throttling and transient failures with backoff."""
        attempt = 0
        while True:
            try:
                return await asyncio.to_thread(_classified, fn)
            except _Retryable as exc:
                attempt += 1
                if attempt >= self._max_attempts:
                    cls = ProviderThrottled if exc.throttled else ProviderUnavailable
                    raise cls(f"gcp: {what} failed {attempt} times, last: {exc}; retry later") from exc
                await self._sleep(self._backoff.delay(attempt - 1))

    def map_error(self, exc: gexc.GoogleAPICallError, what: str) -> Exception:
        """The provider error for an API error that ``call`` did not retry away."""
        message = f"gcp: {what}: {exc.message}"
        if isinstance(exc, gexc.NotFound):
            return InstanceNotFound(message)
        if isinstance(exc, gexc.Forbidden | gexc.Unauthorized):
            return ProviderInvalidRequest(
                f"{message} - check the service account's IAM roles on project {self.project} "
                "(docs/provider-gcp.md)"
            )
        if isinstance(exc, gexc.ClientError):
            return ProviderInvalidRequest(message)
        return ProviderUnavailable(message)

    @staticmethod
    def is_done(op: compute_v1.Operation) -> bool:
        return bool(op.status == compute_v1.Operation.Status.DONE)

    async def wait(
        self, op: compute_v1.Operation, what: str, *, project: str = "", zone: str = ""
    ) -> compute_v1.Operation:
        """Wait for a zone operation on this endpoint; return it (maybe not DONE after the timeout)."""
        project = project or self.project
        zone = zone or self.zone
        deadline = self._clock.monotonic() + self._operation_timeout
        calls = 0
        while not self.is_done(op):
            if calls >= _MAX_WAIT_CALLS or self._clock.monotonic() >= deadline:
                return op
            calls += 1
            remaining = max(1.0, deadline - self._clock.monotonic())
            name = op.name
            try:
                op = await self.call(
                    "zoneOperations.wait",
                    functools.partial(
                        self._wait_blocking, project, zone, name, min(remaining, _MAX_WAIT_SECONDS)
                    ),
                )
            except gexc.GoogleAPICallError as exc:
                raise self.map_error(exc, f"{what}: wait for {name}") from exc
        return op

    async def poll(self, name: str, what: str, *, project: str = "", zone: str = "") -> compute_v1.Operation:
        """One non-blocking look at a zone operation (``zoneOperations.get``)."""
        project = project or self.project
        zone = zone or self.zone
        try:
            return await self.call(
                "zoneOperations.get",
                lambda: self._operations.get(
                    project=project, zone=zone, operation=name, retry=None, timeout=self.request_timeout
                ),
            )
        except gexc.GoogleAPICallError as exc:
            raise self.map_error(exc, f"{what}: read {name}") from exc

    def raise_op_error(self, op: compute_v1.Operation, what: str) -> None:
        """Raise the provider error for a finished operation that failed; return if it did not."""
        if not op.error.errors:
            return
        first = op.error.errors[0]
        text = "; ".join(f"{e.code}: {e.message}" for e in op.error.errors)
        message = f"gcp: {what}: operation {op.name} failed: {text}"
        if first.code in _CAPACITY_CODES:
            raise ProviderUnavailable(message + " (capacity or quota; retry later or use another zone/type)")
        if first.code in ("RATE_LIMIT_EXCEEDED",):
            raise ProviderThrottled(message)
        raise ProviderInvalidRequest(message)

    def _wait_blocking(self, project: str, zone: str, name: str, timeout: float) -> compute_v1.Operation:
        return self._operations.wait(project=project, zone=zone, operation=name, retry=None, timeout=timeout)


def error_reasons(exc: gexc.GoogleAPICallError) -> set[str]:
    """The ``reason`` of each entry of a Google error body (``conditionNotMet``, ``notFound``, ...)."""
    return {str(e.get("reason")) for e in exc.errors if isinstance(e, Mapping) and e.get("reason")}


def _classified(fn: Callable[[], T]) -> T:
    """Call ``fn`` (in a worker thread), turning retryable failures into ``_Retryable``."""
    try:
        return fn()
    except gexc.TooManyRequests as exc:
        raise _Retryable(True, str(exc)) from exc
    except gexc.Forbidden as exc:
        if error_reasons(exc) & _THROTTLE_REASONS:
            raise _Retryable(True, str(exc)) from exc
        raise
    except (gexc.InternalServerError, gexc.BadGateway, gexc.ServiceUnavailable, gexc.GatewayTimeout) as exc:
        raise _Retryable(False, str(exc)) from exc
    except gauth_exceptions.TransportError as exc:
        raise _Retryable(False, f"transport: {exc}") from exc
    except gauth_exceptions.RefreshError as exc:
        raise _Retryable(False, f"cannot refresh Google credentials: {exc}") from exc
    except OSError as exc:  # requests' ConnectionError and Timeout are OSErrors
        raise _Retryable(False, f"connection: {exc}") from exc
