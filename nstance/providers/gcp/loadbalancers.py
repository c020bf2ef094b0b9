"""Registering VMs with Google load balancers through zonal network endpoint groups (NEGs).

A ``load_balancers`` entry with ``provider: "google"`` lists ``network_endpoint_groups``. Each is a
NEG name (a zonal NEG in the shard's zone), ``zones/Z/networkEndpointGroups/N``,
``projects/P/zones/Z/networkEndpointGroups/N`` or that path as a full API URL. A bad reference, or a
NEG in another zone (a zonal NEG holds only VMs of its own zone), is refused naming its config path
``load_balancers.<name>.network_endpoint_groups[i]``. ``frontends`` (the forwarding rules' addresses)
are not used here: a VM joins the load balancer through the NEGs of its backend service.

Each VM is one endpoint ``{instance: <VM name>, ipAddress: <its primary IPv4 when known>}`` without a
port, so the NEG's default port applies (a ``GCE_VM_IP_PORT`` NEG needs one; a ``GCE_VM_IP`` NEG has
none).

* ``register`` lists each NEG's endpoints and attaches the VMs it does not list yet, with one
  ``attachNetworkEndpoints`` call per NEG (in chunks of ``batch_size``). VMs already listed are left
  alone, so registering again is harmless. A NEG that does not exist is refused naming its path.
* ``deregister`` detaches every endpoint the NEG lists for the VMs (one call per NEG, chunked) and
  waits for the operation, not for connection draining. A NEG that does not exist or does not list
  the VM needs nothing. If GCE refuses a detach because the endpoint went away meanwhile, it is done.
* ``states`` lists each NEG with ``healthStatus: SHOW``. A VM listed with every health ``HEALTHY`` is
  healthy, with any ``DRAINING`` draining, otherwise registered; not listed (or the NEG is gone) is
  deregistered. A detach whose operation has not finished reads as draining, so a detach counts as
  confirmed once its operation is DONE and the NEG no longer lists the VM. The NEGs' states are
  combined with ``features.combine_states``.

Operations are waited with ``zoneOperations.wait`` on the provider's own endpoint (``GceCalls``).
This module must not create, delete or change VMs, NEGs or backend services.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Iterator, Sequence
from typing import Any, TypeVar

from google.api_core import exceptions as gexc
from google.cloud import compute_v1

from nstance.config.resources import LoadBalancerConfig
from nstance.providers.base import InstanceNotFound, ProviderInvalidRequest, ProviderUnavailable
from nstance.providers.features import LbTarget, TargetState, combine_states
from nstance.providers.gcp.calls import GceCalls
from nstance.providers.gcp.resources import ZonalRef, zonal_ref

T = TypeVar("T")

#: Endpoints per attach/detach request (GCE accepts at most 500 in one call).
DEFAULT_BATCH_SIZE = 500


NegRef = ZonalRef  # one zonal network endpoint group of a ``load_balancers`` entry


def neg_refs(name: str, lb: LoadBalancerConfig, *, project: str, zone: str) -> list[NegRef]:
    """The NEGs of entry ``name``; refuses another provider's entry and bad or foreign-zone references."""
    if lb.provider != "google":
        raise ProviderInvalidRequest(
            f'load_balancers.{name}.provider: is "{lb.provider}"; the gcp provider registers VMs only with '
            'entries of provider "google" (network_endpoint_groups)'
        )
    return [
        zonal_ref(
            ref,
            where=f"load_balancers.{name}.network_endpoint_groups[{index}]",
            project=project,
            zone=zone,
            collection="networkEndpointGroups",
            noun="network endpoint group",
            holder="a zonal NEG holds only VMs of its own zone",
        )
        for index, ref in enumerate(lb.network_endpoint_groups)
    ]


def vm_name(target: LbTarget) -> str:
    """The GCE name of a target's VM (``name`` when given, else the instance id, which is the name)."""
    return target.name or target.instance_id


def health_state(healths: Sequence[str]) -> TargetState:
    """One listed VM's state in one NEG from its endpoints' health states (one per backend service)."""
    if "DRAINING" in healths:
        return TargetState.DRAINING
    if healths and all(h == "HEALTHY" for h in healths):
        return TargetState.HEALTHY
    return TargetState.REGISTERED


def _listed_vm(endpoint: compute_v1.NetworkEndpoint) -> str:
    return str(endpoint.instance).rsplit("/", 1)[-1]


