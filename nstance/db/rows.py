"""Plain rows for the repository's plain-SQL paths, and the time text those paths read and write.

The ORM builds an identity-mapped, attribute-instrumented object for every row it loads; for the
reconciler's and the garbage collector's listings that cost several times the query itself. The
hot read paths therefore return ``InstanceRow``: an immutable tuple with the attributes of
``models.Instance`` (same names, same Python types: aware UTC datetimes, ``bool`` for ``on_demand``,
the parsed JSON for ``health``). ``health`` is parsed when read, from ``health_json``: most readers
never look at it. ``PublicKeyRow`` and ``LbRow`` do the same for their tables; ``Reader`` is how each
is read (select list and per-row conversion, checked against the table at import).

``UTCDateTime`` stores naive UTC in SQLite's text form (``2026-01-01 12:00:00.000000``);
``sqlite_time`` and ``from_sqlite_time`` are that conversion for statements SQLAlchemy does not bind.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Final, Generic, NamedTuple, TypeVar

from sqlalchemy import Boolean, Table

from nstance.db.models import Instance, LbInstance, PublicKey
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
    def vm_unproven(self) -> bool:
        """No provider id and no registered agent: nothing shows its create reached the cloud.

        Only such a row may be taken for a create cut off before the provider call. A row whose agent
        registered has a VM even when its provider id never reached the record (a failed follow-up,
        then a cache rebuilt from the record): a later listing adopts it.
        """
        return self.provider_id is None and self.registered_at is None

    @property
    def health(self) -> dict[str, Any] | None:
        """The last health report's JSON document (parsed on each read), or None."""
        if self.health_json is None:
            return None
        document: dict[str, Any] | None = json.loads(self.health_json)
        return document


class PublicKeyRow(NamedTuple):
    """One ``public_keys`` row, read with plain SQL (the attributes of ``models.PublicKey``)."""

    id: int
    instance_id: str
    filename: str
    public_key_pem: str
    certificate_name: str | None
    certificate_serial: str | None
    certificate_issued_at: datetime | None
    submitted_at: datetime
    created_at: datetime
    updated_at: datetime


class SyncRow(NamedTuple):
    """The columns of an ``instances`` row that the provider sync compares with a listed VM.

    Read by ``repo.sync_rows`` without the other columns' conversions (times, health JSON): the sync
    reads every row of the shard, 100,000 of them, once per term and per GC pass.
    """

    tenant: str
    group_key: str
    provider_id: str | None
    provider_status: str | None
    deleted: bool
    record_state: str


class LbRow(NamedTuple):
    """One ``lb_instances`` row, read with plain SQL (the attributes of ``models.LbInstance``)."""

    lb_key: str
    instance_id: str
    status: str
    updated_at: datetime


R = TypeVar("R", bound=tuple[Any, ...])


class Reader(Generic[R]):
    """How to read one row type with plain SQL: its select list and its per-row conversion."""

    def __init__(self, row_type: Callable[..., R], table: Table, renamed: Mapping[str, str] = {}) -> None:
        fields: tuple[str, ...] = row_type._fields  # type: ignore[attr-defined]  # a NamedTuple
        self._make: Callable[[Iterable[Any]], R] = row_type._make  # type: ignore[attr-defined]
        columns = [renamed.get(field, field) for field in fields]
        missing = set(columns) - {column.name for column in table.columns}
        if missing:
            raise TypeError(f"{row_type.__name__}: no column(s) {sorted(missing)} in {table.name}")
        self.columns = ", ".join(columns)
        types = {column.name: column.type for column in table.columns}
        self._convert = tuple(
            (i, from_sqlite_time if isinstance(types[name], UTCDateTime) else bool)
            for i, name in enumerate(columns)
            if isinstance(types[name], UTCDateTime | Boolean)
        )

    def row(self, values: Sequence[Any]) -> R:
        """The row of one result tuple selected with ``columns``."""
        out = list(values)
        for i, convert in self._convert:
            value = out[i]
            if value is not None:
                out[i] = convert(value)
        return self._make(out)


INSTANCES: Final = Reader(InstanceRow, Instance.__table__, {"health_json": "health"})  # type: ignore[arg-type]
PUBLIC_KEYS: Final = Reader(PublicKeyRow, PublicKey.__table__)  # type: ignore[arg-type]
LB_INSTANCES: Final = Reader(LbRow, LbInstance.__table__)  # type: ignore[arg-type]
