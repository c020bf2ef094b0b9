"""nstance-server as a user runs it: real processes, real mTLS gRPC, file:// storage, the sim provider.

The sim provider persists its VM table to a file that every server process of the test shares, so what
one process launched another can see - the way a real cloud outlives the servers that drive it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.empty_pb2 import Empty

from nstance.rpc import operator_pb2, operator_pb2_grpc
from nstance.server.state.context import FAULT_ENV, FAULT_EXIT_CODE
from nstance.testing.shardproc import LocalCluster, ServerProcess, free_port, server_addrs, shard_config
from nstance.testing.waiting import eventually_sync

pytestmark = pytest.mark.timeout(120)

SHARD = "zone-a"
FREQUENT = 0.3
LEADER_TIMEOUT = 1.5
GRACE = min(1.0, FREQUENT / 2)
ELECTION = {"frequent_interval": "300ms", "infrequent_interval": "2s", "leader_timeout": "1500ms"}


class Env:
    """One test's cluster, config and server processes."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.cluster = LocalCluster(tmp_path / "bucket")
        self.cluster.init()
        self.addrs = server_addrs()
        self.sim_state = tmp_path / "sim-cloud.json"
        self.identity = self.cluster.operator_identity(tmp_path / "operator")
        self.servers: list[ServerProcess] = []

    def advertised(self) -> dict[str, str]:
        """Port-only: each server's --advertise-host fills health and election, its --bind-host the rest."""
        return {name: ":" + addr.rsplit(":", 1)[1] for name, addr in self.addrs.items()}

    def configure(self, *, groups: dict[str, Any] | None = None, latency: str = "5ms") -> None:
        config = shard_config(
            shard=SHARD,
            addrs=self.addrs,
            provider_options={"state_file": str(self.sim_state), "latency": latency},
            groups=groups,
            election=ELECTION,
            shard_extra={"advertise": self.advertised()},
        )
        config["templates"]["other"] = {"kind": "oth", "arch": "amd64", "subnet_pool": "default"}
        self.cluster.write_config(SHARD, config)

    def start(
        self, server_id: str, host: str = "127.0.0.1", env: dict[str, str] | None = None
    ) -> ServerProcess:
        server = ServerProcess(
            server_id=server_id,
            shard=SHARD,
            bucket=self.cluster.bucket,
            cachedir=self.tmp / f"cache-{server_id}",
            health_addr=f"{host}:{free_port()}",
            env=env or {},
            args=["--bind-host", host, "--advertise-host", host],
            log_path=self.tmp / f"{server_id}-{len(self.servers)}.log",
        ).start()
        self.servers.append(server)
        return server

    def operator_addr(self, host: str) -> str:
        return f"{host}:{self.addrs['operator_addr'].rsplit(':', 1)[1]}"

    def stub(self, host: str = "127.0.0.1") -> operator_pb2_grpc.OperatorServiceStub:
        return self.cluster.operator_stub(self.identity, self.operator_addr(host))

    def vms(self) -> list[dict[str, Any]]:
        """Every VM the simulated cloud has, including deleted ones."""
        if not self.sim_state.exists():
            return []
        data = json.loads(self.sim_state.read_text())
        vms: list[dict[str, Any]] = list(data["vms"])
        return vms

    def live_vms(self) -> list[dict[str, Any]]:
        return [vm for vm in self.vms() if vm["deleted_at"] is None]

    def records(self) -> dict[str, dict[str, Any]]:
        store = self.cluster.shard_store(SHARD)
        out = {}
        for key in store.list("instance/"):
            doc = json.loads(store.get(key)[0])
            out[doc["instance_id"]] = doc
        return out

    def stop_all(self) -> None:
        for server in self.servers:
            server.stop()


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    e = Env(tmp_path)
    try:
        yield e
    finally:
        e.stop_all()


def upsert(stub: operator_pb2_grpc.OperatorServiceStub, key: str, **config: Any) -> operator_pb2.GroupStatus:
    request = operator_pb2.UpsertGroupRequest(key=key, config=operator_pb2.GroupConfig(**config))
    status: operator_pb2.GroupStatus = stub.UpsertGroup(request, timeout=10)
    return status


def group(stub: operator_pb2_grpc.OperatorServiceStub, key: str) -> operator_pb2.GroupStatus:
    for status in stub.ListGroups(Empty(), timeout=10).groups:
        if status.key == key:
            found: operator_pb2.GroupStatus = status
            return found
    raise AssertionError(f"group {key} not listed")


def converged(env: Env, stub: operator_pb2_grpc.OperatorServiceStub, size: int) -> Callable[[], bool]:
    def check() -> bool:
        status = group(stub, "web")
        return status.actual_size == size and len(env.live_vms()) == size

    return check


