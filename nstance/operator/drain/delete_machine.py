"""Deleted step: delete the NstanceMachine's owning CAPI Machine (CAPI cascades to the NstanceMachine).

A Machine already being deleted: nothing. No owner, or the owner is gone: the NstanceMachine itself is
deleted (unless it is already being deleted). Must not: call the shard.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from nstance.operator.crds import names
from nstance.operator.drain.state import DeletedState
from nstance.operator.sync_kinds import CAPI_MACHINES, NSTANCE_MACHINES

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DeleteMachine:
    name: str = "delete_machine"

    async def __call__(self, state: DeletedState) -> None:
        if state.machine is None:
            return
        kube, iid = state.ctx.kube, state.iid
        meta = state.machine.get("metadata") or {}
        name, namespace = str(meta.get("name")), str(meta.get("namespace") or "")
        owners = [
            ref
            for ref in meta.get("ownerReferences") or []
            if ref.get("kind") == names.CAPI_KIND_MACHINE
            and str(ref.get("apiVersion", "")).startswith(f"{names.CAPI_GROUP}/")
        ]
        for owner in owners:
            owner_name = str(owner.get("name"))
            capi_machine = await kube.get(CAPI_MACHINES, owner_name, namespace)
            if capi_machine is None:
                continue
            if (capi_machine.get("metadata") or {}).get("deletionTimestamp"):
                log.info("instance %s: Machine %s/%s is already being deleted", iid, namespace, owner_name)
                return
            await kube.delete(CAPI_MACHINES, owner_name, namespace)
            log.info("instance %s deleted by the server: deleted Machine %s/%s", iid, namespace, owner_name)
            return
        if meta.get("deletionTimestamp"):
            return
        await kube.delete(NSTANCE_MACHINES, name, namespace)
        log.info(
            "instance %s deleted by the server: deleted orphaned NstanceMachine %s/%s", iid, namespace, name
        )
