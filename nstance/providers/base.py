"""The Provider protocol every VM backend implements, its request/response types and its errors.

Providers are asynchronous: the server awaits them from its event loop, and a provider whose SDK is
blocking (boto3, proxmoxer) runs the call in a worker thread itself. A provider never decides
*whether* to create or delete; it only carries out one call and reports what the cloud said.

Statuses are normalised to ``InstanceStatus``. Metadata follows spec/groups-and-instances.md: the
identifier (``instance_id``), the association (managed marker, cluster id, shard) used for filtering,
and annotations (group, kind, created-at) for display. ``create_instance`` must be idempotent per
``CreateRequest.idempotency_token``: a retry with the same token returns the VM the first call made
(or is still making) instead of launching a second one.

Errors: ``InstanceNotFound`` (the VM does not exist), ``ProviderThrottled`` (the cloud said slow down;
retry after backoff), ``ProviderUnavailable`` (transient failure), ``ProviderInvalidRequest`` (the
request cannot succeed as given; names the config path when it can). This module has no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, Protocol

from nstance.core.errors import InvalidArgument, NotFound, ResourceExhausted, Unavailable


class InstanceStatus(StrEnum):
    """Provider VM states, normalised across clouds."""

    PENDING = "pending"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"
    SUSPENDING = "suspending"
    SUSPENDED = "suspended"
    DELETING = "deleting"
    DELETED = "deleted"
    REPAIRING = "repairing"
    UNKNOWN = "unknown"


#: States in which the VM cannot be serving: the instance is replaced without drain.
UNHEALTHY_STATUSES: frozenset[InstanceStatus] = frozenset(
    {
        InstanceStatus.STOPPING,
        InstanceStatus.STOPPED,
        InstanceStatus.SUSPENDING,
        InstanceStatus.SUSPENDED,
        InstanceStatus.DELETING,
        InstanceStatus.DELETED,
        InstanceStatus.REPAIRING,
    }
)

#: States after which the VM is gone or going; it no longer counts toward a group's size.
GONE_STATUSES: frozenset[InstanceStatus] = frozenset({InstanceStatus.DELETING, InstanceStatus.DELETED})


class InstanceNotFound(NotFound):
    """The provider has no VM with this id (or it is long gone)."""


class ProviderThrottled(ResourceExhausted):
    """The provider refused the call for rate reasons; retry after a backoff."""


class ProviderUnavailable(Unavailable):
    """A transient provider failure (timeout, 5xx, connection); retry after a backoff."""


class ProviderInvalidRequest(InvalidArgument):
    """The request cannot succeed as given (bad args, unknown subnet, arch mismatch)."""


@dataclass(frozen=True, slots=True)
class CreateRequest:
    """Everything a provider needs to create one VM. ``userdata`` is already rendered."""

    cluster_id: str
    shard: str
    tenant: str
    group: str
    template: str
    kind: str
    instance_id: str
    instance_type: str
    subnet_id: str
    arch: str
    userdata: bytes
    idempotency_token: str
    created_at: datetime
    args: Mapping[str, Any] = field(default_factory=dict)
    tags: Mapping[str, str] = field(default_factory=dict)  # custom tags from config
    spot: bool = False
    on_demand: bool = False  # tagged on the VM, so a lost record can be rebuilt by adoption
    # For providers that start the agent themselves (local): the agent's bootstrap identity.
    ca_pem: bytes = b""
    nonce: str = ""
    server_registration_addr: str = ""
    server_agent_addr: str = ""


@dataclass(frozen=True, slots=True)
class ProviderInstance:
    """One VM as the provider reports it."""

    instance_id: str  # Nstance instance id (identifier metadata)
    provider_id: str  # the cloud's own id (i-0abc, VMID, name)
    status: InstanceStatus
    cluster_id: str = ""
    shard: str = ""
    group: str = ""
    kind: str = ""
    tenant: str = ""  # annotation tags: what adoption needs to rebuild a missing record
    template: str = ""
    on_demand: bool = False
    instance_type: str = ""
    subnet_id: str = ""
    ip4: str = ""
    ip6: str = ""
    hostname: str = ""
    zone: str = ""
    launched_at: datetime | None = None


class Provider(Protocol):
    """A VM backend. Every method may raise the errors of this module (and only those, for expected cases)."""

    @property
    def kind(self) -> str:
        """Provider name as in config (``sim``, ``local``, ``aws``, ``gcp``, ``proxmox``)."""
        ...

    async def create_instance(self, request: CreateRequest) -> ProviderInstance:
        """Create one VM, idempotently per ``request.idempotency_token``; return it as first seen."""
        ...

    async def delete_instance(self, instance_id: str, provider_id: str) -> None:
        """Delete the VM; a VM that does not exist is not an error."""
        ...

    async def get_instance(self, instance_id: str, provider_id: str) -> ProviderInstance:
        """Current state of one VM; raise InstanceNotFound when it does not exist."""
        ...

    async def list_instances(self, cluster_id: str, shard: str) -> list[ProviderInstance]:
        """Every VM tagged with this cluster and shard, all pages read."""
        ...

    async def check_subnet_capacity(self, subnet_id: str) -> bool:
        """Whether the subnet can take one more VM."""
        ...

    async def close(self) -> None:
        """Release clients, threads and child processes."""
        ...
