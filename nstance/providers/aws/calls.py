"""One AWS API call, run in a worker thread, with throttling and transient failures retried.

``AwsCaller.call`` runs a blocking boto3 client method in a thread (the event loop never blocks),
retries ``RequestLimitExceeded`` and its relatives and transient failures (5xx, connection errors)
with exponential backoff and jitter for a bounded number of attempts, then raises
``ProviderThrottled`` or ``ProviderUnavailable``. Every other ``ClientError`` is re-raised untouched,
so the caller can react to the codes it expects (``InvalidInstanceID.NotFound``...) and pass the rest
to ``translate`` for a clear error naming the config path. boto3 clients must be built with
``retries={"total_max_attempts": 1}`` (see ``client_config``) so this is the only retry loop.

This module must not decide what a call means for an instance; it only carries one call out. It never
sleeps except through the injected ``sleep``.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionClosedError,
    EndpointConnectionError,
    NoCredentialsError,
    ParamValidationError,
    ReadTimeoutError,
)
from botocore.exceptions import (
    ConnectTimeoutError as BotoConnectTimeoutError,
)

from nstance.core.backoff import Backoff
from nstance.providers.base import ProviderInvalidRequest, ProviderThrottled, ProviderUnavailable

log = logging.getLogger(__name__)

Sleep = Callable[[float], Awaitable[None]]

#: Error codes AWS uses to say "slow down".
THROTTLE_CODES: frozenset[str] = frozenset(
    {
        "RequestLimitExceeded",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestThrottledException",
        "TooManyRequestsException",
        "SlowDown",
        "PriorRequestNotComplete",
        "EC2ThrottledException",
        "BandwidthLimitExceeded",
    }
)

#: Error codes for failures on AWS's side that are worth retrying.
TRANSIENT_CODES: frozenset[str] = frozenset(
    {"InternalError", "InternalFailure", "ServiceUnavailable", "Unavailable", "RequestTimeout"}
)

#: Codes meaning the credentials may not do this (docs/provider-aws.md lists the IAM actions).
DENIED_CODES: frozenset[str] = frozenset(
    {"UnauthorizedOperation", "AccessDenied", "AccessDeniedException", "AuthFailure", "OptInRequired"}
)

#: Codes meaning AWS has no room right now (capacity, quotas): a later attempt may succeed.
CAPACITY_CODES: frozenset[str] = frozenset(
    {
        "InsufficientInstanceCapacity",
        "InsufficientAddressCapacity",
        "InsufficientFreeAddressesInSubnet",
        "InstanceLimitExceeded",
        "VcpuLimitExceeded",
        "MaxSpotInstanceCountExceeded",
        "SpotMaxPriceTooLow",
        "InsufficientCapacityOnHost",
    }
)

_TRANSPORT_ERRORS: tuple[type[BotoCoreError], ...] = (
    EndpointConnectionError,
    ConnectionClosedError,
    ReadTimeoutError,
    BotoConnectTimeoutError,
)


def client_config(*, connect_timeout: float = 5.0, read_timeout: float = 30.0) -> Config:
    """botocore settings for every client the provider builds: one attempt per call, bounded waits."""
    return Config(
        retries={"total_max_attempts": 1, "mode": "standard"},
        connect_timeout=connect_timeout,
        read_timeout=read_timeout,
    )


def api_name(operation: str) -> str:
    """The AWS API name of a boto3 method: ``run_instances`` -> ``RunInstances``."""
    return "".join(part[:1].upper() + part[1:] for part in operation.split("_"))


def error_code(exc: ClientError) -> str:
    """The AWS error code of ``exc`` (``""`` if the response had none)."""
    error = exc.response.get("Error", {})
    code = error.get("Code", "") if isinstance(error, Mapping) else ""
    return str(code)


def error_message(exc: ClientError) -> str:
    """The AWS error message of ``exc``."""
    error = exc.response.get("Error", {})
    message = error.get("Message", "") if isinstance(error, Mapping) else ""
    return str(message) or str(exc)


def _http_status(exc: ClientError) -> int:
    meta = exc.response.get("ResponseMetadata", {})
    status = meta.get("HTTPStatusCode", 0) if isinstance(meta, Mapping) else 0
    return status if isinstance(status, int) else 0


def is_throttle(exc: ClientError) -> bool:
    """Whether AWS refused the call for rate reasons."""
    return error_code(exc) in THROTTLE_CODES


def is_transient(exc: ClientError) -> bool:
    """Whether the call failed on AWS's side in a way a retry may fix."""
    return error_code(exc) in TRANSIENT_CODES or _http_status(exc) >= 500


