"""Registering VMs with Google load balancers through zonal network endpoint groups (NEGs).

A ``load_balancers`` entry with ``provider: "google"`` lists ``network_endpoint_groups``. Each is a
NEG name (a zonal NEG in the shard's zone), ``zones/Z/networkEndpointGroups/N``,
``projects/P/zones/Z/networkEndpointGroups/N`` or that path as a full API URL. A bad reference, or a
NEG in another zone (a zonal NEG holds only VMs of its own zone), is refused naming its config path
``load_balancers.<name>.network_endpoint_groups[i]``.

Which NEGs a VM joins, with which address, and how an endpoint's health reads are upstream's rules
(``neghealth``): the NEG on the subnetwork of the VM's first interface that is on one (read with
``instances.get`` and ``networkEndpointGroups.get``), with that interface's ``networkIP``; and, when
the entry has ``frontends``, only the health of the (forwarding rule, backend service) pairs they
resolve to (regional ``forwardingRules.list``) counts, every one of them ``HEALTHY`` for healthy. An
endpoint is ``{instance: <VM name>, ipAddress: <that address>}`` without a port, so the NEG's default
port applies (a ``GCE_VM_IP_PORT`` NEG needs one; a ``GCE_VM_IP`` NEG has none).

* ``register`` reads the NEGs and the VMs, then lists each NEG's endpoints and attaches the VMs that
  belong in it and that it does not list yet, with one ``attachNetworkEndpoints`` call per NEG (in
  chunks of ``batch_size``). VMs already listed are left alone, so registering again is harmless. A
  NEG that does not exist, a VM GCE does not know, and a VM none of whose interfaces is on a
  subnetwork of the entry's NEGs are refused naming the config path.
* ``deregister`` detaches every endpoint any NEG of the entry lists for the VMs (one call per NEG,
  chunked), wherever an earlier version put them, and waits for the operation, not for connection
  draining. A NEG that does not exist or does not list the VM needs nothing. If GCE refuses a detach
  because the endpoint went away meanwhile, it is done.
* ``states`` lists each NEG with ``healthStatus: SHOW``. For each VM, the NEGs it belongs in and
  those that list it count: in each, listed reads as ``neghealth.endpoint_state`` says, not listed as
  deregistered, and a detach whose operation has not finished as draining (so a detach counts as
  confirmed once its operation is DONE and the NEG no longer lists the VM). A VM that no longer
  exists belongs nowhere. The NEGs' states are combined with ``features.combine_states``.

Operations are waited with ``zoneOperations.wait`` on the provider's own endpoint (``GceCalls``).
This module must not create, delete or change VMs, NEGs, forwarding rules or backend services.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import uuid
from collections.abc import Iterator, Sequence
from typing import Any, TypeVar

from google.api_core import exceptions as gexc
from google.cloud import compute_v1

from nstance.config.resources import LoadBalancerConfig
from nstance.providers.base import InstanceNotFound, ProviderInvalidRequest, ProviderUnavailable
from nstance.providers.features import LbTarget, TargetState, combine_states
from nstance.providers.gcp.calls import GceCalls
from nstance.providers.gcp.neghealth import (
    NegNet,
    Pair,
    endpoint_state,
    expected_pairs,
    placement,
    resource_key,
)
from nstance.providers.gcp.resources import ZonalRef, zonal_ref

T = TypeVar("T")

log = logging.getLogger(__name__)

#: Endpoints per attach/detach request (GCE accepts at most 500 in one call).
DEFAULT_BATCH_SIZE = 500
#: VMs read at once (``instances.get``) to learn their interfaces.
VM_READS = 8


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


def _listed_vm(endpoint: compute_v1.NetworkEndpoint) -> str:
    return str(endpoint.instance).rsplit("/", 1)[-1]


def _endpoint(vm: str, address: str) -> compute_v1.NetworkEndpoint:
    """The endpoint a VM is attached as: its name and its address on the NEG's subnetwork, no port."""
    endpoint = compute_v1.NetworkEndpoint(instance=vm)
    if address:
        endpoint.ip_address = address
    return endpoint


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
        instances: compute_v1.InstancesClient,
        forwarding_rules: compute_v1.ForwardingRulesClient,
        page_size: int = 500,
        batch_size: int = DEFAULT_BATCH_SIZE,
    ) -> None:
        self._client = client
        self._api = api
        self._instances = instances
        self._rules = forwarding_rules
        self._region = api.zone.rsplit("-", 1)[0]
        self._page_size = page_size
        self._batch_size = max(1, min(batch_size, DEFAULT_BATCH_SIZE))
        self._detaching = PendingRemovals(api)
        self._warned: set[tuple[str, str]] = set()

    def _negs(self, name: str, lb: LoadBalancerConfig) -> list[NegRef]:
        return neg_refs(name, lb, project=self._api.project, zone=self._api.zone)

    async def register(self, name: str, lb: LoadBalancerConfig, targets: Sequence[LbTarget]) -> None:
        """Attach every target to the NEGs of ``name`` it belongs in that do not list it yet."""
        negs = self._negs(name, lb)
        unique: dict[str, LbTarget] = {}
        for target in targets:
            unique.setdefault(vm_name(target), target)
        nets = await self._nets(negs)
        for neg in negs:
            if neg.path not in nets:
                raise ProviderInvalidRequest(
                    f"{neg.where}: network endpoint group {neg.path} does not exist (or the service "
                    "account cannot see it)"
                )
        places = await self._placements(negs, nets, list(unique))
        for vm in unique:
            place = places.get(vm)
            if place is None:
                raise ProviderInvalidRequest(
                    f"load_balancers.{name}: VM {vm} does not exist in zone {self._api.zone} (or the service "
                    "account cannot see it)"
                )
            if not place[1]:
                raise ProviderInvalidRequest(
                    f"load_balancers.{name}.network_endpoint_groups: none of these NEGs is on the subnetwork "
                    f"of a network interface of VM {vm}; a VM joins the NEG of its interface's subnetwork"
                )
        for neg in negs:
            belong = [vm for vm in unique if neg.path in places[vm][1]]
            if not belong:
                continue
            listed = await self._list(neg, health=False)
            if listed is None:
                raise ProviderInvalidRequest(
                    f"{neg.where}: network endpoint group {neg.path} does not exist (or the service "
                    "account cannot see it)"
                )
            present = {_listed_vm(e.network_endpoint) for e in listed}
            missing = [vm for vm in belong if vm not in present]
            for chunk in chunks(missing, self._batch_size):
                endpoints = [_endpoint(vm, places[vm][0]) for vm in chunk]
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
                for vm in chunk:
                    self._detaching.forget(neg.path, vm)

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
        """Each target's state in entry ``name`` (the NEGs it belongs in or is listed by), by instance id."""
        negs = self._negs(name, lb)
        if not targets:
            return {}
        expected = await self._expected(name, lb) if lb.frontends else None
        nets = await self._nets(negs)
        places = await self._placements(negs, nets, list({vm_name(t) for t in targets}))
        per: dict[str, list[TargetState]] = {t.instance_id: [] for t in targets}
        finished: dict[str, bool] = {}
        for neg in negs:
            # Detaches first: one that finishes now is then already reflected in the listing.
            running = {
                vm_name(t)
                for t in targets
                if await self._detaching.running(neg.path, vm_name(t), f"{neg.where}: detach", finished)
            }
            listed = await self._list(neg, health=True) if neg.path in nets else None
            healths: dict[str, list[compute_v1.HealthStatusForNetworkEndpoint]] = {}
            for item in listed or []:
                healths.setdefault(_listed_vm(item.network_endpoint), []).extend(item.healths)
            for target in targets:
                vm = vm_name(target)
                place = places.get(vm)
                belongs = place is not None and neg.path in place[1]
                if vm in running:
                    per[target.instance_id].append(TargetState.DRAINING)
                elif vm in healths:
                    per[target.instance_id].append(endpoint_state(healths[vm], expected))
                elif belongs:
                    per[target.instance_id].append(TargetState.DEREGISTERED)
        return {instance_id: combine_states(states) for instance_id, states in per.items()}

    # ---- reads: NEG networks, VM interfaces, forwarding rules --------------------------------

    async def _nets(self, negs: Sequence[NegRef]) -> dict[str, NegNet]:
        """Each existing NEG's subnetwork and network, by path (a NEG that does not exist is left out)."""
        out: dict[str, NegNet] = {}
        for neg in negs:
            try:
                found = await self._api.call(
                    "networkEndpointGroups.get",
                    functools.partial(self._get_neg_blocking, neg),
                )
            except gexc.NotFound:
                continue
            except gexc.GoogleAPICallError as exc:
                raise self._api.map_error(exc, f"{neg.where}: read {neg.path}") from exc
            out[neg.path] = NegNet(resource_key(found.subnetwork), resource_key(found.network))
        return out

    async def _placements(
        self, negs: Sequence[NegRef], nets: dict[str, NegNet], vms: Sequence[str]
    ) -> dict[str, tuple[str, list[str]]]:
        """Each VM's (address, NEG paths it belongs in); a VM that does not exist is left out, one on
        none of the NEGs' subnetworks gets ("", [])."""
        known = [(neg.path, nets[neg.path]) for neg in negs if neg.path in nets]
        gate = asyncio.Semaphore(VM_READS)

        async def one(vm: str) -> compute_v1.Instance | None:
            async with gate:
                try:
                    found: compute_v1.Instance = await self._api.call(
                        "instances.get", functools.partial(self._get_vm_blocking, vm)
                    )
                except gexc.NotFound:
                    return None
                except gexc.GoogleAPICallError as exc:
                    raise self._api.map_error(exc, f"read VM {vm}") from exc
                return found

        found = await asyncio.gather(*(one(vm) for vm in vms))
        out: dict[str, tuple[str, list[str]]] = {}
        for vm, instance in zip(vms, found, strict=True):
            if instance is not None:
                out[vm] = placement(instance.network_interfaces, known) or ("", [])
        return out

    async def _expected(self, name: str, lb: LoadBalancerConfig) -> frozenset[Pair] | None:
        """The (forwarding rule, backend service) pairs of the entry's frontends, or None (every health
        entry counts) when they cannot be resolved; that is logged once per entry and reason."""
        try:
            return expected_pairs(name, lb, await self._forwarding_rules(name), region=self._region)
        except ProviderInvalidRequest as exc:
            if (name, str(exc)) not in self._warned:
                self._warned.add((name, str(exc)))
                log.warning(
                    "%s; counting the health of every backend service that reaches the NEGs instead", exc
                )
            return None

    async def _forwarding_rules(self, name: str) -> list[compute_v1.ForwardingRule]:
        """Every forwarding rule of the shard's region (all pages)."""
        rules: list[compute_v1.ForwardingRule] = []
        token = ""
        while True:
            try:
                page = await self._api.call(
                    "forwardingRules.list", functools.partial(self._list_rules_blocking, token)
                )
            except gexc.GoogleAPICallError as exc:
                raise self._api.map_error(
                    exc, f"load_balancers.{name}.frontends: list the forwarding rules of {self._region}"
                ) from exc
            rules.extend(page.items)
            token = page.next_page_token
            if not token:
                return rules

    # ---- calls ------------------------------------------------------------------------------

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

    def _get_neg_blocking(self, neg: NegRef) -> compute_v1.NetworkEndpointGroup:
        return self._client.get(
            project=neg.project,
            zone=neg.zone,
            network_endpoint_group=neg.name,
            retry=None,
            timeout=self._api.request_timeout,
        )

    def _get_vm_blocking(self, vm: str) -> compute_v1.Instance:
        return self._instances.get(
            project=self._api.project,
            zone=self._api.zone,
            instance=vm,
            retry=None,
            timeout=self._api.request_timeout,
        )

    def _list_rules_blocking(self, page_token: str) -> Any:
        """One page of the region's forwarding rules (the pager; its ``items`` are this page's only)."""
        return self._rules.list(
            request=compute_v1.ListForwardingRulesRequest(
                project=self._api.project,
                region=self._region,
                max_results=self._page_size,
                page_token=page_token,
            ),
            retry=None,
            timeout=self._api.request_timeout,
        )

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
