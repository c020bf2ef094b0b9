"""Conditions on the NstanceMachine of an instance (Draining, ServerDeleted), written by drain steps.

The machine is found through the ``MachineIndex`` (by ``status.instanceID``), read fresh, and its status
patched with the read's resourceVersion, so a concurrent writer of the conditions gets a conflict and
we read again. Must not: raise for API trouble (it is logged; the drain goes on).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from nstance.operator.conditions import find_condition, set_condition
from nstance.operator.context import OperatorContext
from nstance.operator.crds import names
from nstance.operator.drain_machines import MachineIndex
from nstance.operator.kube import KubeError, Object
from nstance.operator.sync_kinds import NSTANCE_MACHINES

log = logging.getLogger(__name__)

CONFLICT_ATTEMPTS = 5
"""Fresh reads after a conflict before the condition is left unset."""


async def set_machine_condition(
    ctx: OperatorContext,
    machines: MachineIndex,
    iid: str,
    kind: str,
    status: bool,
    *,
    reason: str,
    message: str,
    extra: Mapping[str, Any] | None = None,
    also_clear_draining: bool = False,
) -> Object | None:
    """Set a condition (and ``extra`` status fields) on the NstanceMachine of ``iid``, if there is one.

    Returns the machine as last read (None when there is none). Conflicts are retried on a fresh read.
    """
    found = machines.find(iid)
    if found is None:
        return None
    meta = found.get("metadata") or {}
    name, namespace = str(meta.get("name")), str(meta.get("namespace") or "")
    for _ in range(CONFLICT_ATTEMPTS):
        try:
            machine = await ctx.kube.get(NSTANCE_MACHINES, name, namespace)
        except KubeError as exc:
            log.warning("NstanceMachine %s/%s: cannot read it: %s", namespace, name, exc)
            return found
        if machine is None:
            return None
        status_obj = machine.get("status") or {}
        now = ctx.clock.now()
        conditions = set_condition(
            status_obj.get("conditions"), kind, status, reason=reason, message=message, now=now
        )
        draining = find_condition(conditions, names.DRAINING)
        if also_clear_draining and draining is not None and draining.get("status") == "True":
            conditions = set_condition(
                conditions, names.DRAINING, False, reason="InstanceDeleted", message=message, now=now
            )
        patch: dict[str, Any] = {"status": {**dict(extra or {}), "conditions": conditions}}
        version = (machine.get("metadata") or {}).get("resourceVersion")
        if version:  # a concurrent writer of the conditions then gets 409 and we re-read
            patch["metadata"] = {"resourceVersion": version}
        try:
            await ctx.kube.patch(NSTANCE_MACHINES, name, patch, namespace, status=True)
            return machine
        except KubeError as exc:
            if exc.status == 409:
                continue
            if exc.status == 404:
                return None
            log.warning("NstanceMachine %s/%s: cannot set %s: %s", namespace, name, kind, exc)
            return machine
    log.warning(
        "NstanceMachine %s/%s: %s not set (kept conflicting with other writers)", namespace, name, kind
    )
    return found
