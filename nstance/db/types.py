"""Column types the SQLite cache needs beyond SQLAlchemy's built-ins.

SQLite has no time zone support, so ``UTCDateTime`` stores every timestamp as naive UTC in SQLite's
fixed-width ``DATETIME`` text form (``2026-01-01 12:00:00.000000``; it sorts and compares correctly as
text) and hands back timezone-aware UTC datetimes. Naive datetimes are refused on the way in: a
wall-clock time without a zone is a bug waiting to happen, and the clock we use is always aware.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import DateTime
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator


class UTCDateTime(TypeDecorator[datetime]):
    """A timezone-aware UTC ``datetime`` stored as naive UTC ``DATETIME``."""

    impl = DateTime(timezone=False)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if not isinstance(value, datetime):
            raise TypeError(f"expected a datetime, got {type(value).__name__}")
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError(f"naive datetime {value.isoformat()} refused: pass a timezone-aware datetime")
        return value.astimezone(UTC).replace(tzinfo=None)

    def process_result_value(self, value: Any | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if not isinstance(value, datetime):
            raise TypeError(f"unexpected stored timestamp {value!r}")
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)
