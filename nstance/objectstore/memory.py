"""In-memory ObjectStore with the same conditional semantics as the real backends.

Used by the deterministic simulator and by unit tests that need storage but not files or sockets.
ETags are content hashes, as with the file backend. Nothing here survives the process.
"""

from __future__ import annotations

import hashlib
import threading
from datetime import UTC, datetime

from nstance.objectstore.base import ObjectInfo, ObjectNotFound, PreconditionFailed


def content_etag(data: bytes) -> str:
    """The ETag every Nstance-owned backend uses: quoted MD5 of the content, as S3 does for plain puts."""
    return '"' + hashlib.md5(data, usedforsecurity=False).hexdigest() + '"'


class MemoryObjectStore:
    """A dict behind a lock."""

    #: Calls wait on nothing but the lock (see ``FileObjectStore.local``).
    local = True

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._objects: dict[str, tuple[bytes, str, datetime]] = {}

    def get(self, key: str) -> tuple[bytes, str]:
        with self._lock:
            entry = self._objects.get(key)
        if entry is None:
            raise ObjectNotFound(f"object {key!r} not found")
        return entry[0], entry[1]

    def head(self, key: str) -> ObjectInfo:
        with self._lock:
            entry = self._objects.get(key)
        if entry is None:
            raise ObjectNotFound(f"object {key!r} not found")
        return ObjectInfo(key=key, etag=entry[1], size=len(entry[0]), last_modified=entry[2])

    def put(self, key: str, data: bytes) -> str:
        etag = content_etag(data)
        with self._lock:
            self._objects[key] = (bytes(data), etag, datetime.now(UTC))
        return etag

    def put_if_match(self, key: str, data: bytes, etag: str | None) -> str:
        new_etag = content_etag(data)
        with self._lock:
            current = self._objects.get(key)
            if etag is None and current is not None:
                raise PreconditionFailed(f"object {key!r} already exists")
            if etag is not None and (current is None or current[1] != etag):
                raise PreconditionFailed(f"object {key!r} changed (etag mismatch)")
            self._objects[key] = (bytes(data), new_etag, datetime.now(UTC))
        return new_etag

    def delete(self, key: str, if_match: str | None = None) -> None:
        with self._lock:
            current = self._objects.get(key)
            if if_match is not None:
                if current is None:
                    raise ObjectNotFound(f"object {key!r} not found")
                if current[1] != if_match:
                    raise PreconditionFailed(f"object {key!r} changed (etag mismatch)")
            self._objects.pop(key, None)

    def list(self, prefix: str = "") -> list[str]:
        with self._lock:
            return sorted(k for k in self._objects if k.startswith(prefix))

    def exists(self, key: str) -> bool:
        with self._lock:
            return key in self._objects
