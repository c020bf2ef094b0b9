"""Registering VMs with Google load balancers through an unmanaged instance group (upstream's v1 shape).

A ``load_balancers`` entry with ``instance_group_name`` (upstream v1 wrote it with ``provider: "gcp"``)
names one unmanaged instance group that backs a load balancer's backend service. The name is a group
of the shard's zone, ``zones/Z/instanceGroups/N``, ``projects/P/zones/Z/instanceGroups/N`` or that
path as a full API URL (upstream took a bare name in the shard's project and zone only). A bad
reference, or a group in another zone (an unmanaged group holds only VMs of its own zone), is refused
naming ``load_balancers.<name>.instance_group_name``. Each VM is named as upstream names it,
``projects/P/zones/Z/instances/<VM name>`` in the provider's project and zone.

* ``register`` lists the group's members (``listInstances``, every state) and adds the VMs it does
  not list yet with ``addInstances`` (in chunks of ``batch_size``), so registering again is
  harmless. If GCE answers ``memberAlreadyExists`` (someone added a VM meanwhile), the group is
  listed again and only the VMs still missing are added. A group that does not exist is refused
  naming its path; so is a VM GCE does not know.
* ``deregister`` removes the members among the VMs with ``removeInstances`` and waits for the
  operation (bounded by the operation timeout). A group that does not exist or does not list the VM
  needs nothing; if GCE refuses a removal because the VM left meanwhile, it is done.
* ``states``: a VM the group lists is ``registered`` (an instance group reports no per-VM health;
  that lives on the backend service); one whose removal operation has not finished is ``draining``
  (GCE keeps it in the group through the backend service's connection draining); otherwise
  ``deregistered``.

Upstream v1 made the same ``addInstances``/``removeInstances`` calls without listing first, so a
repeated registration there failed with ``memberAlreadyExists``; here both directions are idempotent.
This module must not create, delete or change VMs, instance groups or backend services.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Sequence
from typing import Any

from google.api_core import exceptions as gexc
from google.cloud import compute_v1

from nstance.config.resources import LoadBalancerConfig
from nstance.providers.base import ProviderInvalidRequest, ProviderUnavailable
from nstance.providers.features import LbTarget, TargetState
from nstance.providers.gcp.calls import GceCalls, error_reasons
from nstance.providers.gcp.loadbalancers import DEFAULT_BATCH_SIZE, PendingRemovals, chunks, vm_name
from nstance.providers.gcp.resources import ZonalRef, zonal_ref

#: Rounds of "list, then add the missing VMs" when others add the same VMs concurrently.
_ADD_ROUNDS = 3


GroupRef = ZonalRef  # the unmanaged instance group of a ``load_balancers`` entry


def group_ref(name: str, lb: LoadBalancerConfig, *, project: str, zone: str) -> GroupRef:
    """The instance group of entry ``name``; refuses other entries and bad or foreign-zone references."""
    where = f"load_balancers.{name}.instance_group_name"
    if lb.provider != "google" or lb.instance_group_name is None:
        raise ProviderInvalidRequest(
            f"{where}: is not set; this entry has no unmanaged instance group to register VMs with"
        )
    return zonal_ref(
        lb.instance_group_name,
        where=where,
        project=project,
        zone=zone,
        collection="instanceGroups",
        noun="instance group",
        holder="an unmanaged instance group holds only VMs of its own zone",
    )


class InstanceGroupTargets:
    """Add, remove and read the members of unmanaged instance groups; see the module docstring."""

    def __init__(
        self,
        client: compute_v1.InstanceGroupsClient,
        api: GceCalls,
        *,
        page_size: int = 500,
        batch_size: int = DEFAULT_BATCH_SIZE,
    ) -> None:
        self._client = client
        self._api = api
        self._page_size = page_size
        self._batch_size = max(1, min(batch_size, DEFAULT_BATCH_SIZE))
        self._removing = PendingRemovals(api)

    def _group(self, name: str, lb: LoadBalancerConfig) -> GroupRef:
        return group_ref(name, lb, project=self._api.project, zone=self._api.zone)

    def _instance(self, vm: str) -> str:
        return f"projects/{self._api.project}/zones/{self._api.zone}/instances/{vm}"

    async def register(self, name: str, lb: LoadBalancerConfig, targets: Sequence[LbTarget]) -> None:
        """Add every target the group does not list yet."""
        group = self._group(name, lb)
        wanted = list(dict.fromkeys(vm_name(t) for t in targets))
        for _ in range(_ADD_ROUNDS):
            members = await self._members(group)
            if members is None:
                raise self._missing(group)
            missing = [vm for vm in wanted if vm not in members]
            try:
                for chunk in chunks(missing, self._batch_size):
                    await self._add(group, chunk)
                    for vm in chunk:
                        self._removing.forget(group.path, vm)
                return
            except _AlreadyMember:
                continue  # another writer added some of them: list again, add the rest
        raise ProviderUnavailable(
            f"gcp: {group.where}: the members of {group.path} kept changing while adding; "
            "register again later"
        )

    async def deregister(self, name: str, lb: LoadBalancerConfig, targets: Sequence[LbTarget]) -> None:
        """Remove the targets from the group; not a member (or no group) is not an error."""
        group = self._group(name, lb)
        wanted = {vm_name(t) for t in targets}
        if not wanted:
            return
        members = await self._members(group)
        if members is None:
            return  # the group is gone: nothing is in it
        leaving = [vm for vm in members if vm in wanted]
        for chunk in chunks(leaving, self._batch_size):
            try:
                op = await self._change(group, "remove", chunk)
            except ProviderInvalidRequest:
                again = await self._members(group)
                if again is None or not set(chunk) & set(again):
                    continue  # removed meanwhile (by another removal, or the group went away)
                raise
            if op is not None and not self._api.is_done(op):
                for vm in chunk:
                    self._removing.started(group.path, vm, op.name, group.project, group.zone)

    async def states(
        self, name: str, lb: LoadBalancerConfig, targets: Sequence[LbTarget]
    ) -> dict[str, TargetState]:
        """Each target's state in the group of entry ``name``, keyed by instance id."""
        group = self._group(name, lb)
        if not targets:
            return {}
        finished: dict[str, bool] = {}
        # Removals first: one that finishes now is then already reflected in the listing.
        running = {
            vm_name(t)
            for t in targets
            if await self._removing.running(group.path, vm_name(t), f"{group.where}: remove", finished)
        }
        members = await self._members(group) or []
        out: dict[str, TargetState] = {}
        for target in targets:
            vm = vm_name(target)
            if vm in running:
                out[target.instance_id] = TargetState.DRAINING
            elif vm in members:
                out[target.instance_id] = TargetState.REGISTERED
            else:
                out[target.instance_id] = TargetState.DEREGISTERED
        return out

    # ---- calls ------------------------------------------------------------------------------

    @staticmethod
    def _missing(group: GroupRef) -> ProviderInvalidRequest:
        return ProviderInvalidRequest(
            f"{group.where}: instance group {group.path} does not exist (or the service account cannot "
            "see it)"
        )

    async def _members(self, group: GroupRef) -> list[str] | None:
        """The VM names in ``group`` (all pages, every state); None when the group does not exist."""
        out: list[str] = []
        token = ""
        while True:
            try:
                page = await self._api.call(
                    "instanceGroups.listInstances", functools.partial(self._list_blocking, group, token)
                )
            except gexc.NotFound:
                return None
            except gexc.GoogleAPICallError as exc:
                raise self._api.map_error(exc, f"{group.where}: list the members of {group.path}") from exc
            # Only this page: iterating the pager itself would fetch the next pages outside call().
            out.extend(str(item.instance).rsplit("/", 1)[-1] for item in page.items)
            token = page.next_page_token
            if not token:
                return out

    async def _exists(self, group: GroupRef) -> bool:
        try:
            await self._api.call("instanceGroups.get", functools.partial(self._get_blocking, group))
        except gexc.NotFound:
            return False
        except gexc.GoogleAPICallError as exc:
            raise self._api.map_error(exc, f"{group.where}: read {group.path}") from exc
        return True

    async def _add(self, group: GroupRef, vms: Sequence[str]) -> None:
        try:
            op = await self._change(group, "add", vms)
        except _NotFound as exc:
            if not await self._exists(group):
                raise self._missing(group) from exc
            raise ProviderInvalidRequest(  # the group exists, so GCE does not know one of the VMs
                f"gcp: {group.where}: add {', '.join(vms)} to {group.path}: {exc.message}"
            ) from exc
        if op is not None and not self._api.is_done(op):
            raise ProviderUnavailable(
                f"gcp: {group.where}: adding to {group.path} (operation {op.name}) is still running after "
                "the operation timeout; register again later"
            )

    async def _change(self, group: GroupRef, verb: str, vms: Sequence[str]) -> compute_v1.Operation | None:
        """Add or remove ``vms`` in one call and wait; None when the group does not exist (remove only)."""
        what = f"{group.where}: {verb} {len(vms)} instance(s) of {group.path}"
        request_id = str(uuid.uuid4())  # the same for every retry of this call
        refs = [compute_v1.InstanceReference(instance=self._instance(vm)) for vm in vms]
        try:
            op = await self._api.call(
                f"instanceGroups.{verb}Instances",
                functools.partial(self._change_blocking, group, verb, refs, request_id),
            )
        except gexc.NotFound as exc:
            if verb == "add":
                raise _NotFound(exc.message) from exc
            return None
        except gexc.GoogleAPICallError as exc:
            if verb == "add" and "memberAlreadyExists" in error_reasons(exc):
                raise _AlreadyMember() from exc
            raise self._api.map_error(exc, what) from exc
        done = await self._api.wait(op, what, project=group.project, zone=group.zone)
        if self._api.is_done(done):
            self._api.raise_op_error(done, what)
        return done

    def _list_blocking(self, group: GroupRef, page_token: str) -> Any:
        return self._client.list_instances(
            request=compute_v1.ListInstancesInstanceGroupsRequest(
                project=group.project,
                zone=group.zone,
                instance_group=group.name,
                instance_groups_list_instances_request_resource=compute_v1.InstanceGroupsListInstancesRequest(
                    instance_state="ALL"
                ),
                max_results=self._page_size,
                page_token=page_token,
            ),
            retry=None,
            timeout=self._api.request_timeout,
        )

    def _get_blocking(self, group: GroupRef) -> compute_v1.InstanceGroup:
        return self._client.get(
            project=group.project,
            zone=group.zone,
            instance_group=group.name,
            retry=None,
            timeout=self._api.request_timeout,
        )

    def _change_blocking(
        self, group: GroupRef, verb: str, refs: list[compute_v1.InstanceReference], request_id: str
    ) -> compute_v1.Operation:
        where = {"project": group.project, "zone": group.zone, "instance_group": group.name}
        options: dict[str, Any] = {"retry": None, "timeout": self._api.request_timeout}
        if verb == "add":
            return self._client.add_instances_unary(
                request=compute_v1.AddInstancesInstanceGroupRequest(
                    **where,
                    instance_groups_add_instances_request_resource=(
                        compute_v1.InstanceGroupsAddInstancesRequest(instances=refs)
                    ),
                    request_id=request_id,
                ),
                **options,
            )
        return self._client.remove_instances_unary(
            request=compute_v1.RemoveInstancesInstanceGroupRequest(
                **where,
                instance_groups_remove_instances_request_resource=(
                    compute_v1.InstanceGroupsRemoveInstancesRequest(instances=refs)
                ),
                request_id=request_id,
            ),
            **options,
        )


class _AlreadyMember(Exception):
    """GCE refused an add because a VM of it is already a member (added concurrently)."""


class _NotFound(Exception):
    """An add answered 404: the group or one of the VMs does not exist."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
