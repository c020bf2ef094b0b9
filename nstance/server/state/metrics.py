"""Prometheus metrics of one shard server, and a Provider wrapper that measures every provider call.

``Metrics`` owns its own ``prometheus_client.CollectorRegistry`` (never the process-global one), so
several servers can run in one process (tests, benchmarks) without their series colliding. It holds:

* ``nstance_instances{tenant,group,state}`` gauge, replaced wholesale by ``set_instances`` (label
  sets that are no longer reported are removed, so a deleted group does not linger at its last value);
* ``nstance_reconcile_queue_depth`` gauge;
* ``nstance_provider_call_seconds{provider,method}`` histogram and
  ``nstance_provider_call_errors_total{provider,method,code}`` counter (``code`` is the exception
  class name, e.g. ``ProviderThrottled``);
* ``nstance_rpc_total{method,code}`` counter (gRPC method and status code name);
* ``nstance_leader{scope}`` gauge (scope ``shard`` or ``cluster``; 1 while this process leads);
* ``nstance_config_loaded`` gauge (1 while the config in force is the one in object storage: 0 before
  the first load and while the latest reload failed and the last good config is kept);
* ``nstance_degraded{component,kind}`` gauge (1 per reason the server runs degraded, e.g.
  ``component="config",kind="empty"``; both labels come from fixed sets, the text is on ``/health``);
* ``nstance_image_errors``, ``nstance_leader_network_ready`` and ``nstance_lb_deregistrations_waiting``
  gauges (images without an id, the leader address held, deletes waiting for load balancers);
* ``nstance_reconcile_total{result}`` counter and ``nstance_provider_creates_total`` counter;
* ``nstance_leader_changes_total{scope}`` counter (times this process became leader);
* ``nstance_replacements_total{reason}`` counter (instances retired to be replaced: a drain started or a
  delete done for a reason other than scale-down, group deletion, the end of a drain or on-demand
  expiry);
* ``nstance_certificate_expiry_timestamp_seconds{certificate}`` gauge (when the cluster CA and the
  server certificates of the mTLS and registration ports expire; servers issue theirs at start);
* ``nstance_server_info{server_id,shard,version}`` gauge (1; the labels to join other series by shard);
* ``nstance_event_loop_lag_seconds`` histogram (how late each ``watch_event_loop_lag`` tick woke).

``render()`` returns the text exposition format served on ``/metrics``.

``InstrumentedProvider`` implements the ``Provider`` protocol and every optional capability of
``nstance.providers.features`` by delegation (``capability()`` looks at the wrapped provider, so the
wrapper never claims what the provider lacks), timing each call with
``time.perf_counter`` and counting errors by exception class name; it never changes a call's result
or swallows an error. It does not touch ``nstance_provider_creates_total``: the create path calls
``record_provider_create`` once the new VM is recorded (a retried create is one create).

This module does no network I/O and decides nothing; it only records what it is told.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, Final, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

import nstance
from nstance.config.resources import ImageConfig, LoadBalancerConfig
from nstance.core.plan import (
    Reason,
)
from nstance.providers.base import CreateRequest, Provider, ProviderInstance
from nstance.providers.features import LbTarget, TargetState

T = TypeVar("T")

#: Leadership scopes reported by ``nstance_leader``.
LEADER_SCOPES: Final = ("shard", "cluster")
#: Retirement reasons that are not replacements (the instance is not coming back in another form).
NOT_REPLACEMENTS: Final = frozenset(
    {
        Reason.SCALE_DOWN,
        Reason.GROUP_DELETED,
        Reason.DRAIN_COMPLETE,
        Reason.DRAIN_TIMEOUT,
        Reason.ONDEMAND_EXPIRY,
    }
)
LOOP_LAG_INTERVAL: Final = 0.5

#: Provider calls range from milliseconds (get) to minutes (create on a slow cloud).
PROVIDER_CALL_BUCKETS: Final = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
)


class Metrics:
    """The metric families of one shard server, in a registry of their own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        reg = self.registry
        self.instances = Gauge(
            "nstance_instances",
            "Instances known to this shard, by tenant, group and state.",
            ["tenant", "group", "state"],
            registry=reg,
        )
        self.reconcile_queue_depth = Gauge(
            "nstance_reconcile_queue_depth",
            "Groups waiting in the reconcile work queue.",
            registry=reg,
        )
        self.provider_call_seconds = Histogram(
            "nstance_provider_call_seconds",
            "Duration of provider calls in seconds, successful or not.",
            ["provider", "method"],
            buckets=PROVIDER_CALL_BUCKETS,
            registry=reg,
        )
        self.provider_call_errors = Counter(
            "nstance_provider_call_errors_total",
            "Provider calls that raised, by exception class name.",
            ["provider", "method", "code"],
            registry=reg,
        )
        self.rpc = Counter(
            "nstance_rpc_total",
            "gRPC calls handled, by method and status code.",
            ["method", "code"],
            registry=reg,
        )
        self.leader = Gauge(
            "nstance_leader",
            "1 while this process holds the leader lock of the scope (shard or cluster), else 0.",
            ["scope"],
            registry=reg,
        )
        self.config_loaded = Gauge(
            "nstance_config_loaded",
            "1 while the shard configuration in force is the one in object storage, else 0 "
            "(not loaded yet, or the latest reload failed and the last good one is kept).",
            registry=reg,
        )
        self.degraded = Gauge(
            "nstance_degraded",
            "1 per reason this server runs degraded (on a last good view), by component and kind.",
            ["component", "kind"],
            registry=reg,
        )
        self.image_errors = Gauge(
            "nstance_image_errors",
            "Configured images that could not be resolved (no cached value and no fallback).",
            registry=reg,
        )
        self.leader_network = Gauge(
            "nstance_leader_network_ready",
            "1 while this leader holds the shard's leader address and can bind it, else 0.",
            registry=reg,
        )
        self.lb_deregistrations_waiting = Gauge(
            "nstance_lb_deregistrations_waiting",
            "Instance deletions waiting for load balancers to confirm deregistration.",
            registry=reg,
        )
        self.reconcile = Counter(
            "nstance_reconcile_total",
            "Group reconciliations, by result.",
            ["result"],
            registry=reg,
        )
        self.provider_creates = Counter(
            "nstance_provider_creates_total",
            "Instances created through a provider.",
            registry=reg,
        )
        self.leader_changes = Counter(
            "nstance_leader_changes_total",
            "Times this process became leader, by scope.",
            ["scope"],
            registry=reg,
        )
        self.replacements = Counter(
            "nstance_replacements_total",
            "Instances retired to be replaced (drain started or deleted), by reason.",
            ["reason"],
            registry=reg,
        )
        self.info = Gauge(
            "nstance_server_info",
            "1, labelled with this server's id, shard and version.",
            ["server_id", "shard", "version"],
            registry=reg,
        )
        self.event_loop_lag = Histogram(
            "nstance_event_loop_lag_seconds",
            "How much later than asked the event loop woke a timer (sampled every 0.5 s).",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
            registry=reg,
        )
        self.safety_holds = Gauge(
            "nstance_safety_holds",
            "Deletions or replacements the leader holds back because its own view may be wrong, by kind.",
            ["kind"],
            registry=reg,
        )
        self.certificate_expiry = Gauge(
            "nstance_certificate_expiry_timestamp_seconds",
            "When a certificate this server presents or trusts expires (Unix time), by certificate.",
            ["certificate"],
            registry=reg,
        )
        self.unreadable_records = Gauge(
            "nstance_unreadable_instance_records",
            "Objects under instance/ that could not be read as instance records at the last cache rebuild.",
            registry=reg,
        )
        for scope in LEADER_SCOPES:
            self.leader.labels(scope=scope).set(0)
            self.leader_changes.labels(scope=scope)
        self._lock = threading.Lock()
        self._instance_keys: set[tuple[str, str, str]] = set()
        self._leading: dict[str, bool] = {}
        self._hold_kinds: set[str] = set()
        self._degraded_kinds: dict[str, str] = {}

    # --- setters ------------------------------------------------------------------------------

    def set_instances(self, counts: Mapping[tuple[str, str, str], int]) -> None:
        """Replace every ``nstance_instances`` series with ``counts`` keyed by (tenant, group, state).

        Series whose key is not in ``counts`` are removed.
        """
        with self._lock:
            new_keys = set(counts)
            for key in self._instance_keys - new_keys:
                self.instances.remove(*key)
            for (tenant, group, state), value in counts.items():
                self.instances.labels(tenant=tenant, group=group, state=state).set(value)
            self._instance_keys = new_keys

    def set_safety_holds(self, counts: Mapping[str, int]) -> None:
        """Replace every ``nstance_safety_holds`` series with ``counts`` by kind (0 for kinds cleared)."""
        with self._lock:
            for kind in self._hold_kinds - set(counts):
                self.safety_holds.labels(kind=kind).set(0)
            for kind, value in counts.items():
                self.safety_holds.labels(kind=kind).set(value)
            self._hold_kinds |= set(counts)

    def set_unreadable_records(self, count: int) -> None:
        self.unreadable_records.set(count)

    def set_reconcile_queue_depth(self, depth: int) -> None:
        self.reconcile_queue_depth.set(depth)

    def set_leader(self, scope: str, leading: bool) -> None:
        """Report whether this process leads ``scope`` (``shard`` or ``cluster``)."""
        if scope not in LEADER_SCOPES:
            raise ValueError(f"unknown leadership scope {scope!r}; use one of: {', '.join(LEADER_SCOPES)}")
        with self._lock:
            if leading and not self._leading.get(scope, False):
                self.leader_changes.labels(scope=scope).inc()
            self._leading[scope] = leading
        self.leader.labels(scope=scope).set(1 if leading else 0)

    def set_config_loaded(self, loaded: bool) -> None:
        self.config_loaded.set(1 if loaded else 0)

    def set_degraded(self, component: str, kind: str | None) -> None:
        """Report ``component`` degraded for ``kind`` (one series per component), or healthy (None)."""
        with self._lock:
            previous = self._degraded_kinds.pop(component, None)
            if previous is not None and previous != kind:
                self.degraded.remove(component, previous)
            if kind is not None:
                self._degraded_kinds[component] = kind
                self.degraded.labels(component=component, kind=kind).set(1)

    def set_image_errors(self, count: int) -> None:
        self.image_errors.set(count)

    def set_leader_network_ready(self, ready: bool) -> None:
        self.leader_network.set(1 if ready else 0)

    def set_lb_deregistrations_waiting(self, count: int) -> None:
        self.lb_deregistrations_waiting.set(count)

    def record_rpc(self, method: str, code: str) -> None:
        """Count one finished gRPC call (``code`` is a status code name such as ``OK``)."""
        self.rpc.labels(method=method, code=code).inc()

    def record_reconcile(self, result: str) -> None:
        self.reconcile.labels(result=result).inc()

    def record_provider_create(self) -> None:
        self.provider_creates.inc()

    def record_retirement(self, reason: str) -> None:
        """Count an instance retired for ``reason`` when that retirement is a replacement."""
        if reason not in NOT_REPLACEMENTS:
            self.replacements.labels(reason=reason).inc()

    def set_info(self, server_id: str, shard: str) -> None:
        """Publish ``nstance_server_info`` for this server (call once at start)."""
        self.info.labels(server_id=server_id, shard=shard, version=nstance.__version__).set(1)

    def set_certificate_expiry(self, certificate: str, not_after: datetime) -> None:
        """Publish when ``certificate`` (``ca``, ``server-mtls``, ``server-registration``) expires."""
        self.certificate_expiry.labels(certificate=certificate).set(not_after.timestamp())

    def observe_event_loop_lag(self, seconds: float) -> None:
        self.event_loop_lag.observe(max(0.0, seconds))

    def observe_provider_call(self, provider: str, method: str, seconds: float, error: str | None) -> None:
        """Record one provider call's duration and, when it raised, the exception class name."""
        self.provider_call_seconds.labels(provider=provider, method=method).observe(seconds)
        if error is not None:
            self.provider_call_errors.labels(provider=provider, method=method, code=error).inc()

    # --- exposition ---------------------------------------------------------------------------

    def render(self) -> bytes:
        """Every metric in the Prometheus text exposition format."""
        return generate_latest(self.registry)


