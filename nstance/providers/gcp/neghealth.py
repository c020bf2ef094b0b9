"""Which NEG a VM joins with which address, and how its endpoint's health reads, as upstream decides.

Pure decisions for ``loadbalancers`` (no API calls), following upstream's Google provider:

* **Placement** (``placement``): a VM joins the NEGs of one of its network interfaces: the first
  interface, in the VM's order, whose subnetwork is the subnetwork of a configured NEG, with that
  interface's primary address (``networkIP``). Upstream configures one NEG per subnetwork, so that
  is one NEG; where several configured NEGs share the subnetwork, the VM joins each of them. A NEG
  that names no subnetwork (upstream never matches one) takes VMs by its network instead.
* **Frontends** (``expected_pairs``): each ``frontends`` entry (address and port) must be served by
  exactly one regional TCP forwarding rule of the shard's region with a backend service: its
  address equal, and its ``allPorts``, ``ports`` or ``portRange`` covering the port. The pairs
  (forwarding rule, backend service) of those rules are the ones whose health counts.
* **Health** (``endpoint_state``): an endpoint without health entries is registered. With
  frontends, only entries of an expected pair count: one ``DRAINING`` makes it draining, every
  expected pair ``HEALTHY`` makes it healthy, anything else registered (an unrelated healthy or
  draining pair changes nothing). Without frontends (this project's configs that set none), every
  entry counts: any ``DRAINING`` is draining, all ``HEALTHY`` healthy.

Resource references are compared as API paths (``projects/P/regions/R/...``), without the API URL
and a trailing ``/``.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

from google.cloud import compute_v1

from nstance.config.resources import LoadBalancerConfig
from nstance.providers.base import ProviderInvalidRequest
from nstance.providers.features import TargetState
from nstance.providers.gcp.resources import strip_api_url

#: (forwarding rule path, backend service path): one load balancer frontend and what serves it.
Pair = tuple[str, str]


def resource_key(ref: str) -> str:
    """A resource reference as a comparable path: no API URL, no trailing ``/``."""
    return strip_api_url(ref).rstrip("/")


@dataclass(frozen=True, slots=True)
class NegNet:
    """Where a NEG's endpoints live: its subnetwork (may be ``""``) and network, as paths."""

    subnetwork: str
    network: str


def placement(
    nics: Sequence[compute_v1.NetworkInterface], negs: Sequence[tuple[str, NegNet]]
) -> tuple[str, list[str]] | None:
    """(address, NEG paths) a VM with interfaces ``nics`` joins among ``negs`` ((path, where) pairs),
    or None when none of its interfaces is on a NEG's subnetwork (or network)."""
    for nic in nics:
        subnet, network = resource_key(nic.subnetwork), resource_key(nic.network)
        joined = [
            path
            for path, net in negs
            if (net.subnetwork and net.subnetwork == subnet)
            or (not net.subnetwork and net.network == network)
        ]
        if joined:
            return nic.network_i_p, joined
    return None


def forwarding_rule_serves(rule: compute_v1.ForwardingRule, port: int) -> bool:
    """Whether ``rule`` takes traffic for ``port`` (all ports, a listed port, or a port range)."""
    if rule.all_ports:
        return True
    if str(port) in rule.ports:
        return True
    first, sep, last = rule.port_range.partition("-")
    if not sep:
        return first == str(port)
    try:
        return int(first) <= port <= int(last)
    except ValueError:
        return False


def _same_address(a: str, b: str) -> bool:
    try:
        return ipaddress.ip_address(a) == ipaddress.ip_address(b)
    except ValueError:
        return a == b


def expected_pairs(
    name: str, lb: LoadBalancerConfig, rules: Sequence[compute_v1.ForwardingRule], *, region: str
) -> frozenset[Pair]:
    """The (forwarding rule, backend service) pairs of entry ``name``'s ``frontends`` among ``rules``
    (the region's forwarding rules); refuses a frontend no rule, or more than one, serves."""
    pairs: set[Pair] = set()
    for index, frontend in enumerate(lb.frontends):
        where = f"load_balancers.{name}.frontends[{index}]"
        serving = [
            rule
            for rule in rules
            if _same_address(rule.I_p_address, frontend.ip)
            and rule.I_p_protocol == "TCP"
            and forwarding_rule_serves(rule, frontend.port)
        ]
        if len(serving) > 1:
            names = ", ".join(sorted(rule.name for rule in serving))
            raise ProviderInvalidRequest(
                f"{where}: several TCP forwarding rules of region {region} serve "
                f"{frontend.ip}:{frontend.port} ({names}); name an address and port only one of them serves"
            )
        if not serving or not serving[0].backend_service:
            raise ProviderInvalidRequest(
                f"{where}: no TCP forwarding rule of region {region} with a backend service serves "
                f"{frontend.ip}:{frontend.port}; the frontends name the forwarding rules whose health counts"
            )
        pairs.add((resource_key(serving[0].self_link), resource_key(serving[0].backend_service)))
    return frozenset(pairs)


def endpoint_state(
    healths: Sequence[compute_v1.HealthStatusForNetworkEndpoint], expected: frozenset[Pair] | None
) -> TargetState:
    """One listed endpoint's state from its health entries (``expected``: see the module docstring)."""
    if not healths:
        return TargetState.REGISTERED
    if expected is None:
        states = [h.health_state for h in healths]
        if "DRAINING" in states:
            return TargetState.DRAINING
        return TargetState.HEALTHY if all(s == "HEALTHY" for s in states) else TargetState.REGISTERED
    healthy: set[Pair] = set()
    for health in healths:
        rule, backend = health.forwarding_rule.forwarding_rule, health.backend_service.backend_service
        if not rule or not backend:
            continue
        pair = (resource_key(rule), resource_key(backend))
        if pair not in expected:
            continue
        if health.health_state == "DRAINING":
            return TargetState.DRAINING
        if health.health_state == "HEALTHY":
            healthy.add(pair)
    return TargetState.HEALTHY if healthy == expected else TargetState.REGISTERED
