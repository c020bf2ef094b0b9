"""Step: UpsertGroup on the shard when the spec changed since it was last applied (or is not Ready).

Skipped when ``status.observedGeneration`` equals ``metadata.generation`` and Ready is True, so a
resync or a status change costs no shard call. Outcomes:

* success - status gets observedGeneration, isStatic, config, replicas (actual size), sorted
  providerIDs, lastSyncTime; Ready/ShardReachable/ConfigValid True;
* shard unreachable or not configured - ShardReachable False, Ready False, a Warning event
  ``ShardUnreachable`` when it becomes so, retry after ``unreachable_retry``;
* refused (INVALID_ARGUMENT, FAILED_PRECONDITION, NOT_FOUND such as an unknown template) -
  ConfigValid False, Ready False reason ConfigInvalid, Warning event; retried only after
  ``error_retry`` or on a spec change (the same request would be refused again);
* any other error - Ready False reason ProviderError, Warning event, retry after ``error_retry``.

Must not: delete groups, or write the spec.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nstance.core.steps import Requeue
from nstance.operator.conditions import find_condition, is_true, timestamp
from nstance.operator.controllers.common import generation, spec, status
from nstance.operator.controllers.shardcalls import Failure, ShardCallError, call
from nstance.operator.controllers.shardgroup.reasons import ShardGroupReason
from nstance.operator.controllers.shardgroup.state import ShardGroupState
from nstance.operator.crds.names import CONFIG_VALID, READY, SHARD_REACHABLE
from nstance.rpc import operator_pb2


def upsert_request(shard_group_spec: Mapping[str, Any]) -> operator_pb2.UpsertGroupRequest:
    """The UpsertGroup request for a shard group's spec (empty strings mean "keep the server's")."""
    variables = shard_group_spec.get("vars") or {}
    return operator_pb2.UpsertGroupRequest(
        key=str(shard_group_spec.get("group") or ""),
        config=operator_pb2.GroupConfig(
            template=str(shard_group_spec.get("template") or ""),
            size=int(shard_group_spec.get("size") or 0),
            instance_type=str(shard_group_spec.get("instanceType") or ""),
            subnet_pool=str(shard_group_spec.get("subnetPool") or ""),
            vars={str(k): str(v) for k, v in variables.items()},
        ),
    )


def status_from_group(group: operator_pb2.GroupStatus) -> dict[str, Any]:
    """The status fields a shard's GroupStatus answer sets."""
    return {
        "isStatic": bool(group.is_static),
        "config": {
            "template": group.template or None,
            "subnetPool": group.subnet_pool or None,
            "instanceType": group.instance_type or None,
            "vars": dict(group.vars) or None,
        },
        "replicas": int(group.actual_size),
        "providerIDs": sorted(group.provider_ids),
    }


@dataclass(frozen=True)
class UpsertGroup:
    name: str = "upsert_group"

    async def __call__(self, state: ShardGroupState) -> None:
        current = status(state.obj)
        if current.get("observedGeneration") == generation(state.obj) and is_true(
            current.get("conditions"), READY
        ):
            return
        request = upsert_request(spec(state.obj))
        try:
            answer = await call(
                state.ctx, state.shard, "UpsertGroup", lambda stub, t: stub.UpsertGroup(request, timeout=t)
            )
        except ShardCallError as exc:
            await self._failed(state, exc)
            return
        reachable_before = find_condition(current.get("conditions"), SHARD_REACHABLE)
        state.status_updates.update(status_from_group(answer))
        state.status_updates["observedGeneration"] = generation(state.obj)
        state.status_updates["lastSyncTime"] = timestamp(state.ctx.clock.now())
        message = (
            f"group {state.group!r} on shard {state.shard!r}: size {request.config.size}, "
            f"{answer.actual_size} running"
        )
        state.set_condition(READY, True, ShardGroupReason.SYNC_SUCCEEDED, message)
        state.set_condition(
            SHARD_REACHABLE, True, ShardGroupReason.REACHABLE, f"shard {state.shard!r} answered"
        )
        state.set_condition(CONFIG_VALID, True, ShardGroupReason.VALID, "the shard accepted the group config")
        if reachable_before is not None and reachable_before.get("status") == "False":
            await state.event("ShardReachable", f"shard {state.shard!r} answers again; group synced")
        state.logger.info("UpsertGroup %s on %s: size %d", state.group, state.shard, request.config.size)

    async def _failed(self, state: ShardGroupState, exc: ShardCallError) -> None:
        timings = state.ctx.timings
        conditions = status(state.obj).get("conditions")
        detail = f"{exc.code}: {exc.details}"
        if exc.failure in (Failure.UNREACHABLE, Failure.NOT_CONFIGURED):
            reason = (
                ShardGroupReason.SHARD_NOT_CONFIGURED
                if exc.failure is Failure.NOT_CONFIGURED
                else ShardGroupReason.SHARD_UNREACHABLE
            )
            message = f"shard {state.shard!r} cannot apply group {state.group!r}: {detail}"
            state.set_condition(SHARD_REACHABLE, False, reason, message)
            state.set_condition(READY, False, reason, message)
            if is_true(conditions, SHARD_REACHABLE) or find_condition(conditions, SHARD_REACHABLE) is None:
                await state.event("ShardUnreachable", message, warning=True)
            await state.write_status()
            raise Requeue(timings.unreachable_retry, message)
        state.set_condition(
            SHARD_REACHABLE, True, ShardGroupReason.REACHABLE, f"shard {state.shard!r} answered"
        )
        previous = find_condition(conditions, READY)
        if exc.failure in (Failure.REFUSED, Failure.NOT_FOUND):
            reason, event = ShardGroupReason.CONFIG_INVALID, "ConfigInvalid"
            message = f"shard {state.shard!r} refused group {state.group!r}: {detail}"
            state.set_condition(CONFIG_VALID, False, reason, message)
        else:
            reason, event = ShardGroupReason.PROVIDER_ERROR, "ProviderError"
            message = f"shard {state.shard!r} failed to apply group {state.group!r}: {detail}"
        state.set_condition(READY, False, reason, message)
        if previous is None or previous.get("reason") != reason or previous.get("message") != message:
            await state.event(event, message, warning=True)
        await state.write_status()
        raise Requeue(timings.error_retry, message)
