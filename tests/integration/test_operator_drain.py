"""The drain coordinator against a real shard server (local provider: every instance is a real agent
process that registers) and the Kubernetes API emulator, plus one scripted shard for the dispatch rules.

The group ``web`` has a 30 s drain timeout, so a scale-down drains the registered instances and only an
acknowledgement lets the server delete them earlier.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.empty_pb2 import Empty
from google.protobuf.timestamp_pb2 import Timestamp
from operator_harness import NS, Env, emulator, fast_shard_set

from nstance.operator.config import ShardEndpoint
from nstance.operator.context import ShardNotConfigured, Timings
from nstance.operator.crds import names
from nstance.operator.drain import DrainCoordinator, condition_reason, event_deadline, pods_to_drain
from nstance.operator.kube import EVENTS, NODES, PODS, Kube, Object
from nstance.operator.sync_kinds import CAPI_MACHINES, NSTANCE_MACHINES
from nstance.rpc import operator_pb2, operator_pb2_grpc
from nstance.testing.shardproc import LocalCluster, instance_state, server_addrs, shard_config, start_leader
from nstance.testing.waiting import eventually

pytestmark = pytest.mark.timeout(120)

SHARD = "zone-a"
DRAIN_TIMEOUT = 30.0
TIMINGS = Timings(
    resync=1.0, unreachable_retry=0.5, error_retry=0.5, backoff_base=0.1, backoff_cap=0.5, drain_poll=0.2
)


class Shard:
    """One shard server whose instances are local agent processes."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.cluster = LocalCluster(root / "bucket")
        self.cluster.init()
        self.addrs = server_addrs()
        config = shard_config(
            shard=SHARD,
            addrs=self.addrs,
            provider="local",
            election={"frequent_interval": "200ms", "infrequent_interval": "1s", "leader_timeout": "6s"},
            provider_options={"instances_dir": str(root / "instances"), "stop_instances_on_close": True},
            groups={"web": {"template": "app", "size": 2}},
            shard_extra={"health_check_interval": "1s", "default_drain_timeout": f"{DRAIN_TIMEOUT:g}s"},
        )
        self.cluster.write_config(SHARD, config)
        self.identity = self.cluster.operator_identity(root / "operator")
        self.process = start_leader(self.cluster, root, shard=SHARD, env={"NSTANCE_REPORT_INTERVAL": "300ms"})
        self.stub: operator_pb2_grpc.OperatorServiceStub = self.cluster.operator_stub(
            self.identity, self.addrs["operator_addr"]
        )

    def records(self) -> dict[str, dict[str, Any]]:
        store = self.cluster.shard_store(SHARD)
        found = [json.loads(store.get(key)[0]) for key in store.list("instance/")]
        return {record["instance_id"]: record for record in found}

    def status(self, instance_id: str) -> str:
        return instance_state(self.stub, instance_id)

    def provider_id(self, instance_id: str) -> str:
        request = operator_pb2.GetInstanceStatusRequest(instance_id=instance_id)
        return str(self.stub.GetInstanceStatus(request, timeout=10).provider_instance_id)


@pytest.fixture(scope="module")
def shard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shard]:
    server = Shard(tmp_path_factory.mktemp("operator-drain"))
    yield server
    server.process.stop()


@pytest.fixture
async def env(shard: Shard, tmp_path: Path) -> AsyncIterator[Env]:
    shard_set = fast_shard_set(shard.identity)
    shard_set.update(
        {
            SHARD: ShardEndpoint(
                registration_addr=shard.addrs["registration_addr"], operator_addr=shard.addrs["operator_addr"]
            )
        }
    )
    async with emulator(tmp_path, shard_set, shard_set, TIMINGS) as environment:
        yield environment


async def make_node(kube: Kube, name: str, provider_id: str) -> Object:
    return await kube.create(NODES, {"metadata": {"name": name}, "spec": {"providerID": provider_id}})


async def indexed(env: Env, *provider_ids: str) -> None:
    """Wait until the Node index knows the Nodes of these provider IDs."""

    async def known() -> bool:
        return all(env.ctx.nodes.find(pid) is not None for pid in provider_ids)

    await eventually(known, what=f"Nodes of {provider_ids} in the index")


