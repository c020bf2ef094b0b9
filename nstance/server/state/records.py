"""Instance records in object storage: ``instance/{tenant}.{storage-key}.json`` in the shard scope.

The record is the durable account of one VM (the SQLite cache is rebuilt from these after a restart or
a leadership change). Its JSON uses upstream's field names and shapes, so records written by the Go
server read here and ours read there: strings are ``""`` when unset, timestamps are RFC 3339 in UTC
(``2026-01-01T00:00:00Z``), and the registration fields (``registered_at``, ``public_key_pem``,
``cert_serial``, ``cert_expires_at``) are left out until set, as upstream's ``omitempty`` does. On
reading, ``null`` is accepted for every optional field and fields we do not know are kept in
``InstanceRecord.extra`` and written back unchanged.

Functions here are synchronous (the server runs them with ``asyncio.to_thread``) and take the
shard-scoped ObjectStore. This module must not touch SQLite, providers or the clock: callers supply
every timestamp, and it must not decide anything about an instance's lifecycle (it only stores what
it is told).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Self

from nstance.config.merge import MergedGroupConfig
from nstance.core.errors import AlreadyExists, InvalidArgument, NotFound, Unavailable
from nstance.core.ids import parse_storage_key, storage_key_of, validate_identifier
from nstance.core.wrapping import innermost
from nstance.objectstore.base import ObjectNotFound, ObjectStore, PreconditionFailed

RECORD_PREFIX = "instance/"
"""Where instance records live inside the shard scope."""

_SUFFIX = ".json"

GO_ZERO_TIME = datetime(1, 1, 1, tzinfo=UTC)
"""Go's zero ``time.Time``: what an upstream record holds for a timestamp that was never set."""

UPDATE_ATTEMPTS = 5
"""How many compare-and-swap rounds ``update_record`` tries before giving up."""

LIST_WORKERS = 8
"""Parallel reads ``list_records`` and the cache rebuild make (object-storage latency dominates a
rebuild), at most: a store may ask for fewer (``reader_threads``). Read at each call, so the
deterministic simulator can set it to 1 (no threads)."""

READ_CHUNK = 64
"""Records one reader-pool task reads in sequence. A task per record meant a future, a work item and a
condition with its lock per record: at 2,000 records a batch that was some 10,000 short-lived objects
for the garbage collector's young generation (its collections then stalled the event loop), and a
hand-over between threads per record."""


@dataclass(frozen=True, slots=True)
class InstanceRecord:
    """One instance record. Build a changed copy with ``dataclasses.replace`` or ``update_record``.

    ``config`` is the merged group config the instance was made from (see ``config_document``);
    ``extra`` holds JSON fields this version does not know, written back as they were read.
    """

    instance_id: str
    tenant: str
    group: str
    created_at: datetime
    last_updated: datetime
    status: str = "pending"
    on_demand: bool = False
    subnet_id: str = ""
    provider_instance_id: str = ""
    instance_type: str = ""
    private_ipv4: str = ""
    private_ipv6: str = ""
    hostname: str = ""
    registration_jwt: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    infra_config_hash: str = ""
    registered_at: datetime | None = None
    public_key_pem: str = ""
    cert_serial: str = ""
    cert_expires_at: datetime | None = None
    extra: dict[str, Any] = field(default_factory=dict)


_FIELDS = frozenset(f.name for f in dataclasses.fields(InstanceRecord)) - {"extra"}
_STRINGS = (
    "subnet_id",
    "provider_instance_id",
    "instance_type",
    "status",
    "private_ipv4",
    "private_ipv6",
    "hostname",
    "registration_jwt",
    "infra_config_hash",
    "public_key_pem",
    "cert_serial",
)
_IDENTITY = ("instance_id", "tenant")


def record_key(tenant: str, instance_id: str) -> str:
    """``instance/{tenant}.{uuid}-{kind}.json``; InvalidArgument for a bad tenant or instance id."""
    validate_identifier(tenant, "tenant")
    return f"{RECORD_PREFIX}{tenant}.{storage_key_of(instance_id)}{_SUFFIX}"


