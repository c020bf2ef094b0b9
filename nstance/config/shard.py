"""Schema of the ``shard`` section: one zone shard's provider, listeners, pools and timings.

Holds upstream defaults (request_timeout 30s, health_check_interval 60s, default_drain_timeout 5m,
image_refresh_interval 6h, shutdown_timeout 10s, GC 2m/5m/30m, error-exit jitter 10s/40s) and the
rules that need only this section. Unlike upstream, ``default_drain_timeout: "0s"`` is kept as 0
(drain disabled) instead of being rewritten to 5m. No I/O, no provider calls.
"""

from __future__ import annotations

import ipaddress
from datetime import timedelta
from typing import Annotated, Any, Self

from pydantic import AfterValidator, Field, ValidationInfo, field_validator, model_validator

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
)

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
    region: NonEmptyStr
    zone: NonEmptyStr
    options: dict[str, Any] = Field(default_factory=dict)


def split_host_port(addr: str) -> tuple[str, int] | None:
    """Split ``host:port`` (``[v6]:port`` for IPv6, empty host allowed); None if malformed."""
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit() or not 1 <= int(port) <= 65535:
        return None
    if ":" in host and not (host.startswith("[") and host.endswith("]")):
        return None
    return host, int(port)


class AddrsConfig(StrictModel):
    """The five listener addresses of a server (``host:port``; an empty host means all interfaces)."""

    health_addr: str
    election_addr: str
    registration_addr: str
    operator_addr: str
    agent_addr: str

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
    """Addresses the server listens on; no two listeners may share one."""

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
    interface_id: str = ""

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
    registration_timeout: Duration = timedelta(minutes=5)
    deleted_record_retention: Duration = timedelta(minutes=30)

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


class ExpiryConfig(StrictModel):
    """Instance age limits: eligible (replace when convenient), forced, and for on-demand instances."""

    eligible_age: Duration | None = None
    forced_age: Duration | None = None
    ondemand_age: Duration | None = None

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
    """Random delay before the server exits on a fatal error (spreads restarts out)."""

    min_delay: Duration = seconds(10)
    max_delay: Duration = seconds(40)

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
    infra: InfraConfig
    bind: BindConfig
    advertise: AddrsConfig
    leader_network: LeaderNetworkConfig | None = None
    subnet_pools: SubnetPools
    dynamic_subnet_pools: list[str] | None = None
    request_timeout: PositiveDuration = seconds(30)
    create_rate_limit: Duration = timedelta(0)
    health_check_interval: PositiveDuration = seconds(60)
    default_drain_timeout: Duration = timedelta(minutes=5)
    image_refresh_interval: PositiveDuration = timedelta(hours=6)
    shutdown_timeout: Duration = seconds(10)
    garbage_collection: GarbageCollectionConfig = GarbageCollectionConfig()
    expiry: ExpiryConfig = ExpiryConfig()
    leader_election: LeaderElectionConfig = LeaderElectionConfig()
    error_exit_jitter: ErrorExitJitterConfig = ErrorExitJitterConfig()
    max_concurrent_creates: int = Field(default=16, ge=1)

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