def translate(exc: Exception, operation: str, *, path: str = "") -> Exception:
    """A Provider error for an AWS failure nobody handled more specifically.

    ``path`` names the config the request came from (``templates.web.args``), so the message tells
    the user what to change.
    """
    where = f"{path}: " if path else ""
    if isinstance(exc, ParamValidationError):
        return ProviderInvalidRequest(f"{where}AWS {operation} refused the request before sending it: {exc}")
    if isinstance(exc, NoCredentialsError):
        return ProviderUnavailable(
            f"AWS {operation}: no AWS credentials found; give the server an instance profile, or set "
            "AWS_PROFILE or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (docs/provider-aws.md)"
        )
    if isinstance(exc, ClientError):
        code, message = error_code(exc), error_message(exc)
        if code in THROTTLE_CODES:
            return ProviderThrottled(f"AWS {operation} throttled ({code}): {message}")
        if code in DENIED_CODES:
            return ProviderInvalidRequest(
                f"AWS {operation} was denied ({code}): {message}; grant the IAM action listed in "
                "docs/provider-aws.md to the server's credentials"
            )
        if code in CAPACITY_CODES or is_transient(exc):
            return ProviderUnavailable(f"{where}AWS {operation} failed ({code}): {message}; retry later")
        return ProviderInvalidRequest(f"{where}AWS {operation} rejected the request ({code}): {message}")
    if isinstance(exc, BotoCoreError):
        return ProviderUnavailable(f"AWS {operation} failed: {exc}")
    return exc


class AwsCaller:
    """Runs boto3 calls in threads with bounded retries; shared by the provider's helpers."""

    def __init__(
        self,
        *,
        sleep: Sleep = asyncio.sleep,
        backoff: Backoff | None = None,
        max_attempts: int = 5,
    ) -> None:
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        self._sleep = sleep
        self.backoff = backoff or Backoff(base=0.5, cap=10.0, rng=random.Random())
        self.max_attempts = max_attempts
        #: Calls sent, by operation name (retries included): what the provider costs in API budget.
        self.sent: dict[str, int] = {}
        #: Calls refused for rate reasons, by operation name.
        self.throttled: dict[str, int] = {}

    async def call(
        self, client: Any, operation: str, /, *, retry_transient: bool = True, path: str = "", **params: Any
    ) -> dict[str, Any]:
        """``client.<operation>(**params)`` in a thread; throttling and transient failures retried.

        ``operation`` is the boto3 method name (``run_instances``). Raises ProviderThrottled or
        ProviderUnavailable when retries run out, ProviderInvalidRequest for a malformed request, and
        re-raises any other ``ClientError`` for the caller to interpret. With ``retry_transient=False``
        a transient failure (whose outcome is unknown: the call may have taken effect) raises
        ProviderUnavailable at once, so the caller can look before it tries again; throttling (a
        refused call) is still retried. ``path`` names the config the parameters came from, for the
        error when botocore refuses them before sending.
        """
        method = getattr(client, operation)
        name = api_name(operation)
        attempt = 0
        while True:
            self.sent[operation] = self.sent.get(operation, 0) + 1
            try:
                result = await asyncio.to_thread(method, **params)
            except ClientError as exc:
                if is_throttle(exc):
                    self.throttled[operation] = self.throttled.get(operation, 0) + 1
                    kind = "throttled"
                elif is_transient(exc):
                    kind = "unavailable"
                else:
                    raise
                failure: Exception = exc
            except _TRANSPORT_ERRORS as exc:
                kind, failure = "unavailable", exc
            except ParamValidationError as exc:
                raise translate(exc, name, path=path) from exc
            except NoCredentialsError as exc:
                raise translate(exc, name) from exc
            else:
                return dict(result)
            attempt += 1
            if kind == "unavailable" and not retry_transient:
                raise ProviderUnavailable(f"AWS {name} failed, outcome unknown: {failure}") from failure
            if attempt >= self.max_attempts:
                if kind == "throttled":
                    raise ProviderThrottled(
                        f"AWS {name} still throttled after {attempt} attempts: {failure}"
                    ) from failure
                raise ProviderUnavailable(
                    f"AWS {name} still failing after {attempt} attempts: {failure}"
                ) from failure
            delay = self.backoff.delay(attempt - 1)
            log.debug("AWS %s %s (attempt %d), retrying in %.2fs", name, kind, attempt, delay)
            await self._sleep(delay)
