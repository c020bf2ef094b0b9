"""The cloud as one simulated server sees it: the shared ``SimProvider`` behind its gate, fenced.

All servers share one ``SimProvider`` (``World.cloud``: EC2-shaped, load balancers included, with
throttling, a not-found-after-create window and creates whose response is lost after the VM
launched). Each incarnation reaches it through its own ``SimCloud``, which

* raises ``SimCrash`` once the incarnation is dead, before the call and after it (a process that died
  while the call was in flight sees no answer);
* fails every call while the incarnation has lost the provider's API (``Gate.provider_lost_until``);
* checks every mutating call with ``World.check_acting`` as it happens (only the one leader may act);
* refuses creates beyond the simulated account's quota per group, reporting the first as a broken
  promise;
* records each create's nonce (``World.nonces``): the agent of that VM registers with it.

It must not decide anything for the server, nor inject faults itself: throttling and lost responses
are set on the shared provider by ``faults``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

from nstance.config.resources import ImageConfig, LoadBalancerConfig
from nstance.providers.base import CreateRequest, InstanceStatus, ProviderInstance, ProviderUnavailable
from nstance.providers.features import LbTarget, TargetState
from nstance.simulation.floods import MAX_GROUP_SIZE, QUOTA_FACTOR

if TYPE_CHECKING:
    from nstance.simulation.servers import Incarnation
    from nstance.simulation.world import World

T = TypeVar("T")


class SimCloud:
    """The shared SimProvider as one server sees it: behind its gate, mutating calls checked."""

    def __init__(self, world: World, inc: Incarnation) -> None:
        self._world = world
        self._inc = inc
        self.inner = world.cloud

    @property
    def kind(self) -> str:
        return "sim"

    async def _call(self, what: str, mutating: bool, call: Callable[[], Awaitable[T]]) -> T:
        self._inc.gate.check()
        if self._world.clock.monotonic() < self._inc.gate.provider_lost_until:
            raise ProviderUnavailable(f"the provider API is unreachable from {self._inc.name} (simulated)")
        if mutating:
            self._world.check_acting(self._inc, what)
        result = await call()
        self._inc.gate.check()
        return result

    def _check_quota(self, request: CreateRequest) -> None:
        """The simulated account's quota: a create beyond it breaks a promise and is refused."""
        world = self._world
        quota = QUOTA_FACTOR * MAX_GROUP_SIZE
        live = sum(
            1
            for vm in self.inner.vms.values()
            if vm.group == request.group
            and vm.status not in (InstanceStatus.DELETED, InstanceStatus.DELETING)
        )
        if live < quota:
            return
        world.quota_refusals += 1
        if world.quota_refusals == 1:
            world.violations.append(
                f"t={world.now():.2f}: the cloud was asked for more than {quota} VMs in group "
                f"{request.group} ({QUOTA_FACTOR} x shard.limits.max_group_size)"
            )
        raise ProviderUnavailable(f"simulated quota: {live} VMs run in group {request.group}")

    async def create_instance(self, request: CreateRequest) -> ProviderInstance:
        self._world.nonces[request.instance_id] = request.nonce
        self._check_quota(request)
        return await self._call("create", True, lambda: self.inner.create_instance(request))

    async def delete_instance(self, instance_id: str, provider_id: str) -> None:
        await self._call("delete", True, lambda: self.inner.delete_instance(instance_id, provider_id))

    async def get_instance(self, instance_id: str, provider_id: str) -> ProviderInstance:
        return await self._call("get", False, lambda: self.inner.get_instance(instance_id, provider_id))

    async def list_instances(self, cluster_id: str, shard: str) -> list[ProviderInstance]:
        return await self._call("list", False, lambda: self.inner.list_instances(cluster_id, shard))

    async def check_subnet_capacity(self, subnet_id: str) -> bool:
        return await self._call("capacity", False, lambda: self.inner.check_subnet_capacity(subnet_id))

    async def register_targets(self, name: str, lb: LoadBalancerConfig, targets: Sequence[LbTarget]) -> None:
        await self._call("register", True, lambda: self.inner.register_targets(name, lb, targets))

    async def deregister_targets(
        self, name: str, lb: LoadBalancerConfig, targets: Sequence[LbTarget]
    ) -> None:
        await self._call("deregister", True, lambda: self.inner.deregister_targets(name, lb, targets))

    async def target_states(
        self, name: str, lb: LoadBalancerConfig, targets: Sequence[LbTarget]
    ) -> dict[str, TargetState]:
        return await self._call("states", False, lambda: self.inner.target_states(name, lb, targets))

    async def assign_leader_network(self, provider_id: str, ip: str, interface_id: str) -> None:
        await self._call(
            "assign", True, lambda: self.inner.assign_leader_network(provider_id, ip, interface_id)
        )

    async def release_leader_network(self, provider_id: str, ip: str, interface_id: str) -> None:
        await self._call(
            "release", False, lambda: self.inner.release_leader_network(provider_id, ip, interface_id)
        )

    async def lookup_image(self, name: str, image: ImageConfig) -> str:
        return await self._call("image", False, lambda: self.inner.lookup_image(name, image))

    async def check_instance_type(self, instance_type: str, arch: str, *, template: str, where: str) -> None:
        await self._call(
            "type",
            False,
            lambda: self.inner.check_instance_type(instance_type, arch, template=template, where=where),
        )

    async def close(self) -> None:
        return None
