"""What the Operator API needs from a running shard, as plain types and one protocol.

The gRPC servicer (``services/operator``) is a thin translation layer: it reads the caller's tenant
from its verified certificate, converts protobuf to these types, calls a ``ShardAPI`` method, and
converts back. The shard (``shard/shard.py``) implements ``ShardAPI``. Keeping this seam explicit lets the
servicer be tested against a fake shard and the shard be driven without gRPC.

Methods raise ``nstance.core.errors`` exceptions; the error interceptor maps them to status codes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from nstance.config import GroupUpdate
from nstance.server.state.events import Events


@dataclass(frozen=True, slots=True)
class GroupView:
    """A group as the Operator API reports it (GroupStatus)."""

    key: str
    tenant: str
    template: str
    size: int
    instance_type: str
    subnet_pool: str
    vars: dict[str, str]
    is_static: bool
    etag: str
    actual_size: int
    provider_ids: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class InstanceView:
    """One instance as GetInstanceStatus and ListInstances report it."""

    instance_id: str
    tenant: str
    group: str
    #: ListInstances' word (``registered``, ``healthy``, ``draining`` besides the provider's).
    status: str
    created_at: datetime
    last_seen: datetime | None
    provider_id: str
    on_demand: bool = False
    draining: bool = False
    #: GetInstanceStatus' word: the provider's status, as upstream answers (``status`` when empty).
    provider_status: str = ""


@dataclass(frozen=True, slots=True)
class ConfigStatusView:
    """The loaded ``config.jsonc`` object."""

    etag: str
    last_modified: datetime | None
    size: int


@dataclass(frozen=True, slots=True)
class RefreshResult:
    """Outcome of RefreshConfig."""

    updated: bool
    prev_etag: str
    etag: str


@dataclass(frozen=True, slots=True)
class InstanceRequest:
    """CreateInstance input after conversion (empty strings mean "from the group")."""

    group: str
    instance_id: str = ""
    template: str = ""
    instance_type: str = ""
    subnet_pool: str = ""
    vars: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class IssuedCert:
    """A renewed operator certificate."""

    cert_pem: bytes
    expires_at: datetime


class ShardAPI(Protocol):
    """Operations the Operator API performs on a shard. Tenant comes from the caller's certificate."""

    events: Events

    def is_leader(self) -> bool:
        """Whether this server may act (shard leader, fenced)."""
        ...

    def leader_address(self) -> str:
        """The shard leader's operator address as last seen ("" when unknown)."""
        ...

    def list_groups(self, tenant: str) -> list[GroupView]:
        """Every group of the tenant, merged static + dynamic."""
        ...

    def find_group(self, tenant: str, group: str) -> GroupView | None:
        """One group of the tenant, or None when it does not exist."""
        ...

    async def upsert_group(self, tenant: str, group: str, update: GroupUpdate) -> GroupView:
        """Create or change a group; restricted fields of static groups are refused."""
        ...

    async def delete_group(self, tenant: str, group: str) -> bool:
        """Remove a dynamic group (or a static group's overrides); False when there was no dynamic
        entry (not an error: DeleteGroup is idempotent)."""
        ...

    async def create_instance(self, tenant: str, request: InstanceRequest) -> tuple[str, str]:
        """Create an on-demand instance; return (instance id, status). Idempotent per instance id."""
        ...

    async def delete_instance(self, tenant: str, instance_id: str) -> str:
        """Delete an instance; return ``deleting``, ``deleted`` or ``unknown``."""
        ...

    async def instance_status(self, tenant: str, instance_id: str) -> InstanceView:
        """Current status of one instance of the tenant (NotFound otherwise)."""
        ...

    async def list_instances(
        self,
        tenant: str,
        group: str = "",
        *,
        after: tuple[datetime, str] | None = None,
        limit: int | None = None,
    ) -> list[InstanceView]:
        """The tenant's live instances (of ``group`` only, when given), oldest first; ``after`` (the
        ``created_at`` and id of the last one of a previous page) and ``limit`` read one page."""
        ...

    def config_status(self) -> ConfigStatusView:
        """The loaded config object's etag, time and size."""
        ...

    async def refresh_config(self) -> RefreshResult:
        """Reload config and groups from object storage now."""
        ...

    async def acknowledge_drained(self, tenant: str, instance_id: str) -> None:
        """The operator finished draining: delete the instance now."""
        ...

    def draining_instances(self, tenant: str) -> list[tuple[InstanceView, str, datetime | None]]:
        """Instances of the tenant being drained: (view, reason, delete_at), for the watch snapshot."""
        ...

    async def renew_certificate(self, tenant: str, client_id: str, public_key_pem: bytes) -> IssuedCert:
        """Issue a new operator certificate for the same identity and a submitted key."""
        ...