def became_leader(server: ServerProcess) -> int:
    """How often ``server`` became the shard's leader (its ``nstance_leader_changes_total``)."""
    status, text = server.http("/metrics")
    assert status == 200, text
    prefix = 'nstance_leader_changes_total{scope="shard"} '
    return sum(int(float(line[len(prefix) :])) for line in text.splitlines() if line.startswith(prefix))


def reconcile_times(server: ServerProcess) -> list[datetime]:
    return [
        datetime.fromisoformat(entry["time"])
        for entry in server.log_entries()
        if entry["msg"].startswith("reconcile ") and "create" in entry["msg"]
    ]


def test_two_servers_one_leader_and_failover_within_timeout(env: Env) -> None:
    env.configure(groups={"web": {"template": "app", "size": 3}})
    a = env.start("server-a", "127.0.0.2")
    b = env.start("server-b", "127.0.0.3")
    a.wait_healthy()
    b.wait_healthy()
    eventually_sync(lambda: a.is_leader() or b.is_leader(), what="a leader")
    leader, follower = (a, b) if a.is_leader() else (b, a)
    leader_host, follower_host = ("127.0.0.2", "127.0.0.3") if leader is a else ("127.0.0.3", "127.0.0.2")
    eventually_sync(converged(env, env.stub(leader_host), 3), what="3 instances")
    # One leader all along: each server counts the times it became leader (history, not samples). The
    # standby never did; the leader may have lost and won its own lock again on a starved machine.
    assert became_leader(follower) == 0
    assert became_leader(leader) >= 1

    leader.kill()
    killed_at = time.monotonic()
    eventually_sync(follower.is_leader, within=10, what="the follower to lead")
    took = time.monotonic() - killed_at
    # The follower must wait out the lock (no split brain), and must not wait much longer.
    assert took <= LEADER_TIMEOUT + FREQUENT + GRACE + 0.3, f"failover took {took:.2f}s"

    stub = env.stub(follower_host)
    upsert(stub, "web", size=4)
    eventually_sync(converged(env, stub, 4), what="4 instances after failover")
    live = env.live_vms()
    assert len({vm["instance_id"] for vm in live}) == 4  # no duplicate
    assert set(env.records()) >= {vm["instance_id"] for vm in live}  # every VM explained by a record
    # No group was reconciled by both: every reconcile by the dead leader precedes every one by the new.
    old, new = reconcile_times(leader), reconcile_times(follower)
    assert old
    assert new
    assert max(old) < min(new)


def test_standby_answers_reads_and_refuses_changes_naming_the_leader(env: Env) -> None:
    env.configure()
    a = env.start("server-a", "127.0.0.2")
    a.wait_healthy()
    eventually_sync(a.is_leader, what="server-a to lead")
    b = env.start("server-b", "127.0.0.3")
    assert "standby" in b.wait_healthy()
    assert b.http("/leader/health")[0] == 503
    standby = env.stub("127.0.0.3")

    assert [g.key for g in standby.ListGroups(Empty(), timeout=10).groups] == ["web"]
    assert standby.GetConfigStatus(Empty(), timeout=10).etag
    with pytest.raises(grpc.RpcError) as err:
        upsert(standby, "web", size=2)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert env.operator_addr("127.0.0.2") in (err.value.details() or "")
    assert group(env.stub("127.0.0.2"), "web").size == 0  # nothing changed


def test_static_group_refuses_template_change_but_allows_size(env: Env) -> None:
    env.configure()
    server = env.start("server-a")
    server.wait_healthy()
    eventually_sync(server.is_leader, what="leadership")
    stub = env.stub()

    with pytest.raises(grpc.RpcError) as err:
        upsert(stub, "web", template="other", size=1)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert '"template"' in (err.value.details() or "")
    assert group(stub, "web").size == 0

    status = upsert(stub, "web", size=2)
    assert status.size == 2
    assert status.is_static
    eventually_sync(converged(env, stub, 2), what="2 instances")


def test_sim_scale_0_20_5_0_converges_without_leak_or_duplicate(env: Env) -> None:
    env.configure()
    server = env.start("server-a")
    server.wait_healthy()
    eventually_sync(server.is_leader, what="leadership")
    stub = env.stub()
    for size in (20, 5, 0):
        upsert(stub, "web", size=size)
        eventually_sync(converged(env, stub, size), what=f"{size} instances")
    vms = env.vms()
    assert len(vms) == 20  # exactly 20 launches over the whole run: no duplicate create
    assert len({vm["instance_id"] for vm in vms}) == 20
    assert env.live_vms() == []  # no leak
    # the last step of a delete marks the record; it lands just after the VM is gone
    eventually_sync(
        lambda: all(rec["status"] == "deleted" for rec in env.records().values()), what="deleted records"
    )
    assert len(env.records()) == 20


