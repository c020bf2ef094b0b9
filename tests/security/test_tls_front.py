"""The OpenSSL front of the mTLS ports: nothing reaches a servicer without a verified certificate.

A real server in this process (file storage, sim provider). The gRPC servers behind the front listen
on Unix sockets in a private directory; a process that connects there directly (as only the server's
own user could) presents no certificate the front verified, so every call is refused. The front runs
in a child process; if that process dies, the server starts a new one on the same listening sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import stat
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import grpc.aio
import pytest
from google.protobuf.empty_pb2 import Empty

from nstance.rpc import operator_pb2_grpc
from nstance.server.app import ServerApp, ServerOptions
from nstance.testing.identities import make_identity
from nstance.testing.shardproc import ENCRYPTION_KEY_B64, LocalCluster, server_addrs, shard_config
from nstance.testing.waiting import eventually

pytestmark = pytest.mark.timeout(120)
SHARD = "zone-a"
CLUSTER = "front"


@contextlib.asynccontextmanager
async def serving(tmp_path: Path) -> AsyncIterator[tuple[ServerApp, LocalCluster, dict[str, str]]]:
    cluster = LocalCluster(tmp_path / "bucket", cluster_id=CLUSTER)
    cluster.init()
    addrs = server_addrs()
    cluster.write_config(SHARD, shard_config(cluster_id=CLUSTER, shard=SHARD, addrs=addrs))
    app = ServerApp(
        ServerOptions(
            server_id="s1",
            shard=SHARD,
            storage="file",
            bucket=str(cluster.bucket),
            cachedir=tmp_path / "cache",
            health_addr=addrs["health_addr"],
            environ={"NSTANCE_ENCRYPTION_KEY": ENCRYPTION_KEY_B64},
        )
    )
    stop = asyncio.Event()
    task = asyncio.create_task(app.run(stop))
    try:
        await eventually(lambda: app.tls_front is not None, within=30, what="the mTLS ports")
        yield app, cluster, addrs
    finally:
        stop.set()
        assert await asyncio.wait_for(task, 30) == 0


async def list_groups(channel: grpc.aio.Channel) -> grpc.aio.AioRpcError | None:
    try:
        await operator_pb2_grpc.OperatorServiceStub(channel).ListGroups(Empty(), timeout=5)
    except grpc.aio.AioRpcError as exc:
        return exc
    return None


async def test_a_direct_connection_to_the_grpc_socket_is_refused(tmp_path: Path) -> None:
    async with serving(tmp_path) as (app, _, _):
        front = app.tls_front
        assert front is not None
        backend = front.backends[0]
        assert backend.name == "operator_addr.sock"
        assert stat.S_IMODE(os.stat(backend.parent).st_mode) == 0o700
        async with grpc.aio.insecure_channel(f"unix:{backend}") as channel:
            err = await list_groups(channel)
        assert err is not None
        assert err.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "requires a client certificate" in (err.details() or "")


async def test_the_front_process_is_restarted_and_serves_again(tmp_path: Path) -> None:
    async with serving(tmp_path) as (app, cluster, addrs):
        front = app.tls_front
        assert front is not None
        assert cluster.identity is not None
        identity = make_identity(cluster.identity.ca, role="operator", tenant="default", client_id=CLUSTER)
        async with identity.aio_channel(addrs["operator_addr"]) as channel:
            await eventually(lambda: _ok(channel), within=20, what="the operator API")
        first = front.pid
        assert first is not None
        os.kill(first, signal.SIGKILL)
        await eventually(lambda: front.pid not in (None, first), within=20, what="a new front process")
        async with identity.aio_channel(addrs["operator_addr"]) as channel:
            await eventually(lambda: _ok(channel), within=20, what="the operator API after the restart")


async def _ok(channel: grpc.aio.Channel) -> bool:
    return await list_groups(channel) is None
