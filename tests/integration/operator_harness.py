"""One in-process operator for the integration tests: the API emulator, a Kube client, a context, kopf.

What it runs: the Kubernetes API emulator (``nstance.testing.kubeapi``), either on its own loop in a
thread (for kopf, see ``running_operator``) or on the test's loop (for code that drives the emulator
directly); a ``Kube`` client from a written kubeconfig; an ``OperatorContext`` with a running
``NodeIndex``; the operator's kopf registry in the caller's task; and, for the controller tests, real
``nstance-server`` shard processes reached over grpc.aio mTLS (``TestShards``). ``wait_for`` re-checks a
condition on every API change (``nstance.testing.waiting.eventually`` with ``wake=``).

What it must not do: stub the operator's own code (every handler, controller and client is the real
one), sleep to prove an absence, or start anything it does not stop. It lives here rather than in
``nstance.testing`` because that package sits below the programs (import-linter layers) and must not
import ``nstance.operator`` or kopf.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import kopf
from google.protobuf.empty_pb2 import Empty

from nstance.operator import handlers
from nstance.operator.context import OperatorContext, ShardAccess, ShardNotConfigured, Timings
from nstance.operator.controllers.cluster import ensure_cluster
from nstance.operator.drain import DrainCoordinator
from nstance.operator.kube import EVENTS, Kube, Object, load_configuration
from nstance.operator.nodes import NodeIndex
from nstance.operator.shards import ShardSet
from nstance.rpc import operator_pb2, operator_pb2_grpc
from nstance.testing.kubeapi import KubeAPIServer
from nstance.testing.shardproc import LocalCluster, ServerProcess, free_port, server_addrs, shard_config
from nstance.testing.waiting import eventually, eventually_sync

CRDS = Path(__file__).resolve().parents[2] / "config" / "crd"
NS = "default"


def _wake(loop: asyncio.AbstractEventLoop, event: asyncio.Event) -> None:
    """Set ``event`` from the emulator's thread (store listeners run there)."""
    loop.call_soon_threadsafe(event.set)


@contextlib.contextmanager
def api_changes(server: KubeAPIServer) -> Iterator[asyncio.Event]:
    """An event set on every change in a threaded emulator's store (for ``eventually(wake=...)``)."""
    changed = asyncio.Event()
    loop = asyncio.get_running_loop()
    unsubscribe = server.call(lambda: server.store.subscribe(lambda _event: _wake(loop, changed)))
    try:
        yield changed
    finally:
        server.call(unsubscribe)


async def connect(server: KubeAPIServer, kubeconfig: Path) -> Kube:
    """A ``Kube`` client for ``server`` through a kubeconfig written at ``kubeconfig``."""
    return Kube.from_configuration(await load_configuration(str(server.write_kubeconfig(kubeconfig))))


def operator_context(kube: Kube, shards: ShardAccess, timings: Timings, nodes: NodeIndex) -> OperatorContext:
    """The context the handlers get, for cluster ``test`` in namespace ``default``."""
    return OperatorContext(
        namespace=NS,
        cluster_id="test",
        tenant="default",
        kube=kube,
        shards=shards,
        nodes=nodes,
        timings=timings,
    )


def fast_shard_set(identity: Path) -> ShardSet:
    """The operator's real shard connections with the operator identity in ``identity``, quick to
    reconnect; the caller gives it its endpoints (``update``) and closes it."""
    return ShardSet(
        (identity / "ca.crt").read_bytes(),
        (identity / "identity.crt").read_bytes(),
        (identity / "identity.key").read_bytes(),
        reconnect_min=0.1,
        reconnect_max=0.5,
        grace=0.2,
    )


def fast_nodes(kube: Kube) -> NodeIndex:
    """A Node index that retries a broken watch quickly."""
    return NodeIndex(kube, backoff_base=0.1, backoff_cap=0.5)


