"""Optional provider capabilities beyond ``Provider``: load balancer targets, the leader network,
machine-image lookup, instance-type checks and the provider id of the VM this process runs on.

A provider implements the capabilities its cloud has (``aws``: all; ``google``: all but images;
``sim``: all, in memory; ``proxmox`` and ``local``: none). The server asks ``load_balancing(provider)``
(and likewise for the others) and gets the provider typed as that protocol, or None; wrappers such
as the server's metrics proxy and its fenced handle are looked through (their ``inner``, down to the
innermost) so that they never claim a capability the wrapped provider lacks.

Load balancers are handled per target, in batches: ``register_targets`` attaches VMs to every
target group (AWS) or network endpoint group (Google) of one ``load_balancers`` entry;
``deregister_targets`` only *starts* removing them (connection draining may take minutes) and
``target_states`` tells where each VM stands in that entry as a whole, so the caller decides how long
to wait and never blocks inside the provider. This module has no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol, cast, runtime_checkable

from nstance.config.resources import ImageConfig, LoadBalancerConfig
from nstance.core.wrapping import innermost


class TargetState(StrEnum):
    """Where one VM stands in one ``load_balancers`` entry (all of its target groups / NEGs)."""

    #: Attached everywhere; the load balancer's own health check has not passed (yet) or is unknown.
    REGISTERED = "registered"
    #: Attached everywhere and passing the load balancer's health checks.
    HEALTHY = "healthy"
    #: Attached to some of the entry's target groups or endpoint groups, not all.
    PARTIALLY_REGISTERED = "partially_registered"
    #: Being removed: the load balancer sends no new connections but existing ones may still drain.
    DRAINING = "draining"
    #: Attached nowhere (never was, or removal finished): safe to delete the VM.
    DEREGISTERED = "deregistered"


def combine_states(states: Sequence[TargetState]) -> TargetState:
    """One state for a VM across several target groups / NEGs of one entry (each one's state given).

    Draining anywhere wins (the VM is on its way out); attached nowhere is ``deregistered``;
    attached to some but not all is ``partially_registered``; otherwise ``healthy`` only when every
    part says so.
    """
    if not states:
        return TargetState.DEREGISTERED
    if TargetState.DRAINING in states:
        return TargetState.DRAINING
    attached = [s for s in states if s != TargetState.DEREGISTERED]
    if not attached:
        return TargetState.DEREGISTERED
    if len(attached) < len(states) or TargetState.PARTIALLY_REGISTERED in attached:
        return TargetState.PARTIALLY_REGISTERED
    if all(s == TargetState.HEALTHY for s in attached):
        return TargetState.HEALTHY
    return TargetState.REGISTERED


@dataclass(frozen=True, slots=True)
class LbTarget:
    """One VM as a load balancer target."""

    instance_id: str  # Nstance instance id (results are keyed by it)
    provider_id: str  # the cloud's id of the VM (EC2 instance id, GCE numeric id)
    ip4: str = ""  # primary private IPv4, for endpoint-by-address load balancers
    name: str = ""  # the VM's name at the provider where it differs from the instance id


@runtime_checkable
class LoadBalancing(Protocol):
    """Registration of VMs with the load balancers named in ``load_balancers`` entries."""

    async def register_targets(self, name: str, lb: LoadBalancerConfig, targets: Sequence[LbTarget]) -> None:
        """Attach every target to every part of entry ``name`` (idempotent; attached ones stay)."""
        ...

    async def deregister_targets(
        self, name: str, lb: LoadBalancerConfig, targets: Sequence[LbTarget]
    ) -> None:
        """Start removing the targets from every part of ``name``; return without waiting for draining.

        Removing a target that is not attached (or whose target group is gone) is not an error.
        """
        ...

    async def target_states(
        self, name: str, lb: LoadBalancerConfig, targets: Sequence[LbTarget]
    ) -> dict[str, TargetState]:
        """The state of each target in entry ``name``, keyed by ``instance_id``."""
        ...


@runtime_checkable
class LeaderNetworking(Protocol):
    """A floating address (``shard.leader_network``) that follows the shard leader's VM."""

    async def assign_leader_network(self, provider_id: str, ip: str, interface_id: str) -> None:
        """Give VM ``provider_id`` the leader address, taking it from any VM that holds it now."""
        ...

    async def release_leader_network(self, provider_id: str, ip: str, interface_id: str) -> None:
        """Take the leader address off VM ``provider_id`` if, and only if, it holds it."""
        ...


@runtime_checkable
class OwnInstance(Protocol):
    """Knows which VM the calling process runs on (the cloud's metadata service)."""

    async def own_instance_id(self) -> str:
        """The provider id of this VM; raises ProviderUnavailable when no metadata service answers."""
        ...


@runtime_checkable
class ImageLookup(Protocol):
    """Resolves ``images`` entries to the provider's image ids."""

    async def lookup_image(self, name: str, image: ImageConfig) -> str:
        """The id of the image that best matches ``image`` now; raise if the lookup fails or finds none."""
        ...


@runtime_checkable
class InstanceTypeCheck(Protocol):
    """Knows the CPU architecture of the provider's instance types."""

    async def check_instance_type(self, instance_type: str, arch: str, *, template: str, where: str) -> None:
        """Raise ProviderInvalidRequest naming ``where`` unless ``instance_type`` runs ``arch``."""
        ...


def _has(provider: object, protocol: type) -> bool:
    """Whether ``provider`` has ``protocol``'s methods and so does the provider it wraps, if any.

    A wrapper (anything with an ``inner`` provider, like the server's metrics proxy or its fenced
    handle, possibly one around the other) defines every capability's methods; only the innermost
    provider says which it really has.
    """
    return isinstance(provider, protocol) and isinstance(innermost(provider), protocol)


def load_balancing(provider: object) -> LoadBalancing | None:
    """``provider`` as LoadBalancing when it (or the provider it wraps) has that capability."""
    return cast(LoadBalancing, provider) if _has(provider, LoadBalancing) else None


def leader_networking(provider: object) -> LeaderNetworking | None:
    """``provider`` as LeaderNetworking when it (or the provider it wraps) has that capability."""
    return cast(LeaderNetworking, provider) if _has(provider, LeaderNetworking) else None


def own_instance(provider: object) -> OwnInstance | None:
    """``provider`` as OwnInstance when it (or the provider it wraps) has that capability."""
    return cast(OwnInstance, provider) if _has(provider, OwnInstance) else None


def image_lookup(provider: object) -> ImageLookup | None:
    """``provider`` as ImageLookup when it (or the provider it wraps) has that capability."""
    return cast(ImageLookup, provider) if _has(provider, ImageLookup) else None


def instance_type_check(provider: object) -> InstanceTypeCheck | None:
    """``provider`` as InstanceTypeCheck when it (or the provider it wraps) has that capability."""
    return cast(InstanceTypeCheck, provider) if _has(provider, InstanceTypeCheck) else None