async def watch_event_loop_lag(
    metrics: Metrics, stop: asyncio.Event, interval: float = LOOP_LAG_INTERVAL
) -> None:
    """Until ``stop``: sleep ``interval`` and record how much later than that the loop woke us."""
    while not stop.is_set():
        started = time.monotonic()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval)
        if not stop.is_set():
            metrics.observe_event_loop_lag(time.monotonic() - started - interval)


class InstrumentedProvider:
    """A ``Provider`` that delegates to ``provider`` and records each call in ``metrics``.

    The ``provider`` label is the wrapped provider's ``kind``; ``method`` is the protocol method name.
    Cancelled calls are not recorded (they say nothing about the provider).
    """

    def __init__(self, provider: Provider, metrics: Metrics) -> None:
        self._provider = provider
        self._metrics = metrics

    @property
    def inner(self) -> Provider:
        """The wrapped provider (for provider-specific operations such as fault injection)."""
        return self._provider

    @property
    def kind(self) -> str:
        return self._provider.kind

    async def _timed(self, method: str, call: Callable[[], Awaitable[T]]) -> T:
        kind = self._provider.kind
        start = time.perf_counter()
        try:
            result = await call()
        except Exception as exc:
            self._metrics.observe_provider_call(kind, method, time.perf_counter() - start, type(exc).__name__)
            raise
        self._metrics.observe_provider_call(kind, method, time.perf_counter() - start, None)
        return result

    async def create_instance(self, request: CreateRequest) -> ProviderInstance:
        return await self._timed("create_instance", lambda: self._provider.create_instance(request))

    async def delete_instance(self, instance_id: str, provider_id: str) -> None:
        await self._timed("delete_instance", lambda: self._provider.delete_instance(instance_id, provider_id))

    async def get_instance(self, instance_id: str, provider_id: str) -> ProviderInstance:
        return await self._timed(
            "get_instance", lambda: self._provider.get_instance(instance_id, provider_id)
        )

    async def list_instances(self, cluster_id: str, shard: str) -> list[ProviderInstance]:
        return await self._timed("list_instances", lambda: self._provider.list_instances(cluster_id, shard))

    async def check_subnet_capacity(self, subnet_id: str) -> bool:
        return await self._timed(
            "check_subnet_capacity", lambda: self._provider.check_subnet_capacity(subnet_id)
        )

    async def close(self) -> None:
        await self._provider.close()

    # --- optional capabilities: only called after capability() found them on the wrapped provider ---

    @property
    def _any(self) -> Any:
        return self._provider

    async def register_targets(self, name: str, lb: LoadBalancerConfig, targets: Sequence[LbTarget]) -> None:
        await self._timed("register_targets", lambda: self._any.register_targets(name, lb, targets))

    async def deregister_targets(
        self, name: str, lb: LoadBalancerConfig, targets: Sequence[LbTarget]
    ) -> None:
        await self._timed("deregister_targets", lambda: self._any.deregister_targets(name, lb, targets))

    async def target_states(
        self, name: str, lb: LoadBalancerConfig, targets: Sequence[LbTarget]
    ) -> dict[str, TargetState]:
        result: dict[str, TargetState] = await self._timed(
            "target_states", lambda: self._any.target_states(name, lb, targets)
        )
        return result

    async def assign_leader_network(self, provider_id: str, ip: str, interface_id: str) -> None:
        await self._timed(
            "assign_leader_network", lambda: self._any.assign_leader_network(provider_id, ip, interface_id)
        )

    async def release_leader_network(self, provider_id: str, ip: str, interface_id: str) -> None:
        await self._timed(
            "release_leader_network", lambda: self._any.release_leader_network(provider_id, ip, interface_id)
        )

    async def own_instance_id(self) -> str:
        result: str = await self._timed("own_instance_id", lambda: self._any.own_instance_id())
        return result

    async def lookup_image(self, name: str, image: ImageConfig) -> str:
        result: str = await self._timed("lookup_image", lambda: self._any.lookup_image(name, image))
        return result

    async def check_instance_type(self, instance_type: str, arch: str, *, template: str, where: str) -> None:
        await self._timed(
            "check_instance_type",
            lambda: self._any.check_instance_type(instance_type, arch, template=template, where=where),
        )
