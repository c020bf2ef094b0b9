"""A prefixed view of another ObjectStore: the ``shard/{shard}/`` and ``cluster/`` scopes.

``ScopedObjectStore(inner, "shard/a/")`` maps key ``leader.json`` to ``shard/a/leader.json`` in the inner
store, strips the prefix again from listings and metadata, and passes conditional semantics and errors
through unchanged. It must not add behaviour of its own (no caching, no retries): every call is one
call on the inner store.
"""

from __future__ import annotations

import builtins
import dataclasses

from nstance.core.errors import InvalidArgument
from nstance.objectstore.base import ObjectInfo, ObjectStore
from nstance.objectstore.file import validate_key


def normalize_prefix(prefix: str) -> str:
    """Return ``prefix`` ending in ``/`` (``""`` stays ``""``); raise InvalidArgument if unportable."""
    if not prefix:
        return ""
    if not prefix.endswith("/"):
        prefix += "/"
    try:
        validate_key(prefix[:-1])
    except InvalidArgument as exc:
        raise InvalidArgument(f"invalid storage prefix {prefix!r}: {exc}") from None
    return prefix


class ScopedObjectStore:
    """Every key of ``inner`` under ``prefix``, seen without the prefix."""

    def __init__(self, inner: ObjectStore, prefix: str) -> None:
        """``prefix`` gets a trailing ``/`` if it lacks one (``"cluster"`` -> ``"cluster/"``)."""
        self._inner = inner
        self._prefix = normalize_prefix(prefix)

    @property
    def inner(self) -> ObjectStore:
        """The store this view writes to."""
        return self._inner

    @property
    def prefix(self) -> str:
        """The prefix added to every key (ends with ``/`` unless empty)."""
        return self._prefix

    def close(self) -> None:
        """Close the inner store if it has anything to close."""
        close = getattr(self._inner, "close", None)
        if callable(close):
            close()

    def __repr__(self) -> str:
        return f"ScopedObjectStore({self._inner!r}, {self._prefix!r})"

    def get(self, key: str) -> tuple[bytes, str]:
        return self._inner.get(self._full(key))

    def head(self, key: str) -> ObjectInfo:
        return dataclasses.replace(self._inner.head(self._full(key)), key=key)

    def put(self, key: str, data: bytes) -> str:
        return self._inner.put(self._full(key), data)

    def put_if_match(self, key: str, data: bytes, etag: str | None) -> str:
        return self._inner.put_if_match(self._full(key), data, etag)

    def delete(self, key: str, if_match: str | None = None) -> None:
        self._inner.delete(self._full(key), if_match)

    def list(self, prefix: str = "") -> builtins.list[str]:
        strip = len(self._prefix)
        return [key[strip:] for key in self._inner.list(self._prefix + prefix)]

    def exists(self, key: str) -> bool:
        return self._inner.exists(self._full(key))

    def _full(self, key: str) -> str:
        return self._prefix + validate_key(key)
