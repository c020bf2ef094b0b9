"""The ``s3://bucket/prefix`` object store on boto3: AWS S3 and S3-compatible servers with If-Match.

Keys are stored as ``prefix + key``; listings strip the prefix again. Conditional writes use S3's own
preconditions: ``PutObject`` with ``IfNoneMatch='*'`` (create only) or ``IfMatch=<etag>`` (replace only
that version), and ``DeleteObject`` with ``IfMatch``. Errors become the ObjectStore errors:
412 -> PreconditionFailed (a missing key under ``IfMatch`` on a put also counts as a lost precondition);
404/NoSuchKey -> ObjectNotFound; NoSuchBucket -> core NotFound (never ObjectNotFound, so a missing
bucket is not mistaken for a missing lease); 403 -> PermissionDenied. ETags are returned exactly as S3
sends them (quoted).

Retries are ours, not botocore's. The client is built with ``retries={"total_max_attempts": 1}`` so
botocore sends each request exactly once, and this module runs one loop with explicit rules:

* 409 ConditionalRequestConflict and 503 SlowDown (and other throttling codes) mean the request was not
  applied, so every operation retries them with exponential backoff and full jitter
  (``sleep(rand() * min(max_delay, base_delay * 2**n))``). If they persist for ``max_attempts`` they
  surface as ``Conflict`` and ``Throttled``.
* Failures to connect are retried the same way (nothing was sent); they surface as core Unavailable.
* Ambiguous failures (500/502/504, read timeouts, a connection dropped mid-request) are retried only
  for idempotent operations (get, head, list, unconditional put and delete). A conditional write or
  delete may already have been applied, and a blind retry could then report a false 412; so they raise
  Unavailable at once and the caller re-reads before deciding.

We do this ourselves because botocore's retry modes would retry 409/503 invisibly, with their own
budget, and without distinguishing conditional writes; owning the loop makes the behaviour
deterministic and testable (``sleep`` and ``rand`` are injectable).

S3-compatible stores: pass ``endpoint_url`` and ``path_style=True``, or set ``AWS_ENDPOINT_URL`` (or
``AWS_ENDPOINT_URL_S3``) and ``AWS_S3_USE_PATH_STYLE=true`` as for upstream Nstance. With a custom
endpoint, request/response checksums are only sent when the operation requires them, because many
S3-compatible servers reject botocore's newer default checksum headers. The store must support
If-Match/If-None-Match on PutObject and If-Match on DeleteObject (AWS S3, SeaweedFS, Ceph RGW do; a 501
NotImplemented surfaces as FailedPrecondition naming the missing feature).

This module must not be imported by code that runs without boto3; the factory imports it lazily. It
keeps no state beyond the boto3 client and does not create buckets.
"""

from __future__ import annotations

import builtins
import contextlib
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC
from typing import Any, TypeVar

import boto3
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectTimeoutError,
    EndpointConnectionError,
    HTTPClientError,
    NoCredentialsError,
    NoRegionError,
    PartialCredentialsError,
    ProxyConnectionError,
)

from nstance.core.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    Unauthenticated,
    Unavailable,
)
from nstance.objectstore.base import Conflict, ObjectInfo, ObjectNotFound, PreconditionFailed, Throttled
from nstance.objectstore.file import validate_key

T = TypeVar("T")

_THROTTLE_CODES = frozenset(
    {"SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded", "TooManyRequests"}
)
_NOT_FOUND_CODES = frozenset({"NoSuchKey", "NotFound", "404"})
_NOT_SENT_ERRORS = (EndpointConnectionError, ConnectTimeoutError, ProxyConnectionError)


def env_path_style() -> bool:
    """Whether ``AWS_S3_USE_PATH_STYLE`` asks for path-style addressing (as upstream reads it)."""
    return os.environ.get("AWS_S3_USE_PATH_STYLE", "").strip().lower() in ("1", "true", "yes", "on")


def env_endpoint_url() -> str | None:
    """The S3 endpoint from ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL``, if set."""
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None


@dataclass(frozen=True, slots=True)
class _Retry:
    """What to do about one failed attempt: retry it, and what to raise once attempts run out."""

    final: Exception


