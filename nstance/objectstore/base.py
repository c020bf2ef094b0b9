"""The ObjectStore protocol and its errors.

Every backend (``file://`` for the embedded default, ``s3://`` for real deployments) offers the same
small surface with the same conditional-write semantics, so leader election and compare-and-swap
updates behave identically everywhere. ETags are opaque strings: equal content may give equal
ETags (as S3's MD5 ETags do); callers compare them only for equality.

Calls are synchronous and thread-safe; asyncio code runs them with ``asyncio.to_thread``.
This module does no I/O itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from nstance.core.errors import FailedPrecondition, NotFound, Unavailable


class ObjectNotFound(NotFound):
    """The key does not exist."""


class PreconditionFailed(FailedPrecondition):
    """A conditional write or delete lost: the ETag did not match, or the key already existed."""


class Conflict(Unavailable):
    """A concurrent conditional write was in flight (S3 409 ConditionalRequestConflict); retryable."""


class Throttled(Unavailable):
    """The store asked us to slow down (S3 503 SlowDown); retryable after backing off."""


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """Metadata of one stored object."""

    key: str
    etag: str
    size: int
    last_modified: datetime


class ObjectStore(Protocol):
    """Key/value blobs with ETags and conditional writes. Keys are ``/``-separated, no leading ``/``."""

    def get(self, key: str) -> tuple[bytes, str]:
        """Return ``(data, etag)``; raise ObjectNotFound."""
        ...

    def head(self, key: str) -> ObjectInfo:
        """Return metadata without the body; raise ObjectNotFound."""
        ...

    def put(self, key: str, data: bytes) -> str:
        """Write unconditionally (atomically: readers see the old or the new bytes); return the ETag."""
        ...

    def put_if_match(self, key: str, data: bytes, etag: str | None) -> str:
        """Write only if the current ETag equals ``etag``; ``etag=None`` means "only if absent".

        Return the new ETag; raise PreconditionFailed when the condition does not hold.
        """
        ...

    def delete(self, key: str, if_match: str | None = None) -> None:
        """Delete ``key``. Without ``if_match`` a missing key is not an error.

        With ``if_match``: raise ObjectNotFound if missing, PreconditionFailed if the ETag differs.
        """
        ...

    def list(self, prefix: str = "") -> list[str]:
        """Return every key starting with ``prefix``, sorted; pagination is the backend's business."""
        ...

    def exists(self, key: str) -> bool:
        """Return whether ``key`` exists."""
        ...