def parse_record_key(key: str) -> tuple[str, str]:
    """Inverse of ``record_key``: ``(tenant, instance_id)``; InvalidArgument if ``key`` is not one."""
    if not key.startswith(RECORD_PREFIX) or not key.endswith(_SUFFIX):
        raise InvalidArgument(
            f"{key!r} is not an instance record key (instance/{{tenant}}.{{uuid}}-{{kind}}.json)"
        )
    tenant, dot, storage_key = key[len(RECORD_PREFIX) : -len(_SUFFIX)].partition(".")
    if not dot:
        raise InvalidArgument(f"{key!r} is not an instance record key: no '.' between tenant and id")
    validate_identifier(tenant, f"tenant in record key {key!r}")
    return tenant, str(parse_storage_key(storage_key))


def format_time(value: datetime) -> str:
    """RFC 3339 in UTC with a ``Z`` (microseconds only when non-zero), as Go's encoder writes it."""
    if value.tzinfo is None:
        raise InvalidArgument(f"timestamp {value!r} has no time zone; record times must be aware UTC")
    text = value.astimezone(UTC).isoformat()
    return text.removesuffix("+00:00") + "Z"


def config_document(merged: MergedGroupConfig) -> dict[str, Any]:
    """The merged group config as the JSON object stored in a record's ``config`` field."""
    return {
        "tenant": merged.tenant,
        "group": merged.group,
        "template": merged.template,
        "kind": merged.kind,
        "arch": merged.arch,
        "size": merged.size,
        "instance_type": merged.instance_type,
        "subnet_pool": merged.subnet_pool,
        "vars": dict(merged.vars),
        "args": json.loads(json.dumps(merged.args)),
        "userdata": merged.userdata.model_dump(mode="json") if merged.userdata else None,
        "files": {name: f.model_dump(mode="json", exclude_defaults=True) for name, f in merged.files.items()},
        "drain_timeout": merged.drain_timeout.total_seconds(),
        "load_balancers": list(merged.load_balancers),
        "is_static": merged.is_static,
    }


def config_as_run(merged: MergedGroupConfig | None, *, template: str, instance_type: str) -> dict[str, Any]:
    """``config_document(merged)`` ({} without a group) with the template and instance type an instance
    is known to run, when known: they win over the group's config now, which may have changed since the
    instance was made. Drift of an instance without an infra hash is judged by these two
    (``plan.visibly_differs``), so a record rebuilt from tags or from a cache row must keep them."""
    config = config_document(merged) if merged is not None else {}
    known = (("template", template), ("instance_type", instance_type))
    config.update({name: value for name, value in known if value})
    return config


def _document(r: InstanceRecord) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "instance_id": r.instance_id,
        "tenant": r.tenant,
        "group": r.group,
        "on_demand": r.on_demand,
        "subnet_id": r.subnet_id,
        "provider_instance_id": r.provider_instance_id,
        "instance_type": r.instance_type,
        "status": r.status,
        "private_ipv4": r.private_ipv4,
        "private_ipv6": r.private_ipv6,
        "hostname": r.hostname,
        "created_at": format_time(r.created_at),
        "last_updated": format_time(r.last_updated),
        "registration_jwt": r.registration_jwt,
        "config": r.config,
        "tags": r.tags,
        "infra_config_hash": r.infra_config_hash,
    }
    # Upstream marks these omitempty: absent until the instance registers.
    if r.registered_at is not None:
        doc["registered_at"] = format_time(r.registered_at)
    if r.public_key_pem:
        doc["public_key_pem"] = r.public_key_pem
    if r.cert_serial:
        doc["cert_serial"] = r.cert_serial
    if r.cert_expires_at is not None:
        doc["cert_expires_at"] = format_time(r.cert_expires_at)
    for name, value in r.extra.items():
        doc.setdefault(name, value)
    return doc