class S3ObjectStore:
    """An ObjectStore over one bucket and key prefix; thread-safe (one boto3 client, shared)."""

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        path_style: bool | None = None,
        client: Any = None,
        max_attempts: int = 5,
        base_delay: float = 0.05,
        max_delay: float = 2.0,
        sleep: Callable[[float], None] = time.sleep,
        rand: Callable[[], float] = random.random,
        connect_timeout: float = 5.0,
        read_timeout: float = 30.0,
    ) -> None:
        """Open a store; ``None`` for endpoint/path style means "from the environment"."""
        if not bucket:
            raise InvalidArgument("bucket must not be empty")
        if max_attempts < 1:
            raise InvalidArgument("max_attempts must be at least 1")
        self._bucket = bucket
        self._prefix = prefix
        self._max_attempts = max_attempts
        self._base_delay = base_delay
        self._max_delay = max_delay
        self._sleep = sleep
        self._rand = rand
        self._endpoint_url = endpoint_url if endpoint_url is not None else env_endpoint_url()
        self._path_style = path_style if path_style is not None else env_path_style()
        self._owns_client = client is None
        if client is None:
            checksums = "when_required" if self._endpoint_url else "when_supported"
            config = Config(
                retries={"total_max_attempts": 1, "mode": "standard"},
                connect_timeout=connect_timeout,
                read_timeout=read_timeout,
                max_pool_connections=32,
                s3={"addressing_style": "path"} if self._path_style else None,
                request_checksum_calculation=checksums,
                response_checksum_validation=checksums,
            )
            session = boto3.session.Session(region_name=region)
            client = session.client("s3", endpoint_url=self._endpoint_url, config=config)
        self._client: Any = client

    # -- properties ------------------------------------------------------------------------------

    @property
    def bucket(self) -> str:
        """The bucket name."""
        return self._bucket

    @property
    def prefix(self) -> str:
        """The prefix prepended to every key."""
        return self._prefix

    @property
    def endpoint_url(self) -> str | None:
        """The custom endpoint in use, or None for AWS."""
        return self._endpoint_url

    @property
    def path_style(self) -> bool:
        """Whether path-style addressing is forced."""
        return self._path_style

    @property
    def client(self) -> Any:
        """The underlying boto3 S3 client (for bucket administration in tools and tests)."""
        return self._client

    def close(self) -> None:
        """Close the HTTP connection pool of a client this store created."""
        if self._owns_client:
            self._client.close()

    def __enter__(self) -> S3ObjectStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"S3ObjectStore(bucket={self._bucket!r}, prefix={self._prefix!r})"

    # -- reads -----------------------------------------------------------------------------------

    def get(self, key: str) -> tuple[bytes, str]:
        full = self._full(key)

        def attempt() -> tuple[bytes, str]:
            resp = self._client.get_object(Bucket=self._bucket, Key=full)
            body = resp["Body"]
            try:
                data = body.read()
            finally:
                body.close()
            return bytes(data), str(resp["ETag"])

        return self._run(attempt, key=key, idempotent=True)

    def head(self, key: str) -> ObjectInfo:
        full = self._full(key)
        resp = self._run(
            lambda: self._client.head_object(Bucket=self._bucket, Key=full), key=key, idempotent=True
        )
        return ObjectInfo(
            key=key,
            etag=str(resp["ETag"]),
            size=int(resp["ContentLength"]),
            last_modified=resp["LastModified"].astimezone(UTC),
        )

    def exists(self, key: str) -> bool:
        try:
            self.head(key)
        except ObjectNotFound:
            return False
        return True

    # -- writes ----------------------------------------------------------------------------------

    def put(self, key: str, data: bytes) -> str:
        full = self._full(key)
        resp = self._run(
            lambda: self._client.put_object(Bucket=self._bucket, Key=full, Body=data),
            key=key,
            idempotent=True,
        )
        return str(resp["ETag"])

    def put_if_match(self, key: str, data: bytes, etag: str | None) -> str:
        full = self._full(key)
        condition = {"IfNoneMatch": "*"} if etag is None else {"IfMatch": etag}
        try:
            resp = self._run(
                lambda: self._client.put_object(Bucket=self._bucket, Key=full, Body=data, **condition),
                key=key,
                idempotent=False,
            )
        except ObjectNotFound:
            # AWS answers If-Match on a missing key with 404; for a compare-and-swap that is a lost race.
            raise PreconditionFailed(f"object {key!r} does not exist (etag mismatch)") from None
        return str(resp["ETag"])

    def delete(self, key: str, if_match: str | None = None) -> None:
        full = self._full(key)
        if if_match is None:
            with contextlib.suppress(ObjectNotFound):
                self._run(
                    lambda: self._client.delete_object(Bucket=self._bucket, Key=full),
                    key=key,
                    idempotent=True,
                )
            return
        self._run(
            lambda: self._client.delete_object(Bucket=self._bucket, Key=full, IfMatch=if_match),
            key=key,
            idempotent=False,
        )

    # -- listing ---------------------------------------------------------------------------------

    def list(self, prefix: str = "") -> builtins.list[str]:
        full_prefix = self._prefix + prefix
        strip = len(self._prefix)

        def attempt() -> builtins.list[str]:
            keys: builtins.list[str] = []
            paginator = self._client.get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=self._bucket, Prefix=full_prefix):
                keys.extend(str(obj["Key"])[strip:] for obj in page.get("Contents", ()))
            return keys

        return sorted(self._run(attempt, key=prefix, idempotent=True))

    # -- internals -------------------------------------------------------------------------------

    def _full(self, key: str) -> str:
        return self._prefix + validate_key(key)

    def _backoff(self, attempt: int) -> float:
        """Full-jitter exponential backoff before retry number ``attempt`` (1-based)."""
        cap = min(self._max_delay, self._base_delay * 2.0 ** (attempt - 1))
        return self._rand() * cap

    def _run(self, call: Callable[[], T], *, key: str, idempotent: bool) -> T:
        """Run ``call`` with this module's retry rules; translate what is not retried."""
        attempt = 0
        while True:
            attempt += 1
            try:
                return call()
            except ClientError as exc:
                decision = self._classify_client_error(exc, key=key, idempotent=idempotent)
                cause: Exception = exc
            except _NOT_SENT_ERRORS as exc:
                decision = _Retry(Unavailable(f"cannot reach object storage: {exc}"))
                cause = exc
            except HTTPClientError as exc:
                if not idempotent:
                    raise Unavailable(
                        f"object storage request for {key!r} failed mid-flight ({exc}); "
                        "the conditional write may or may not have been applied: re-read before retrying"
                    ) from exc
                decision = _Retry(Unavailable(f"object storage request failed: {exc}"))
                cause = exc
            except (NoCredentialsError, PartialCredentialsError) as exc:
                raise Unauthenticated(
                    f"s3://{self._bucket}: no usable AWS credentials ({exc}); set AWS_ACCESS_KEY_ID and "
                    "AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or run with an instance role"
                ) from exc
            except NoRegionError as exc:
                raise InvalidArgument(f"s3://{self._bucket}: no AWS region; set AWS_REGION") from exc
            except BotoCoreError as exc:
                raise Unavailable(f"s3://{self._bucket}: object storage request failed: {exc}") from exc
            if attempt >= self._max_attempts:
                raise decision.final from cause
            self._sleep(self._backoff(attempt))

    def _classify_client_error(self, exc: ClientError, *, key: str, idempotent: bool) -> _Retry:
        """Return a retry decision, or raise the ObjectStore error for a final answer."""
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        where = f"s3://{self._bucket}/{self._prefix}{key}"
        if status == 409 and code in ("ConditionalRequestConflict", "OperationAborted", "409"):
            return _Retry(Conflict(f"{where}: concurrent conditional write in progress (409 {code})"))
        if code in _THROTTLE_CODES or status in (429, 503):
            return _Retry(Throttled(f"{where}: object storage is throttling ({status} {code})"))
        if status >= 500 and status != 501:
            if idempotent:
                return _Retry(Unavailable(f"{where}: object storage error ({status} {code})"))
            raise Unavailable(
                f"{where}: object storage error ({status} {code}); the conditional write may or may "
                "not have been applied: re-read before retrying"
            ) from exc
        if status == 412 or code == "PreconditionFailed":
            raise PreconditionFailed(f"object {key!r} changed (etag mismatch)") from None
        if code == "NoSuchBucket":
            raise NotFound(f"bucket {self._bucket!r} does not exist") from exc
        if code in _NOT_FOUND_CODES or status == 404:
            raise ObjectNotFound(f"object {key!r} not found") from None
        if status == 403:
            raise PermissionDenied(f"{where}: access denied ({code})") from exc
        if status == 501:
            raise FailedPrecondition(
                f"{where}: the S3 endpoint does not implement this request ({code}); Nstance needs "
                "If-Match/If-None-Match on PutObject and If-Match on DeleteObject"
            ) from exc
        message = str(error.get("Message", "")) or "no details"
        raise InvalidArgument(
            f"{where}: object storage refused the request ({status} {code}: {message})"
        ) from exc
