"""What must hold after a simulated run: the promises Nstance makes, checked on the end state.

* **Never two leaders acting** - checked while the run happens (``World.check_acting``); its
  violations are reported here.
* **No leaked VM**: every VM the cloud runs has an instance record that is not deleted or failed.
* **No duplicate VM**: one VM per instance id.
* **Groups converge**: each group has exactly its desired number of VMs, and every one of them has an
  agent that registered and still reports (a VM whose agent died was replaced). On-demand VMs count
  toward no size and are never replaced (``on_demand`` has their promises).
* **No dynamic group update lost**: each group's size is the last size an acknowledged UpsertGroup set,
  or one of the sizes of later attempts whose outcome the client could not know; a group the last
  acknowledged DeleteGroup removed is gone (``group_edits`` checks instance types the same way).
* **A deleted group leaves nothing**: no VM runs for a group the shard's config no longer has.
* **Drift converges**: every VM runs the instance type and template its group's config says now.
* **Blips replace nothing**: an instance replaced for missed health reports had an agent that really
  died (or could never register), or a VM that was already gone; a blip shorter than the missed-report
  window never causes it.
* **Storage damage and floods** have their own promises (``nemeses.StorageNemeses.check``,
  ``floods.FloodNemesis.check``), reported here with the others.

Pure reads of the world's shared state; nothing here changes it.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from nstance.config import MergedGroupConfig
from nstance.core.errors import NstanceError
from nstance.core.plan import Reason
from nstance.objectstore.scoped import ScopedObjectStore
from nstance.providers.base import InstanceStatus, ProviderInstance
from nstance.server.state import records
from nstance.server.state.configstate import ConfigState
from nstance.simulation.agents import AgentState
from nstance.simulation.scenario import SHARD, TENANT
from nstance.simulation.world import World


def desired_groups(world: World, cache: Path) -> dict[str, MergedGroupConfig]:
    """Each group's config as the shard's config and dynamic groups say now."""
    state = ConfigState(ScopedObjectStore(world.base_store, f"shard/{SHARD}/"), cache, clock=world.clock)
    state.load(True)
    snapshot = state.snapshot()
    assert snapshot is not None
    out: dict[str, MergedGroupConfig] = {}
    for tenant, group in snapshot.group_keys():
        merged = snapshot.merged(tenant, group)
        if tenant == TENANT and merged is not None:
            out[group] = merged
    return out


def check_end_state(world: World, cache: Path) -> list[str]:
    """Every broken promise, as a sentence naming the instance or group (empty when all hold)."""
    problems = list(world.violations) + world.storage.check() + world.floods.check()
    try:
        groups = desired_groups(world, cache)
    except NstanceError as exc:  # e.g. an over-limit size got stored: nothing to compare sizes with
        problems.append(f"the shard's stored configuration cannot be loaded: {exc}")
        groups = None
    desired = {name: merged.size for name, merged in (groups or {}).items()}
    live = [
        vm
        for vm in world.cloud.vms.values()
        if vm.status not in (InstanceStatus.DELETED, InstanceStatus.DELETING)
    ]
    for iid, count in sorted(Counter(vm.instance_id for vm in live).items()):
        if count > 1:
            problems.append(f"duplicate: {count} VMs run for instance {iid}")
    found, _bad = records.list_records(ScopedObjectStore(world.base_store, f"shard/{SHARD}/"), workers=1)
    active = {r.instance_id: r for r in found if r.status not in ("deleted", "failed", "deleting")}
    for vm in sorted(live, key=lambda v: v.instance_id):
        if vm.instance_id not in active:
            problems.append(
                f"leak: VM {vm.provider_id} ({vm.instance_id}) runs but no live record explains it"
            )
    live_ids = {vm.instance_id for vm in live}
    for iid, rec in sorted(active.items()):
        if iid not in live_ids:
            problems.append(f"record of {iid} ({rec.group}) says {rec.status} but no VM runs for it")
    # On-demand VMs count toward no group's size (the operator's ``CreateInstance``, ``on_demand``).
    per_group = Counter(
        active[vm.instance_id].group for vm in live if vm.instance_id in active and not vm.on_demand
    )
    for group, size in sorted(desired.items()):
        if per_group.get(group, 0) != size:
            problems.append(f"group {group}: {per_group.get(group, 0)} VMs run, {size} wanted")
    if groups is not None:
        problems.extend(_leftovers_and_drift(live, groups))
        problems.extend(world.group_edits.check({name: m.instance_type for name, m in groups.items()}))
    problems.extend(world.on_demand.check(live))
    for vm in sorted(live, key=lambda v: v.instance_id):
        if vm.on_demand:
            continue  # never replaced: a dead agent's on-demand VM is the operator's to delete
        agent = world.agents.get(vm.instance_id)
        if agent is None or not agent.registered or agent.crashed or agent.stuck:
            problems.append(
                f"instance {vm.instance_id} runs with no working agent ({_agent_state(agent)}) and was "
                "not replaced"
            )
    problems.extend(_lost_updates(world, desired))
    for at, iid, status, reason in world.events:
        if reason != Reason.SILENT:
            continue
        agent = world.agents.get(iid)
        vm_gone = agent is not None and agent.vm_gone_at is not None and agent.vm_gone_at <= at
        if agent is None or not (agent.crashed or agent.stuck or vm_gone):
            problems.append(
                f"t={at:.2f}: instance {iid} was {status} for missed health reports, but its agent was alive"
            )
    return problems


def _agent_state(agent: AgentState | None) -> str:
    if agent is None:
        return "none"
    if agent.crashed:
        return "crashed"
    return "stuck" if agent.stuck else "not registered"


def _leftovers_and_drift(live: list[ProviderInstance], groups: dict[str, MergedGroupConfig]) -> list[str]:
    """VMs of groups the config no longer has, and VMs whose instance type is not their group's."""
    out: list[str] = []
    gone = Counter(vm.group for vm in live if vm.tenant == TENANT and vm.group not in groups)
    for group, count in sorted(gone.items()):
        out.append(f"group {group} was deleted, but {count} VMs still run for it")
    for vm in sorted(live, key=lambda v: v.instance_id):
        merged = groups.get(vm.group)
        if vm.on_demand or vm.tenant != TENANT or merged is None:
            continue  # an on-demand VM keeps the config it was made with until the operator deletes it
        if (vm.instance_type, vm.template) != (merged.instance_type, merged.template):
            out.append(
                f"drift: instance {vm.instance_id} of group {vm.group} runs {vm.instance_type} from "
                f"template {vm.template}, but the group's config says {merged.instance_type} from "
                f"template {merged.template}"
            )
    return out


def _lost_updates(world: World, desired: dict[str, int]) -> list[str]:
    """Groups whose size (or absence: size None) no UpsertGroup or DeleteGroup call explains."""
    out: list[str] = []
    static = world.scenario.groups
    for group in sorted(static.keys() | {u.group for u in world.upserts}):
        attempts = [u for u in world.upserts if u.group == group]
        acked = [i for i, u in enumerate(attempts) if u.acknowledged]
        allowed: set[int | None]
        if acked:
            last = acked[-1]
            allowed = {attempts[last].size} | {u.size for u in attempts[last + 1 :]}
        else:
            allowed = {static.get(group)} | {u.size for u in attempts}
        if desired.get(group) not in allowed:
            shown = sorted(allowed, key=lambda size: -1 if size is None else size)
            out.append(
                f"lost update: group {group} has size {desired.get(group)}, expected one of "
                f"{shown} after {len(attempts)} UpsertGroup or DeleteGroup calls"
            )
    return out
