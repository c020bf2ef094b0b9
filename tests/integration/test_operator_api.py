"""The Operator API of a running nstance-server: watches, on-demand instances, refresh, renewal.

One server process (sim provider) for the module; each test leaves the groups as it found them.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.empty_pb2 import Empty
from typer.testing import CliRunner

from nstance.admin import client as admin_client
from nstance.admin.cli import app as admin_app
from nstance.core.ids import new_instance_id
from nstance.pki.keys import generate_private_key, private_key_to_pem, public_key_to_pem
from nstance.rpc import operator_pb2, operator_pb2_grpc
from nstance.testing.shardproc import LocalCluster, server_addrs, shard_config, start_leader
from nstance.testing.waiting import eventually_sync

pytestmark = pytest.mark.timeout(120)
SHARD = "zone-a"
ELECTION = {"frequent_interval": "500ms", "infrequent_interval": "2s", "leader_timeout": "6s"}
"""One server that nothing here kills: a lease long enough that a loaded CI machine (a renewal given
0.3 s under the 1 s test default) does not turn it into a standby between the tests' calls."""


class Server:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.cluster = LocalCluster(root / "bucket")
        self.cluster.init()
        self.addrs = server_addrs()
        self.config = shard_config(
            shard=SHARD,
            addrs=self.addrs,
            provider_options={"latency": "5ms"},
            election=ELECTION,
            groups={
                "web": {"template": "app", "size": 0},
                "jobs": {"template": "app", "size": 0},
                "idle": {"template": "app", "size": 0},
            },
        )
        self.cluster.write_config(SHARD, self.config)
        self.identity = self.cluster.operator_identity(root / "operator")
        self.process = start_leader(self.cluster, root, shard=SHARD)
        self.stub = self.cluster.operator_stub(self.identity, self.addrs["operator_addr"])


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = Server(tmp_path_factory.mktemp("operator-api"))
    yield s
    s.process.stop()


def watch(call: Any) -> tuple[queue.Queue[Any], Callable[[], None]]:
    """Read a server stream on a thread into a queue; returns the queue and a cancel function."""
    q: queue.Queue[Any] = queue.Queue()

    def pump() -> None:
        try:
            for event in call:
                q.put(event)
        except grpc.RpcError as exc:
            q.put(exc)

    threading.Thread(target=pump, daemon=True).start()
    return q, call.cancel


def take_until(q: queue.Queue[Any], done: Callable[[list[Any]], bool], timeout: float = 15) -> list[Any]:
    got: list[Any] = []
    deadline = time.monotonic() + timeout
    while not done(got):
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"stream did not deliver in time; got {got}"
        try:
            item = q.get(timeout=remaining)
        except queue.Empty:
            continue
        assert not isinstance(item, grpc.RpcError), item
        got.append(item)
    return got


def scale(stub: operator_pb2_grpc.OperatorServiceStub, key: str, size: int) -> None:
    stub.UpsertGroup(
        operator_pb2.UpsertGroupRequest(key=key, config=operator_pb2.GroupConfig(size=size)), timeout=10
    )


def wait_size(stub: operator_pb2_grpc.OperatorServiceStub, key: str, size: int) -> operator_pb2.GroupStatus:
    def at_size() -> operator_pb2.GroupStatus | None:
        for g in stub.ListGroups(Empty(), timeout=10).groups:
            if g.key == key and g.actual_size == size and len(g.provider_ids) == size:
                found: operator_pb2.GroupStatus = g
                return found
        return None

    return eventually_sync(at_size, what=f"{key} to reach {size}")


def test_two_instance_watchers_both_see_deletions(server: Server) -> None:
    stub = server.stub
    scale(stub, "web", 2)
    created = wait_size(stub, "web", 2)
    calls = [stub.WatchInstances(Empty()), stub.WatchInstances(Empty())]
    for call in calls:
        call.initial_metadata()  # headers are sent once the stream is subscribed
    (first, cancel_first), (second, cancel_second) = (watch(call) for call in calls)
    scale(stub, "web", 0)
    wait_size(stub, "web", 0)
    for q in (first, second):
        events = take_until(q, lambda got: sum(e.status == "deleted" for e in got) >= 2)
        deleted = {e.provider_instance_id for e in events if e.status == "deleted"}
        assert deleted == set(created.provider_ids)
        assert all(e.reason == "scale-down" for e in events)
        # Upstream's operator drains the node of every event but "deleted": only drain notices and
        # deletions are sent, as upstream's server sends them.
        assert {e.status for e in events} <= {"pending_deletion", "deleted"}
    cancel_first()
    cancel_second()