@pytest.mark.parametrize("keep_cache", [True, False], ids=["same-cache", "fresh-cache"])
def test_crash_between_provider_create_and_record_update(env: Env, keep_cache: bool) -> None:
    env.configure()
    crashing = env.start("server-a", env={FAULT_ENV: "after-provider-create"})
    crashing.wait_healthy()
    eventually_sync(crashing.is_leader, what="leadership")
    upsert(env.stub(), "web", size=3)
    assert crashing.proc is not None
    assert crashing.proc.wait(20) == FAULT_EXIT_CODE
    launched = env.live_vms()
    assert len(launched) >= 1  # the provider made VMs the records do not yet name
    assert any(not env.records()[vm["instance_id"]].get("provider_instance_id") for vm in launched)

    if not keep_cache:
        (env.tmp / "cache-server-a" / "db" / "nstance.db").unlink()
    restarted = env.start("server-a")
    restarted.wait_healthy()
    eventually_sync(restarted.is_leader, within=15, what="leadership after restart")
    stub = env.stub()
    eventually_sync(converged(env, stub, 3), what="3 instances after restart")

    live = env.live_vms()
    assert len({vm["instance_id"] for vm in live}) == 3
    records = env.records()
    for vm in launched:  # the VMs made before the crash were adopted, not duplicated or leaked
        assert vm["instance_id"] in {v["instance_id"] for v in live}
        assert records[vm["instance_id"]]["provider_instance_id"] == vm["provider_id"]
    assert len(env.vms()) == 3  # nothing else was ever launched


def test_a_restart_with_a_corrupt_cache_file_rebuilds_it_and_touches_no_vm(env: Env) -> None:
    env.configure(groups={"web": {"template": "app", "size": 2}})
    first = env.start("server-a")
    first.wait_healthy()
    eventually_sync(first.is_leader, what="leadership")
    eventually_sync(converged(env, env.stub(), 2), what="2 instances")
    before = sorted(vm["provider_id"] for vm in env.live_vms())
    assert first.stop() == 0
    cache = env.tmp / "cache-server-a" / "db" / "nstance.db"
    cache.write_bytes(b"\xa5" * 8192)  # what a bad disk leaves behind

    restarted = env.start("server-a")
    restarted.wait_healthy()
    eventually_sync(restarted.is_leader, within=15, what="leadership after restart")
    eventually_sync(converged(env, env.stub(), 2), what="2 instances after restart")
    assert sorted(vm["provider_id"] for vm in env.live_vms()) == before  # nothing deleted or recreated
    assert len(env.vms()) == 2
    log = restarted.log_text()
    assert "is corrupt" in log
    assert "Traceback" not in log
    assert [p.name for p in cache.parent.iterdir() if ".corrupt-" in p.name]


def test_cluster_scope_in_a_separate_bucket(env: Env, tmp_path: Path) -> None:
    other = LocalCluster(tmp_path / "cluster-bucket")
    other.init()
    config = shard_config(shard=SHARD, addrs=env.addrs, election=ELECTION)
    config["shard"]["advertise"] = env.advertised()
    config["cluster"]["storage"] = {"provider": "file", "bucket": str(other.bucket), "prefix": "cluster/"}
    env.cluster.write_config(SHARD, config)
    server = env.start("server-a")
    server.wait_healthy()
    eventually_sync(server.is_leader, what="leadership")
    assert other.cluster.exists("leader.json")  # the cluster election runs in the cluster bucket
    identity = other.operator_identity(tmp_path / "other-operator")
    stub = other.operator_stub(identity, env.addrs["operator_addr"])
    assert [g.key for g in stub.ListGroups(Empty(), timeout=10).groups] == ["web"]  # served with that CA


def test_bad_config_is_reported_on_health_and_retried_until_fixed(env: Env) -> None:
    env.configure()
    good = env.cluster.shard_store(SHARD).get("config.jsonc")[0]
    bad = json.loads(good)
    bad["shard"]["leader_election"]["leader_timeout"] = "100ms"  # must exceed frequent_interval
    env.cluster.write_config(SHARD, bad)
    server = env.start("server-a")

    def reported() -> bool:
        code, body = server.http("/health")
        return code == 503 and "shard.leader_election.leader_timeout" in body

    eventually_sync(reported, what="the config error on /health")
    assert server.http("/leader/health")[0] == 503
    assert any("shard.leader_election.leader_timeout" in e["msg"] for e in server.log_entries())
    env.cluster.shard_store(SHARD).put("config.jsonc", good)
    assert server.wait_healthy(timeout=30).startswith("ok")  # picked up by the retry, no restart
