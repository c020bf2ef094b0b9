"""Each of the drain coordinator's steps on its own (nstance.operator.drain.*), on the in-memory
stand-ins of ``operator_standins``. The whole coordinator against the API emulator and a real shard
server is tests/integration/test_operator_drain.py.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import grpc
import pytest
from operator_standins import NS, FakeKube, Shards, ShardStub, context, rpc_error

from nstance.core.backoff import Backoff
from nstance.core.clock import ManualClock
from nstance.core.steps import Done, run_steps
from nstance.operator.conditions import find_condition
from nstance.operator.context import OperatorContext
from nstance.operator.crds import names
from nstance.operator.drain import steps
from nstance.operator.drain.acknowledge_drain import AcknowledgeDrain
from nstance.operator.drain.cordon_node import CordonNode
from nstance.operator.drain.delete_machine import DeleteMachine
from nstance.operator.drain.evict_pods import EvictPods
from nstance.operator.drain.find_machine import FindMachine
from nstance.operator.drain.find_node import FindNode
from nstance.operator.drain.finish_drain import FinishDrain
from nstance.operator.drain.mark_server_deleted import MarkServerDeleted
from nstance.operator.drain.node_phase import UNLISTED
from nstance.operator.drain.reasons import (
    REASON_BLOCKED,
    REASON_FAILED,
    REASON_RETRYING,
    REASON_STARTED,
    REASON_SUCCEEDED,
    REASON_TIMEOUT,
)
from nstance.operator.drain.record_outcome import RecordOutcome
from nstance.operator.drain.start_drain import StartDrain
from nstance.operator.drain.state import DeletedState, DrainLedger, DrainState, Outcome
from nstance.operator.drain_machines import MachineIndex
from nstance.operator.kube import NODES, PODS, KubeError, Object, Resource
from nstance.operator.sync_kinds import CAPI_MACHINES, NSTANCE_MACHINES
from nstance.rpc import operator_pb2
from nstance.testing.waiting import eventually

IID = "ins-0001"
PROVIDER_ID = "aws:///zone-a/i-0001"
SHARD = "zone-a"
ACK = "AcknowledgeDrained"

log = logging.getLogger("test.drain")


def node(name: str = "node-1", *, unschedulable: bool = False) -> Object:
    return {"metadata": {"name": name}, "spec": {"providerID": PROVIDER_ID, "unschedulable": unschedulable}}


def pod(name: str, *, on: str = "node-1", kind: str = "ReplicaSet", **meta: Any) -> Object:
    return {
        "metadata": {"name": name, "namespace": NS, "ownerReferences": [{"kind": kind}], **meta},
        "spec": {"nodeName": on},
    }


def machine(*, owner: str | None = "web-abc", deleting: bool = False) -> Object:
    meta: dict[str, Any] = {"name": "web-abc-x", "namespace": NS}
    if owner:
        meta["ownerReferences"] = [
            {"kind": names.CAPI_KIND_MACHINE, "apiVersion": f"{names.CAPI_GROUP}/v1beta1", "name": owner}
        ]
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta, "status": {"instanceID": IID, "ready": True}}


@dataclass
class World:
    """The stand-ins, the context built on them and the ledger the steps record into."""

    kube: FakeKube
    shards: Shards
    ctx: OperatorContext
    clock: ManualClock
    machines: MachineIndex
    ledger: DrainLedger = field(default_factory=DrainLedger)

    def drain_state(self, *, deadline_in: float = 60.0, **event: Any) -> DrainState:
        fields = {"instance_id": IID, "provider_instance_id": PROVIDER_ID, "group": "web", **event}
        return DrainState(
            ctx=self.ctx,
            machines=self.machines,
            ledger=self.ledger,
            shard=SHARD,
            event=operator_pb2.InstanceEvent(status="pending_deletion", **fields),
            deadline=self.clock.now() + timedelta(seconds=deadline_in),
            backoff=Backoff(base=0.001, cap=0.002, jitter=0),
        )

    def deleted_state(self, reason: str = "scale-down") -> DeletedState:
        event = operator_pb2.InstanceEvent(instance_id=IID, status="deleted", reason=reason)
        return DeletedState(
            ctx=self.ctx, machines=self.machines, ledger=self.ledger, shard=SHARD, event=event
        )

    def nstance_machine(self) -> Object | None:
        return self.kube.find(NSTANCE_MACHINES, "web-abc-x", NS)

    def start_node_index(self, tasks: list[asyncio.Task[None]]) -> None:
        tasks.append(asyncio.create_task(self.ctx.nodes.run()))


@asynccontextmanager
async def world(*objects: tuple[Resource, Object], nodes_synced: bool = True) -> AsyncIterator[World]:
    kube, shards, clock = FakeKube(), Shards({SHARD: ShardStub()}), ManualClock()
    for res, obj in objects:
        kube.put(res, obj)
    ctx = context(kube, shards, clock, drain_poll=0.001, drain_fallback=60.0)
    machines = MachineIndex(kube)
    indexes = [asyncio.create_task(machines.run())]
    w = World(kube, shards, ctx, clock, machines)
    if nodes_synced:
        w.start_node_index(indexes)
        await ctx.nodes.wait_synced()
    await machines.wait_synced()
    try:
        yield w
    finally:
        for task in indexes:
            task.cancel()
        await asyncio.gather(*indexes, return_exceptions=True)


# --- the lists ----------------------------------------------------------------------------------------


def test_the_lists_run_find_drain_acknowledge_and_clean_up_in_order() -> None:
    assert [s.name for s in steps.STEPS] == [
        "find_node",
        "start_drain",
        "cordon_node",
        "evict_pods",
        "record_outcome",
        "acknowledge_drain",
        "finish_drain",
    ]
    assert [s.name for s in steps.ACKNOWLEDGE_AGAIN_STEPS] == ["acknowledge_drain"]
    assert [s.name for s in steps.DELETED_STEPS] == ["find_machine", "mark_server_deleted", "delete_machine"]


# --- find_node ----------------------------------------------------------------------------------------


async def test_find_node_finds_the_node_by_provider_id_and_sees_it_cordoned() -> None:
    async with world((NODES, node(unschedulable=True))) as w:
        state = w.drain_state()
        await FindNode()(state)
        assert state.node_name == "node-1"
        assert state.cordoned


async def test_find_node_without_a_node_or_provider_id_leaves_none() -> None:
    async with world((NODES, node())) as w:
        no_id = w.drain_state(provider_instance_id="")
        await FindNode()(no_id)
        assert no_id.node is None
        other = w.drain_state(provider_instance_id="aws:///zone-a/i-other")
        await FindNode()(other)
        assert other.node is None
        assert not other.draining


async def test_find_node_waits_for_the_node_index_to_load() -> None:
    async with world((NODES, node()), nodes_synced=False) as w:
        state = w.drain_state()
        finding = asyncio.create_task(FindNode()(state))
        loading: list[asyncio.Task[None]] = []
        w.start_node_index(loading)
        await asyncio.wait_for(finding, 5)
        assert state.node_name == "node-1"  # not "no Node" from the empty index it started with
        loading[0].cancel()


async def test_find_node_gives_up_on_an_unloaded_index_at_the_deadline() -> None:
    async with world((NODES, node()), nodes_synced=False) as w:
        state = w.drain_state(deadline_in=0.0)
        await FindNode()(state)
        assert state.node is None


# --- start_drain --------------------------------------------------------------------------------------


async def test_start_drain_counts_announces_and_marks_the_machine_draining() -> None:
    async with world((NODES, node()), (NSTANCE_MACHINES, machine())) as w:
        state = w.drain_state()
        await FindNode()(state)
        await StartDrain()(state)
        assert w.ledger.started == 1
        assert w.kube.reasons() == [REASON_STARTED]
        draining = find_condition((w.nstance_machine() or {})["status"]["conditions"], names.DRAINING)
        assert draining is not None
        assert draining["status"] == "True"


async def test_start_drain_without_a_node_does_nothing() -> None:
    async with world((NSTANCE_MACHINES, machine())) as w:
        state = w.drain_state()
        await FindNode()(state)
        await StartDrain()(state)
        assert w.ledger.started == 0
        assert w.kube.events == []
        assert w.kube.writes == []


# --- cordon_node --------------------------------------------------------------------------------------


async def test_cordon_node_marks_the_node_unschedulable_once() -> None:
    async with world((NODES, node())) as w:
        state = w.drain_state()
        await FindNode()(state)
        await CordonNode()(state)
        await CordonNode()(state)
        assert (w.kube.find(NODES, "node-1") or {})["spec"]["unschedulable"] is True
        assert w.kube.writes == [("patch", "nodes", "node-1")]
        assert state.draining


async def test_cordon_node_retries_api_errors_reporting_them_once() -> None:
    async with world((NODES, node())) as w:
        state = w.drain_state()
        await FindNode()(state)
        w.kube.fail["patch"] = [KubeError(500, "InternalError", "etcd"), KubeError(503, "Unavailable", "x")]
        await CordonNode()(state)
        assert state.cordoned
        assert state.draining
        assert w.kube.reasons() == [REASON_RETRYING]


async def test_cordon_node_of_a_vanished_node_counts_as_drained() -> None:
    async with world((NODES, node())) as w:
        state = w.drain_state()
        await FindNode()(state)
        del w.kube.objects[("nodes", "", "node-1")]
        await CordonNode()(state)
        assert state.outcome is Outcome.DRAINED
        await EvictPods()(state)  # the drain is over: nothing listed or evicted
        assert w.kube.evicted == []


async def test_cordon_node_at_the_deadline_times_out_without_a_pod_list() -> None:
    async with world((NODES, node())) as w:
        state = w.drain_state(deadline_in=0.0)
        await FindNode()(state)
        w.kube.fail["patch"] = [KubeError(500, "InternalError", "etcd")]
        await CordonNode()(state)
        assert state.outcome is Outcome.TIMED_OUT
        assert state.pods_left == [UNLISTED]


async def test_an_unexpected_error_ends_the_drain_as_failed() -> None:
    async with world((NODES, node())) as w:
        state = w.drain_state()
        await FindNode()(state)
        w.kube.fail["patch"] = [RuntimeError("bug")]
        await CordonNode()(state)
        assert state.outcome is Outcome.FAILED
        assert state.failure == "bug"


# --- evict_pods ---------------------------------------------------------------------------------------


async def test_evict_pods_evicts_all_but_daemonset_mirror_and_terminating_pods() -> None:
    terminating = pod("leaving", deletionTimestamp="2026-01-01T00:00:00Z")
    async with world(
        (NODES, node(unschedulable=True)),
        (PODS, pod("app")),
        (PODS, pod("agent", kind="DaemonSet")),
        (PODS, pod("static", annotations={"kubernetes.io/config.mirror": "x"})),
        (PODS, terminating),
        (PODS, pod("elsewhere", on="node-2")),
    ) as w:
        state = w.drain_state()
        await FindNode()(state)
        finished = asyncio.create_task(EvictPods()(state))
        # The evicted pod is gone; the terminating one is waited for, not evicted again.
        await eventually(lambda: state.pods_left == [f"{NS}/leaving"], within=5, what="only the leaving pod")
        assert w.kube.evicted == [f"{NS}/app"]
        del w.kube.objects[("pods", NS, "leaving")]  # its kubelet finished it
        await asyncio.wait_for(finished, 5)
        assert state.outcome is Outcome.DRAINED
        assert state.pods_left == []
        assert w.kube.evicted == [f"{NS}/app"]


async def test_evict_pods_reports_a_refused_eviction_once_and_times_out_at_the_deadline() -> None:
    async with world((NODES, node(unschedulable=True)), (PODS, pod("guarded"))) as w:
        state = w.drain_state(deadline_in=0.0)
        await FindNode()(state)
        w.kube.refuse_eviction["guarded"] = KubeError(429, "TooManyRequests", "pdb web")
        await EvictPods()(state)
        await EvictPods()(state)  # the drain is over: not tried again
        assert state.outcome is Outcome.TIMED_OUT
        assert state.pods_left == [f"{NS}/guarded"]
        assert w.kube.reasons() == [REASON_BLOCKED]
        assert "pdb web" in w.kube.events[0][1]


# --- record_outcome -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("outcome", "reason", "warning"),
    [
        (Outcome.DRAINED, REASON_SUCCEEDED, False),
        (Outcome.TIMED_OUT, REASON_TIMEOUT, True),
        (Outcome.FAILED, REASON_FAILED, True),
    ],
)
async def test_record_outcome_puts_one_event_on_the_node(
    outcome: Outcome, reason: str, warning: bool
) -> None:
    async with world((NODES, node())) as w:
        state = w.drain_state()
        await FindNode()(state)
        state.outcome = outcome
        state.pods_left = [f"{NS}/p{i}" for i in range(12)]
        await RecordOutcome()(state)
        assert [(r, wa) for r, _, wa in w.kube.events] == [(reason, warning)]
        if outcome is Outcome.TIMED_OUT:
            assert "p9 and 2 more" in w.kube.events[0][1]


# --- acknowledge_drain --------------------------------------------------------------------------------


async def test_acknowledge_drain_retries_until_the_server_answers() -> None:
    async with world() as w:
        stub = w.shards.stubs[SHARD]
        stub.answers[ACK] = [rpc_error(grpc.StatusCode.UNAVAILABLE, "down"), None]
        await AcknowledgeDrain()(w.drain_state())
        assert stub.count(ACK) == 2
        assert IID in w.ledger.acked
        assert w.shards.reports == [(SHARD, False), (SHARD, True)]


@pytest.mark.parametrize(
    "error",
    [
        rpc_error(grpc.StatusCode.NOT_FOUND, "no such instance"),
        rpc_error(grpc.StatusCode.FAILED_PRECONDITION, "instance is not draining"),
    ],
)
async def test_acknowledge_drain_takes_gone_or_not_draining_as_done(error: BaseException) -> None:
    async with world() as w:
        w.shards.stubs[SHARD].answers[ACK] = [error]
        await AcknowledgeDrain()(w.drain_state())
        assert IID in w.ledger.acked
        assert w.shards.stubs[SHARD].count(ACK) == 1


async def test_acknowledge_drain_gives_up_after_the_deadline_and_on_an_unknown_shard() -> None:
    async with world() as w:
        stub = w.shards.stubs[SHARD]
        stub.answers[ACK] = [rpc_error(grpc.StatusCode.FAILED_PRECONDITION, "this server is a standby")] * 50
        state = w.drain_state(deadline_in=-1.0)
        await AcknowledgeDrain()(state)
        assert stub.count(ACK) == 1
        assert IID not in w.ledger.acked
        w.shards.stubs.clear()
        await AcknowledgeDrain()(w.drain_state())
        assert IID not in w.ledger.acked


# --- finish_drain -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("outcome", "reason"),
    [(Outcome.DRAINED, "Drained"), (Outcome.TIMED_OUT, "DrainTimedOut"), (Outcome.FAILED, "DrainFailed")],
)
async def test_finish_drain_remembers_it_and_ends_the_draining_condition(
    outcome: Outcome, reason: str
) -> None:
    async with world((NODES, node()), (NSTANCE_MACHINES, machine())) as w:
        state = w.drain_state()
        await FindNode()(state)
        state.outcome = outcome
        w.clock.advance(5.0)
        await FinishDrain()(state)
        assert w.ledger.finished == {IID: w.clock.monotonic()}
        draining = find_condition((w.nstance_machine() or {})["status"]["conditions"], names.DRAINING)
        assert draining is not None
        assert (draining["status"], draining["reason"]) == ("False", reason)


async def test_finish_drain_without_a_node_only_remembers_it() -> None:
    async with world((NSTANCE_MACHINES, machine())) as w:
        state = w.drain_state()
        await FinishDrain()(state)
        assert IID in w.ledger.finished
        assert w.kube.writes == []


# --- the deleted steps --------------------------------------------------------------------------------


async def test_find_machine_stops_when_no_machine_refers_to_the_instance() -> None:
    async with world() as w:
        with pytest.raises(Done):
            await FindMachine()(w.deleted_state())


async def test_mark_server_deleted_sets_not_ready_server_deleted_and_ends_draining() -> None:
    async with world((NSTANCE_MACHINES, machine())) as w:
        state = w.deleted_state("spot-termination")
        await FindMachine()(state)
        stored = w.nstance_machine() or {}
        stored["status"]["conditions"] = [{"type": names.DRAINING, "status": "True", "reason": "Draining"}]
        await MarkServerDeleted()(state)
        status = (w.nstance_machine() or {})["status"]
        assert status["ready"] is False
        deleted = find_condition(status["conditions"], names.SERVER_DELETED)
        assert deleted is not None
        assert (deleted["status"], deleted["reason"]) == ("True", "SpotTermination")
        draining = find_condition(status["conditions"], names.DRAINING)
        assert draining is not None
        assert draining["status"] == "False"


async def test_mark_server_deleted_stops_when_the_machine_is_gone_meanwhile() -> None:
    async with world((NSTANCE_MACHINES, machine())) as w:
        state = w.deleted_state()
        await FindMachine()(state)
        w.kube.objects.clear()
        with pytest.raises(Done):
            await MarkServerDeleted()(state)


async def test_delete_machine_deletes_the_owning_machine() -> None:
    owner = {"metadata": {"name": "web-abc", "namespace": NS}}
    async with world((NSTANCE_MACHINES, machine()), (CAPI_MACHINES, owner)) as w:
        result = await run_steps(steps.DELETED_STEPS, w.deleted_state(), log)
        assert result.stopped_by is None
        assert ("delete", CAPI_MACHINES.plural, "web-abc") in w.kube.writes
        assert w.nstance_machine() is not None  # CAPI's cascade removes it, not us


async def test_delete_machine_leaves_a_machine_being_deleted_alone() -> None:
    owner = {"metadata": {"name": "web-abc", "namespace": NS, "deletionTimestamp": "2026-01-01T00:00:00Z"}}
    async with world((NSTANCE_MACHINES, machine()), (CAPI_MACHINES, owner)) as w:
        await run_steps(steps.DELETED_STEPS, w.deleted_state(), log)
        assert [write for write in w.kube.writes if write[0] == "delete"] == []


@pytest.mark.parametrize("owner", [None, "gone"])
async def test_delete_machine_deletes_an_orphaned_nstance_machine(owner: str | None) -> None:
    async with world((NSTANCE_MACHINES, machine(owner=owner))) as w:
        state = w.deleted_state()
        await FindMachine()(state)
        await DeleteMachine()(state)
        assert w.nstance_machine() is None
