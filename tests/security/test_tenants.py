"""Tenant isolation on the Operator API: tenant A's operator cannot see or touch tenant B's things.

The tenant is the O of the caller's certificate, and every operation is scoped by it
(``nstance/server/shard/shard.py``), so to A, B's groups and instances do not exist. What A sees is exactly
what it sees for names and ids that exist nowhere:

* ListGroups lists A's groups only; UpsertGroup of B's group name makes (or refuses to make) a group
  of A's own; DeleteGroup of B's group name changes nothing (DeleteGroup is idempotent, as upstream's,
  so it answers OK) and CreateInstance on it is NOT_FOUND;
* GetInstanceStatus and AcknowledgeDrained of B's instance are NOT_FOUND, DeleteInstance answers
  ``unknown``; CreateInstance reusing B's instance id is FAILED_PRECONDITION, naming neither B nor
  the group;
* WatchGroups, WatchInstances and WatchErrors deliver A's events only, while B's watchers see B's.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import grpc
import grpc.aio
import pytest
from google.protobuf.empty_pb2 import Empty

from nstance.core.ids import new_instance_id
from nstance.rpc import operator_pb2, operator_pb2_grpc
from nstance.testing.securityshard import CALL_TIMEOUT, TENANT_A, TENANT_B, SecurityShard
from nstance.testing.waiting import eventually

pytestmark = pytest.mark.timeout(60)
A_GROUPS = {"web", "needy"}
B_GROUPS = {"secret", "web", "secret-needy"}


def rpc_error(call: Callable[[], object]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value


def groups_of(stub: operator_pb2_grpc.OperatorServiceStub) -> dict[str, operator_pb2.GroupStatus]:
    return {g.key: g for g in stub.ListGroups(Empty(), timeout=CALL_TIMEOUT).groups}


def upsert(stub: operator_pb2_grpc.OperatorServiceStub, key: str, **config: Any) -> operator_pb2.GroupStatus:
    request = operator_pb2.UpsertGroupRequest(key=key, config=operator_pb2.GroupConfig(**config))
    status: operator_pb2.GroupStatus = stub.UpsertGroup(request, timeout=CALL_TIMEOUT)
    return status


def test_an_operator_lists_only_its_own_tenants_groups(shard: SecurityShard) -> None:
    a, b = groups_of(shard.operator(TENANT_A)), groups_of(shard.operator(TENANT_B))
    assert set(a) == A_GROUPS
    assert {g.tenant for g in a.values()} == {TENANT_A}
    assert set(b) == B_GROUPS
    assert {g.tenant for g in b.values()} == {TENANT_B}


def test_another_tenants_groups_cannot_be_changed(shard: SecurityShard) -> None:
    a, b = shard.operator(TENANT_A), shard.operator(TENANT_B)
    before = {key: (g.size, g.etag, dict(g.vars)) for key, g in groups_of(b).items()}

    # B's "secret" does not exist for A: changing it is creating a group of A's own, which needs a template.
    err = rpc_error(lambda: upsert(a, "secret", size=3))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details() == 'group "secret": field "template" is required for a new group'
    a.DeleteGroup(operator_pb2.DeleteGroupRequest(key="secret"), timeout=CALL_TIMEOUT)  # A has none
    err = rpc_error(
        lambda: a.CreateInstance(
            operator_pb2.CreateInstanceRequest(config=operator_pb2.InstanceConfig(group="secret")),
            timeout=CALL_TIMEOUT,
        )
    )
    assert err.code() == grpc.StatusCode.NOT_FOUND
    assert err.details() == f'group "secret" of tenant "{TENANT_A}" does not exist'

    # Both tenants have a "web": A's change stays in A's.
    mine = upsert(a, "web", vars={"owner": TENANT_A})
    assert (mine.tenant, dict(mine.vars)) == (TENANT_A, {"owner": TENANT_A})
    try:
        created = upsert(a, "secret", template="app", size=0)  # A may have a "secret" of its own
        assert created.tenant == TENANT_A
        a.DeleteGroup(operator_pb2.DeleteGroupRequest(key="secret"), timeout=CALL_TIMEOUT)
    finally:
        a.DeleteGroup(operator_pb2.DeleteGroupRequest(key="web"), timeout=CALL_TIMEOUT)  # drops the override

    assert {key: (g.size, g.etag, dict(g.vars)) for key, g in groups_of(b).items()} == before
    assert set(groups_of(a)) == A_GROUPS
    shard.assert_healthy()


def test_another_tenants_instances_cannot_be_seen_or_touched(shard: SecurityShard) -> None:
    a, b = shard.operator(TENANT_A), shard.operator(TENANT_B)
    theirs, _ = shard.create_instance(TENANT_B, "secret")
    nowhere = str(new_instance_id("app"))

    for instance_id in (theirs, nowhere):  # B's instance looks exactly like one that does not exist
        err = rpc_error(
            lambda iid=instance_id: a.GetInstanceStatus(
                operator_pb2.GetInstanceStatusRequest(instance_id=iid), timeout=CALL_TIMEOUT
            )
        )
        assert err.code() == grpc.StatusCode.NOT_FOUND
        assert err.details() == f"instance {instance_id!r} does not exist in this shard"
        err = rpc_error(
            lambda iid=instance_id: a.AcknowledgeDrained(
                operator_pb2.DrainAckRequest(instance_id=iid), timeout=CALL_TIMEOUT
            )
        )
        assert err.code() == grpc.StatusCode.NOT_FOUND
        assert err.details() == f"instance {instance_id!r} does not exist in this shard"
        deleted = a.DeleteInstance(
            operator_pb2.DeleteInstanceRequest(instance_id=instance_id), timeout=CALL_TIMEOUT
        )
        assert deleted.status == "unknown"

    err = rpc_error(
        lambda: a.CreateInstance(
            operator_pb2.CreateInstanceRequest(
                instance_id=theirs, config=operator_pb2.InstanceConfig(group="web")
            ),
            timeout=CALL_TIMEOUT,
        )
    )
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert err.details() == f"instance_id {theirs!r} is already used by another instance"

    status = b.GetInstanceStatus(
        operator_pb2.GetInstanceStatusRequest(instance_id=theirs), timeout=CALL_TIMEOUT
    )
    assert (status.instance_id, status.tenant) == (theirs, TENANT_B)
    assert status.status not in ("deleting", "deleted")
    b.DeleteInstance(operator_pb2.DeleteInstanceRequest(instance_id=theirs), timeout=CALL_TIMEOUT)
    shard.assert_healthy()


class Watch:
    """One open watch stream, its events collected in the background."""

    def __init__(self, call: Any) -> None:
        self.call = call
        self.events: list[Any] = []
        self._task = asyncio.create_task(self._pump())

    async def _pump(self) -> None:
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.CancelledError):
            async for event in self.call:
                self.events.append(event)

    def seen(self, check: Callable[[Any], bool]) -> bool:
        return any(check(event) for event in self.events)

    async def close(self) -> None:
        self.call.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


async def open_watches(stub: operator_pb2_grpc.OperatorServiceStub) -> dict[str, Watch]:
    calls = {
        "groups": stub.WatchGroups(Empty()),
        "instances": stub.WatchInstances(Empty()),
        "errors": stub.WatchErrors(Empty()),
    }
    for call in calls.values():
        await call.initial_metadata()  # sent once the stream is subscribed
    return {name: Watch(call) for name, call in calls.items()}


async def test_watch_streams_deliver_only_the_callers_tenants_events(shard: SecurityShard) -> None:
    a, b = shard.operator(TENANT_A), shard.operator(TENANT_B)
    operators = shard.operators
    async with (
        operators[TENANT_A].aio_channel(shard.addrs["operator_addr"]) as a_channel,
        operators[TENANT_B].aio_channel(shard.addrs["operator_addr"]) as b_channel,
    ):
        mine = await open_watches(operator_pb2_grpc.OperatorServiceStub(a_channel))
        theirs = await open_watches(operator_pb2_grpc.OperatorServiceStub(b_channel))
        try:
            # B makes one event of each kind, and its own watchers see them.
            upsert(b, "secret", vars={"rotated": "yes"})
            b_instance, _ = shard.create_instance(TENANT_B, "secret")
            b.DeleteInstance(operator_pb2.DeleteInstanceRequest(instance_id=b_instance), timeout=CALL_TIMEOUT)
            upsert(b, "secret-needy", size=1)
            await eventually(
                lambda: (
                    theirs["groups"].seen(lambda e: e.group.key == "secret" and e.group.vars.get("rotated"))
                    and theirs["instances"].seen(
                        lambda e: e.instance_id == b_instance and e.status == "deleted"
                    )
                    and theirs["errors"].seen(lambda e: e.group == "secret-needy")
                ),
                within=15,
                what="tenant B's own events",
            )

            # Then A makes its own: once A's watchers have those, B's would have come before them.
            upsert(a, "needy", size=1)
            a_instance, _ = shard.create_instance(TENANT_A, "web")
            a.DeleteInstance(operator_pb2.DeleteInstanceRequest(instance_id=a_instance), timeout=CALL_TIMEOUT)
            await eventually(
                lambda: (
                    mine["groups"].seen(lambda e: e.group.key == "needy" and e.group.size == 1)
                    and mine["instances"].seen(
                        lambda e: e.instance_id == a_instance and e.status == "deleted"
                    )
                    and mine["errors"].seen(lambda e: e.group == "needy")
                ),
                within=15,
                what="tenant A's own events",
            )
        finally:
            for watch in [*mine.values(), *theirs.values()]:
                await watch.close()
            for stub, key in ((a, "needy"), (b, "secret-needy"), (b, "secret")):
                stub.DeleteGroup(operator_pb2.DeleteGroupRequest(key=key), timeout=CALL_TIMEOUT)

    assert {e.group.tenant for e in mine["groups"].events} == {TENANT_A}
    assert {e.group.key for e in mine["groups"].events} <= A_GROUPS
    assert {e.tenant for e in mine["instances"].events} == {TENANT_A}
    assert b_instance not in {e.instance_id for e in mine["instances"].events}
    assert {e.group for e in mine["errors"].events} == {"needy"}
    shard.assert_healthy()