def encode_record(r: InstanceRecord) -> bytes:
    """The record as compact UTF-8 JSON, as upstream writes it (upstream field names, known fields first).

    Compact, not indented: the standard library encodes without indentation in C, and every create,
    registration and status change rewrites a record (an indented one took several times as long).
    """
    return json.dumps(_document(r), ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _parse_time(raw: object, name: str) -> datetime:
    if not isinstance(raw, str):
        raise ValueError(f'field "{name}" must be an RFC 3339 timestamp string, got {type(raw).__name__}')
    try:
        value = datetime.fromisoformat(raw)
    except ValueError:
        raise ValueError(f'field "{name}": {raw!r} is not an RFC 3339 timestamp') from None
    if value.tzinfo is None:
        raise ValueError(f'field "{name}": {raw!r} has no time zone offset (RFC 3339 requires one)')
    return value.astimezone(UTC)


def _fields_from(doc: dict[str, Any]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name in ("instance_id", "tenant", "group"):
        raw = doc.get(name)
        if not isinstance(raw, str) or not raw:
            raise ValueError(f'field "{name}" must be a non-empty string')
        values[name] = raw
    for name in _STRINGS:
        raw = doc.get(name)
        if raw is not None and not isinstance(raw, str):
            raise ValueError(f'field "{name}" must be a string, got {type(raw).__name__}')
        if raw is not None:
            values[name] = raw
    on_demand = doc.get("on_demand")
    if on_demand is not None and not isinstance(on_demand, bool):
        raise ValueError(f'field "on_demand" must be true or false, got {on_demand!r}')
    values["on_demand"] = bool(on_demand)
    for name in ("created_at", "last_updated"):
        raw = doc.get(name)
        values[name] = GO_ZERO_TIME if raw is None else _parse_time(raw, name)
    for name in ("registered_at", "cert_expires_at"):
        raw = doc.get(name)
        values[name] = None if raw is None else _parse_time(raw, name)
    config = doc.get("config")
    if config is not None and not isinstance(config, dict):
        raise ValueError(f'field "config" must be an object, got {type(config).__name__}')
    values["config"] = config or {}
    tags = doc.get("tags")
    if tags is not None and (
        not isinstance(tags, dict) or not all(isinstance(v, str) for v in tags.values())
    ):
        raise ValueError('field "tags" must be an object of strings')
    values["tags"] = tags or {}
    values["extra"] = {k: v for k, v in doc.items() if k not in _FIELDS}
    return values


def decode_record(data: bytes, key: str) -> InstanceRecord:
    """Parse a stored record; InvalidArgument naming ``key`` and the problem if it is corrupt."""
    try:
        doc = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise InvalidArgument(f"instance record {key}: not UTF-8 text (byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise InvalidArgument(f"instance record {key}: not valid JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise InvalidArgument(f"instance record {key}: must be a JSON object, got {type(doc).__name__}")
    try:
        return InstanceRecord(**_fields_from(doc))
    except ValueError as exc:
        raise InvalidArgument(f"instance record {key}: {exc}") from None


def write_record(store: ObjectStore, r: InstanceRecord, *, create_only: bool = False) -> str:
    """Store ``r`` at its key and return the new ETag.

    With ``create_only`` the write happens only if no record exists yet (AlreadyExists otherwise), so a
    client-supplied instance id can never overwrite another instance's record.
    """
    key = record_key(r.tenant, r.instance_id)
    data = encode_record(r)
    if not create_only:
        return store.put(key, data)
    try:
        return store.put_if_match(key, data, None)
    except PreconditionFailed:
        raise AlreadyExists(
            f'instance {r.instance_id} of tenant "{r.tenant}" already has a record ({key})'
        ) from None


def write_record_if_match(store: ObjectStore, r: InstanceRecord, etag: str) -> str:
    """Replace the record only if it still has ``etag`` (PreconditionFailed otherwise); the new ETag."""
    return store.put_if_match(record_key(r.tenant, r.instance_id), encode_record(r), etag)


def read_record(store: ObjectStore, tenant: str, instance_id: str) -> tuple[InstanceRecord, str] | None:
    """``(record, etag)``, or None if there is no record; InvalidArgument if it is corrupt."""
    key = record_key(tenant, instance_id)
    try:
        data, etag = store.get(key)
    except ObjectNotFound:
        return None
    return decode_record(data, key), etag


def delete_record(store: ObjectStore, tenant: str, instance_id: str) -> None:
    """Remove the record; a record that is already gone is not an error."""
    store.delete(record_key(tenant, instance_id))


class RecordProblem(str):
    """One unreadable object under ``instance/``: the sentence to report (it *is* that str), plus what
    can still be recovered from it so it keeps claiming its VM (see ``claims``).

    ``tenant``/``instance_id`` are those its key names ("" when the key names no instance); ``raw`` is
    the stored bytes (empty when there were none), searched for the ids of a VM it might describe.
    """

    key: str
    tenant: str
    instance_id: str
    raw: bytes

    def __new__(
        cls, message: str, *, key: str, tenant: str = "", instance_id: str = "", raw: bytes = b""
    ) -> Self:
        problem = super().__new__(cls, message)
        problem.key = key
        problem.tenant = tenant
        problem.instance_id = instance_id
        problem.raw = raw
        return problem


def _load_one(store: ObjectStore, key: str) -> InstanceRecord | RecordProblem | None:
    """The record at ``key``, the problem with it, or None if it vanished since the listing."""
    try:
        tenant, instance_id = parse_record_key(key)
    except InvalidArgument as exc:
        tenant = instance_id = ""
        key_problem: str | None = str(exc)
    else:
        key_problem = None
    try:
        data, _ = store.get(key)
    except ObjectNotFound:
        return None
    if key_problem is not None:
        return RecordProblem(f"skipped {key}: {key_problem}", key=key, raw=data)
    try:
        record = decode_record(data, key)
    except InvalidArgument as exc:
        return RecordProblem(
            f"skipped {key}: {exc}", key=key, tenant=tenant, instance_id=instance_id, raw=data
        )
    if (record.tenant, record.instance_id) != (tenant, instance_id):
        return RecordProblem(
            f'skipped {key}: it holds instance {record.instance_id} of tenant "{record.tenant}" '
            f'but its key names instance {instance_id} of tenant "{tenant}"',
            key=key,
            tenant=tenant,
            instance_id=instance_id,
            raw=data,
        )
    return record


def _load_many(store: ObjectStore, keys: list[str]) -> list[InstanceRecord | RecordProblem | None]:
    """``_load_one`` for each key, in order (one pool task)."""
    return [_load_one(store, key) for key in keys]


def list_record_keys(store: ObjectStore) -> list[str]:
    """The keys of every instance record, in key order (one listing, no reads)."""
    return [key for key in store.list(RECORD_PREFIX) if key.endswith(_SUFFIX)]


def is_local(store: ObjectStore) -> bool:
    """Whether ``store`` under its wrappers says its calls wait on no network (a ``local`` attribute:
    files on this host, memory), so that many small writes are cheaper made one after another in one
    thread than each in a thread of its own."""
    return bool(getattr(innermost(store), "local", False))


def reader_threads(store: ObjectStore) -> int:
    """Reader threads worth running against ``store``: ``LIST_WORKERS``, or fewer if the store under
    its wrappers says so with a ``reader_threads`` attribute."""
    wanted = getattr(innermost(store), "reader_threads", LIST_WORKERS)
    return max(1, min(int(wanted), LIST_WORKERS))


@contextlib.contextmanager
def reader_pool(store: ObjectStore, keys: int, *, workers: int | None = None) -> Iterator[Executor | None]:
    """Threads for ``read_records`` from ``store`` (``reader_threads`` of it unless ``workers`` is
    given; None - read in the caller's thread - for one worker or key)."""
    workers = reader_threads(store) if workers is None else workers
    if workers <= 1 or keys <= 1:
        yield None
        return
    pool = ThreadPoolExecutor(max_workers=min(workers, keys), thread_name_prefix="nstance-records")
    try:
        yield pool
    finally:
        # Not waiting: a rebuild cancelled mid-batch (leadership lost) must not hold its caller.
        pool.shutdown(wait=False, cancel_futures=True)


def read_records(
    store: ObjectStore, keys: list[str], *, pool: Executor | None = None
) -> tuple[list[InstanceRecord], list[RecordProblem]]:
    """The records at ``keys`` (in that order) and one problem per bad object; see ``list_records``."""
    if pool is None:
        results = _load_many(store, keys)
    else:
        chunks = [keys[i : i + READ_CHUNK] for i in range(0, len(keys), READ_CHUNK)]
        loaded = pool.map(functools.partial(_load_many, store), chunks)
        results = [result for chunk in loaded for result in chunk]
    found: list[InstanceRecord] = []
    problems: list[RecordProblem] = []
    for result in results:
        if isinstance(result, InstanceRecord):
            found.append(result)
        elif isinstance(result, RecordProblem):
            problems.append(result)
    return found, problems


def list_records(
    store: ObjectStore, *, workers: int | None = None
) -> tuple[list[InstanceRecord], list[RecordProblem]]:
    """Every readable record (in key order, i.e. creation order per tenant) and one problem per bad object.

    A corrupt or misnamed object is reported in the problem list (which keeps what identity it still
    gives: an unreadable record must go on claiming its VM); a record deleted while listing is
    silently left out. Storage errors (Unavailable) propagate: a partial list must not be mistaken for
    the whole fleet. (The cache rebuild uses the same pieces - ``list_record_keys``, ``reader_pool``,
    ``read_records`` - in bounded batches.)
    """
    keys = list_record_keys(store)
    with reader_pool(store, len(keys), workers=workers) as pool:
        return read_records(store, keys, pool=pool)


def update_record(
    store: ObjectStore, tenant: str, instance_id: str, /, *, attempts: int = UPDATE_ATTEMPTS, **changes: Any
) -> InstanceRecord:
    """Read, apply ``changes`` (field=value), write back with If-Match; retry when someone else wrote first.

    Returns the record as written. NotFound if there is no record; InvalidArgument for an unknown field
    or an attempt to change ``instance_id``/``tenant`` (they determine the key); Unavailable if the
    record kept changing for ``attempts`` rounds. ``last_updated`` is changed only if passed.
    """
    unknown = sorted(set(changes) - _FIELDS - {"extra"})
    if unknown:
        raise InvalidArgument(f"unknown instance record field(s): {', '.join(unknown)}")
    fixed = [name for name in _IDENTITY if name in changes]
    if fixed:
        raise InvalidArgument(
            f"instance record field(s) {', '.join(fixed)} cannot change (they name the record)"
        )
    return modify_record(
        store, tenant, instance_id, lambda current: dataclasses.replace(current, **changes), attempts=attempts
    )


def modify_record(
    store: ObjectStore,
    tenant: str,
    instance_id: str,
    change: Callable[[InstanceRecord], InstanceRecord],
    *,
    attempts: int = UPDATE_ATTEMPTS,
) -> InstanceRecord:
    """Read the record, apply ``change`` to it, write it back with If-Match; retry when someone wrote first.

    ``change`` sees the current record each round, so it can decide from what is there (for example,
    set a status only if the record still has the one it expects). NotFound if there is no record;
    Unavailable if the record kept changing for ``attempts`` rounds.
    """
    key = record_key(tenant, instance_id)
    for _ in range(max(1, attempts)):
        found = read_record(store, tenant, instance_id)
        if found is None:
            raise NotFound(f'instance {instance_id} of tenant "{tenant}" has no record ({key})')
        current, etag = found
        updated = change(current)
        try:
            store.put_if_match(key, encode_record(updated), etag)
        except PreconditionFailed:
            continue
        return updated
    raise Unavailable(f"instance record {key} kept changing during {attempts} update attempts; retry")


RecordChange = tuple[str, str, Callable[[InstanceRecord], InstanceRecord]]
"""What ``modify_records`` applies: tenant, instance id and the change, as ``modify_record`` takes them."""


def modify_records(store: ObjectStore, changes: Sequence[RecordChange]) -> list[InstanceRecord | Exception]:
    """``modify_record`` for each change, one after another in this thread; in each change's place the
    record as written or the exception that change raised, so one failed record fails no other."""
    results: list[InstanceRecord | Exception] = []
    for tenant, instance_id, change in changes:
        try:
            results.append(modify_record(store, tenant, instance_id, change))
        except Exception as exc:  # noqa: BLE001 - handed to the caller that asked for this change
            results.append(exc)
    return results
