"""Schema of the ``shard`` section: one zone shard's provider, listeners, pools and timings.

Holds upstream defaults (request_timeout 30s, health_check_interval 60s, default_drain_timeout 5m,
image_refresh_interval 6h, shutdown_timeout 10s, GC 2m/5m/30m, error-exit jitter 10s/40s) and the
rules that need only this section. Unlike upstream, ``default_drain_timeout: "0s"`` is kept as 0
(drain disabled) instead of being rewritten to 5m. No I/O, no provider calls.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from datetime import timedelta
from typing import Annotated, Any, Self

from pydantic import (
    AfterValidator,
    Field,
    ModelWrapValidatorHandler,
    PrivateAttr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from nstance.config.cluster import LeaderElectionConfig
from nstance.config.fields import (
    Duration,
    Identifier,
    NonEmptyStr,
    PoolName,
    PositiveDuration,
    Provider,
    Ref,
    Rules,
    StrictModel,
    seconds,
    zero_means_default,
)
from nstance.config.limits import LimitsConfig
from nstance.core.hostport import split_host_port

ADDR_FIELDS: tuple[str, ...] = (
    "health_addr",
    "election_addr",
    "registration_addr",
    "operator_addr",
    "agent_addr",
)
_WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::", "[::]"})


class InfraConfig(StrictModel):
    """Which infrastructure provider this shard drives, and where."""

    provider: Provider
    """`aws`, `google` (alias `gcp`), `proxmox`, `local` (every instance is an `nstance-agent` process on
    the server's machine) or `sim` (simulated VMs, for tests and demos). Upstream's development providers
    `tmux` and `mock` run as `local` and `sim` (with a notice). Templates see the name as written
    (`.Provider.Kind`), as upstream's do."""
    region: NonEmptyStr
    """The provider's region (any label for `proxmox` and `local`); `Provider.Region` in templates."""
    zone: NonEmptyStr
    """The zone this shard runs in (AWS availability zone, Google zone, any label for `proxmox` and
    `local`); `Provider.Zone` in templates."""
    options: dict[str, Any] = Field(default_factory=dict)
    """Provider options; each provider refuses keys it does not know, naming them. See
    docs/provider-aws.md, docs/provider-gcp.md and docs/provider-proxmox.md."""

    _provider_as_written: str = PrivateAttr(default="")

    @model_validator(mode="wrap")
    @classmethod
    def _keep_the_provider_as_written(cls, data: Any, handler: ModelWrapValidatorHandler[Self]) -> Self:
        model = handler(data)
        written = data.get("provider") if isinstance(data, Mapping) else None
        model._provider_as_written = written if isinstance(written, str) else ""
        return model

    @property
    def provider_as_written(self) -> str:
        """``provider`` exactly as the document writes it (``gcp``, ``tmux``...): what upstream passes to
        templates as ``.Provider.Kind``. Not dumped, so never part of a hash."""
        return self._provider_as_written or self.provider


#: Keys of ``shard.infra.options`` that name a Google shard's project: upstream's (both generations), ours.
GOOGLE_PROJECT_KEYS: tuple[str, ...] = ("project_id", "project")


def google_project(options: Mapping[str, Any]) -> str:
    """The project a Google shard's ``shard.infra.options`` names (``project_id`` first); "" if none."""
    for key in GOOGLE_PROJECT_KEYS:
        value = options.get(key)
        if isinstance(value, str) and value:
            return value
    return ""


class AddrsConfig(StrictModel):
    """The five addresses of a server.

    Each is ``host:port`` with a port from 1 to 65535 and an IPv6 host in brackets
    (``[fd00::5]:8993``). In ``shard.bind`` an empty host (``:8993``) listens on every interface; in
    ``shard.advertise`` an empty, ``0.0.0.0`` or ``::`` host is replaced by the server's primary IP
    at start-up (``--advertise-host`` sets it for ``health_addr`` and ``election_addr``, which must then
    name no host, as upstream's).
    """

    health_addr: str
    """Health and metrics endpoint. The server listens on `shard.bind.health_addr` once the config is
    loaded (on `:8990` before), or on `--health-addr` when given; the advertised value is recorded in the
    shard lockfile (`healthAddr`)."""
    election_addr: str
    """Election peer address. No listener is opened on it; the advertised value is the `leaderAddr` of the
    lockfiles."""
    registration_addr: str
    """RegistrationService (TLS without client certificates): agents and operators register here."""
    operator_addr: str
    """Operator API (mTLS, client certificates with role `operator`)."""
    agent_addr: str
    """Agent API (mTLS, client certificates with role `agent`)."""

    def addrs(self) -> dict[str, str]:
        return {name: getattr(self, name) for name in ADDR_FIELDS}

    @model_validator(mode="after")
    def _rules(self) -> Self:
        rules = Rules()
        for name, addr in self.addrs().items():
            if split_host_port(addr) is None:
                rules.add(name, f'must be "host:port" with a port between 1 and 65535 (got "{addr}")')
        rules.check()
        return self


def _same_listener(a: tuple[str, int], b: tuple[str, int]) -> bool:
    if a[1] != b[1]:
        return False
    return a[0] == b[0] or a[0] in _WILDCARD_HOSTS or b[0] in _WILDCARD_HOSTS


class BindConfig(AddrsConfig):
    """Addresses the server listens on, in the form of ``shard.advertise``; no two may share one.

    A listener on an empty or wildcard host clashes with every other listener on the same port.
    """

    @model_validator(mode="after")
    def _distinct(self) -> Self:
        rules = Rules()
        parsed = {name: split_host_port(addr) for name, addr in self.addrs().items()}
        for i, name in enumerate(ADDR_FIELDS):
            mine = parsed[name]
            for earlier in ADDR_FIELDS[:i]:
                theirs = parsed[earlier]
                if mine is not None and theirs is not None and _same_listener(mine, theirs):
                    rules.add(name, "must differ from ", Ref((earlier,)))
                    break
        rules.check()
        return self


class LeaderNetworkConfig(StrictModel):
    """A floating IP (and, on AWS, the ENI holding it) moved to whichever server leads."""

    ip: NonEmptyStr
    """The address that follows the leader; it must be an IP address. Google supports IPv4 only."""
    interface_id: str = ""
    """AWS: the ENI (`eni-...`) that holds `ip`; required. Google: the VM network interface that gets the
    alias IP (`nic0` when empty)."""

    @model_validator(mode="after")
    def _rules(self) -> Self:
        rules = Rules()
        try:
            ipaddress.ip_address(self.ip)
        except ValueError:
            rules.add("ip", f'must be an IP address (got "{self.ip}")')
        rules.check()
        return self


class GarbageCollectionConfig(StrictModel):
    """Cleanup of instances that never registered and of old deleted-instance records."""

    interval: Duration = timedelta(minutes=2)
    """How often the leader collects garbage: never-registered instances, stale create intents, VMs the
    provider lists but no record explains, and old records. `0s` together with `registration_timeout: 0s`
    disables it."""
    registration_timeout: Duration = timedelta(minutes=5)
    """An instance that has not registered this long after its creation is deleted; also the lifetime of
    agent registration nonces. Must be greater than `interval`, or `0s` when `interval` is `0s`."""
    deleted_record_retention: Duration = timedelta(minutes=30)
    """How long records of deleted instances stay in object storage and SQLite before they are purged.
    `0s` means the default, as upstream reads it."""

    @field_validator("deleted_record_retention")
    @classmethod
    def _retention_zero_is_default(cls, value: timedelta, info: ValidationInfo) -> timedelta:
        return zero_means_default(cls, value, info)

    @model_validator(mode="after")
    def _rules(self) -> Self:
        rules = Rules()
        zero = timedelta(0)
        if self.interval == zero and self.registration_timeout > zero:
            rules.add(
                "registration_timeout", "must be 0 when ", Ref(("interval",)), " is 0 (both 0 disables GC)"
            )
        elif self.interval > zero and self.registration_timeout == zero:
            rules.add("registration_timeout", "must be greater than 0 when ", Ref(("interval",)), " is set")
        elif self.interval > zero and self.registration_timeout <= self.interval:
            rules.add("registration_timeout", "must be greater than ", Ref(("interval",)))
        rules.check()
        return self


class DeletionBrakeConfig(StrictModel):
    """Bounds on deletions the leader decides on its own (orphan VMs, silent agents), per group."""

    max_deletions: int = Field(default=5, ge=1)
    """At most this many VMs of one group are deleted as orphans, and at most this many are replaced for
    missed health reports, per `interval`; the rest wait (and are reported)."""
    interval: PositiveDuration = timedelta(minutes=10)
    """The window `max_deletions` counts in."""
    silent_fraction: float = Field(default=0.5, gt=0, le=1)
    """When at least this fraction of a group's registered instances (and at least `min_silent` of
    them) stop reporting together (within one missed-report window, or all of them), the fault is
    presumed to be the server's: none is replaced for up to `max_hold`, and `/health` says why."""
    min_silent: int = Field(default=2, ge=1)
    """Fewer silent instances than this are never taken for a fault on the server's side."""
    max_hold: PositiveDuration = timedelta(minutes=5)
    """How long such a presumed server-side fault holds replacements back; if the silence lasts
    longer, the silent instances are replaced at the `max_deletions` rate."""


class ExpiryConfig(StrictModel):
    """Instance age limits: eligible (replace when convenient), forced, and for on-demand instances."""

    eligible_age: Duration | None = None
    """Instances older than this are rotated (replacement first, then drain), one per reconcile and only
    while nothing in the group drains. Unset: never."""
    forced_age: Duration | None = None
    """Instances older than this are rotated even while another drain runs, one per reconcile. Must be
    greater than `eligible_age`. Unset: never."""
    ondemand_age: Duration | None = None
    """On-demand instances older than this are drained and deleted, without replacement. Unset: never."""

    @model_validator(mode="after")
    def _rules(self) -> Self:
        rules = Rules()
        if (
            self.eligible_age is not None
            and self.forced_age is not None
            and self.eligible_age >= self.forced_age
        ):
            rules.add("forced_age", "must be greater than ", Ref(("eligible_age",)))
        rules.check()
        return self


class ErrorExitJitterConfig(StrictModel):
    """Upstream's random delay before exiting on a fatal error; accepted and not used here."""

    min_delay: Duration = seconds(10)
    """Accepted for upstream compatibility and not used: this server retries failed start-up steps with
    backoff instead of exiting."""
    max_delay: Duration = seconds(40)
    """Accepted for upstream compatibility and not used; must not be less than `min_delay`."""

    @model_validator(mode="after")
    def _rules(self) -> Self:
        rules = Rules()
        if self.max_delay < self.min_delay:
            rules.add("max_delay", "must not be less than ", Ref(("min_delay",)))
        rules.check()
        return self


def _check_pools(pools: dict[str, list[str]]) -> dict[str, list[str]]:
    rules = Rules()
    owner: dict[str, str] = {}
    for pool, subnets in pools.items():
        if not subnets:
            rules.add(pool, "must list at least one subnet")
        for i, subnet in enumerate(subnets):
            if subnet in owner:
                where = "earlier in this pool" if owner[subnet] == pool else f'in pool "{owner[subnet]}"'
                rules.add((pool, i), f'subnet "{subnet}" is already {where}')
            else:
                owner[subnet] = pool
    rules.check()
    return pools


SubnetPools = Annotated[dict[PoolName, list[NonEmptyStr]], Field(min_length=1), AfterValidator(_check_pools)]
"""Pool name → provider subnet IDs: at least one pool, one subnet each, no subnet in two pools."""


class ShardConfig(StrictModel):
    """One zone shard: provider, listeners, subnet pools and the server's timings."""

    id: Identifier
    """Shard identifier; must equal `nstance-server --shard`. The file is stored as
    `shard/<id>/config.jsonc`."""
    infra: InfraConfig
    """Which provider creates this shard's VMs, and where."""
    bind: BindConfig
    """Addresses this server listens on. An empty host (`:8993`) listens on every interface; `--bind-host`
    replaces every host."""
    advertise: AddrsConfig
    """Addresses given to agents (userdata, `Server.*` in templates) and operators, and written to the
    lockfiles. With standby servers, use the shard's leader address (`leader_network.ip`, a keepalived
    address, or a DNS name that follows the leader); `--advertise-host` sets the host of `health_addr`
    and `election_addr` (this server's own), as upstream's does."""
    leader_network: LeaderNetworkConfig | None = None
    """A private address moved to whichever server leads (AWS: the ENI `interface_id`; Google: an alias
    IP). Refused for providers that cannot move one (`proxmox`, `local`); use keepalived there."""
    subnet_pools: SubnetPools
    """Pool name to provider subnet IDs: AWS subnet IDs, Google subnetworks, Proxmox bridges (`vmbr0`, or
    `vmbr0:120` with a VLAN tag)."""
    dynamic_subnet_pools: list[str] | None = None
    """Pools that groups created through the Operator API may use; each must be a pool of `subnet_pools`.
    Unset or empty: any pool (as upstream reads an empty list)."""
    request_timeout: Duration = seconds(30)
    """Upstream's per-request timeout. Here only garbage collection uses it: a create intent whose provider
    call never started is retired once older than twice this value. `0s` means the default, as upstream
    reads it."""
    create_rate_limit: Duration = timedelta(0)
    """Minimum spacing between two provider creates of this shard; `0s`: none."""
    health_check_interval: Duration = seconds(60)
    """How often agents are expected to report; set the agents' `NSTANCE_REPORT_INTERVAL` to the same
    value. A registered agent silent for three intervals while its VM runs is replaced and drained. `0s`
    means the default, as upstream reads it."""
    default_drain_timeout: Duration = timedelta(minutes=5)
    """Drain timeout of groups that set none. `0s` disables drain: instances are deleted at once (upstream
    rewrites 0 to 5m)."""
    image_refresh_interval: PositiveDuration = timedelta(hours=6)
    """How old a resolved `images` answer may get before the leader looks it up again."""
    shutdown_timeout: Duration = seconds(10)
    """On SIGTERM or loss of leadership, how long provider calls in flight may take to finish and record
    their outcome."""
    garbage_collection: GarbageCollectionConfig = GarbageCollectionConfig()
    """Cleanup timing."""
    expiry: ExpiryConfig = ExpiryConfig()
    """Instance age limits."""
    deletion_brake: DeletionBrakeConfig = DeletionBrakeConfig()
    """The mass-deletion brake (not in upstream's schema)."""
    leader_election: LeaderElectionConfig = LeaderElectionConfig()
    """Timing of the shard election (`shard/<id>/leader.json`)."""
    error_exit_jitter: ErrorExitJitterConfig = ErrorExitJitterConfig()
    """Accepted for upstream compatibility; not used."""
    max_concurrent_creates: int = Field(default=16, ge=1)
    """At most this many provider creates in flight at once, across all groups of the shard."""
    limits: LimitsConfig = LimitsConfig()
    """Upper bounds on what the shard accepts through the API and in its documents."""

    @field_validator("request_timeout", "health_check_interval")
    @classmethod
    def _zero_is_default(cls, value: timedelta, info: ValidationInfo) -> timedelta:
        return zero_means_default(cls, value, info)

    @field_validator("dynamic_subnet_pools")
    @classmethod
    def _dynamic_pools_exist(cls, value: list[str] | None, info: ValidationInfo) -> list[str] | None:
        pools = info.data.get("subnet_pools")
        if value is None or pools is None:
            return value
        rules = Rules()
        for i, pool in enumerate(value):
            if pool not in pools:
                rules.add(i, f'subnet pool "{pool}" is not defined in shard.subnet_pools')
        rules.check()
        return value

    @field_validator("leader_network")
    @classmethod
    def _leader_interface(
        cls, value: LeaderNetworkConfig | None, info: ValidationInfo
    ) -> LeaderNetworkConfig | None:
        infra = info.data.get("infra")
        if value is not None and infra is not None and infra.provider == "aws" and not value.interface_id:
            rules = Rules()
            rules.add(
                "interface_id", 'is required when the provider is "aws" (the ENI that carries the leader IP)'
            )
            rules.check()
        return value