def test_quiet_watch_streams_announce_themselves_with_headers(server: Server) -> None:
    # Nothing is draining and no error happened: without headers a client could not tell a
    # subscribed stream from one still connecting.
    for call in (server.stub.WatchInstances(Empty(), timeout=8), server.stub.WatchErrors(Empty(), timeout=8)):
        started = time.monotonic()
        call.initial_metadata()  # without headers this returns only when the 8 s deadline ends the call
        assert time.monotonic() - started < 4
        call.cancel()


def test_watch_groups_sends_a_snapshot_then_changes(server: Server) -> None:
    q, cancel = watch(server.stub.WatchGroups(Empty()))
    snapshot = take_until(q, lambda got: len(got) >= 3)
    assert {e.group.key for e in snapshot} == {"web", "jobs", "idle"}
    assert all(e.type == operator_pb2.GroupEvent.TYPE_UPSERT for e in snapshot)
    scale(server.stub, "jobs", 1)
    change = take_until(q, lambda got: any(e.group.size == 1 for e in got))
    assert change[-1].group.key == "jobs"
    cancel()
    scale(server.stub, "jobs", 0)
    wait_size(server.stub, "jobs", 0)


def test_on_demand_instance_is_idempotent_not_counted_and_deletable(server: Server) -> None:
    stub = server.stub
    iid = str(new_instance_id("app"))
    request = operator_pb2.CreateInstanceRequest(
        instance_id=iid, config=operator_pb2.InstanceConfig(group="web")
    )
    first = stub.CreateInstance(request, timeout=10)
    again = stub.CreateInstance(request, timeout=10)
    assert first.instance_id == again.instance_id == iid
    status = stub.GetInstanceStatus(operator_pb2.GetInstanceStatusRequest(instance_id=iid), timeout=10)
    assert status.tenant == "default"
    assert status.provider_instance_id
    assert wait_size(stub, "web", 0).actual_size == 0  # on-demand instances are not counted

    with pytest.raises(grpc.RpcError) as err:
        stub.CreateInstance(
            operator_pb2.CreateInstanceRequest(
                instance_id=str(new_instance_id("knc")), config=operator_pb2.InstanceConfig(group="web")
            ),
            timeout=10,
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert 'kind "app"' in (err.value.details() or "")

    deleted = stub.DeleteInstance(operator_pb2.DeleteInstanceRequest(instance_id=iid), timeout=10)
    assert deleted.status == "deleted"
    assert (
        stub.DeleteInstance(operator_pb2.DeleteInstanceRequest(instance_id=iid), timeout=10).status
        == "deleted"
    )
    unknown = str(new_instance_id("app"))
    assert (
        stub.DeleteInstance(operator_pb2.DeleteInstanceRequest(instance_id=unknown), timeout=10).status
        == "unknown"
    )
    with pytest.raises(grpc.RpcError) as missing:
        stub.GetInstanceStatus(operator_pb2.GetInstanceStatusRequest(instance_id=unknown), timeout=10)
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND


def test_concurrent_create_instance_with_one_id_all_get_the_same_instance(server: Server) -> None:
    iid = str(new_instance_id("app"))
    request = operator_pb2.CreateInstanceRequest(
        instance_id=iid, config=operator_pb2.InstanceConfig(group="web")
    )
    futures = [server.stub.CreateInstance.future(request, timeout=10) for _ in range(8)]
    answers = [f.result() for f in futures]  # an ALREADY_EXISTS here raises
    assert {a.instance_id for a in answers} == {iid}
    status = server.stub.GetInstanceStatus(operator_pb2.GetInstanceStatusRequest(instance_id=iid), timeout=10)
    assert status.provider_instance_id
    deleted = server.stub.DeleteInstance(operator_pb2.DeleteInstanceRequest(instance_id=iid), timeout=10)
    assert deleted.status == "deleted"


def test_a_million_instances_or_a_megabyte_var_is_refused_by_the_limits(server: Server) -> None:
    for config, words in (
        (operator_pb2.GroupConfig(size=1_000_000), "1000000 is more than 10000"),
        (operator_pb2.GroupConfig(size=1, vars={"blob": "x" * 1_000_000}), "shard.limits.max_var_bytes"),
    ):
        with pytest.raises(grpc.RpcError) as err:
            server.stub.UpsertGroup(operator_pb2.UpsertGroupRequest(key="web", config=config), timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert words in (err.value.details() or "")
    assert [g.size for g in server.stub.ListGroups(Empty(), timeout=10).groups if g.key == "web"] == [0]


def test_delete_group_is_idempotent_and_keeps_static_groups(server: Server) -> None:
    """DeleteGroup answers OK whenever the group has no dynamic entry, as upstream's does: its
    operator removes an NstanceShardGroup's finalizer only once DeleteGroup succeeds, so an answer of
    NOT_FOUND to a retried call kept the resource in deletion for ever."""
    stub = server.stub
    config = operator_pb2.GroupConfig(template="app", size=0)
    stub.UpsertGroup(operator_pb2.UpsertGroupRequest(key="batch", config=config), timeout=10)
    for _ in range(2):  # the second call is a retry of the first
        stub.DeleteGroup(operator_pb2.DeleteGroupRequest(key="batch"), timeout=10)
    stub.DeleteGroup(operator_pb2.DeleteGroupRequest(key="never-created"), timeout=10)
    stub.DeleteGroup(operator_pb2.DeleteGroupRequest(key="web"), timeout=10)  # static, no overrides
    groups = {g.key: g for g in stub.ListGroups(Empty(), timeout=10).groups}
    assert "batch" not in groups
    assert "never-created" not in groups
    assert groups["web"].is_static


def test_refresh_config_reloads_and_reports_removed_groups(server: Server) -> None:
    stub = server.stub
    q, cancel = watch(stub.WatchGroups(Empty()))
    take_until(q, lambda got: len(got) >= 3)  # snapshot
    before = stub.GetConfigStatus(Empty(), timeout=10).etag
    config = json.loads(json.dumps(server.config))
    config["groups"]["default"]["extra"] = {"template": "app", "size": 0}
    del config["groups"]["default"]["idle"]  # never given a dynamic entry, so it disappears
    server.cluster.write_config(SHARD, config)
    result = stub.RefreshConfig(Empty(), timeout=10)
    assert result.updated
    assert result.prev_etag == before
    assert result.etag != before
    events = take_until(q, lambda got: len(got) >= 2)
    kinds = {(e.group.key, e.type) for e in events}
    assert ("extra", operator_pb2.GroupEvent.TYPE_UPSERT) in kinds
    assert ("idle", operator_pb2.GroupEvent.TYPE_DELETE) in kinds
    assert stub.RefreshConfig(Empty(), timeout=10).updated is False
    cancel()
    server.cluster.write_config(SHARD, server.config)
    stub.RefreshConfig(Empty(), timeout=10)


def test_renew_certificate_issues_a_working_certificate_for_a_new_key(server: Server, tmp_path: Path) -> None:
    key = generate_private_key("ecdsa-p256")
    response = server.stub.RenewCertificate(
        operator_pb2.RenewCertificateRequest(public_key_pem=public_key_to_pem(key.public_key())), timeout=10
    )
    renewed = tmp_path / "renewed"
    renewed.mkdir()
    (renewed / "ca.crt").write_bytes((server.identity / "ca.crt").read_bytes())
    (renewed / "identity.key").write_bytes(private_key_to_pem(key))
    (renewed / "identity.crt").write_bytes(response.client_certificate_pem)
    stub = server.cluster.operator_stub(renewed, server.addrs["operator_addr"])
    assert {g.key for g in stub.ListGroups(Empty(), timeout=10).groups} >= {"web"}
    record = server.cluster.cluster.get("operator/default.test.json")[0]
    assert json.loads(record)["public_key"] == public_key_to_pem(key.public_key()).decode()


def test_list_instances_names_managed_and_on_demand_instances_by_id(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    stub = server.stub
    scale(stub, "idle", 2)
    group = wait_size(stub, "idle", 2)
    iid = str(new_instance_id("app"))
    stub.CreateInstance(
        operator_pb2.CreateInstanceRequest(instance_id=iid, config=operator_pb2.InstanceConfig(group="idle")),
        timeout=10,
    )
    try:
        listed = stub.ListInstances(operator_pb2.ListInstancesRequest(group="idle"), timeout=10).instances
        assert {i.instance_id for i in listed if i.on_demand} == {iid}
        managed = [i for i in listed if not i.on_demand]
        assert sorted(i.provider_instance_id for i in managed) == sorted(group.provider_ids)
        assert all(i.group == "idle" and i.instance_id.startswith("app") for i in listed)
        everything = stub.ListInstances(operator_pb2.ListInstancesRequest(), timeout=10).instances
        assert {i.instance_id for i in listed} <= {i.instance_id for i in everything}
        # In pages of two: the same instances, oldest first, each once.
        pages: list[list[str]] = []
        token = ""
        while not pages or token:
            request = operator_pb2.ListInstancesRequest(page_size=2, page_token=token)
            answer = stub.ListInstances(request, timeout=10)
            pages.append([i.instance_id for i in answer.instances])
            token = answer.next_page_token
        assert len(pages) >= 2
        assert all(len(page) <= 2 for page in pages)
        assert [iid for page in pages for iid in page] == [i.instance_id for i in everything]
        with pytest.raises(grpc.RpcError) as bad:
            stub.ListInstances(operator_pb2.ListInstancesRequest(page_size=2, page_token="x"), timeout=10)
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        monkeypatch.setattr(admin_client, "LIST_PAGE_SIZE", 1)  # nstance-admin below: one per call
        with pytest.raises(grpc.RpcError) as bad:
            stub.ListInstances(operator_pb2.ListInstancesRequest(group="no/such"), timeout=10)
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT

        # nstance-admin shows the same, by instance id.
        result = CliRunner().invoke(
            admin_app,
            [
                "instance", "list", "--group", "idle", "-o", "json", "--shard", SHARD,
                "--servers", f"{SHARD}={server.addrs['operator_addr']}",
                "--identity-dir", str(server.identity),
            ],
        )  # fmt: skip
        assert result.exit_code == 0, result.stderr
        rows = json.loads(result.stdout)
        assert {r["instance_id"] for r in rows} == {i.instance_id for i in listed}
        assert [r["on_demand"] for r in rows if r["instance_id"] == iid] == [True]

        # The live view shows them by ID too, from the same listing (no --instances-dir needed).
        frame = CliRunner().invoke(
            admin_app,
            [
                "watch", "--once", "--shard", SHARD, "--servers", f"{SHARD}={server.addrs['operator_addr']}",
                "--identity-dir", str(server.identity),
            ],
        )  # fmt: skip
        assert frame.exit_code == 0, frame.stderr
        lines = frame.stdout.splitlines()
        assert any(iid in line and "idle (on-demand)" in line for line in lines), frame.stdout
        assert sum(any(i.instance_id in line for line in lines) for i in managed) == 2, frame.stdout
        # A large shard is not listed whole on every redraw: the oldest N, and a line saying there are more.
        frame = CliRunner().invoke(
            admin_app,
            [
                "watch", "--once", "--shard", SHARD, "--servers", f"{SHARD}={server.addrs['operator_addr']}",
                "--identity-dir", str(server.identity), "--max-instances", "1",
            ],
        )  # fmt: skip
        assert frame.exit_code == 0, frame.stderr
        shown = [
            i.instance_id
            for i in everything
            if any(i.instance_id in line for line in frame.stdout.splitlines())
        ]
        assert shown == [everything[0].instance_id], frame.stdout
        assert f"(more instances on {SHARD}: at most 1 per shard are shown" in frame.stdout
    finally:
        stub.DeleteInstance(operator_pb2.DeleteInstanceRequest(instance_id=iid), timeout=10)
        scale(stub, "idle", 0)
        wait_size(stub, "idle", 0)
