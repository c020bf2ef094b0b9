"""Fenced handles: an object store and a provider that only the shard leader can change things with.

``ShardContext`` holds its object store and its provider only through these wrappers, so every
leader-only path (recovery and its retries, the record follow-ups, GC, load-balancer registration,
image resolution, drain and retire, group edits, leader-network moves) is fenced at the one place
where the change happens, not by checks scattered over call sites. Immediately before each object-store
write (``put``, ``put_if_match``, ``delete``) and each provider mutation (create, delete, load-balancer
register and deregister, leader-network assign, image lookup) the wrapper calls ``fence``, which
raises ``NotLeader`` unless the election's fenced lease is valid at that instant. Reads pass through:
followers read records and config too.

``release_leader_network`` is deliberately not fenced: a server that lost leadership must still be able
to take the leader address off its own VM (it never touches another VM's address).

The election's own lockfile writes do not go through here (the elector has the unwrapped store).
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Sequence
from typing import Any

from nstance.config.resources import ImageConfig, LoadBalancerConfig
from nstance.core.errors import Unavailable
from nstance.objectstore.base import ObjectInfo, ObjectStore
from nstance.providers.base import CreateRequest, Provider, ProviderInstance
from nstance.providers.features import LbTarget, TargetState


class NotLeader(Unavailable):
    """This server is not (or no longer) the shard leader: the write or provider call was not made."""


Fence = Callable[[], None]
"""Raises NotLeader unless this server holds fenced leadership right now."""


class FencedStore:
    """``store`` for reading by anyone and for writing by the leader only (see the module docstring)."""

    def __init__(self, store: ObjectStore, fence: Fence) -> None:
        self._store = store
        self._fence = fence

    def __repr__(self) -> str:
        return f"FencedStore({self._store!r})"

    @property
    def inner(self) -> ObjectStore:
        """The wrapped store, for probes of what it is (reads and writes go through this wrapper)."""
        return self._store

    def get(self, key: str) -> tuple[bytes, str]:
        return self._store.get(key)

    def head(self, key: str) -> ObjectInfo:
        return self._store.head(key)

    def list(self, prefix: str = "") -> builtins.list[str]:
        return self._store.list(prefix)

    def exists(self, key: str) -> bool:
        return self._store.exists(key)

    def put(self, key: str, data: bytes) -> str:
        self._fence()
        return self._store.put(key, data)

    def put_if_match(self, key: str, data: bytes, etag: str | None) -> str:
        self._fence()
        return self._store.put_if_match(key, data, etag)

    def delete(self, key: str, if_match: str | None = None) -> None:
        self._fence()
        self._store.delete(key, if_match=if_match)


class FencedProvider:
    """``provider`` for reads by anyone and for mutations by the leader only (see the module docstring).

    It defines every optional capability's methods; ``nstance.providers.features`` looks through
    ``inner`` to the provider that really has them.
    """

    def __init__(self, provider: Provider, fence: Fence) -> None:
        self._provider = provider
        self._fence = fence

    @property
    def inner(self) -> Provider:
        """The wrapped provider, for capability probes (calls must go through this wrapper)."""
        return self._provider

    @property
    def kind(self) -> str:
        return self._provider.kind

    @property
    def _any(self) -> Any:
        return self._provider

    # --- mutations: fenced ---------------------------------------------------------------------

    async def create_instance(self, request: CreateRequest) -> ProviderInstance:
        self._fence()
        return await self._provider.create_instance(request)

    async def delete_instance(self, instance_id: str, provider_id: str) -> None:
        self._fence()
        await self._provider.delete_instance(instance_id, provider_id)

    async def register_targets(self, name: str, lb: LoadBalancerConfig, targets: Sequence[LbTarget]) -> None:
        self._fence()
        await self._any.register_targets(name, lb, targets)

    async def deregister_targets(
        self, name: str, lb: LoadBalancerConfig, targets: Sequence[LbTarget]
    ) -> None:
        self._fence()
        await self._any.deregister_targets(name, lb, targets)

    async def assign_leader_network(self, provider_id: str, ip: str, interface_id: str) -> None:
        self._fence()
        await self._any.assign_leader_network(provider_id, ip, interface_id)

    async def lookup_image(self, name: str, image: ImageConfig) -> str:
        self._fence()  # answers are stored and used for creates: the leader's business
        result: str = await self._any.lookup_image(name, image)
        return result

    # --- reads, and the release a former leader must still be able to make -----------------------

    async def get_instance(self, instance_id: str, provider_id: str) -> ProviderInstance:
        return await self._provider.get_instance(instance_id, provider_id)

    async def list_instances(self, cluster_id: str, shard: str) -> list[ProviderInstance]:
        return await self._provider.list_instances(cluster_id, shard)

    async def check_subnet_capacity(self, subnet_id: str) -> bool:
        return await self._provider.check_subnet_capacity(subnet_id)

    async def target_states(
        self, name: str, lb: LoadBalancerConfig, targets: Sequence[LbTarget]
    ) -> dict[str, TargetState]:
        result: dict[str, TargetState] = await self._any.target_states(name, lb, targets)
        return result

    async def release_leader_network(self, provider_id: str, ip: str, interface_id: str) -> None:
        await self._any.release_leader_network(provider_id, ip, interface_id)

    async def own_instance_id(self) -> str:
        result: str = await self._any.own_instance_id()
        return result

    async def check_instance_type(self, instance_type: str, arch: str, *, template: str, where: str) -> None:
        await self._any.check_instance_type(instance_type, arch, template=template, where=where)

    async def close(self) -> None:
        await self._provider.close()