def chunks(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    """``items`` in consecutive slices of at most ``size``."""
    for start in range(0, len(items), size):
        yield items[start : start + size]


class PendingRemovals:
    """Removals (NEG detaches, instance group removals) whose zone operation had not finished yet.

    Keyed by (resource path, VM name). ``running`` polls the operation once per call and forgets it
    when it is done or GCE no longer keeps it (operations are kept for a limited time only).
    """

    def __init__(self, api: GceCalls) -> None:
        self._api = api
        self._pending: dict[tuple[str, str], tuple[str, str, str]] = {}  # -> (operation, project, zone)

    def started(self, path: str, vm: str, operation: str, project: str, zone: str) -> None:
        self._pending[(path, vm)] = (operation, project, zone)

    def forget(self, path: str, vm: str) -> None:
        self._pending.pop((path, vm), None)

    async def running(self, path: str, vm: str, what: str, finished: dict[str, bool]) -> bool:
        """Whether a removal of ``vm`` from ``path`` started here has not finished (``finished`` caches)."""
        pending = self._pending.get((path, vm))
        if pending is None:
            return False
        op_name, project, zone = pending
        if op_name not in finished:
            try:
                op = await self._api.poll(op_name, what, project=project, zone=zone)
            except InstanceNotFound:
                finished[op_name] = True
            else:
                finished[op_name] = self._api.is_done(op)
        if finished[op_name]:
            self.forget(path, vm)
            return False
        return True


class NegTargets:
    """Attach, detach and read VM endpoints of network endpoint groups; see the module docstring."""

    def __init__(
        self,
        client: compute_v1.NetworkEndpointGroupsClient,
        api: GceCalls,
        *,
        page_size: int = 500,
        batch_size: int = DEFAULT_BATCH_SIZE,
    ) -> None:
        self._client = client
        self._api = api
        self._page_size = page_size
        self._batch_size = max(1, min(batch_size, DEFAULT_BATCH_SIZE))
        self._detaching = PendingRemovals(api)

    def _negs(self, name: str, lb: LoadBalancerConfig) -> list[NegRef]:
        return neg_refs(name, lb, project=self._api.project, zone=self._api.zone)

    async def register(self, name: str, lb: LoadBalancerConfig, targets: Sequence[LbTarget]) -> None:
        """Attach every target to every NEG of ``name`` that does not list it yet."""
        negs = self._negs(name, lb)
        unique: dict[str, LbTarget] = {}
        for target in targets:
            unique.setdefault(vm_name(target), target)
        for neg in negs:
            listed = await self._list(neg, health=False)
            if listed is None:
                raise ProviderInvalidRequest(
                    f"{neg.where}: network endpoint group {neg.path} does not exist (or the service "
                    "account cannot see it)"
                )
            present = {_listed_vm(e.network_endpoint) for e in listed}
            missing = [t for vm, t in unique.items() if vm not in present]
            for chunk in chunks(missing, self._batch_size):
                endpoints = [self._endpoint(t) for t in chunk]
                op = await self._change(neg, "attach", endpoints)
                if op is None:
                    raise ProviderInvalidRequest(
                        f"{neg.where}: network endpoint group {neg.path} does not exist (or the service "
                        "account cannot see it)"
                    )
                if not self._api.is_done(op):
                    raise ProviderUnavailable(
                        f"gcp: {neg.where}: attaching to {neg.path} (operation {op.name}) is still running "
                        "after the operation timeout; register again later"
                    )
                for target in chunk:
                    self._detaching.forget(neg.path, vm_name(target))

    async def deregister(self, name: str, lb: LoadBalancerConfig, targets: Sequence[LbTarget]) -> None:
        """Detach the targets' endpoints from every NEG of ``name``; not attached is not an error."""
        negs = self._negs(name, lb)
        wanted = {vm_name(t) for t in targets}
        if not wanted:
            return
        for neg in negs:
            listed = await self._list(neg, health=False)
            if listed is None:
                continue  # the NEG is gone: nothing is attached to it
            endpoints = [
                self._as_sent(e.network_endpoint) for e in listed if _listed_vm(e.network_endpoint) in wanted
            ]
            for chunk in chunks(endpoints, self._batch_size):
                names = {str(e.instance) for e in chunk}
                try:
                    op = await self._change(neg, "detach", chunk)
                except ProviderInvalidRequest:
                    again = await self._list(neg, health=False)
                    if again is None or not names & {_listed_vm(e.network_endpoint) for e in again}:
                        continue  # removed meanwhile (by another detach, or the NEG went away)
                    raise
                if op is not None and not self._api.is_done(op):
                    for vm in names:
                        self._detaching.started(neg.path, vm, op.name, neg.project, neg.zone)

    async def states(
        self, name: str, lb: LoadBalancerConfig, targets: Sequence[LbTarget]
    ) -> dict[str, TargetState]:
        """Each target's state in entry ``name`` (all of its NEGs), keyed by instance id."""
        negs = self._negs(name, lb)
        if not targets:
            return {}
        per: dict[str, list[TargetState]] = {t.instance_id: [] for t in targets}
        finished: dict[str, bool] = {}
        for neg in negs:
            # Detaches first: one that finishes now is then already reflected in the listing.
            running = {
                vm_name(t)
                for t in targets
                if await self._detaching.running(neg.path, vm_name(t), f"{neg.where}: detach", finished)
            }
            listed = await self._list(neg, health=True)
            healths: dict[str, list[str]] = {}
            for item in listed or []:
                found = healths.setdefault(_listed_vm(item.network_endpoint), [])
                found.extend(str(h.health_state) for h in item.healths)
            for target in targets:
                vm = vm_name(target)
                if vm in running:
                    state = TargetState.DRAINING
                elif vm not in healths:
                    state = TargetState.DEREGISTERED
                else:
                    state = health_state(healths[vm])
                per[target.instance_id].append(state)
        return {instance_id: combine_states(states) for instance_id, states in per.items()}

    # ---- calls ------------------------------------------------------------------------------

    @staticmethod
    def _endpoint(target: LbTarget) -> compute_v1.NetworkEndpoint:
        endpoint = compute_v1.NetworkEndpoint(instance=vm_name(target))
        if target.ip4:
            endpoint.ip_address = target.ip4
        return endpoint

    @staticmethod
    def _as_sent(listed: compute_v1.NetworkEndpoint) -> compute_v1.NetworkEndpoint:
        """A listed endpoint as a detach request names it (VM name, address and port as listed)."""
        endpoint = compute_v1.NetworkEndpoint(instance=_listed_vm(listed))
        if listed.ip_address:
            endpoint.ip_address = listed.ip_address
        if "port" in listed:
            endpoint.port = listed.port
        return endpoint

    async def _list(
        self, neg: NegRef, *, health: bool
    ) -> list[compute_v1.NetworkEndpointWithHealthStatus] | None:
        """Every endpoint of ``neg`` (all pages); None when the NEG does not exist."""
        out: list[compute_v1.NetworkEndpointWithHealthStatus] = []
        token = ""
        while True:
            try:
                page = await self._api.call(
                    "networkEndpointGroups.listNetworkEndpoints",
                    functools.partial(self._list_blocking, neg, token, health),
                )
            except gexc.NotFound:
                return None
            except gexc.GoogleAPICallError as exc:
                raise self._api.map_error(exc, f"{neg.where}: list the endpoints of {neg.path}") from exc
            # Only this page: iterating the pager itself would fetch the next pages outside call().
            out.extend(page.items)
            token = page.next_page_token
            if not token:
                return out

    def _list_blocking(self, neg: NegRef, page_token: str, health: bool) -> Any:
        return self._client.list_network_endpoints(
            request=compute_v1.ListNetworkEndpointsNetworkEndpointGroupsRequest(
                project=neg.project,
                zone=neg.zone,
                network_endpoint_group=neg.name,
                network_endpoint_groups_list_endpoints_request_resource=(
                    compute_v1.NetworkEndpointGroupsListEndpointsRequest(
                        health_status="SHOW" if health else "SKIP"
                    )
                ),
                max_results=self._page_size,
                page_token=page_token,
            ),
            retry=None,
            timeout=self._api.request_timeout,
        )

    async def _change(
        self, neg: NegRef, verb: str, endpoints: Sequence[compute_v1.NetworkEndpoint]
    ) -> compute_v1.Operation | None:
        """Attach or detach ``endpoints`` in one call and wait; None when the NEG does not exist."""
        what = f"{neg.where}: {verb} {len(endpoints)} endpoint(s) of {neg.path}"
        request_id = str(uuid.uuid4())  # the same for every retry of this call
        try:
            op = await self._api.call(
                f"networkEndpointGroups.{verb}NetworkEndpoints",
                functools.partial(self._change_blocking, neg, verb, list(endpoints), request_id),
            )
        except gexc.NotFound:
            return None
        except gexc.GoogleAPICallError as exc:
            raise self._api.map_error(exc, what) from exc
        done = await self._api.wait(op, what, project=neg.project, zone=neg.zone)
        if self._api.is_done(done):
            self._api.raise_op_error(done, what)
        return done

    def _change_blocking(
        self, neg: NegRef, verb: str, endpoints: list[compute_v1.NetworkEndpoint], request_id: str
    ) -> compute_v1.Operation:
        if verb == "attach":
            return self._client.attach_network_endpoints_unary(
                request=compute_v1.AttachNetworkEndpointsNetworkEndpointGroupRequest(
                    project=neg.project,
                    zone=neg.zone,
                    network_endpoint_group=neg.name,
                    network_endpoint_groups_attach_endpoints_request_resource=(
                        compute_v1.NetworkEndpointGroupsAttachEndpointsRequest(network_endpoints=endpoints)
                    ),
                    request_id=request_id,
                ),
                retry=None,
                timeout=self._api.request_timeout,
            )
        return self._client.detach_network_endpoints_unary(
            request=compute_v1.DetachNetworkEndpointsNetworkEndpointGroupRequest(
                project=neg.project,
                zone=neg.zone,
                network_endpoint_group=neg.name,
                network_endpoint_groups_detach_endpoints_request_resource=(
                    compute_v1.NetworkEndpointGroupsDetachEndpointsRequest(network_endpoints=endpoints)
                ),
                request_id=request_id,
            ),
            retry=None,
            timeout=self._api.request_timeout,
        )
