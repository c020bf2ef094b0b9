"""Rebuilding a lost instance record from the VM's own tags (``claims.Verdict.ADOPT``).

The record gets what the tags and the provider's listing say - tenant, group, on-demand, provider id,
type, subnet, addresses, status - plus the group's current merged config when the group still exists,
with the template and instance type the VM's tags and listing give, when they give them. Its
``created_at`` is the adoption time, so age-based rules (registration timeout, expiry) start counting
afresh instead of condemning the VM at once; its infra hash is left empty (nobody knows the config it
was made from), so drift is judged by its instance type and template (``plan.visibly_differs``): the
adoption starts a rotation only when those are not the group's. ``adopted_at`` (a field upstream does
not know, kept as extra) marks it. The record is written create-only: a record that appeared meanwhile
is never overwritten. Also here: the tenant for a VM whose tags have none (VMs made by upstream's
server, which does not tag the tenant), found when exactly one tenant has a group of that name.
"""

from __future__ import annotations

import asyncio
import dataclasses

from nstance.core.errors import AlreadyExists
from nstance.providers.base import ProviderInstance
from nstance.server.state import records
from nstance.server.state.configstate import ConfigSnapshot
from nstance.server.state.context import ShardContext


def with_tenant(vm: ProviderInstance, snapshot: ConfigSnapshot | None) -> ProviderInstance:
    """``vm`` with its tenant filled in from the config when its tags lack one and it is unambiguous."""
    if vm.tenant or not vm.group or snapshot is None:
        return vm
    tenants = {tenant for tenant, group in snapshot.group_keys() if group == vm.group}
    if len(tenants) != 1:
        return vm
    return dataclasses.replace(vm, tenant=tenants.pop())


def adopted_record(
    vm: ProviderInstance, snapshot: ConfigSnapshot | None, ctx: ShardContext
) -> records.InstanceRecord:
    """The record to rebuild for ``vm`` (see the module docstring)."""
    now = ctx.clock.now()
    merged = snapshot.merged(vm.tenant, vm.group) if snapshot is not None else None
    config = records.config_as_run(merged, template=vm.template, instance_type=vm.instance_type)
    return records.InstanceRecord(
        instance_id=vm.instance_id,
        tenant=vm.tenant,
        group=vm.group,
        created_at=now,
        last_updated=now,
        status=vm.status.value,
        on_demand=vm.on_demand,
        subnet_id=vm.subnet_id,
        provider_instance_id=vm.provider_id,
        instance_type=vm.instance_type,
        private_ipv4=vm.ip4,
        private_ipv6=vm.ip6,
        hostname=vm.hostname,
        config=config,
        extra={"adopted_at": records.format_time(now)},
    )


async def write_adopted(ctx: ShardContext, record: records.InstanceRecord) -> bool:
    """Write the rebuilt record (create-only, fenced); False when a record exists already."""
    ctx.fence()
    try:
        await asyncio.to_thread(records.write_record, ctx.store, record, create_only=True)
    except AlreadyExists:
        return False
    return True
