"""Instance records: upstream-compatible JSON, record keys, tolerant listing and compare-and-swap updates."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from nstance.core.errors import AlreadyExists, InvalidArgument, NotFound, Unavailable
from nstance.core.ids import new_puid
from nstance.objectstore.file import FileObjectStore
from nstance.objectstore.memory import MemoryObjectStore
from nstance.objectstore.s3 import S3ObjectStore
from nstance.objectstore.scoped import ScopedObjectStore
from nstance.server.state import records as records_module
from nstance.server.state.fencing import FencedStore
from nstance.server.state.records import (
    READ_CHUNK,
    InstanceRecord,
    decode_record,
    delete_record,
    encode_record,
    is_local,
    list_record_keys,
    list_records,
    parse_record_key,
    read_record,
    read_records,
    reader_pool,
    reader_threads,
    record_key,
    update_record,
    write_record,
)

KNOWN_ID = "knc06bgm7733st2576nx5jht4ecjw"  # upstream's example puid
KNOWN_KEY = "instance/default.01970a1c-e31e-7422-9cd5-e9651d11cc97-knc.json"
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)

UPSTREAM_KEYS = [
    "instance_id",
    "tenant",
    "group",
    "on_demand",
    "subnet_id",
    "provider_instance_id",
    "instance_type",
    "status",
    "private_ipv4",
    "private_ipv6",
    "hostname",
    "created_at",
    "last_updated",
    "registration_jwt",
    "config",
    "tags",
    "infra_config_hash",
]
REGISTRATION_KEYS = ["registered_at", "public_key_pem", "cert_serial", "cert_expires_at"]


def pending(instance_id: str = KNOWN_ID, tenant: str = "default", **changes: Any) -> InstanceRecord:
    record = InstanceRecord(
        instance_id=instance_id,
        tenant=tenant,
        group="main",
        created_at=T0,
        last_updated=T0,
        subnet_id="subnet-a",
        instance_type="m7g.large",
        registration_jwt="eyJhbGciOiJFZERTQSJ9.e30.sig",
        config={"template": "knc", "size": 3, "args": {"ImageId": "ami-1"}},
        tags={"nstance:group": "main"},
        infra_config_hash="sha256:abc",
    )
    return dataclasses.replace(record, **changes)


def test_record_key_uses_tenant_and_the_time_ordered_storage_key() -> None:
    assert record_key("default", KNOWN_ID) == KNOWN_KEY
    assert parse_record_key(KNOWN_KEY) == ("default", KNOWN_ID)


@pytest.mark.parametrize(
    ("tenant", "instance_id", "message"),
    [
        ("Default", KNOWN_ID, "tenant 'Default'"),
        ("a.b", KNOWN_ID, "tenant 'a.b'"),
        ("default", "knc-not-a-puid", "instance id 'knc-not-a-puid'"),
    ],
)
def test_record_key_refuses_names_that_would_corrupt_the_key(
    tenant: str, instance_id: str, message: str
) -> None:
    with pytest.raises(InvalidArgument, match=message):
        record_key(tenant, instance_id)


def test_pending_record_has_exactly_upstreams_fields_and_omits_unset_registration_fields() -> None:
    doc = json.loads(encode_record(pending()))
    assert list(doc) == UPSTREAM_KEYS
    assert doc["created_at"] == "2026-03-01T12:00:00Z"
    assert doc["status"] == "pending"
    assert doc["private_ipv4"] == ""  # Go strings are "" when unset, never null
    assert doc["config"]["args"] == {"ImageId": "ami-1"}


def test_registered_record_round_trips_with_all_fields() -> None:
    record = pending(
        status="running",
        provider_instance_id="i-0123",
        private_ipv4="10.0.0.5",
        hostname="ip-10-0-0-5",
        registered_at=T0 + timedelta(minutes=1, microseconds=250),
        public_key_pem="-----BEGIN PUBLIC KEY-----\n...\n-----END PUBLIC KEY-----\n",
        cert_serial="0a1b2c",
        cert_expires_at=T0 + timedelta(days=365),
    )
    data = encode_record(record)
    doc = json.loads(data)
    assert list(doc) == UPSTREAM_KEYS + REGISTRATION_KEYS
    assert doc["registered_at"] == "2026-03-01T12:01:00.000250Z"
    assert decode_record(data, KNOWN_KEY) == record


def test_reads_a_record_written_by_the_go_server_and_keeps_unknown_fields() -> None:
    go_written = {
        "instance_id": KNOWN_ID,
        "tenant": "default",
        "group": "main",
        "on_demand": True,
        "subnet_id": "subnet-a",
        "provider_instance_id": "",
        "instance_type": "m7g.large",
        "status": "pending",
        "private_ipv4": "",
        "private_ipv6": "",
        "hostname": "",
        "created_at": "2026-03-01T22:00:00.123456789+10:00",  # RFC3339Nano in a local zone
        "last_updated": "0001-01-01T00:00:00Z",  # Go's zero time
        "registration_jwt": "jwt",
        "config": None,
        "tags": None,
        "infra_config_hash": "sha256:abc",
        "lb_state": {"tg-1": "registered"},  # a field from a newer version
    }
    record = decode_record(json.dumps(go_written).encode(), KNOWN_KEY)
    assert record.on_demand is True
    assert record.created_at == datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=UTC)
    assert record.last_updated == datetime(1, 1, 1, tzinfo=UTC)
    assert record.config == {}
    assert record.tags == {}
    assert record.registered_at is None
    rewritten = json.loads(encode_record(record))
    assert rewritten["lb_state"] == {"tg-1": "registered"}
    assert rewritten["created_at"] == "2026-03-01T12:00:00.123456Z"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"{not json", "not valid JSON"),
        (b"\xff\xfe", "not UTF-8"),
        (b"[1, 2]", "must be a JSON object"),
        (b'{"tenant": "default", "group": "main"}', 'field "instance_id"'),
        (
            json.dumps({"instance_id": KNOWN_ID, "tenant": "default", "group": "g", "status": 5}).encode(),
            'field "status" must be a string',
        ),
        (
            json.dumps(
                {"instance_id": KNOWN_ID, "tenant": "default", "group": "g", "created_at": "yesterday"}
            ).encode(),
            'field "created_at"',
        ),
        (
            json.dumps(
                {
                    "instance_id": KNOWN_ID,
                    "tenant": "default",
                    "group": "g",
                    "created_at": "2026-03-01T12:00:00",
                }
            ).encode(),
            "no time zone",
        ),
    ],
)
def test_corrupt_record_error_names_the_key_and_the_problem(data: bytes, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message) as caught:
        decode_record(data, KNOWN_KEY)
    assert KNOWN_KEY in str(caught.value)


def test_naive_timestamps_are_refused_on_write() -> None:
    with pytest.raises(InvalidArgument, match="no time zone"):
        encode_record(pending(created_at=datetime(2026, 3, 1)))


def test_write_read_delete() -> None:
    store = MemoryObjectStore()
    record = pending()
    etag = write_record(store, record)
    assert store.exists(KNOWN_KEY)
    assert read_record(store, "default", KNOWN_ID) == (record, etag)
    delete_record(store, "default", KNOWN_ID)
    assert read_record(store, "default", KNOWN_ID) is None
    delete_record(store, "default", KNOWN_ID)  # already gone: fine


def test_create_only_never_overwrites_another_instances_record() -> None:
    store = MemoryObjectStore()
    write_record(store, pending(), create_only=True)
    with pytest.raises(AlreadyExists, match=KNOWN_ID):
        write_record(store, pending(group="intruder"), create_only=True)
    found = read_record(store, "default", KNOWN_ID)
    assert found is not None
    assert found[0].group == "main"


def test_list_records_skips_and_reports_bad_objects_without_failing() -> None:
    store = MemoryObjectStore()
    good_a = pending()
    good_b = pending(tenant="acme")
    write_record(store, good_a)
    write_record(store, good_b)
    other_key = record_key("default", "app06bgm7733st2576nx5jht4ecjw")
    store.put(other_key, b'{"instance_id": "half a rec')
    store.put("instance/README.txt", b"not a record")  # ignored: not a .json object
    store.put("instance/notes.json", b"{}")
    # A copy of a record under the wrong key must not be mistaken for the instance the key names.
    moved_key = record_key("default", "nat06bgm7733st2576nx5jht4ecjw")
    store.put(moved_key, encode_record(good_a))

    records, problems = list_records(store)

    assert {(r.tenant, r.instance_id) for r in records} == {("default", KNOWN_ID), ("acme", KNOWN_ID)}
    assert len(problems) == 3
    assert any(other_key in p and "not valid JSON" in p for p in problems)
    assert any("instance/notes.json" in p for p in problems)
    assert any(moved_key in p and "its key names" in p for p in problems)


def test_a_reader_pool_reads_in_chunks_and_keeps_key_order() -> None:
    store = MemoryObjectStore()
    ids = [str(new_puid("app")) for _ in range(3 * READ_CHUNK + 5)]
    for iid in ids:
        write_record(store, pending(instance_id=iid))
    bad_key = record_key("default", ids[READ_CHUNK + 1])
    store.put(bad_key, b"{not json")
    keys = list_record_keys(store)
    tasks: list[int] = []

    with reader_pool(store, len(keys), workers=4) as pool:
        assert pool is not None
        submit = pool.submit

        def counted(fn: Any, /, *args: Any, **kwargs: Any) -> Any:
            tasks.append(len(args[0]))
            return submit(fn, *args, **kwargs)

        pool.submit = counted  # type: ignore[method-assign]
        found, problems = read_records(store, keys, pool=pool)

    # One task per READ_CHUNK keys, not one per key; results come back in key order all the same.
    assert tasks == [READ_CHUNK, READ_CHUNK, READ_CHUNK, 5]
    assert [record_key(r.tenant, r.instance_id) for r in found] == [k for k in keys if k != bad_key]
    assert len(problems) == 1
    assert problems[0].key == bad_key


def test_reader_threads_follow_what_the_store_under_the_wrappers_asks_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    local = FencedStore(ScopedObjectStore(FileObjectStore(tmp_path), "shard/a"), fence=lambda: None)
    assert reader_threads(local) == FileObjectStore.reader_threads < records_module.LIST_WORKERS
    assert reader_threads(MemoryObjectStore()) == records_module.LIST_WORKERS
    monkeypatch.setattr(records_module, "LIST_WORKERS", 1)  # as the deterministic simulation does
    assert reader_threads(local) == 1


def test_local_stores_are_recognised_under_their_wrappers_and_remote_ones_are_not(tmp_path: Path) -> None:
    wrapped = FencedStore(ScopedObjectStore(FileObjectStore(tmp_path), "shard/a"), fence=lambda: None)
    assert is_local(wrapped)
    assert is_local(MemoryObjectStore())
    remote = S3ObjectStore.__new__(S3ObjectStore)  # not connected: only what the class declares is read
    assert not is_local(FencedStore(remote, fence=lambda: None))


class FlakyGets(MemoryObjectStore):
    """Storage that fails every read after listing works."""

    def get(self, key: str) -> tuple[bytes, str]:
        raise Unavailable("connection reset by peer")


def test_list_records_does_not_hide_a_storage_outage_as_an_empty_fleet() -> None:
    store = FlakyGets()
    store.put(KNOWN_KEY, encode_record(pending()))
    with pytest.raises(Unavailable):
        list_records(store)


def test_update_record_applies_and_persists_changes() -> None:
    store = MemoryObjectStore()
    write_record(store, pending())
    later = T0 + timedelta(seconds=30)
    updated = update_record(
        store, "default", KNOWN_ID, status="running", provider_instance_id="i-1", last_updated=later
    )
    assert (updated.status, updated.provider_instance_id, updated.last_updated) == ("running", "i-1", later)
    stored = read_record(store, "default", KNOWN_ID)
    assert stored is not None
    assert stored[0] == updated


def test_update_record_refuses_bad_requests() -> None:
    store = MemoryObjectStore()
    write_record(store, pending())
    with pytest.raises(InvalidArgument, match="statuss"):
        update_record(store, "default", KNOWN_ID, statuss="running")
    with pytest.raises(InvalidArgument, match="tenant"):
        update_record(store, "default", KNOWN_ID, tenant="acme")
    with pytest.raises(NotFound, match="acme"):
        update_record(store, "acme", KNOWN_ID, status="running")


class InterleavingStore(MemoryObjectStore):
    """Before each of the first ``races`` conditional writes, someone else updates the record."""

    def __init__(self, races: int) -> None:
        super().__init__()
        self.races = races

    def put_if_match(self, key: str, data: bytes, etag: str | None) -> str:
        if self.races > 0:
            self.races -= 1
            current, _ = self.get(key)
            doc = json.loads(current)
            doc["hostname"] = f"renamed-{self.races}"
            self.put(key, json.dumps(doc).encode())
        return super().put_if_match(key, data, etag)


def test_update_record_retries_on_conflict_without_losing_the_other_write() -> None:
    store = InterleavingStore(races=2)
    write_record(store, pending())
    updated = update_record(store, "default", KNOWN_ID, status="running")
    assert updated.status == "running"
    assert updated.hostname == "renamed-0"  # the concurrent writer's change survived
    stored = read_record(store, "default", KNOWN_ID)
    assert stored is not None
    assert stored[0] == updated


def test_update_record_gives_up_when_the_record_keeps_changing() -> None:
    store = InterleavingStore(races=100)
    write_record(store, pending())
    with pytest.raises(Unavailable, match="kept changing"):
        update_record(store, "default", KNOWN_ID, attempts=3, status="running")


def test_local_offsets_are_stored_as_utc() -> None:
    sydney = timezone(timedelta(hours=10))
    record = pending(created_at=datetime(2026, 3, 1, 22, 0, tzinfo=sydney))
    assert json.loads(encode_record(record))["created_at"] == "2026-03-01T12:00:00Z"


def test_writes_touch_only_the_records_own_key() -> None:
    store = MemoryObjectStore()
    write_record(store, pending())
    update_record(store, "default", KNOWN_ID, status="running")
    assert store.list() == [KNOWN_KEY]