@contextlib.asynccontextmanager
async def kopf_running(
    registry: kopf.OperatorRegistry,
    server: KubeAPIServer,
    ctx: OperatorContext | None = None,
    settings: kopf.OperatorSettings | None = None,
) -> AsyncIterator[None]:
    """``registry`` run by kopf against ``server`` in the caller's task until the block ends.

    ``ctx`` goes to the handlers as ``memo.ctx`` (the operator's handlers need it; a bare registry
    testing the emulator does not).

    kopf cancels, when it stops, every task created after it started (it takes them for its own), so
    the operator is started and stopped inside the test's task rather than by an async fixture, whose
    teardown pytest-asyncio runs in a task of its own; and the emulator must run in a thread.
    """

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(server=server.url)

    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(
        kopf.operator(
            registry=registry,
            settings=settings,
            standalone=True,
            clusterwide=True,
            stop_flag=stop,
            ready_flag=ready,
            memo=kopf.Memo(ctx=ctx) if ctx is not None else None,
        )
    )
    try:
        await asyncio.wait_for(ready.wait(), 15)
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, 20)


# --- shard servers ------------------------------------------------------------------------------------


@dataclass
class ShardEnv:
    cluster: LocalCluster
    identity: Path
    addrs: dict[str, dict[str, str]]
    processes: dict[str, ServerProcess]

    def instance_records(self, shard: str) -> list[Path]:
        directory = self.cluster.bucket / "shard" / shard / "instance"
        return sorted(directory.glob("*.json")) if directory.exists() else []


@contextlib.contextmanager
def shard_servers(root: Path, shards: Sequence[str]) -> Iterator[ShardEnv]:
    """One leading ``nstance-server`` (sim provider, group ``web`` of size 0) per shard."""
    cluster = LocalCluster(root / "bucket")
    cluster.init()
    addrs: dict[str, dict[str, str]] = {}
    processes: dict[str, ServerProcess] = {}
    for shard in shards:
        addrs[shard] = server_addrs()
        cluster.write_config(
            shard,
            shard_config(
                shard=shard,
                addrs=addrs[shard],
                provider_options={"latency": "5ms"},
                groups={"web": {"template": "app", "size": 0}},
                # A lease long enough that a busy CI machine does not cost a server its leadership.
                election={"frequent_interval": "200ms", "infrequent_interval": "1s", "leader_timeout": "6s"},
            ),
        )
        processes[shard] = ServerProcess(
            server_id=f"{shard}-s1",
            shard=shard,
            bucket=cluster.bucket,
            cachedir=root / shard / "cache",
            health_addr=f"127.0.0.1:{free_port()}",
            log_path=root / shard / "server.log",
        ).start()
    try:
        for process in processes.values():
            process.wait_healthy()
        eventually_sync(
            lambda: all(p.is_leader() for p in processes.values()), what="the shard servers to lead"
        )
        yield ShardEnv(cluster, cluster.operator_identity(root / "operator"), addrs, processes)
    finally:
        for process in processes.values():
            process.stop()


class TestShards:
    """A ShardAccess over grpc.aio mTLS channels; ``take_down`` points a shard at a closed port."""

    __test__ = False

    def __init__(self, identity: Path, addrs: Mapping[str, str]) -> None:
        self._credentials = grpc.ssl_channel_credentials(
            root_certificates=(identity / "ca.crt").read_bytes(),
            private_key=(identity / "identity.key").read_bytes(),
            certificate_chain=(identity / "identity.crt").read_bytes(),
        )
        self._addrs = dict(addrs)
        self._channels: dict[str, Any] = {}
        self._ok: dict[str, bool] = {}
        self.calls: list[tuple[str, bool, str]] = []
        for shard, addr in self._addrs.items():
            self._channels[shard] = self._channel(addr)
        self._never = asyncio.Event()

    def _channel(self, addr: str) -> Any:
        options = [("grpc.ssl_target_name_override", "nstance-server")]
        return grpc.aio.secure_channel(addr, self._credentials, options=options)

    def configured(self) -> Sequence[str]:
        return list(self._addrs)

    def stub(self, shard: str) -> operator_pb2_grpc.OperatorServiceStub:
        if shard not in self._channels:
            raise ShardNotConfigured(shard)
        return operator_pb2_grpc.OperatorServiceStub(self._channels[shard])

    def reachable(self, shard: str) -> bool:
        return self._ok.get(shard, shard in self._addrs)

    def report(self, shard: str, ok: bool, error: str = "") -> None:
        self._ok[shard] = ok
        self.calls.append((shard, ok, error))

    async def wait_changed(self) -> None:
        await self._never.wait()

    async def take_down(self, shard: str) -> None:
        old = self._channels[shard]
        self._channels[shard] = self._channel(f"127.0.0.1:{free_port()}")
        await old.close()

    async def bring_up(self, shard: str) -> None:
        old = self._channels[shard]
        self._channels[shard] = self._channel(self._addrs[shard])
        await old.close()

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()


