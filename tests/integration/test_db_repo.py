"""Repository functions of the SQLite cache, on a real migrated database file.

Covers the crash-safe create path (pending row before the provider call), single-use registration
nonces under concurrency, the active-instance listing the reconciler plans from, soft delete and
purge, group hashes, workload public keys, the certificate deny list and operator nonces.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import pytest

from nstance.core.errors import AlreadyExists, InvalidArgument, NotFound
from nstance.db import repo
from nstance.db.engine import Database, open_database
from nstance.db.models import RECORD_PENDING, RECORD_PROVISIONED, Instance, LbInstance, PublicKey
from nstance.db.repo import NonceClaim, PurgedInstance
from nstance.db.rows import SyncRow

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
CERT_EXPIRY = T0 + timedelta(days=365)
T = TypeVar("T")


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    database = open_database(tmp_path / "db" / "nstance.db")
    yield database
    database.close()


def _add(
    db: Database,
    instance_id: str,
    *,
    tenant: str = "acme",
    group_key: str = "workers",
    at: datetime = T0,
    on_demand: bool = False,
    nonce: str | None = None,
) -> None:
    with db.session() as session:
        repo.insert_instance(
            session,
            instance_id=instance_id,
            tenant=tenant,
            group_key=group_key,
            kind="knc",
            nonce=nonce or f"jwt-{instance_id}",
            now=at,
            on_demand=on_demand,
        )


def _race(workers: int, action: Callable[[int], T]) -> list[T]:
    """Run ``action(i)`` on ``workers`` threads released together by a barrier; re-raise any error."""
    barrier = threading.Barrier(workers)

    def run(index: int) -> T:
        barrier.wait(timeout=10)
        return action(index)

    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(run, i) for i in range(workers)]
        return [future.result(timeout=30) for future in futures]


# --- create path ---------------------------------------------------------------------------------


def test_insert_records_a_pending_row_before_the_provider_call(db: Database) -> None:
    with db.session() as session:
        row = repo.insert_instance(
            session,
            instance_id="i1",
            tenant="acme",
            group_key="workers",
            kind="knc",
            nonce="jwt-1",
            now=T0,
            template="k8s-node",
            subnet_id="subnet-a",
            instance_type="t4g.small",
            infra_config_hash="sha256:infra",
            idempotency_token="tok-1",
            issued_at=T0,
        )
        assert row.record_state == RECORD_PENDING
    with db.read_session() as session:
        stored = repo.get_instance(session, "i1")
    assert stored is not None
    assert (stored.record_state, stored.provider_id, stored.on_demand) == (RECORD_PENDING, None, False)
    assert (stored.template, stored.subnet_id, stored.instance_type) == ("k8s-node", "subnet-a", "t4g.small")
    assert stored.infra_config_hash == "sha256:infra"
    assert stored.created_at == stored.updated_at == T0
    assert stored.deleted_at is None


@pytest.mark.parametrize(
    ("instance_id", "nonce", "token"),
    [("i1", "jwt-other", None), ("i2", "jwt-1", None), ("i2", "jwt-2", "tok-1")],
    ids=["same-id", "same-nonce", "same-idempotency-token"],
)
def test_insert_refuses_duplicates_and_keeps_the_transaction_usable(
    db: Database, instance_id: str, nonce: str, token: str | None
) -> None:
    with db.session() as session:
        repo.insert_instance(
            session,
            instance_id="i1",
            tenant="acme",
            group_key="g",
            kind="knc",
            nonce="jwt-1",
            now=T0,
            idempotency_token="tok-1",
        )
    with db.session() as session:
        with pytest.raises(AlreadyExists, match=instance_id):
            repo.insert_instance(
                session,
                instance_id=instance_id,
                tenant="acme",
                group_key="g",
                kind="knc",
                nonce=nonce,
                now=T0,
                idempotency_token=token,
            )
        # Same transaction, next statement: still fine.
        repo.insert_instance(
            session, instance_id="i3", tenant="acme", group_key="g", kind="knc", nonce="jwt-3", now=T0
        )
    with db.read_session() as session:
        assert [row.id for row in repo.list_active_instances(session)] == ["i1", "i3"]


def test_set_provider_details_marks_the_row_provisioned(db: Database) -> None:
    _add(db, "i1")
    later = T0 + timedelta(seconds=3)
    with db.session() as session:
        assert repo.set_provider_details(
            session, "i1", provider_id="i-0abc", now=later, provider_status="pending", ip4="10.0.0.5"
        )
        assert not repo.set_provider_details(session, "missing", provider_id="i-x", now=later)
    with db.session() as session:
        # Fields not given keep their value.
        assert repo.set_provider_details(
            session, "i1", provider_id="i-0abc", now=later, hostname="ip-10-0-0-5"
        )
    with db.read_session() as session:
        row = repo.get_instance(session, "i1")
    assert row is not None
    assert (row.provider_id, row.record_state, row.provider_status) == (
        "i-0abc",
        RECORD_PROVISIONED,
        "pending",
    )
    assert (row.ip4, row.hostname) == ("10.0.0.5", "ip-10-0-0-5")
    assert row.provider_at == row.updated_at == later


def test_set_provider_status(db: Database) -> None:
    _add(db, "i1")
    with db.session() as session:
        assert repo.set_provider_status(session, "i1", "running", now=T0 + timedelta(minutes=1))
        assert not repo.set_provider_status(session, "missing", "running", now=T0)
    with db.read_session() as session:
        row = repo.get_instance(session, "i1")
    assert row is not None
    assert (row.provider_status, row.provider_at) == ("running", T0 + timedelta(minutes=1))


# --- registration ----------------------------------------------------------------------------------


def _register(db: Database, nonce: str, *, instance_id: str | None = None, serial: int | str = 0xABC) -> bool:
    with db.session() as session:
        return repo.mark_registered_atomically(
            session,
            nonce=nonce,
            public_key_pem="PEM",
            cert_serial=serial,
            cert_expires_at=CERT_EXPIRY,
            now=T0 + timedelta(seconds=40),
            instance_id=instance_id,
        )


def test_registration_nonce_is_single_use(db: Database) -> None:
    _add(db, "i1", nonce="jwt-1")

    assert _register(db, "jwt-1", serial=0x00FF10)
    assert not _register(db, "jwt-1")

    with db.read_session() as session:
        row = repo.get_instance_by_nonce(session, "jwt-1")
    assert row is not None
    assert row.id == "i1"
    assert row.registered_at == T0 + timedelta(seconds=40)
    assert (row.instance_pub, row.cert_serial, row.cert_expires_at) == ("PEM", "ff10", CERT_EXPIRY)


def test_registration_refuses_unknown_deleted_and_mismatched_nonces(db: Database) -> None:
    _add(db, "i1", nonce="jwt-1")
    _add(db, "i2", nonce="jwt-2")
    with db.session() as session:
        assert repo.soft_delete(session, "i2", now=T0)

    assert not _register(db, "jwt-unknown")
    assert not _register(db, "jwt-2")  # deleted instance
    assert not _register(db, "jwt-1", instance_id="i2")  # nonce of another instance
    assert _register(db, "jwt-1", instance_id="i1")


def test_concurrent_registrations_with_one_nonce_have_exactly_one_winner(db: Database) -> None:
    _add(db, "i1", nonce="jwt-1")

    results = _race(8, lambda i: _register(db, "jwt-1", serial=i + 1))

    assert sorted(results) == [False] * 7 + [True]
    with db.read_session() as session:
        row = repo.get_instance(session, "i1")
    assert row is not None
    assert row.registered_at is not None
    assert row.cert_serial in {format(i + 1, "x") for i in range(8)}


# --- listing -------------------------------------------------------------------------------------


def test_list_active_instances_filters_and_orders_oldest_first(db: Database) -> None:
    _add(db, "new", at=T0 + timedelta(minutes=3))
    _add(db, "old", at=T0)
    _add(db, "mid", at=T0 + timedelta(minutes=1))
    _add(db, "ondemand", at=T0 + timedelta(minutes=2), on_demand=True)
    _add(db, "other-group", group_key="ingress", at=T0)
    _add(db, "other-tenant", tenant="globex", at=T0)
    _add(db, "gone", at=T0)
    _add(db, "deleting", at=T0)
    _add(db, "terminated", at=T0)
    _add(db, "stopped", at=T0 + timedelta(minutes=4))
    with db.session() as session:
        repo.soft_delete(session, "gone", now=T0)
        repo.set_provider_status(session, "deleting", "deleting", now=T0)
        repo.set_provider_status(session, "terminated", "deleted", now=T0)
        repo.set_provider_status(session, "stopped", "stopped", now=T0)  # still active: needs replacing

    with db.read_session() as session:
        group = repo.list_active_instances(session, tenant="acme", group_key="workers")
        managed = repo.list_active_instances(session, tenant="acme", group_key="workers", managed_only=True)
        tenant = repo.list_active_instances(session, tenant="acme")
        everything = repo.list_active_instances(session)

    assert [r.id for r in group] == ["old", "mid", "ondemand", "new", "stopped"]
    assert [r.id for r in managed] == ["old", "mid", "new", "stopped"]
    assert {r.id for r in tenant} == {"old", "mid", "ondemand", "new", "stopped", "other-group"}
    assert {r.id for r in everything} == {r.id for r in tenant} | {"other-tenant"}


def test_list_active_instances_reads_pages_after_a_key_through_ties_of_created_at(db: Database) -> None:
    for i in range(7):  # pairs created in the same microsecond: the id orders them
        _add(db, f"i{6 - i}", at=T0 + timedelta(microseconds=i // 2))
    _add(db, "other-tenant", tenant="globex", at=T0)
    with db.read_session() as session:
        everything = [r.id for r in repo.list_active_instances(session, tenant="acme")]
        pages: list[list[str]] = []
        after = None
        while True:
            rows = repo.list_active_instances(session, tenant="acme", after=after, limit=3)
            if not rows:
                break
            pages.append([r.id for r in rows])
            after = (rows[-1].created_at, rows[-1].id)
    assert everything == ["i5", "i6", "i3", "i4", "i1", "i2", "i0"]
    assert pages == [["i5", "i6", "i3"], ["i4", "i1", "i2"], ["i0"]]


def _steps(db: Database, read: Callable[[Any], object]) -> int:
    """SQLite virtual-machine steps (in units of 100) that ``read`` on one read connection takes."""
    counted = [0]

    def count() -> int:
        counted[0] += 1
        return 0  # 0: go on

    with db.read_connection() as conn:
        conn.set_progress_handler(count, 100)
        try:
            read(conn)
        finally:
            conn.set_progress_handler(None, 0)
    return counted[0]


def test_a_page_of_instances_costs_its_own_rows_not_every_row_before_it(db: Database) -> None:
    # 20,000 rows in 20 groups, restored in batches as the cache rebuild writes them.
    rows = [
        {
            "id": f"app{i:08d}",
            "tenant": "acme",
            "group_key": f"g{i % 20:02d}",
            "kind": "knc",
            "template": "app",
            "nonce": f"jwt-{i}",
            "created_at": T0 + timedelta(milliseconds=i),
            "updated_at": T0,
        }
        for i in range(20_000)
    ]
    with db.write_connection() as conn:
        for start in range(0, len(rows), 5_000):
            repo.restore_instances(conn, rows[start : start + 5_000])
    last = (rows[-11]["created_at"], rows[-11]["id"])
    whole = _steps(db, lambda c: repo.list_active_instances(c, tenant="acme"))
    page = _steps(db, lambda c: repo.list_active_instances(c, tenant="acme", after=last, limit=10))
    first = _steps(db, lambda c: repo.list_active_instances(c, tenant="acme", limit=10))
    group_last = (rows[-40]["created_at"], rows[-40]["id"])  # the last row of g00 but one
    group_page = _steps(
        db,
        lambda c: repo.list_active_instances(c, tenant="acme", group_key="g00", after=group_last, limit=10),
    )
    # A seek in the (tenant[, group_key], created_at, id) index: a page of 10 costs about what 10
    # rows cost, wherever it starts. Scanning and sorting the tenant's rows cost as much as the
    # whole listing for every page.
    assert whole > 1_000
    assert page * 50 < whole, (page, whole)
    assert first * 50 < whole, (first, whole)
    assert group_page * 50 < whole, (group_page, whole)
    with db.read_connection() as conn:
        tail = repo.list_active_instances(conn, tenant="acme", after=last, limit=10)
        assert [r.id for r in tail] == [r["id"] for r in rows[-10:]]
        in_group = repo.list_active_instances(
            conn, tenant="acme", group_key="g00", after=group_last, limit=10
        )
        assert [r.id for r in in_group] == [rows[-20]["id"]]


def test_serving_provider_ids_leave_out_what_a_group_status_does_not_count(db: Database) -> None:
    for iid in ("up", "young", "draining", "failed", "gone", "stopped"):
        _add(db, iid)
    _add(db, "ondemand", on_demand=True)
    _add(db, "ingress-1", group_key="ingress")
    _add(db, "other-tenant", tenant="globex")
    with db.session() as session:
        for iid in ("up", "draining", "gone", "stopped", "ondemand", "ingress-1", "other-tenant"):
            repo.set_provider_details(
                session, iid, provider_id=f"vm-{iid}", now=T0, provider_status="running"
            )
        repo.set_provider_status(session, "stopped", "deleted", now=T0)
        repo.soft_delete(session, "gone", now=T0)
        repo.start_drain(session, "draining", reason="unhealthy", now=T0, delete_at=T0 + timedelta(minutes=5))
        repo.mark_create_failed(session, "failed", now=T0)
    with db.read_connection() as conn:
        tenant = repo.serving_provider_ids(conn, tenant="acme")
        one = repo.serving_provider_ids(conn, tenant="acme", group_key="ingress")
    assert {group: sorted(ids, key=str) for group, ids in tenant.items()} == {
        "workers": sorted(["vm-up", None], key=str),  # "young": its create has not returned yet
        "ingress": ["vm-ingress-1"],
    }
    assert one == {"ingress": ["vm-ingress-1"]}


def test_live_rows_by_group_counts_live_rows_and_the_managed_among_them(db: Database) -> None:
    for iid in ("a", "b", "gone"):
        _add(db, iid)
    _add(db, "od", on_demand=True)
    _add(db, "only-od", group_key="batch", on_demand=True)
    _add(db, "x", tenant="globex")
    with db.session() as session:
        repo.soft_delete(session, "gone", now=T0)
    with db.read_connection() as conn:
        counted = repo.live_rows_by_group(conn)
    assert counted == {("acme", "workers"): (3, 2), ("acme", "batch"): (1, 0), ("globex", "workers"): (1, 1)}


def test_awaiting_drain_ack_is_the_unacknowledged_drains_of_one_tenant(db: Database) -> None:
    for iid, at in (
        ("late", T0 + timedelta(minutes=2)),
        ("early", T0),
        ("acked", T0),
        ("gone", T0),
        ("up", T0),
    ):
        _add(db, iid, at=at)
    _add(db, "other-tenant", tenant="globex")
    deadline = T0 + timedelta(minutes=5)
    with db.session() as session:
        for iid in ("late", "early", "acked", "gone", "other-tenant"):
            repo.start_drain(session, iid, reason="unhealthy", now=T0, delete_at=deadline)
        repo.acknowledge_drain(session, "acked", now=T0)
        repo.soft_delete(session, "gone", now=T0)
    with db.read_connection() as conn:
        rows = repo.awaiting_drain_ack(conn, tenant="acme")
    assert [r.id for r in rows] == ["early", "late"]
    assert all(r.drain_reason == "unhealthy" and r.delete_at == deadline for r in rows)


def test_get_instance_returns_none_for_unknown_ids(db: Database) -> None:
    with db.read_session() as session:
        assert repo.get_instance(session, "nope") is None
        assert repo.get_instance_by_nonce(session, "nope") is None


# --- delete and purge ----------------------------------------------------------------------------


def test_soft_delete_happens_once(db: Database) -> None:
    _add(db, "i1")
    with db.session() as session:
        assert repo.soft_delete(session, "i1", now=T0 + timedelta(minutes=1))
        assert not repo.soft_delete(session, "i1", now=T0 + timedelta(minutes=2))
        assert not repo.soft_delete(session, "missing", now=T0)
    with db.read_session() as session:
        row = repo.get_instance(session, "i1")
        assert repo.list_active_instances(session) == []
    assert row is not None
    assert row.deleted_at == T0 + timedelta(minutes=1)


def test_purge_removes_old_deleted_rows_with_their_keys_and_lb_rows(db: Database) -> None:
    for name in ("old", "recent", "alive"):
        _add(db, name, tenant="acme" if name != "recent" else "globex")
    with db.session() as session:
        repo.soft_delete(session, "old", now=T0)
        repo.soft_delete(session, "recent", now=T0 + timedelta(minutes=40))
        repo.upsert_public_key(session, instance_id="old", filename="tls.key", public_key_pem="PEM", now=T0)
        repo.upsert_public_key(session, instance_id="alive", filename="tls.key", public_key_pem="PEM", now=T0)
        session.add(LbInstance(lb_key="api", instance_id="old", status="registered", updated_at=T0))

    with db.session() as session:
        purged = repo.purge_deleted_before(session, T0 + timedelta(minutes=30))
    assert purged == [PurgedInstance("acme", "old")]

    with db.read_session() as session:
        assert repo.get_instance(session, "old") is None
        assert repo.get_instance(session, "recent") is not None
        assert repo.list_public_keys(session, "old") == []
        assert len(repo.list_public_keys(session, "alive")) == 1
        assert session.query(LbInstance).count() == 0
    with db.session() as session:
        assert repo.purge_deleted_before(session, T0 + timedelta(minutes=30)) == []


# --- groups --------------------------------------------------------------------------------------


def test_group_hashes_upsert_reports_changes_and_tracks_when_they_changed(db: Database) -> None:
    def upsert(runtime: str, infra: str, at: datetime) -> bool:
        with db.session() as session:
            return repo.upsert_group_hashes(
                session,
                tenant="acme",
                group_key="workers",
                runtime_config_hash=runtime,
                infra_config_hash=infra,
                now=at,
            )

    assert upsert("sha256:r1", "sha256:i1", T0)
    assert not upsert("sha256:r1", "sha256:i1", T0 + timedelta(minutes=1))
    with db.read_session() as session:
        group = repo.get_group_hashes(session, "acme", "workers")
    assert group is not None
    assert (group.runtime_config_hash, group.infra_config_hash) == ("sha256:r1", "sha256:i1")
    assert group.hashes_updated_at == group.updated_at == T0

    assert upsert("sha256:r1", "sha256:i2", T0 + timedelta(minutes=2))
    with db.read_session() as session:
        group = repo.get_group_hashes(session, "acme", "workers")
    assert group is not None
    assert group.infra_config_hash == "sha256:i2"
    assert group.hashes_updated_at == T0 + timedelta(minutes=2)
    assert group.created_at == T0


def test_list_and_delete_groups(db: Database) -> None:
    with db.session() as session:
        for tenant, key in [("globex", "a"), ("acme", "workers"), ("acme", "ingress")]:
            repo.upsert_group_hashes(
                session, tenant=tenant, group_key=key, runtime_config_hash="r", infra_config_hash="i", now=T0
            )
    with db.session() as session:
        assert [(g.tenant, g.group_key) for g in repo.list_groups(session)] == [
            ("acme", "ingress"),
            ("acme", "workers"),
            ("globex", "a"),
        ]
        assert [g.group_key for g in repo.list_groups(session, tenant="acme")] == ["ingress", "workers"]
        assert repo.delete_group_hashes(session, "acme", "ingress")
        assert not repo.delete_group_hashes(session, "acme", "ingress")
        assert repo.get_group_hashes(session, "acme", "ingress") is None


# --- workload public keys ------------------------------------------------------------------------


def _issue_cert(db: Database, instance_id: str, filename: str, serial: str) -> None:
    with db.session() as session:
        key = session.query(PublicKey).filter_by(instance_id=instance_id, filename=filename).one()
        key.certificate_serial = serial
        key.certificate_issued_at = T0


def test_public_key_upsert_keeps_the_cert_for_the_same_key_and_drops_it_for_a_new_one(db: Database) -> None:
    _add(db, "i1")
    with db.session() as session:
        first = repo.upsert_public_key(
            session,
            instance_id="i1",
            filename="kubelet.key",
            public_key_pem="PEM-A",
            now=T0,
            certificate_name="kubelet",
        )
    assert (first.public_key_pem, first.certificate_name, first.submitted_at) == ("PEM-A", "kubelet", T0)
    _issue_cert(db, "i1", "kubelet.key", "abc")

    with db.session() as session:
        same = repo.upsert_public_key(
            session,
            instance_id="i1",
            filename="kubelet.key",
            public_key_pem="PEM-A",
            now=T0 + timedelta(minutes=1),
        )
    assert (same.id, same.certificate_serial, same.certificate_issued_at) == (first.id, "abc", T0)
    assert same.submitted_at == T0 + timedelta(minutes=1)

    with db.session() as session:
        rotated = repo.upsert_public_key(
            session,
            instance_id="i1",
            filename="kubelet.key",
            public_key_pem="PEM-B",
            now=T0 + timedelta(minutes=2),
        )
    assert (rotated.id, rotated.public_key_pem) == (first.id, "PEM-B")
    assert (rotated.certificate_serial, rotated.certificate_issued_at) == (None, None)
    assert rotated.created_at == T0

    with db.read_session() as session:
        assert [k.filename for k in repo.list_public_keys(session, "i1")] == ["kubelet.key"]


def test_public_key_for_unknown_instance_is_not_found(db: Database) -> None:
    with db.session() as session, pytest.raises(NotFound, match="ghost"):
        repo.upsert_public_key(session, instance_id="ghost", filename="a.key", public_key_pem="PEM", now=T0)


# --- certificate deny list -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "canonical"),
    [(255, "ff"), ("FF", "ff"), ("0x00ff", "ff"), ("00:FF", "ff"), (0, "0"), ("000", "0")],
)
def test_normalize_serial(given: int | str, canonical: str) -> None:
    assert repo.normalize_serial(given) == canonical


@pytest.mark.parametrize("bad", ["xyz", "", -1])
def test_normalize_serial_refuses_garbage(bad: int | str) -> None:
    with pytest.raises(InvalidArgument):
        repo.normalize_serial(bad)


def test_revoked_serials_match_any_spelling(db: Database) -> None:
    serial = 0x1F2E3D4C5B6A79880000000000000001
    with db.session() as session:
        assert repo.add_revoked_serial(session, serial, now=T0, reason="key leaked", expires_at=CERT_EXPIRY)
        assert not repo.add_revoked_serial(session, format(serial, "#034x").upper().replace("X", "x"), now=T0)
    with db.read_session() as session:
        listed = repo.revoked_serials(session)
    assert listed == {format(serial, "x")}
    assert repo.normalize_serial(serial) in listed
    assert repo.normalize_serial("1F:2E:3D:4C:5B:6A:79:88:00:00:00:00:00:00:00:01") in listed
    assert repo.normalize_serial(serial + 1) not in listed


# --- operators -----------------------------------------------------------------------------------


def _claim(db: Database, nonce: str, key: str, operator_id: str) -> NonceClaim:
    with db.session() as session:
        outcome, holder = repo.claim_operator_nonce(
            session,
            nonce=nonce,
            operator_id=operator_id,
            cluster_id="c1",
            tenant="acme",
            public_key=key,
            now=T0,
            cert_serial=0x10,
            cert_expires_at=CERT_EXPIRY,
        )
        assert holder.nonce == nonce
        return outcome


def test_operator_nonce_claim_allows_same_key_retries_only(db: Database) -> None:
    assert _claim(db, "op-jwt", "KEY-A", "opr1") is NonceClaim.CLAIMED
    assert _claim(db, "op-jwt", "KEY-A", "opr2") is NonceClaim.SAME_KEY
    assert _claim(db, "op-jwt", "KEY-B", "opr3") is NonceClaim.TAKEN
    with db.read_session() as session:
        assert [o.id for o in repo.list_operators(session)] == ["opr1"]
        operator = repo.get_operator(session, "opr1")
    assert operator is not None
    assert (operator.public_key, operator.cert_serial, operator.registered_at) == ("KEY-A", "10", T0)


def test_operator_id_reused_for_another_nonce_is_refused(db: Database) -> None:
    assert _claim(db, "op-jwt-1", "KEY-A", "opr1") is NonceClaim.CLAIMED
    with pytest.raises(AlreadyExists, match="opr1"):
        _claim(db, "op-jwt-2", "KEY-A", "opr1")


def test_concurrent_operator_claims_with_different_keys_have_one_winner(db: Database) -> None:
    results = _race(8, lambda i: _claim(db, "op-jwt", f"KEY-{i}", f"opr{i}"))
    assert sorted(r.value for r in results) == ["claimed"] + ["taken"] * 7


def test_upsert_operator_creates_refreshes_and_keeps_the_nonce(db: Database) -> None:
    assert _claim(db, "op-jwt", "KEY-A", "opr1") is NonceClaim.CLAIMED
    renewed = T0 + timedelta(days=180)
    with db.session() as session:
        # Renewal (or a rebuild from object storage, whose records carry no nonce).
        repo.upsert_operator(
            session,
            operator_id="opr1",
            cluster_id="c1",
            tenant="acme",
            public_key="KEY-A",
            registered_at=T0,
            now=renewed,
            cert_serial="0x20",
            cert_expires_at=renewed + timedelta(days=365),
            renewed_at=renewed,
        )
        repo.upsert_operator(
            session,
            operator_id="opr2",
            cluster_id="c1",
            tenant="globex",
            public_key="KEY-Z",
            registered_at=T0,
            now=T0,
        )
    with db.read_session() as session:
        first = repo.get_operator(session, "opr1")
        assert [o.id for o in repo.list_operators(session, tenant="globex")] == ["opr2"]
    assert first is not None
    assert (first.nonce, first.cert_serial, first.renewed_at, first.created_at) == (
        "op-jwt",
        "20",
        renewed,
        T0,
    )


def test_upsert_operator_refuses_a_nonce_bound_to_another_operator(db: Database) -> None:
    assert _claim(db, "op-jwt", "KEY-A", "opr1") is NonceClaim.CLAIMED
    with db.session() as session, pytest.raises(AlreadyExists, match="opr2"):
        repo.upsert_operator(
            session,
            operator_id="opr2",
            cluster_id="c1",
            tenant="acme",
            public_key="KEY-B",
            registered_at=T0,
            now=T0,
            nonce="op-jwt",
        )


# --- sessions ------------------------------------------------------------------------------------


def test_read_session_discards_writes_and_session_rolls_back_on_error(db: Database) -> None:
    with db.read_session() as session:
        repo.insert_instance(
            session, instance_id="i1", tenant="acme", group_key="g", kind="knc", nonce="n1", now=T0
        )

    def failing_write() -> None:
        with db.session() as session:
            repo.insert_instance(
                session, instance_id="i2", tenant="acme", group_key="g", kind="knc", nonce="n2", now=T0
            )
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        failing_write()
    with db.read_session() as session:
        assert repo.list_active_instances(session) == []


def test_read_session_sees_a_stable_snapshot_while_a_writer_commits(db: Database) -> None:
    _add(db, "i1")
    with db.read_session() as reader:
        assert len(repo.list_active_instances(reader)) == 1
        _add(db, "i2")  # commits on another connection; WAL lets it through
        assert len(repo.list_active_instances(reader)) == 1
    with db.read_session() as session:
        assert len(repo.list_active_instances(session)) == 2


def _restored(instance_id: str, *, provider_status: str | None, at: datetime) -> dict[str, object]:
    return {
        "id": instance_id,
        "tenant": "acme",
        "group_key": "workers",
        "kind": "knc",
        "on_demand": False,
        "record_state": RECORD_PROVISIONED,
        "nonce": f"jwt-{instance_id}",
        "provider_id": f"vm-{instance_id}",
        "provider_status": provider_status,
        "registered_at": None,
        "cert_expires_at": at + timedelta(days=1),
        "created_at": at,
        "updated_at": at,
        "deleted_at": None,
    }


def test_batch_restore_writes_what_the_single_row_restore_writes(db: Database) -> None:
    one = _restored("knc-one", provider_status="running", at=T0)
    many = _restored("knc-many", provider_status="running", at=T0)
    with db.session() as session:
        repo.restore_instance(session, **one)
        repo.restore_instances(session, [many])
    with db.read_session() as session:
        single, batch = repo.get_instance(session, "knc-one"), repo.get_instance(session, "knc-many")
    assert single is not None
    assert batch is not None
    columns = [c.name for c in Instance.__table__.columns if c.name not in ("id", "nonce", "provider_id")]
    assert {c: getattr(batch, c) for c in columns} == {c: getattr(single, c) for c in columns}
    assert batch.created_at == T0
    assert batch.created_at.tzinfo is not None


def test_batch_restore_overwrites_rows_and_keeps_a_status_the_record_leaves_unset(db: Database) -> None:
    later = T0 + timedelta(minutes=5)
    with db.session() as session:
        repo.restore_instances(
            session,
            [
                _restored("knc-a", provider_status="running", at=T0),
                _restored("knc-b", provider_status="stopped", at=T0),
            ],
        )
    with db.session() as session:
        repo.restore_instances(
            session,
            [
                _restored("knc-a", provider_status=None, at=later),
                _restored("knc-b", provider_status="running", at=later),
            ],
            keep_stored_if_null=("provider_status",),
        )
    with db.read_session() as session:
        a, b = repo.get_instances(session, ["knc-a", "knc-b", "knc-unknown"])
    assert (a.provider_status, a.updated_at) == ("running", later)
    assert (b.provider_status, b.updated_at) == ("running", later)


def test_batch_restore_refuses_unknown_columns_and_naive_times(db: Database) -> None:
    with db.session() as session, pytest.raises(InvalidArgument, match="unknown column"):
        repo.restore_instances(session, [{"id": "knc-x", "colour": "red"}])
    with db.session() as session, pytest.raises(ValueError, match="naive"):
        repo.restore_instances(session, [_restored("knc-x", provider_status=None, at=datetime(2026, 1, 1))])


def test_soft_delete_many_and_live_ids(db: Database) -> None:
    for iid in ("knc-1", "knc-2", "knc-3"):
        _add(db, iid)
    with db.session() as session:
        repo.soft_delete_many(session, ["knc-1", "knc-3", "knc-unknown"], now=T0)
    with db.session() as session:
        repo.soft_delete_many(session, ["knc-1"], now=T0 + timedelta(hours=1))  # already deleted: kept
    with db.read_session() as session:
        assert repo.live_instance_ids(session) == {"knc-2"}
        first = repo.get_instance(session, "knc-1")
    assert first is not None
    assert first.deleted_at == T0


def test_unlaunched_on_demand_tombstones_are_deleted_on_demand_rows_without_a_provider_id(
    db: Database,
) -> None:
    _add(db, "od-never", on_demand=True)
    _add(db, "od-launched", on_demand=True)
    _add(db, "od-live", on_demand=True)
    _add(db, "group-never")
    with db.session() as session:
        repo.set_provider_details(session, "od-launched", provider_id="i-0abc", now=T0)
        repo.soft_delete_many(session, ["od-never", "od-launched", "group-never"], now=T0)
    with db.read_session() as session:
        assert repo.unlaunched_on_demand_tombstones(session) == {"od-never"}


def _claim_agent(
    db: Database, nonce: str, instance_id: str, *, tenant: str = "acme", serial: int = 0xABC
) -> repo.AgentClaim:
    with db.write_connection() as conn:
        return repo.claim_agent_registration(
            conn,
            nonce=nonce,
            instance_id=instance_id,
            tenant=tenant,
            public_key_pem="PEM",
            cert_serial=serial,
            cert_expires_at=CERT_EXPIRY,
            now=T0 + timedelta(seconds=40),
        )


def test_plain_sql_agent_claim_is_single_use_and_checks_instance_and_tenant(db: Database) -> None:
    _add(db, "i1", nonce="jwt-1")
    _add(db, "i2", nonce="jwt-2")
    with db.session() as session:
        assert repo.soft_delete(session, "i2", now=T0)

    assert not _claim_agent(db, "jwt-unknown", "i1").claimed
    assert not _claim_agent(db, "jwt-2", "i2").claimed  # deleted
    assert not _claim_agent(db, "jwt-1", "i2").claimed  # another instance's nonce
    assert not _claim_agent(db, "jwt-1", "i1", tenant="other").claimed
    assert _claim_agent(db, "jwt-1", "i1", serial=0x00FF10) == repo.AgentClaim(
        claimed=True, group_key="workers"
    )
    assert not _claim_agent(db, "jwt-1", "i1").claimed  # used

    with db.read_session() as session:
        row = repo.get_instance(session, "i1")
    assert row is not None
    assert row.registered_at == T0 + timedelta(seconds=40)
    assert (row.instance_pub, row.cert_serial, row.cert_expires_at) == ("PEM", "ff10", CERT_EXPIRY)


def test_concurrent_plain_sql_claims_have_exactly_one_winner(db: Database) -> None:
    _add(db, "i1", nonce="jwt-1")
    results = _race(8, lambda i: _claim_agent(db, "jwt-1", "i1", serial=i + 1).claimed)
    assert sorted(results) == [False] * 7 + [True]


def test_the_claim_stores_reported_addresses_only_when_it_claims(db: Database) -> None:
    _add(db, "i1", nonce="jwt-1")
    with db.write_connection() as conn:
        assert repo.store_reported_addresses(conn, "i1", now=T0, ip6="fd00::1")

    def claim(hostname: str) -> bool:
        with db.write_connection() as conn:
            return repo.claim_agent_registration(
                conn,
                nonce="jwt-1",
                instance_id="i1",
                tenant="acme",
                public_key_pem="PEM",
                cert_serial=1,
                cert_expires_at=CERT_EXPIRY,
                now=T0,
                ip4="10.0.0.9",
                hostname=hostname,
            ).claimed

    assert claim("h1")
    assert not claim("evil")  # a replay writes nothing
    with db.read_connection() as conn:
        row = repo.get_instance(conn, "i1")
    assert row is not None
    assert (row.ip4, row.ip6, row.hostname) == ("10.0.0.9", "fd00::1", "h1")  # empty ip6 kept


def test_stored_addresses_leave_empty_fields_alone(db: Database) -> None:
    _add(db, "i1")
    with db.write_connection() as conn:
        assert repo.store_reported_addresses(conn, "i1", now=T0, ip4="10.0.0.9", hostname="h1")
        assert repo.store_reported_addresses(conn, "i1", now=T0, ip6="fd00::9")
        assert not repo.store_reported_addresses(conn, "unknown", now=T0, ip4="10.0.0.1")
    with db.read_session() as session:
        row = repo.get_instance(session, "i1")
    assert row is not None
    assert (row.ip4, row.ip6, row.hostname) == ("10.0.0.9", "fd00::9", "h1")


# --- plain-SQL rows and transactions -------------------------------------------------------------


def test_plain_rows_read_every_column_as_the_orm_does(db: Database) -> None:
    later = T0 + timedelta(hours=1, microseconds=7)
    values: dict[str, object] = {
        "id": "knc-full",
        "tenant": "acme",
        "group_key": "workers",
        "kind": "knc",
        "template": "app",
        "on_demand": True,
        "record_state": RECORD_PROVISIONED,
        "idempotency_token": "tok",
        "subnet_id": "sn-1",
        "instance_type": "t3.micro",
        "provider_id": "vm-1",
        "provider_status": "running",
        "provider_at": later,
        "hostname": "h",
        "fqdn": "h.example",
        "ip4": "10.0.0.1",
        "ip6": "fd00::1",
        "nonce": "jwt-full",
        "issued_at": T0,
        "instance_pub": "PEM",
        "registered_at": later,
        "cert_serial": "ab",
        "cert_expires_at": CERT_EXPIRY,
        "certificates_at": later,
        "health_at": later,
        "health": {"termination_notice": {"action": "stop"}, "count": 3},
        "infra_config_hash": "infra",
        "runtime_config_hash": "runtime",
        "drain_reason": "scale-in",
        "drain_started_at": later,
        "drain_acked_at": later,
        "delete_at": later + timedelta(minutes=5),
        "created_at": T0,
        "updated_at": later,
        "deleted_at": None,
    }
    assert set(values) == {c.name for c in Instance.__table__.columns}  # every column is covered
    with db.session() as session:
        session.add(Instance(**values))
    with db.read_session() as session:
        orm = session.get(Instance, "knc-full")
        via_session = repo.get_instance(session, "knc-full")
    with db.read_connection() as conn:
        plain = repo.get_instance(conn, "knc-full")
        listed = repo.list_active_instances(conn, tenant="acme", group_key="workers")
    assert orm is not None
    assert plain is not None
    assert plain == via_session
    assert listed == [plain]
    assert {name: getattr(plain, name) for name in values} == {name: getattr(orm, name) for name in values}
    assert plain.on_demand is True
    assert plain.created_at.tzinfo is not None


def test_plain_health_writes_store_what_the_orm_reads(db: Database) -> None:
    _add(db, "i1")
    _add(db, "gone")
    with db.session() as session:
        repo.soft_delete(session, "gone", now=T0)
    with db.write_connection() as conn:
        repo.record_health_many(
            conn,
            [
                {
                    "instance_id": "i1",
                    "health_at": T0,
                    "health": {"a": [1, "x"]},
                    "runtime_config_hash": "h1",
                },
                {"instance_id": "gone", "health_at": T0, "health": {"a": 2}, "runtime_config_hash": "h2"},
            ],
        )
        repo.record_health_many(conn, [{"instance_id": "i1", "health_at": T0, "health": None}])
    with db.read_session() as session:
        kept, deleted = session.get(Instance, "i1"), session.get(Instance, "gone")
    assert kept is not None
    assert deleted is not None
    assert (kept.health, kept.health_at, kept.runtime_config_hash) == (None, T0, "h1")  # None keeps the hash
    assert (deleted.health, deleted.health_at) == (None, None)  # deleted rows are skipped


def test_write_connection_commits_or_rolls_back_and_read_connection_discards(db: Database) -> None:
    _add(db, "i1")
    _add(db, "i2")

    def failing_write() -> None:
        with db.write_connection() as conn:
            assert repo.soft_delete(conn, "i1", now=T0)
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        failing_write()
    with db.read_connection() as conn:
        assert repo.soft_delete(conn, "i2", now=T0)  # seen inside, discarded at the end
    with db.write_connection() as conn:  # the connection that failed is usable again
        assert repo.set_provider_status(conn, "i1", "running", now=T0)
    with db.read_connection() as conn:
        rows = {row.id: row for row in repo.list_instances(conn)}
    assert set(rows) == {"i1", "i2"}
    assert rows["i1"].provider_status == "running"


def test_plain_connections_are_reopened_after_the_file_is_replaced(db: Database) -> None:
    _add(db, "i1")
    with db.read_connection() as conn:
        assert repo.get_instance(conn, "i1") is not None
    db.replace_corrupt_file()  # the file is moved aside; pooled plain connections must not follow it
    with db.read_connection() as conn:
        assert repo.get_instance(conn, "i1") is None


def test_sync_rows_are_every_row_with_the_columns_the_provider_sync_compares(db: Database) -> None:
    _add(db, "a")
    _add(db, "b", tenant="globex", group_key="batch")
    _add(db, "gone")
    with db.session() as session:
        repo.set_provider_details(session, "a", provider_id="i-a", provider_status="running", now=T0)
        repo.soft_delete(session, "gone", now=T0)
    with db.read_connection() as conn:
        rows = repo.sync_rows(conn)
    assert rows == {
        "a": SyncRow("acme", "workers", "i-a", "running", False, RECORD_PROVISIONED),
        "b": SyncRow("globex", "batch", None, None, False, RECORD_PENDING),
        "gone": SyncRow("acme", "workers", None, None, True, RECORD_PENDING),
    }


def test_gc_and_restore_reads_are_the_unregistered_rows_and_the_ids_that_need_records(db: Database) -> None:
    _add(db, "old", at=T0 - timedelta(minutes=1))
    _add(db, "up")
    _add(db, "failed")
    _add(db, "gone")
    with db.session() as session:
        repo.mark_registered_atomically(
            session, nonce="jwt-up", public_key_pem="pem", cert_serial=1, cert_expires_at=T0, now=T0
        )
        repo.mark_create_failed(session, "failed", now=T0)
        repo.soft_delete(session, "gone", now=T0)
    with db.read_connection() as conn:
        assert [row.id for row in repo.list_unregistered_instances(conn)] == ["old", "failed"]
        assert sorted(repo.recorded_instance_ids(conn)) == [("acme", "old"), ("acme", "up")]
