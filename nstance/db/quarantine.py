"""Telling a corrupt SQLite cache from other database errors, and moving a corrupt file aside.

The cache can always be rebuilt from object storage, so a corrupt file is never repaired in place:
it is renamed (with its ``-wal`` and ``-shm`` companions) to ``nstance.db.corrupt-<UTC time>`` next to
it - kept for a person to look at, never deleted silently - and a fresh file takes its place.
Corruption is SQLite's ``SQLITE_CORRUPT`` or ``SQLITE_NOTADB`` result (also when wrapped by
SQLAlchemy), or a ``quick_check`` that does not answer "ok"; "database is locked" and other
operational errors are not corruption. A session that hits corruption raises ``CacheCorrupt`` (an
``Unavailable``: callers retry, RPC clients get UNAVAILABLE rather than INTERNAL).
"""

from __future__ import annotations

import logging
import sqlite3
from datetime import UTC, datetime
from pathlib import Path

from nstance.core.errors import Unavailable

log = logging.getLogger(__name__)

_SQLITE_CORRUPT = 11
_SQLITE_NOTADB = 26
_COMPANIONS = ("", "-wal", "-shm", "-journal")


class CacheCorrupt(Unavailable):
    """A cache read or write failed because the file is damaged: retry once it has been rebuilt."""


def is_corruption(exc: BaseException) -> bool:
    """Whether ``exc`` (or the DB-API error it wraps) says the database file is damaged."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, sqlite3.DatabaseError):
            code = getattr(current, "sqlite_errorcode", None)
            if isinstance(code, int):  # the result code decides ("malformed JSON" is not corruption)
                return code & 0xFF in (_SQLITE_CORRUPT, _SQLITE_NOTADB)
            text = str(current).lower()
            if "disk image is malformed" in text or "not a database" in text:
                return True
        current = getattr(current, "orig", None) or current.__cause__
    return False


def check_file(path: Path) -> str | None:
    """None when ``path`` is absent or passes ``PRAGMA quick_check``; else what is wrong with it."""
    if not path.exists():
        return None
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5.0)
    except sqlite3.Error as exc:
        return str(exc) if is_corruption(exc) else None
    try:
        rows = conn.execute("PRAGMA quick_check").fetchall()
    except sqlite3.DatabaseError as exc:
        if is_corruption(exc):
            return str(exc)
        raise
    finally:
        conn.close()
    answers = [str(row[0]) for row in rows]
    return None if answers == ["ok"] else "; ".join(answers[:3])


def move_aside(path: Path, now: datetime | None = None) -> Path:
    """Rename the cache file and its companions to ``<name>.corrupt-<time>``; the new main file's path."""
    stamp = (now or datetime.now(UTC)).astimezone(UTC).strftime("%Y%m%dT%H%M%S%fZ")
    target = path.with_name(f"{path.name}.corrupt-{stamp}")
    for suffix in _COMPANIONS:
        source = path.with_name(path.name + suffix)
        if source.exists():
            source.rename(path.with_name(target.name + suffix))
    return target