# --- the whole operator (kopf) against shard servers --------------------------------------------------


@dataclass
class Operator:
    server: KubeAPIServer
    kube: Kube
    ctx: OperatorContext
    shards: TestShards
    env: ShardEnv
    registry: kopf.OperatorRegistry = field(default_factory=kopf.OperatorRegistry)

    async def wait_for(self, check: Callable[[], Awaitable[bool]], what: str, within: float = 20.0) -> None:
        """Re-check ``check`` after every API change (and every 0.1 s for shard-side state)."""
        with api_changes(self.server) as changed:
            await eventually(check, within=within, what=what, every=0.1, wake=changed)

    async def get(self, res: Any, name: str, namespace: str | None = NS) -> Object | None:
        return await self.kube.get(res, name, namespace)

    async def server_groups(self, shard: str) -> dict[str, operator_pb2.GroupStatus]:
        reply = await self.shards.stub(shard).ListGroups(Empty(), timeout=5)
        return {g.key: g for g in reply.groups}

    async def events(self, reason: str, name: str) -> list[Object]:
        return [
            e
            for e in await self.kube.list(EVENTS, NS)
            if e.get("reason") == reason and (e.get("involvedObject") or {}).get("name") == name
        ]


@contextlib.asynccontextmanager
async def running_operator(shard_env: ShardEnv, tmp_path: Path, timings: Timings) -> AsyncIterator[Operator]:
    """The emulator (in a thread) plus the operator's kopf registry, run in the caller's task."""
    with KubeAPIServer.in_thread(crds=[CRDS]) as server:
        kube = await connect(server, tmp_path / "kubeconfig")
        shards = TestShards(shard_env.identity, {s: a["operator_addr"] for s, a in shard_env.addrs.items()})
        nodes = fast_nodes(kube)
        ctx = operator_context(kube, shards, timings, nodes)
        op = Operator(server, kube, ctx, shards, shard_env)
        handlers.register(op.registry, webhook=False)
        node_task = asyncio.create_task(nodes.run())
        try:
            await ensure_cluster(ctx)
            async with kopf_running(op.registry, server, ctx):
                yield op
        finally:
            node_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await node_task
            await shards.close()
            await kube.close()


# --- the operator's parts on the test's loop (no kopf) -------------------------------------------------


@dataclass
class Env:
    api: KubeAPIServer
    kube: Kube
    ctx: OperatorContext
    shard_set: ShardSet | None
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def start(self, coordinator: DrainCoordinator) -> None:
        self.tasks.append(asyncio.create_task(coordinator.run()))


@contextlib.asynccontextmanager
async def emulator(
    tmp_path: Path, shards: ShardAccess, shard_set: ShardSet | None, timings: Timings
) -> AsyncIterator[Env]:
    """The emulator on this loop, a client, a context with a running Node index; ``shard_set`` is closed
    at the end when given. Every started loop must still be running when the block ends."""
    async with KubeAPIServer(crds=[CRDS]) as api:
        kube = await connect(api, tmp_path / "kubeconfig")
        nodes = fast_nodes(kube)
        env = Env(api, kube, operator_context(kube, shards, timings, nodes), shard_set)
        env.tasks.append(asyncio.create_task(nodes.run()))
        try:
            yield env
            for task in env.tasks:
                assert not task.done(), f"a loop stopped: {task}"
        finally:
            for task in env.tasks:
                task.cancel()
            for task in env.tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            if shard_set is not None:
                await shard_set.close()
            await kube.close()