async def make_pod(
    kube: Kube, name: str, node: str, *, daemonset: bool = False, mirror: bool = False
) -> None:
    meta: dict[str, Any] = {"name": name, "namespace": NS}
    if daemonset:
        meta["ownerReferences"] = [
            {
                "apiVersion": "apps/v1",
                "kind": "DaemonSet",
                "name": "agent",
                "uid": "ds-uid",
                "controller": True,
            }
        ]
    if mirror:
        meta["annotations"] = {"kubernetes.io/config.mirror": "abc"}
    body = {"metadata": meta, "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]}}
    await kube.create(PODS, body, NS)


async def pod_names(kube: Kube, node: str) -> set[str]:
    return {str(p["metadata"]["name"]) for p in await kube.list(PODS, NS, fields=f"spec.nodeName={node}")}


async def node_events(kube: Kube, node: str, reason: str) -> list[Object]:
    """The node's events as ``kubectl describe node`` finds them: in ``default``, naming no namespace."""
    selector = f"involvedObject.kind=Node,involvedObject.name={node},involvedObject.namespace="
    return [e for e in await kube.list(EVENTS, "default", fields=selector) if e.get("reason") == reason]


def condition(obj: Object | None, kind: str) -> dict[str, Any]:
    for item in ((obj or {}).get("status") or {}).get("conditions") or []:
        if item.get("type") == kind:
            return dict(item)
    return {}


# --- pure rules ----------------------------------------------------------------------------------------


def test_daemonset_and_mirror_pods_stay_terminating_pods_are_waited_for() -> None:
    pods: list[dict[str, Any]] = [
        {"metadata": {"name": "app"}},
        {"metadata": {"name": "ds", "ownerReferences": [{"kind": "DaemonSet", "name": "x"}]}},
        {"metadata": {"name": "mirror", "annotations": {"kubernetes.io/config.mirror": "h"}}},
        {"metadata": {"name": "leaving", "deletionTimestamp": "2026-01-01T00:00:00Z"}},
        {"metadata": {"name": "rs", "ownerReferences": [{"kind": "ReplicaSet", "name": "y"}]}},
    ]
    assert [p["metadata"]["name"] for p in pods_to_drain(pods)] == ["app", "leaving", "rs"]


def test_deadline_is_delete_at_else_the_fallback_and_reasons_become_camel_case() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    at = Timestamp()
    at.FromDatetime(now + timedelta(seconds=42))
    with_deadline = operator_pb2.InstanceEvent(instance_id="i", delete_at=at)
    assert event_deadline(with_deadline, now, 300) == now + timedelta(seconds=42)
    assert event_deadline(operator_pb2.InstanceEvent(instance_id="i"), now, 300) == now + timedelta(
        seconds=300
    )
    assert condition_reason("scale-down", "Deleted") == "ScaleDown"
    assert condition_reason("operator-request", "Deleted") == "OperatorRequest"
    assert condition_reason("", "Deleted") == "Deleted"


# --- a scripted shard: the dispatch rules ----------------------------------------------------------------


class ScriptedStream:
    def __init__(self, script: Sequence[operator_pb2.InstanceEvent | asyncio.Event]) -> None:
        self._script = list(script)

    def __aiter__(self) -> AsyncIterator[operator_pb2.InstanceEvent]:
        return self._run()

    async def _run(self) -> AsyncIterator[operator_pb2.InstanceEvent]:
        for step in self._script:
            if isinstance(step, asyncio.Event):
                await step.wait()
            else:
                yield step
        await asyncio.Event().wait()  # then stay open

    def cancel(self) -> bool:
        return True


class ScriptedShard:
    """A ShardAccess whose only shard streams a script and records acknowledgements."""

    def __init__(self, script: Sequence[operator_pb2.InstanceEvent | asyncio.Event]) -> None:
        self.script = script
        self.acks: list[str] = []
        self.acked = [asyncio.Event() for _ in range(4)]
        self.opened = 0

    def configured(self) -> Sequence[str]:
        return ["scripted"]

    def stub(self, shard: str) -> Any:
        if shard != "scripted":
            raise ShardNotConfigured(shard)
        return self

    def reachable(self, shard: str) -> bool:
        return True

    def report(self, shard: str, ok: bool, error: str = "") -> None:
        return None

    async def wait_changed(self) -> None:
        await asyncio.Event().wait()

    def WatchInstances(self, request: Empty) -> ScriptedStream:  # noqa: N802 - the gRPC method name
        self.opened += 1
        return ScriptedStream(self.script)

    async def AcknowledgeDrained(self, request: operator_pb2.DrainAckRequest, **_: Any) -> Empty:  # noqa: N802
        self.acks.append(request.instance_id)
        self.acked[len(self.acks) - 1].set()
        return Empty()


async def test_an_event_after_a_finished_drain_is_acknowledged_again_without_a_second_drain(
    tmp_path: Path,
) -> None:
    first, second = asyncio.Event(), asyncio.Event()
    drain = operator_pb2.InstanceEvent(
        instance_id="i-1", provider_instance_id="p-1", status="pending_deletion", reason="scale-down"
    )
    lonely = operator_pb2.InstanceEvent(
        instance_id="i-2", provider_instance_id="p-unknown", status="pending_deletion", reason="expiry"
    )
    scripted = ScriptedShard([drain, first, drain, second, lonely])
    async with emulator(tmp_path, scripted, None, TIMINGS) as env:
        await make_node(env.kube, "node-1", "fake://region/p-1")
        await indexed(env, "p-1")
        coordinator = DrainCoordinator(env.ctx)
        env.start(coordinator)

        async def acked(n: int) -> bool:
            return len(scripted.acks) >= n

        await eventually(lambda: acked(1), what="the first acknowledgement")
        first.set()
        await eventually(lambda: acked(2), what="the second acknowledgement")
        second.set()
        await eventually(lambda: acked(3), what="the acknowledgement of an instance without a Node")
        assert scripted.acks == ["i-1", "i-1", "i-2"]
        assert coordinator.drains_started == 1
        assert len(await node_events(env.kube, "node-1", "NstanceDrainStarted")) == 1
        node = await env.kube.get(NODES, "node-1")
        assert (node or {})["spec"]["unschedulable"] is True


# --- the real server ---------------------------------------------------------------------------------


async def test_scale_down_drains_both_nodes_concurrently_and_acknowledges_before_the_timeout(
    env: Env, shard: Shard
) -> None:
    async def two_healthy() -> list[str]:
        def check() -> list[str]:
            live = [iid for iid, r in shard.records().items() if r["status"] not in ("deleting", "deleted")]
            healthy = [iid for iid in live if shard.status(iid) == "healthy"]
            return healthy if len(healthy) == 2 else []

        return await asyncio.to_thread(check)

    ids = sorted(await eventually(two_healthy, what="two registered instances", within=40))
    provider = {iid: await asyncio.to_thread(shard.provider_id, iid) for iid in ids}
    nodes = {iid: f"node-{n}" for n, iid in enumerate(ids, 1)}
    fast, slow = ids
    await make_node(env.kube, nodes[fast], f"nstance://zone-a/{provider[fast]}")
    await make_node(env.kube, nodes[slow], f"nstance://zone-a/{provider[slow]}")
    await indexed(env, provider[fast], provider[slow])
    await make_pod(env.kube, "app-1", nodes[fast])
    await make_pod(env.kube, "logs-1", nodes[fast], daemonset=True)
    await make_pod(env.kube, "static-1", nodes[fast], mirror=True)
    await make_pod(env.kube, "app-2", nodes[slow])
    await make_pod(env.kube, "guarded-2", nodes[slow])
    env.api.block_evictions(lambda pod: pod["metadata"]["name"] == "guarded-2")

    coordinator = DrainCoordinator(env.ctx)
    env.start(coordinator)
    started = time.monotonic()
    await asyncio.to_thread(
        shard.stub.UpsertGroup,
        operator_pb2.UpsertGroupRequest(key="web", config=operator_pb2.GroupConfig(size=0)),
        timeout=10,
    )

    def deleted(iid: str) -> Callable[[], Awaitable[bool]]:
        async def check() -> bool:
            records = await asyncio.to_thread(shard.records)
            return records[iid]["status"] in ("deleting", "deleted")

        return check

    # The node without obstacles drains and its instance is deleted while the other drain is stuck.
    await eventually(deleted(fast), what=f"instance {fast} deleted after its drain")
    assert await pod_names(env.kube, nodes[fast]) == {"logs-1", "static-1"}
    assert ((await env.kube.get(NODES, nodes[fast])) or {})["spec"]["unschedulable"] is True
    assert len(await node_events(env.kube, nodes[fast], "NstanceDrainSucceeded")) == 1

    async def blocked() -> list[Object]:
        return await node_events(env.kube, nodes[slow], "NstanceDrainBlocked")

    (event,) = await eventually(blocked, what="the refused eviction recorded on the node")
    assert "guarded-2" in event["message"]
    assert await pod_names(env.kube, nodes[slow]) == {"guarded-2"}
    assert not await deleted(slow)()
    assert slow in coordinator.draining()

    # A reconnect replays the drains in progress: the running one is not started again.
    assert env.shard_set is not None
    identity = shard.identity
    env.shard_set.set_credentials(
        (identity / "identity.crt").read_bytes(), (identity / "identity.key").read_bytes()
    )

    async def replayed() -> bool:
        return coordinator.duplicates_ignored >= 1

    await eventually(replayed, what="the replayed drain event")
    assert coordinator.drains_started == 2

    env.api.block_evictions(None)  # the disruption budget allows it now: the retry succeeds
    await eventually(deleted(slow), what=f"instance {slow} deleted after its drain")
    elapsed = time.monotonic() - started
    assert elapsed < DRAIN_TIMEOUT - 5, f"deleted after {elapsed:.1f}s: the server waited for its own timer"
    assert await pod_names(env.kube, nodes[slow]) == set()
    for node in nodes.values():
        assert len(await node_events(env.kube, node, "NstanceDrainStarted")) == 1
        assert len(await node_events(env.kube, node, "NstanceDrainSucceeded")) == 1
    assert coordinator.drains_started == 2


async def test_a_deleted_instance_marks_its_machine_and_deletes_the_owning_machine(
    env: Env, shard: Shard
) -> None:
    def create() -> str:
        response = shard.stub.CreateInstance(
            operator_pb2.CreateInstanceRequest(config=operator_pb2.InstanceConfig(group="web")), timeout=10
        )
        return str(response.instance_id)

    owned_iid, orphan_iid = await asyncio.to_thread(create), await asyncio.to_thread(create)
    keep = "test.nstance.dev/keep"  # stands in for the NstanceMachine controller's finalizer
    machine = await env.kube.create(
        CAPI_MACHINES,
        {
            "metadata": {"name": "on-demand-a", "namespace": NS},
            "spec": {
                "clusterName": "test--default",
                "bootstrap": {"dataSecretName": ""},
                "infrastructureRef": {
                    "apiGroup": names.GROUP,
                    "kind": names.KIND_MACHINE,
                    "name": "on-demand-a",
                },
            },
        },
        NS,
    )
    owner = {
        "apiVersion": machine["apiVersion"],
        "kind": "Machine",
        "name": "on-demand-a",
        "uid": machine["metadata"]["uid"],
        "controller": True,
    }
    for name, iid, owners in (("on-demand-a", owned_iid, [owner]), ("orphan-b", orphan_iid, [])):
        await env.kube.create(
            NSTANCE_MACHINES,
            {
                "metadata": {"name": name, "namespace": NS, "finalizers": [keep], "ownerReferences": owners},
                "spec": {"group": "web"},
            },
            NS,
        )
        await env.kube.patch(
            NSTANCE_MACHINES, name, {"status": {"instanceID": iid, "ready": True}}, NS, status=True
        )

    coordinator = DrainCoordinator(env.ctx)
    env.start(coordinator)

    # Deletions before the coordinator's stream is up would not reach it. The server answers a quiet
    # stream only with its first event, so delete throwaway instances until one was seen.
    async def subscribed() -> bool:
        if SHARD in coordinator.connected_shards():
            return True
        probe = await asyncio.to_thread(create)
        await asyncio.to_thread(
            shard.stub.DeleteInstance, operator_pb2.DeleteInstanceRequest(instance_id=probe), timeout=10
        )
        await asyncio.sleep(0.2)
        return SHARD in coordinator.connected_shards()

    await eventually(subscribed, what="the WatchInstances stream")
    for iid in (owned_iid, orphan_iid):
        await asyncio.to_thread(
            shard.stub.DeleteInstance, operator_pb2.DeleteInstanceRequest(instance_id=iid), timeout=10
        )

    async def marked(name: str) -> Object | None:
        obj = await env.kube.get(NSTANCE_MACHINES, name, NS)
        return obj if condition(obj, names.SERVER_DELETED).get("status") == "True" else None

    owned = await eventually(lambda: marked("on-demand-a"), what="ServerDeleted on the owned NstanceMachine")
    assert owned["status"]["ready"] is False
    assert condition(owned, names.SERVER_DELETED)["reason"] == "OperatorRequest"

    async def machine_gone() -> bool:
        return await env.kube.get(CAPI_MACHINES, "on-demand-a", NS) is None

    await eventually(machine_gone, what="the owning Machine deleted")
    orphan = await eventually(lambda: marked("orphan-b"), what="ServerDeleted on the orphaned NstanceMachine")

    async def orphan_deleting() -> bool:
        obj = await env.kube.get(NSTANCE_MACHINES, "orphan-b", NS)
        return bool(((obj or {}).get("metadata") or {}).get("deletionTimestamp"))

    await eventually(orphan_deleting, what="the orphaned NstanceMachine deleted directly")
    assert orphan["status"]["ready"] is False
