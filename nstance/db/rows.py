"""Plain rows for the repository's plain-SQL paths, and the time text those paths read and write.

The ORM builds an identity-mapped, attribute-instrumented object for every row it loads; for the
reconciler's and the garbage collector's listings that cost about ten times the query itself. The
hot read paths therefore return ``InstanceRow``: an immutable tuple with the attributes of
``models.Instance`` (same names, same Python types: aware UTC datetimes, ``bool`` for ``on_demand``,
the parsed JSON for ``health``). ``health`` is parsed when read, from ``health_json``: most readers
never look at it.

``UTCDateTime`` stores naive UTC in SQLite's text form (``2026-01-01 12:00:00.000000``);
``sqlite_time`` and ``from_sqlite_time`` are that conversion for statements SQLAlchemy does not bind.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, Final, NamedTuple

from nstance.db.models import Instance
from nstance.db.types import UTCDateTime


def sqlite_time(value: datetime | None) -> str | None:
    """An aware datetime as the text ``UTCDateTime`` stores (naive UTC, microseconds), for plain SQL."""
    if value is None:
        return None
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"naive datetime {value.isoformat()} refused: pass a timezone-aware datetime")
    return value.astimezone(UTC).replace(tzinfo=None).isoformat(sep=" ", timespec="microseconds")


def from_sqlite_time(value: str | None) -> datetime | None:
    """A stored ``UTCDateTime`` text as an aware UTC datetime (None stays None)."""
    if value is None:
        return None
    parsed = datetime.fromisoformat(value)
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)


class InstanceRow(NamedTuple):
    """One ``instances`` row, read with plain SQL (the attributes of ``models.Instance``)."""

    id: str
    tenant: str
    group_key: str
    kind: str
    template: str | None
    on_demand: bool
    record_state: str
    idempotency_token: str | None
    subnet_id: str | None
    instance_type: str | None
    provider_id: str | None
    provider_status: str | None
    provider_at: datetime | None
    hostname: str | None
    fqdn: str | None
    ip4: str | None
    ip6: str | None
    nonce: str
    issued_at: datetime | None
    instance_pub: str | None
    registered_at: datetime | None
    cert_serial: str | None
    cert_expires_at: datetime | None
    certificates_at: datetime | None
    health_at: datetime | None
    health_json: str | None  # the stored JSON text; ``health`` parses it
    infra_config_hash: str | None
    runtime_config_hash: str | None
    drain_reason: str | None
    drain_started_at: datetime | None
    drain_acked_at: datetime | None
    delete_at: datetime | None
    created_at: datetime
    updated_at: datetime
    deleted_at: datetime | None

    @property
    def health(self) -> dict[str, Any] | None:
        """The last health report's JSON document (parsed on each read), or None."""
        if self.health_json is None:
            return None
        document: dict[str, Any] | None = json.loads(self.health_json)
        return document


def _column(field: str) -> str:
    return "health" if field == "health_json" else field


#: The select list that ``instance_row`` reads, in ``InstanceRow`` field order.
INSTANCE_COLUMNS: Final = ", ".join(_column(field) for field in InstanceRow._fields)

_TIME_COLUMNS: Final = frozenset(
    column.name for column in Instance.__table__.columns if isinstance(column.type, UTCDateTime)
)
#: (field index, converter) for every field whose stored form is not its Python value.
_CONVERT: Final[tuple[tuple[int, Callable[[Any], Any]], ...]] = tuple(
    (i, from_sqlite_time if field in _TIME_COLUMNS else bool)
    for i, field in enumerate(InstanceRow._fields)
    if field in _TIME_COLUMNS or field == "on_demand"
)


def instance_row(values: Sequence[Any]) -> InstanceRow:
    """The ``InstanceRow`` of one result tuple selected with ``INSTANCE_COLUMNS``."""
    out = list(values)
    for i, convert in _CONVERT:
        value = out[i]
        if value is not None:
            out[i] = convert(value)
    return InstanceRow._make(out)
