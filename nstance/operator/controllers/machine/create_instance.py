"""Step: CreateInstance with the instance ID saved in status (once; idempotent if repeated).

Skipped once the InstanceCreated condition is True. The server refuses an ID whose 3-letter prefix
is not its template's kind (INVALID_ARGUMENT, nothing created); the step then saves an ID of the
kind the server named and tries again at once. Other failures: unreachable shard - retry after
``unreachable_retry``; refused (unknown group, bad instance type) or other errors - Ready False with
a Warning event, retry after ``error_retry``. Must not: choose the shard (``choose_instance`` did).
"""

from __future__ import annotations

from dataclasses import dataclass

from nstance.core.ids import new_puid
from nstance.core.steps import Requeue
from nstance.operator.conditions import find_condition, is_true
from nstance.operator.controllers.common import spec, status
from nstance.operator.controllers.machine.placement import expected_kind
from nstance.operator.controllers.machine.reasons import INSTANCE_CREATED, MachineReason
from nstance.operator.controllers.machine.state import MachineState
from nstance.operator.controllers.shardcalls import Failure, ShardCallError, call
from nstance.operator.crds.names import READY, SHARD_REACHABLE
from nstance.rpc import operator_pb2

MAX_KIND_RETRIES = 2


def create_request(state: MachineState) -> operator_pb2.CreateInstanceRequest:
    machine_spec = spec(state.obj)
    variables = machine_spec.get("vars") or {}
    return operator_pb2.CreateInstanceRequest(
        instance_id=state.instance_id(),
        config=operator_pb2.InstanceConfig(
            group=state.group,
            instance_type=str(machine_spec.get("instanceType") or ""),
            vars={str(k): str(v) for k, v in variables.items()},
        ),
    )


async def send_create(
    state: MachineState, shard: str, request: operator_pb2.CreateInstanceRequest
) -> operator_pb2.CreateInstanceResponse:
    answer: operator_pb2.CreateInstanceResponse = await call(
        state.ctx, shard, "CreateInstance", lambda stub, t: stub.CreateInstance(request, timeout=t)
    )
    return answer


@dataclass(frozen=True)
class CreateInstance:
    name: str = "create_instance"

    async def __call__(self, state: MachineState) -> None:
        if is_true(state.current_status().get("conditions"), INSTANCE_CREATED):
            return
        shard = state.shard()
        for _attempt in range(MAX_KIND_RETRIES + 1):
            try:
                answer = await send_create(state, shard, create_request(state))
            except ShardCallError as exc:
                kind = expected_kind(exc.details) if exc.failure is Failure.REFUSED else None
                if kind is None:
                    await self._failed(state, exc)
                    return
                instance_id = str(new_puid(kind))
                state.logger.info(
                    "shard %s creates instances of kind %r for group %s; using %s",
                    shard,
                    kind,
                    state.group,
                    instance_id,
                )
                state.status_updates["instanceID"] = instance_id
                await state.write_status()
                continue
            state.set_condition(
                INSTANCE_CREATED,
                True,
                MachineReason.CREATED,
                f"instance {answer.instance_id} on shard {shard!r}",
            )
            state.set_condition(SHARD_REACHABLE, True, MachineReason.REACHABLE, f"shard {shard!r} answered")
            await state.write_status()
            await state.event("InstanceCreated", f"created instance {answer.instance_id} on shard {shard!r}")
            return
        message = f"shard {shard!r} kept refusing the instance ID's kind; giving up for now"
        state.set_condition(READY, False, MachineReason.CREATE_REFUSED, message)
        await state.write_status()
        raise Requeue(state.ctx.timings.error_retry, message)

    async def _failed(self, state: MachineState, exc: ShardCallError) -> None:
        timings = state.ctx.timings
        detail = f"CreateInstance {state.instance_id()} on shard {exc.shard!r}: {exc.code}: {exc.details}"
        if exc.failure in (Failure.UNREACHABLE, Failure.NOT_CONFIGURED):
            reason = (
                MachineReason.SHARD_NOT_CONFIGURED
                if exc.failure is Failure.NOT_CONFIGURED
                else MachineReason.SHARD_UNREACHABLE
            )
            state.set_condition(SHARD_REACHABLE, False, reason, detail)
            state.set_condition(READY, False, reason, detail)
            await state.write_status()
            raise Requeue(timings.unreachable_retry, detail)
        refused = exc.failure in (Failure.REFUSED, Failure.NOT_FOUND)
        reason = MachineReason.CREATE_REFUSED if refused else MachineReason.PROVIDER_ERROR
        previous = find_condition(status(state.obj).get("conditions"), READY)
        state.set_condition(READY, False, reason, detail)
        await state.write_status()
        if previous is None or previous.get("message") != detail:
            await state.event("CreateInstanceFailed", detail, warning=True)
        raise Requeue(timings.error_retry, detail)
