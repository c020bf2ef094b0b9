"""The ``sim`` provider: an in-memory, seeded, fault-injecting imitation of a cloud's VM API.

It behaves the way EC2 does where that matters to a control plane: token buckets that refuse calls
(``ProviderThrottled``, like ``RequestLimitExceeded``) instead of queueing them - charged when a call
arrives, before its latency - idempotent creates per
client token, a window after a create in which the new VM is not yet visible (eventual consistency),
boot time (``pending`` then ``running``), per-call latency, and injected failures, including failures
that happen *after* the cloud acted (a timed-out create that launched the VM anyway). Everything random
comes from ``random.Random`` streams derived from the seed, so a run is reproducible.

It also has the optional capabilities of ``nstance.providers.features``: load balancer membership
(each ``load_balancers`` entry is one pool; a registered VM reads ``healthy`` after ``lb_health_delay``
seconds; a deregistered one ``draining`` for ``lb_deregistration_delay`` seconds, then gone), a leader
address that one VM holds at a time, deterministic image lookups (``img-`` and a hash of the entry's
filters) and instance-type checks for EC2-shaped names (a ``g`` after the generation, as in
``t4g.small`` or ``m7gd.large``, is arm64; other EC2-shaped types are amd64; other names pass).

Visibility rules: a deleted VM leaves ``list_instances`` at once; ``get_instance`` reports it as
``deleted`` for ``deleted_retention`` seconds and then raises InstanceNotFound. Its record (a tombstone)
is kept so that a retried create with the same idempotency token still returns it. Ages use the wall
clock (``clock.now()``) so that a table persisted to ``state_path`` means the same after a restart;
``create_times`` uses ``clock.monotonic()``.

This module must not sleep except through the injected ``sleep``, must not wait for a bucket (callers
rate-limit themselves), and does no I/O except the optional state file and call log. The state file
may be shared by several processes: every call re-reads it under an advisory lock (``flock`` on
``<file>.lock``), and every change is written back with an atomic replace before the lock is released.

Call log (``calls_file``, off by default): for tests that run several server processes on one
simulated cloud and must show that no two of them acted as leader at once. Every call of a method in
``LEADER_METHODS`` (the mutating calls only a shard leader makes) that reaches the cloud - it took
effect, or was an idempotent repeat - appends one JSON line: ``t`` (``clock.now()`` as Unix seconds
when it took effect), ``started`` (when the call arrived), ``method``, ``server`` (the caller: the
``NSTANCE_SERVER_ID`` environment variable unless ``caller`` is given), ``pid``, ``instance_ids`` and
``provider_ids``. With a ``state_file`` the line is written while its exclusive lock is held, so the
lines of all processes are in the order their effects happened. Calls refused before taking effect
(throttled, injected failures) are not logged; ``release_leader_network`` is not either (any server
may release an address from its own VM).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import os
import random
import re
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from types import MappingProxyType
from typing import Any

from nstance.config.resources import ImageConfig, LoadBalancerConfig
from nstance.core.atomicfile import write_atomic
from nstance.core.clock import Clock
from nstance.core.errors import FailedPrecondition, InvalidArgument
from nstance.core.ratelimit import TokenBucket
from nstance.providers import options as opt
from nstance.providers.base import (
    CreateRequest,
    InstanceNotFound,
    InstanceStatus,
    ProviderInstance,
    ProviderInvalidRequest,
    ProviderThrottled,
)
from nstance.providers.features import LbTarget, TargetState

#: Provider methods that failures can be injected into (and that ``calls`` counts).
METHODS: tuple[str, ...] = (
    "create_instance",
    "delete_instance",
    "get_instance",
    "list_instances",
    "check_subnet_capacity",
    "register_targets",
    "deregister_targets",
    "target_states",
    "assign_leader_network",
    "release_leader_network",
    "lookup_image",
)

#: The mutating methods only a shard leader calls; with ``calls_file`` each call is logged (module doc).
LEADER_METHODS: tuple[str, ...] = (
    "create_instance",
    "delete_instance",
    "register_targets",
    "deregister_targets",
    "assign_leader_network",
)

#: Keys accepted in ``shard.infra.options`` when the provider is ``sim``.
OPTION_KEYS: tuple[str, ...] = (
    "seed",
    "latency",
    "latency_jitter",
    "boot_time",
    "not_found_after_create",
    "deleted_retention",
    "state_file",
    "request_bucket",
    "instance_bucket",
    "throttle_probability",
    "lb_health_delay",
    "lb_deregistration_delay",
    "calls_file",
)
#: An EC2-style family: letters, the generation digit(s), then attribute letters (``g`` = Graviton).
_EC2_FAMILY = re.compile(r"^[a-z]+\d+([a-z-]*)$")
_BUCKET_KEYS: tuple[str, ...] = ("capacity", "refill_per_second")
_STATE_VERSION = 1

Sleep = Callable[[float], Awaitable[None]]
#: VMs converted between yields to the event loop in ``list_instances`` (a cloud API's page size).
LIST_PAGE = 1000
BucketSpec = tuple[float, float]


@dataclass(slots=True)
class _Record:
    """One simulated VM, including tombstones of deleted ones. Serialised as-is to the state file."""

    instance_id: str
    provider_id: str
    idempotency_token: str
    cluster_id: str
    shard: str
    tenant: str
    group: str
    template: str
    kind: str
    instance_type: str
    subnet_id: str
    ip4: str
    launched_at: str  # ISO 8601, clock.now() at launch
    deleted_at: str | None = None
    status_override: str | None = None  # set by set_status(); None = follow boot time
    tags: dict[str, str] = field(default_factory=dict)
    on_demand: bool = False


@dataclass(slots=True)
class _Member:
    """One VM's membership of one simulated load balancer. Serialised as-is to the state file."""

    registered_at: str  # ISO 8601
    deregistered_at: str | None = None


