"""The operator's shard connections (``ShardSet``) against a real nstance-server process.

What a user sees: Operator API calls go over mTLS with the operator certificate; a shard whose server
dies shows as unreachable and comes back by itself when the server returns (no operator restart);
shards are added, removed and re-addressed from the config without a restart; a renewed certificate
replaces the channels while a stream in flight finishes on the old one.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import grpc.aio
import pytest
from google.protobuf.empty_pb2 import Empty

from nstance.operator.config import ShardEndpoint
from nstance.operator.context import ShardNotConfigured
from nstance.operator.health import OperatorMetrics
from nstance.operator.shards import ShardSet
from nstance.rpc import operator_pb2
from nstance.testing.shardproc import (
    LocalCluster,
    ServerProcess,
    free_port,
    server_addrs,
    shard_config,
    start_leader,
)
from nstance.testing.waiting import eventually

ELECTION = {"frequent_interval": "200ms", "infrequent_interval": "1s", "leader_timeout": "2s"}


class Identity:
    def __init__(self, directory: Path) -> None:
        self.ca = (directory / "ca.crt").read_bytes()
        self.key = (directory / "identity.key").read_bytes()
        self.cert = (directory / "identity.crt").read_bytes()


@pytest.fixture
def shard(tmp_path: Path) -> tuple[LocalCluster, dict[str, str], Path]:
    cluster = LocalCluster(tmp_path / "bucket")
    cluster.init()
    addrs = server_addrs()
    cluster.write_config("zone-a", shard_config(shard="zone-a", addrs=addrs, election=ELECTION))
    return cluster, addrs, tmp_path


def endpoint(addrs: dict[str, str]) -> ShardEndpoint:
    return ShardEndpoint(addrs["registration_addr"], addrs["operator_addr"])


def restart(process: ServerProcess) -> ServerProcess:
    """The same server again (same config, same listener addresses)."""
    again = ServerProcess(
        server_id=process.server_id,
        shard=process.shard,
        bucket=process.bucket,
        cachedir=process.cachedir,
        health_addr=f"127.0.0.1:{free_port()}",
        log_path=process.log_path,
    ).start()
    again.wait_healthy()
    return again


async def test_calls_use_mtls_and_a_dead_server_comes_back_without_a_restart(
    shard: tuple[LocalCluster, dict[str, str], Path],
) -> None:
    cluster, addrs, root = shard
    identity = Identity(cluster.operator_identity(root / "operator"))
    process = start_leader(cluster, root / "server", shard="zone-a")
    metrics = OperatorMetrics()
    shards = ShardSet(identity.ca, identity.cert, identity.key, metrics=metrics, reconnect_max=0.5)
    try:
        shards.update({"zone-a": endpoint(addrs)})
        await eventually(lambda: shards.reachable("zone-a"), what="zone-a reachable")
        response = await shards.stub("zone-a").ListGroups(Empty(), timeout=10)
        assert [g.key for g in response.groups] == ["web"]
        assert metrics.registry.get_sample_value("nstance_operator_shards_reachable") == 1

        process.kill()
        await eventually(lambda: not shards.reachable("zone-a"), what="zone-a unreachable after the kill")
        assert "zone-a" in shards.describe()
        assert metrics.registry.get_sample_value("nstance_operator_shard_reachable", {"shard": "zone-a"}) == 0
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await shards.stub("zone-a").ListGroups(Empty(), timeout=2)
        assert failed.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)

        process = restart(process)
        await eventually(lambda: shards.reachable("zone-a"), what="zone-a reachable again")
        response = await shards.stub("zone-a").ListGroups(Empty(), timeout=10)
        assert [g.key for g in response.groups] == ["web"]
        reconnects = metrics.registry.get_sample_value(
            "nstance_operator_shard_reconnects_total", {"shard": "zone-a"}
        )
        assert reconnects == 1
    finally:
        await shards.close()
        process.stop()


async def test_a_renewed_certificate_replaces_channels_while_streams_in_flight_finish(
    shard: tuple[LocalCluster, dict[str, str], Path],
) -> None:
    cluster, addrs, root = shard
    first = Identity(cluster.operator_identity(root / "first"))
    second = Identity(cluster.operator_identity(root / "second"))
    process = start_leader(cluster, root / "server", shard="zone-a")
    shards = ShardSet(first.ca, first.cert, first.key, grace=1.0)
    try:
        shards.update({"zone-a": endpoint(addrs)})
        old_stub = shards.stub("zone-a")
        # wait_for_ready: a fresh channel's first handshake can fail on a starved machine (seen at load
        # 27: "Handshake read failed"); this test is about the stream once it is up.
        stream = old_stub.WatchGroups(Empty(), wait_for_ready=True)
        snapshot = await asyncio.wait_for(stream.read(), 10)
        assert isinstance(snapshot, operator_pb2.GroupEvent)

        changed = asyncio.create_task(shards.wait_changed())
        shards.set_credentials(second.cert, second.key)
        await asyncio.wait_for(changed, 1)  # stream owners learn that the stubs changed
        new_stub = shards.stub("zone-a")
        assert new_stub is not old_stub
        response = await new_stub.ListGroups(Empty(), timeout=10, wait_for_ready=True)
        assert [g.key for g in response.groups] == ["web"]
        assert not stream.done()  # the old channel lives on for the grace period

        # After the grace period the old channel is closed; grpc.aio ends its calls as cancelled.
        with pytest.raises((asyncio.CancelledError, grpc.aio.AioRpcError)):
            await asyncio.wait_for(stream.read(), 10)
        assert stream.done()
        assert shards.reachable("zone-a")
    finally:
        await shards.close()
        process.stop()


async def test_the_shard_map_follows_the_config_without_a_restart() -> None:
    metrics = OperatorMetrics()
    # No server listens on these ports: the connections fail, and the map is what is tested.
    a = ShardEndpoint(f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}")
    b = ShardEndpoint(f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}")
    moved = ShardEndpoint(a.registration_addr, f"127.0.0.1:{free_port()}")
    shards = ShardSet(b"", b"", b"", metrics=metrics, reconnect_max=0.2)
    try:
        changed = asyncio.create_task(shards.wait_changed())
        shards.update({"zone-a": a})
        await asyncio.wait_for(changed, 1)
        assert list(shards.configured()) == ["zone-a"]
        stub_a = shards.stub("zone-a")

        changed = asyncio.create_task(shards.wait_changed())
        shards.update({"zone-a": a, "zone-b": b})
        await asyncio.wait_for(changed, 1)
        assert list(shards.configured()) == ["zone-a", "zone-b"]
        assert shards.stub("zone-a") is stub_a  # an unchanged shard keeps its connection

        changed = asyncio.create_task(shards.wait_changed())
        shards.update({"zone-a": moved})
        await asyncio.wait_for(changed, 1)
        assert list(shards.configured()) == ["zone-a"]
        assert shards.stub("zone-a") is not stub_a  # re-addressed: a new connection
        assert shards.endpoint("zone-a").operator_addr == moved.operator_addr
        with pytest.raises(ShardNotConfigured, match="'zone-b' is not in the operator config"):
            shards.stub("zone-b")
        assert not shards.reachable("zone-b")

        # Outcomes reported by callers count, until the connection state says otherwise.
        shards.report("zone-a", True)
        assert shards.reachable("zone-a")
        shards.report("zone-a", False, "UNAVAILABLE: connection refused")
        assert not shards.reachable("zone-a")
        assert shards.error("zone-a") == "UNAVAILABLE: connection refused"
        shards.report("zone-x", True)  # unknown shards are ignored
        assert metrics.registry.get_sample_value("nstance_operator_shards_configured") == 1

        unchanged = asyncio.create_task(shards.wait_changed())
        shards.update({"zone-a": moved})
        # A change wakes waiters inside update(); a task started after it runs after such a wake-up, so
        # once it has run the waiter would be done (loop order, not a pause).
        await asyncio.create_task(asyncio.sleep(0))
        assert not unchanged.done()
        unchanged.cancel()
    finally:
        await shards.close()