@dataclass(slots=True)
class _Injected:
    error: Exception
    remaining: int
    after_effect: bool


class SimProvider:
    """A deterministic simulated cloud; see the module docstring for its rules."""

    def __init__(
        self,
        *,
        clock: Clock,
        sleep: Sleep = asyncio.sleep,
        seed: int = 0,
        latency: float = 0.0,
        latency_jitter: float = 0.0,
        request_bucket: BucketSpec | None = None,
        instance_bucket: BucketSpec | None = None,
        boot_time: float = 0.0,
        not_found_after_create: float = 0.0,
        deleted_retention: float = 60.0,
        throttle_probability: float = 0.0,
        state_path: Path | None = None,
        zone: str = "",
        lb_health_delay: float = 0.0,
        lb_deregistration_delay: float = 0.0,
        calls_path: Path | None = None,
        caller: str | None = None,
    ) -> None:
        for name, value in (
            ("lb_health_delay", lb_health_delay),
            ("lb_deregistration_delay", lb_deregistration_delay),
            ("latency", latency),
            ("boot_time", boot_time),
            ("not_found_after_create", not_found_after_create),
            ("deleted_retention", deleted_retention),
        ):
            if value < 0:
                raise InvalidArgument(f"sim provider: {name} must not be negative (got {value})")
        if not 0.0 <= latency_jitter <= 1.0:
            raise InvalidArgument(
                f"sim provider: latency_jitter must be between 0 and 1 (got {latency_jitter})"
            )
        if not 0.0 <= throttle_probability <= 1.0:
            raise InvalidArgument(
                f"sim provider: throttle_probability must be between 0 and 1 (got {throttle_probability})"
            )
        self._clock = clock
        self._sleep = sleep
        self._latency = latency
        self._latency_jitter = latency_jitter
        self._boot_time = timedelta(seconds=boot_time)
        self._not_found_after_create = timedelta(seconds=not_found_after_create)
        self._deleted_retention = timedelta(seconds=deleted_retention)
        self._throttle_probability = throttle_probability
        self._zone = zone
        self._lb_health_delay = timedelta(seconds=lb_health_delay)
        self._lb_deregistration_delay = timedelta(seconds=lb_deregistration_delay)
        # Independent streams, so that e.g. enabling jitter does not change the ids a run produces.
        self._id_rng = random.Random(f"{seed}:ids")
        self._latency_rng = random.Random(f"{seed}:latency")
        self._fault_rng = random.Random(f"{seed}:faults")
        self._request_bucket = self._bucket(request_bucket, clock)
        self._instance_bucket = self._bucket(instance_bucket, clock)
        self._injected: dict[str, deque[_Injected]] = {m: deque() for m in METHODS}
        self._failure_rates: dict[str, tuple[float, Callable[[], Exception]]] = {}
        self._records: dict[str, _Record] = {}
        self._by_token: dict[str, str] = {}
        self._ip_counter = 0
        self._members: dict[str, dict[str, _Member]] = {}  # load balancer -> provider id -> membership
        self._leader: dict[str, str] = {}  # leader address -> provider id holding it
        self._state_path = state_path
        self._calls_path = calls_path
        self._caller = os.environ.get("NSTANCE_SERVER_ID", "") if caller is None else caller

        self.calls: Counter[str] = Counter()
        self.create_times: list[float] = []
        self.launch_count = 0
        self.throttled_calls = 0
        self.full_subnets: set[str] = set()

        with self._shared_state(exclusive=False):
            pass  # load the table now, so that a broken state file fails at startup

    @staticmethod
    def _bucket(spec: BucketSpec | None, clock: Clock) -> TokenBucket | None:
        if spec is None:
            return None
        capacity, refill = spec
        try:
            return TokenBucket(capacity, refill, clock)
        except ValueError as exc:
            raise InvalidArgument(f"sim provider bucket {spec}: {exc}") from exc

    @property
    def kind(self) -> str:
        return "sim"

    # ---- observability and fault injection -------------------------------------------------

    @property
    def vms(self) -> Mapping[str, ProviderInstance]:
        """Every VM ever launched (tombstones included), by provider id, as of now; read-only."""
        now = self._clock.now()
        with self._shared_state(exclusive=False):
            return MappingProxyType({pid: self._to_instance(r, now) for pid, r in self._records.items()})

    def fail_next(self, method: str, error: Exception, times: int = 1, *, after_effect: bool = False) -> None:
        """Make the next ``times`` calls of ``method`` raise ``error``.

        With ``after_effect`` the call first does its work (a create launches, a delete deletes) and
        then raises, like a cloud call whose response was lost.
        """
        self._check_method(method)
        if times < 1:
            raise InvalidArgument(f"fail_next: times must be at least 1 (got {times})")
        self._injected[method].append(_Injected(error, times, after_effect))

    def set_failure_rate(
        self, method: str, probability: float, error_factory: Callable[[], Exception]
    ) -> None:
        """Make each call of ``method`` fail with ``error_factory()`` at this probability (0: off)."""
        self._check_method(method)
        if not 0.0 <= probability <= 1.0:
            raise InvalidArgument(
                f"set_failure_rate: probability must be between 0 and 1 (got {probability})"
            )
        if probability == 0.0:
            self._failure_rates.pop(method, None)
        else:
            self._failure_rates[method] = (probability, error_factory)

    def set_throttle_probability(self, probability: float) -> None:
        """Throttle each call at this probability from now on (0: off), like ``throttle_probability``."""
        if not 0.0 <= probability <= 1.0:
            raise InvalidArgument(f"throttle probability must be between 0 and 1 (got {probability})")
        self._throttle_probability = probability

    def set_status(self, provider_id: str, status: InstanceStatus | None) -> None:
        """Force a VM's status (e.g. ``stopped`` to imitate a crashed VM); None returns it to normal."""
        with self._shared_state(exclusive=True):
            record = self._records.get(provider_id)
            if record is None:
                raise InstanceNotFound(f"sim: no VM with provider id {provider_id!r}")
            record.status_override = None if status is None else str(status)
            self._save()

    def vanish(self, provider_id: str) -> None:
        """Remove a VM without a delete call, as when a cloud reclaims it and forgets it (and its targets)."""
        with self._shared_state(exclusive=True):
            record = self._records.pop(provider_id, None)
            if record is not None:
                self._by_token.pop(record.idempotency_token, None)
                for members in self._members.values():
                    members.pop(provider_id, None)
                self._save()

    @staticmethod
    def _check_method(method: str) -> None:
        if method not in METHODS:
            raise InvalidArgument(f"unknown sim provider method {method!r}; use one of: {', '.join(METHODS)}")

    # ---- the Provider protocol -------------------------------------------------------------

    async def create_instance(self, request: CreateRequest) -> ProviderInstance:
        started = self._now()
        token = request.idempotency_token
        # Buckets are charged when the request arrives, before its latency, as a cloud counts requests.
        with self._shared_state(exclusive=False):
            known = bool(token) and token in self._by_token
        if not known:
            self._take(self._request_bucket, "request")
            self._take(self._instance_bucket, "instance")
        late = await self._begin("create_instance")
        with self._shared_state(exclusive=True):
            existing = self._by_token.get(token) if token else None
            if existing is not None:
                record = self._records[existing]
                if record.instance_id != request.instance_id:
                    raise ProviderInvalidRequest(
                        f"idempotency token {token!r} was already used to create instance "
                        f"{record.instance_id} ({record.provider_id}); a new instance needs a new token"
                    )
            else:
                record = self._launch(request)
            self._log_call("create_instance", started, [record.instance_id], [record.provider_id])
            self._end(late)
            return self._to_instance(record, self._clock.now())

    async def delete_instance(self, instance_id: str, provider_id: str) -> None:
        started = self._now()
        late = await self._begin("delete_instance")
        self._take(self._request_bucket, "request")
        with self._shared_state(exclusive=True):
            matching = self._matching(instance_id, provider_id)
            self._log_call(
                "delete_instance",
                started,
                [r.instance_id for r in matching] or [instance_id],
                [r.provider_id for r in matching] or [provider_id],
            )
            for record in matching:
                if record.deleted_at is None:
                    now = self._clock.now().isoformat()
                    record.deleted_at = now
                    for members in self._members.values():  # as a cloud drops a terminated target
                        member = members.get(record.provider_id)
                        if member is not None and member.deregistered_at is None:
                            member.deregistered_at = now
                    self._save()
        self._end(late)

    async def get_instance(self, instance_id: str, provider_id: str) -> ProviderInstance:
        late = await self._begin("get_instance")
        now = self._clock.now()
        with self._shared_state(exclusive=False):
            found = [r for r in self._matching(instance_id, provider_id) if self._visible_to_get(r, now)]
        if not found:
            raise InstanceNotFound(
                f"sim: no VM {provider_id or '(no provider id)'} for instance {instance_id or '(any)'}"
            )
        # Several VMs for one instance id only happen after duplicate creates; prefer a live one.
        found.sort(key=lambda r: (r.deleted_at is not None, r.launched_at))
        self._end(late)
        return self._to_instance(found[0], now)

    async def list_instances(self, cluster_id: str, shard: str) -> list[ProviderInstance]:
        late = await self._begin("list_instances")
        now = self._clock.now()
        with self._shared_state(exclusive=False):
            records = [r for r in self._records.values() if r.cluster_id == cluster_id and r.shard == shard]
        out: list[ProviderInstance] = []
        for start in range(0, len(records), LIST_PAGE):
            if start:
                await self._sleep(0)  # a cloud pages a large listing; do not hold the event loop
            out += [
                self._to_instance(r, now)
                for r in records[start : start + LIST_PAGE]
                if r.deleted_at is None and now >= _parse_time(r.launched_at) + self._not_found_after_create
            ]
        self._end(late)
        return out

    def add_existing(
        self,
        *,
        instance_id: str,
        provider_id: str,
        cluster_id: str,
        shard: str,
        tenant: str,
        group: str,
        kind: str,
        launched_at: datetime,
        instance_type: str = "",
        subnet_id: str = "",
    ) -> None:
        """Put a VM in the table as if it had been created earlier (benchmarks start from a big fleet).

        Not a provider call: nothing is counted, logged or rate-limited.
        """
        with self._shared_state(exclusive=True):
            self._ip_counter += 1
            n = self._ip_counter
            self._records[provider_id] = _Record(
                instance_id=instance_id,
                provider_id=provider_id,
                idempotency_token=instance_id,
                cluster_id=cluster_id,
                shard=shard,
                tenant=tenant,
                group=group,
                template="",
                kind=kind,
                instance_type=instance_type,
                subnet_id=subnet_id,
                ip4=f"10.{(n >> 16) & 0xFF}.{(n >> 8) & 0xFF}.{n & 0xFF}",
                launched_at=launched_at.isoformat(),
            )
            self._by_token[instance_id] = provider_id
            if self._state_path is not None:
                self._save()

    async def check_subnet_capacity(self, subnet_id: str) -> bool:
        late = await self._begin("check_subnet_capacity")
        self._end(late)
        return subnet_id not in self.full_subnets

    async def close(self) -> None:
        """Nothing to release; the state file is already up to date after every change."""

    # ---- capabilities (nstance.providers.features) -------------------------------------------

    def lb_members(self, name: str) -> dict[str, TargetState]:
        """Every VM attached to simulated load balancer ``name`` now, by provider id (for tests)."""
        now = self._clock.now()
        with self._shared_state(exclusive=False):
            members = self._members.get(name, {})
            states = {pid: self._member_state(m, now) for pid, m in members.items()}
        return {pid: state for pid, state in states.items() if state != TargetState.DEREGISTERED}

    def leader_holder(self, ip: str) -> str:
        """The provider id of the VM holding leader address ``ip`` (``""`` when none does)."""
        with self._shared_state(exclusive=False):
            return self._leader.get(ip, "")

    async def register_targets(self, name: str, lb: LoadBalancerConfig, targets: Sequence[LbTarget]) -> None:
        started = self._now()
        late = await self._begin("register_targets")
        now = self._clock.now()
        with self._shared_state(exclusive=True):
            members = self._members.setdefault(name, {})
            for target in targets:
                record = self._records.get(target.provider_id)
                if record is None or record.deleted_at is not None:
                    raise ProviderInvalidRequest(
                        f"sim: load balancer {name}: VM {target.provider_id} does not exist"
                    )
                member = members.get(target.provider_id)
                if member is None or self._member_state(member, now) == TargetState.DEREGISTERED:
                    members[target.provider_id] = _Member(registered_at=now.isoformat())
                elif member.deregistered_at is not None:  # re-registered while draining
                    members[target.provider_id] = _Member(registered_at=member.registered_at)
            self._log_call("register_targets", started, *_target_ids(targets))
            self._save()
        self._end(late)

    async def deregister_targets(
        self, name: str, lb: LoadBalancerConfig, targets: Sequence[LbTarget]
    ) -> None:
        started = self._now()
        late = await self._begin("deregister_targets")
        now = self._clock.now()
        with self._shared_state(exclusive=True):
            members = self._members.get(name, {})
            for target in targets:
                member = members.get(target.provider_id)
                if member is not None and member.deregistered_at is None:
                    member.deregistered_at = now.isoformat()
            self._log_call("deregister_targets", started, *_target_ids(targets))
            self._save()
        self._end(late)

    async def target_states(
        self, name: str, lb: LoadBalancerConfig, targets: Sequence[LbTarget]
    ) -> dict[str, TargetState]:
        late = await self._begin("target_states")
        now = self._clock.now()
        with self._shared_state(exclusive=False):
            members = self._members.get(name, {})
            out = {}
            for target in targets:
                member = members.get(target.provider_id)
                out[target.instance_id] = (
                    TargetState.DEREGISTERED if member is None else self._member_state(member, now)
                )
        self._end(late)
        return out

    async def assign_leader_network(self, provider_id: str, ip: str, interface_id: str) -> None:
        started = self._now()
        late = await self._begin("assign_leader_network")
        with self._shared_state(exclusive=True):
            holder = self._records.get(provider_id)
            holder_id = holder.instance_id if holder is not None else ""
            self._log_call("assign_leader_network", started, [holder_id], [provider_id])
            self._leader[ip] = provider_id
            self._save()
        self._end(late)

    async def release_leader_network(self, provider_id: str, ip: str, interface_id: str) -> None:
        late = await self._begin("release_leader_network")
        with self._shared_state(exclusive=True):
            if self._leader.get(ip) == provider_id:
                del self._leader[ip]
                self._save()
        self._end(late)

    async def lookup_image(self, name: str, image: ImageConfig) -> str:
        late = await self._begin("lookup_image")
        self._end(late)
        digest = hashlib.sha256(
            json.dumps(image.model_dump(exclude={"fallback"}), sort_keys=True).encode()
        ).hexdigest()
        return f"img-{digest[:12]}"

    async def check_instance_type(self, instance_type: str, arch: str, *, template: str, where: str) -> None:
        match = _EC2_FAMILY.match(instance_type.split(".", 1)[0])
        if match is None:
            return  # not EC2-shaped: the sim does not know its architecture
        actual = "arm64" if "g" in match.group(1) else "amd64"
        if arch and arch != actual:
            raise ProviderInvalidRequest(
                f'{where}: instance type "{instance_type}" is {actual}, but template "{template}" is {arch}'
            )

    def _member_state(self, member: _Member, now: datetime) -> TargetState:
        if member.deregistered_at is not None:
            if now >= _parse_time(member.deregistered_at) + self._lb_deregistration_delay:
                return TargetState.DEREGISTERED
            return TargetState.DRAINING
        if now >= _parse_time(member.registered_at) + self._lb_health_delay:
            return TargetState.HEALTHY
        return TargetState.REGISTERED

    # ---- internals -------------------------------------------------------------------------

    def _now(self) -> float:
        return self._clock.now().timestamp()

    def _log_call(
        self, method: str, started: float, instance_ids: Sequence[str], provider_ids: Sequence[str]
    ) -> None:
        """Append one line to the call log, if there is one (module docstring); hold the state lock."""
        if self._calls_path is None:
            return
        line = {
            "t": self._now(),
            "started": started,
            "method": method,
            "server": self._caller,
            "pid": os.getpid(),
            "instance_ids": list(instance_ids),
            "provider_ids": list(provider_ids),
        }
        data = (json.dumps(line, separators=(",", ":")) + "\n").encode("utf-8")
        self._calls_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self._calls_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, data)  # one write on an O_APPEND file: lines of concurrent writers never mix
        finally:
            os.close(fd)

    async def _begin(self, method: str) -> _Injected | None:
        """Count, wait the latency, then apply injected failures and random throttling.

        Returns an injected failure to raise after the call's effect, if one is due.
        """
        self.calls[method] += 1
        if self._latency > 0:
            factor = 1.0 + self._latency_jitter * self._latency_rng.uniform(-1.0, 1.0)
            await self._sleep(self._latency * factor)
        queue = self._injected[method]
        if queue:
            head = queue[0]
            head.remaining -= 1
            if head.remaining <= 0:
                queue.popleft()
            if head.after_effect:
                return head
            raise head.error
        rate = self._failure_rates.get(method)
        if rate is not None and self._fault_rng.random() < rate[0]:
            raise rate[1]()
        if self._throttle_probability > 0 and self._fault_rng.random() < self._throttle_probability:
            self.throttled_calls += 1
            raise ProviderThrottled(
                f"sim: {method} throttled (simulated RequestLimitExceeded); back off and retry"
            )
        return None

    @staticmethod
    def _end(late: _Injected | None) -> None:
        if late is not None:
            raise late.error

    def _take(self, bucket: TokenBucket | None, which: str) -> None:
        if bucket is None:
            return
        wait = bucket.try_take(1.0)
        if wait > 0:
            self.throttled_calls += 1
            raise ProviderThrottled(
                f"sim: {which} bucket empty (capacity {bucket.capacity:g}, refill "
                f"{bucket.refill_per_second:g}/s); retry in {wait:.3f}s"
            )

    def _launch(self, request: CreateRequest) -> _Record:
        provider_id = self._new_provider_id()
        self._ip_counter += 1
        n = self._ip_counter
        record = _Record(
            instance_id=request.instance_id,
            provider_id=provider_id,
            idempotency_token=request.idempotency_token,
            cluster_id=request.cluster_id,
            shard=request.shard,
            tenant=request.tenant,
            group=request.group,
            template=request.template,
            kind=request.kind,
            instance_type=request.instance_type,
            subnet_id=request.subnet_id,
            ip4=f"10.{(n >> 16) & 0xFF}.{(n >> 8) & 0xFF}.{n & 0xFF}",
            launched_at=self._clock.now().isoformat(),
            tags=dict(request.tags),
            on_demand=request.on_demand,
        )
        self._records[provider_id] = record
        if request.idempotency_token:
            self._by_token[request.idempotency_token] = provider_id
        self.launch_count += 1
        self.create_times.append(self._clock.monotonic())
        self._save()
        return record

    def _new_provider_id(self) -> str:
        while True:
            candidate = f"sim-{self._id_rng.getrandbits(48):012x}"
            if candidate not in self._records:
                return candidate

    def _matching(self, instance_id: str, provider_id: str) -> list[_Record]:
        if provider_id:
            record = self._records.get(provider_id)
            if record is None:
                return []
            if instance_id and record.instance_id != instance_id:
                raise ProviderInvalidRequest(
                    f"sim: VM {provider_id} belongs to instance {record.instance_id}, not {instance_id}"
                )
            return [record]
        if not instance_id:
            raise ProviderInvalidRequest("sim: give an instance id or a provider id")
        return [r for r in self._records.values() if r.instance_id == instance_id]

    def _visible_to_get(self, record: _Record, now: datetime) -> bool:
        if now < _parse_time(record.launched_at) + self._not_found_after_create:
            return False
        return record.deleted_at is None or now < _parse_time(record.deleted_at) + self._deleted_retention

    def _status(self, record: _Record, now: datetime) -> InstanceStatus:
        if record.deleted_at is not None:
            return InstanceStatus.DELETED
        if record.status_override is not None:
            return InstanceStatus(record.status_override)
        if now < _parse_time(record.launched_at) + self._boot_time:
            return InstanceStatus.PENDING
        return InstanceStatus.RUNNING

    def _to_instance(self, record: _Record, now: datetime) -> ProviderInstance:
        return ProviderInstance(
            instance_id=record.instance_id,
            provider_id=record.provider_id,
            status=self._status(record, now),
            cluster_id=record.cluster_id,
            shard=record.shard,
            group=record.group,
            kind=record.kind,
            tenant=record.tenant,
            template=record.template,
            on_demand=record.on_demand,
            instance_type=record.instance_type,
            subnet_id=record.subnet_id,
            ip4=record.ip4,
            hostname=record.instance_id,
            zone=self._zone,
            launched_at=_parse_time(record.launched_at),
        )

    # ---- persistence -----------------------------------------------------------------------

    @contextlib.contextmanager
    def _shared_state(self, *, exclusive: bool) -> Iterator[None]:
        """With a state file: hold its lock (shared to read, exclusive to change) and see the latest table.

        Several processes (a leader and its standbys, or a server and its restarted self) may share
        one file; the lock serialises their changes and the re-read keeps each one's view current.
        """
        path = self._state_path
        if path is None:
            yield
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path.with_name(path.name + ".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            self._refresh(path)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _refresh(self, path: Path) -> None:
        """Re-read the table (always: inode numbers and coarse mtimes make stat-based shortcuts unsafe)."""
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            self._records, self._by_token, self._ip_counter = {}, {}, 0  # no file: an empty cloud
            self._members, self._leader = {}, {}
            return
        except OSError as exc:
            raise FailedPrecondition(f"cannot read sim state file {path}: {exc}") from exc
        try:
            doc = json.loads(raw)
            if doc.get("version") != _STATE_VERSION:
                raise ValueError(f"unsupported version {doc.get('version')!r}")
            records = [_Record(**item) for item in doc["vms"]]
            ip_counter = int(doc.get("ip_counter", len(records)))
            members = {
                lb: {pid: _Member(**m) for pid, m in pool.items()}
                for lb, pool in doc.get("load_balancers", {}).items()
            }
            leader = {str(ip): str(pid) for ip, pid in doc.get("leader_network", {}).items()}
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise FailedPrecondition(
                f"sim state file {path} is not a valid sim VM table ({exc}); delete it to start with no VMs"
            ) from exc
        self._records = {r.provider_id: r for r in records}
        self._by_token = {r.idempotency_token: r.provider_id for r in records if r.idempotency_token}
        self._ip_counter = ip_counter
        self._members, self._leader = members, leader

    def _save(self) -> None:
        path = self._state_path
        if path is None:
            return
        doc = {
            "version": _STATE_VERSION,
            "ip_counter": self._ip_counter,
            "vms": [asdict(r) for r in self._records.values()],
            "load_balancers": {
                lb: {pid: asdict(m) for pid, m in pool.items()} for lb, pool in self._members.items()
            },
            "leader_network": dict(self._leader),
        }
        data = json.dumps(doc, indent=1, sort_keys=True).encode("utf-8")
        write_atomic(path, data, mode=0o644, dir_mode=None)


def _target_ids(targets: Sequence[LbTarget]) -> tuple[list[str], list[str]]:
    return [t.instance_id for t in targets], [t.provider_id for t in targets]


def _parse_time(text: str) -> datetime:
    return datetime.fromisoformat(text)


# ---- construction from config ------------------------------------------------------------------


def sim_provider_from_options(
    options: Mapping[str, Any],
    *,
    clock: Clock,
    base_dir: Path,
    zone: str = "",
    sleep: Sleep = asyncio.sleep,
) -> SimProvider:
    """Build a SimProvider from ``shard.infra.options``; refuse unknown keys and bad values by path."""
    prefix = opt.PREFIX
    opt.check_known(options, OPTION_KEYS, "sim")
    seed = options.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise InvalidArgument(f"{prefix}.seed: must be an integer (got {seed!r})")
    state_path = opt.path(options, "state_file", base_dir)
    calls_path = opt.path(options, "calls_file", base_dir)
    return SimProvider(
        clock=clock,
        sleep=sleep,
        seed=seed,
        latency=opt.seconds(options, "latency", 0.0, allow_zero=True),
        latency_jitter=_fraction(options, "latency_jitter", prefix),
        boot_time=opt.seconds(options, "boot_time", 0.0, allow_zero=True),
        not_found_after_create=opt.seconds(options, "not_found_after_create", 0.0, allow_zero=True),
        deleted_retention=opt.seconds(options, "deleted_retention", 60.0, allow_zero=True),
        throttle_probability=_fraction(options, "throttle_probability", prefix),
        request_bucket=_bucket_option(options, "request_bucket", prefix),
        instance_bucket=_bucket_option(options, "instance_bucket", prefix),
        state_path=state_path,
        zone=zone,
        lb_health_delay=opt.seconds(options, "lb_health_delay", 0.0, allow_zero=True),
        lb_deregistration_delay=opt.seconds(options, "lb_deregistration_delay", 0.0, allow_zero=True),
        calls_path=calls_path,
    )


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _fraction(options: Mapping[str, Any], key: str, prefix: str) -> float:
    value = options.get(key, 0.0)
    number = _number(value)
    if number is None or not 0.0 <= number <= 1.0:
        raise InvalidArgument(f"{prefix}.{key}: must be a number between 0 and 1 (got {value!r})")
    return number


def _bucket_option(options: Mapping[str, Any], key: str, prefix: str) -> BucketSpec | None:
    value = options.get(key)
    if value is None:
        return None
    path = f"{prefix}.{key}"
    if not isinstance(value, Mapping):
        raise InvalidArgument(f"{path}: must be an object with {' and '.join(_BUCKET_KEYS)} (got {value!r})")
    unknown = sorted(set(value) - set(_BUCKET_KEYS))
    if unknown:
        raise InvalidArgument(f"{path}.{unknown[0]}: unknown key; allowed: {', '.join(_BUCKET_KEYS)}")
    missing = [k for k in _BUCKET_KEYS if k not in value]
    if missing:
        raise InvalidArgument(f"{path}.{missing[0]}: is required")
    capacity = _number(value["capacity"])
    if capacity is None or capacity < 1:
        raise InvalidArgument(f"{path}.capacity: must be a number of at least 1 (got {value['capacity']!r})")
    refill = _number(value["refill_per_second"])
    if refill is None or refill < 0:
        raise InvalidArgument(
            f"{path}.refill_per_second: must be a number of at least 0 (got {value['refill_per_second']!r})"
        )
    return capacity, refill
