"""One simulated shard: servers, cloud, object storage, agents and an operator, driven by a seed.

A ``World`` builds everything from ``random.Random(seed)`` and runs it on a ``VirtualTimeLoop``:

* **Servers** (2 or 3) are the real ``Shard``, ``Elector``, ``Registrar`` and ``AgentHub`` code, each
  incarnation with its own SQLite file and its own *gates* on object storage, the provider and SQLite.
  Crashing a server closes its gates (any I/O it still attempts raises ``SimCrash``, so no ``finally``
  block can act after death) and cancels every task it started. A restarted server keeps or loses its
  SQLite file at random.
* **Object storage** is one ``MemoryObjectStore`` shared by all; each server sees it through a
  ``SimStore`` that injects 503s and 409s (not applied), timeouts (applied or not: an ambiguous
  outcome), and partitions (every call fails for a while: the server loses leadership).
* **The cloud** is one ``SimProvider`` (EC2-shaped, load balancers included) with throttling, a
  not-found-after-create window and creates whose response is lost after the VM launched.
* **Agents** boot with their VM, register with the leader using the nonce from the create request,
  and stream health reports. Faults crash an agent (its VM keeps running: it must be replaced) or
  break its stream briefly (a blip shorter than the missed-report window: nothing may be replaced).
* **The operator** changes group sizes through ``UpsertGroup`` and acknowledges drains.
* **Process faults** (``leader_faults``): a server paused and continued after a takeover, a server that
  loses the provider's API but not storage, and steps of a server's wall clock.
* **Nemeses** of their own: damaged and lost storage (``nemeses``) and floods of forged, replayed and
  over-limit calls (``floods``); the cloud refuses creates beyond a quota per group (``check_quota``).
* **Fault points** in the server (``nstance.server.state.context.fault_point``: before and after the
  provider create, after the provider delete, after a registration claim, after a groups write)
  crash the server that reaches them when armed.

Every mutating provider call and every instance-record or groups write is checked as it happens: the
server making it must be the only one whose elector says it leads. After the fault phase a calm phase
lets the shard converge, then ``invariants`` checks the end state. This module is test tooling; the
server never imports it.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import functools
import json
import logging
import math
import random
import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from nstance.config import GroupUpdate
from nstance.config.cluster import LeaderElectionConfig
from nstance.config.resources import ImageConfig, LoadBalancerConfig
from nstance.config.shard import DeletionBrakeConfig
from nstance.core import backoff as backoff_module
from nstance.core import ids as ids_module
from nstance.core.clock import ManualClock
from nstance.core.durations import parse_duration
from nstance.core.errors import AlreadyExists, NstanceError, Unauthenticated
from nstance.db.engine import Database, open_database
from nstance.objectstore.base import Conflict, ObjectInfo, Throttled
from nstance.objectstore.memory import MemoryObjectStore
from nstance.objectstore.scoped import ScopedObjectStore
from nstance.pki.ca import create_ca
from nstance.pki.keys import generate_private_key, public_key_to_pem
from nstance.providers.base import CreateRequest, InstanceStatus, ProviderInstance, ProviderUnavailable
from nstance.providers.features import LbTarget, TargetState
from nstance.providers.sim import SimProvider
from nstance.server.agents.hub import HealthReport
from nstance.server.identity.registration import Registrar
from nstance.server.leadership.election import Elector, ElectorLeadership
from nstance.server.reconcile.reconciler import MISSED_REPORTS
from nstance.server.shard import shard as shard_module
from nstance.server.shard.build import build_shard
from nstance.server.shard.shard import Shard
from nstance.server.state import records as records_module
from nstance.server.state.configstate import ConfigState
from nstance.server.state.events import InstanceEventData
from nstance.server.state.limits import CreateLimiter
from nstance.server.state.provisioning import ShardIdentity
from nstance.simulation import leader_faults
from nstance.simulation.floods import MAX_GROUP_SIZE, QUOTA_FACTOR, FloodNemesis
from nstance.simulation.nemeses import StorageNemeses

log = logging.getLogger("nstance.simulation")

T = TypeVar("T")
CLUSTER = "sim"
SHARD = "zone-a"
TENANT = "default"
HEALTH_INTERVAL = 10.0
#: Fault points the server code has (``fault_point(...)`` calls).
FAULT_POINTS = (
    "before-provider-create",
    "after-provider-create",
    "after-provider-delete",
    "after-registration-claim",
    "after-groups-write",
)
#: Fault kinds and their weights (a kind listed twice is drawn twice as often).
FAULT_KINDS = (
    "crash",
    "fault-point",
    "fault-point",
    "partition",
    "agent-crash",
    "blip",
    "blip",
    "lost-create",
    "throttle",
    "pause",
    "provider-loss",
    "wall-step",
)
#: Fault kinds that leave the servers (and so leadership) alone.
HARMLESS_TO_SERVERS = frozenset({"agent-crash", "blip", "lost-create", "throttle", "flood"})
#: Set while an agent's health stream runs: its end is not held back when the server it talks to is paused.
_STREAMING: contextvars.ContextVar[bool] = contextvars.ContextVar("sim_streaming", default=False)
_CURRENT: contextvars.ContextVar[Incarnation | None] = contextvars.ContextVar("sim_server", default=None)


class SimCrash(BaseException):
    """The simulated server process is dead: raised out of its I/O so nothing more happens."""


class InvariantViolation(AssertionError):
    """Something the system promises did not hold."""


# ---- gates -----------------------------------------------------------------------------------


class Gate:
    """Whether one server incarnation is alive, and whether object storage is reachable for it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.alive = True
        self.partitioned_until = -math.inf
        self.provider_lost_until = -math.inf
        self.paused_since: float | None = None  # monotonic time the process was stopped (pause fault)

    def check(self) -> None:
        if not self.alive:
            raise SimCrash(self.name)


class SimStore:
    """Object storage as one server sees it: the shared store behind a gate, with injected faults."""

    def __init__(self, world: World, inc: Incarnation) -> None:
        self._world = world
        self._inc = inc
        self._base = world.base_store

    def _enter(self, key: str, *, write: bool) -> None:
        world, gate = self._world, self._inc.gate
        gate.check()
        if world.clock.monotonic() < gate.partitioned_until:
            raise Throttled(f"object storage unreachable from {gate.name} (simulated partition)")
        if world.rng.random() < world.store_fault_rate:
            kind = world.rng.choice(("503", "409") if write else ("503",))
            world.stats["store_faults"] += 1
            if kind == "409":
                raise Conflict(f"simulated 409 ConditionalRequestConflict on {key}")
            raise Throttled(f"simulated 503 SlowDown on {key}")
        if write and _is_guarded(key):
            world.check_acting(self._inc, f"write {key}")

    def _after_write(self, key: str) -> None:
        world = self._world
        if world.rng.random() < world.store_timeout_rate:
            world.stats["store_timeouts"] += 1
            raise Throttled(f"simulated timeout writing {key} (the write was applied)")

    def _maybe_lost(self, key: str) -> None:
        """A timeout before the write reached the store (not applied)."""
        world = self._world
        if world.rng.random() < world.store_timeout_rate:
            world.stats["store_timeouts"] += 1
            raise Throttled(f"simulated timeout writing {key} (the write was not applied)")

    def get(self, key: str) -> tuple[bytes, str]:
        self._enter(key, write=False)
        return self._base.get(key)

    def head(self, key: str) -> ObjectInfo:
        self._enter(key, write=False)
        return self._base.head(key)

    def put(self, key: str, data: bytes) -> str:
        self._enter(key, write=True)
        self._maybe_lost(key)
        etag = self._base.put(key, data)
        self._after_write(key)
        return etag

    def put_if_match(self, key: str, data: bytes, etag: str | None) -> str:
        self._enter(key, write=True)
        self._maybe_lost(key)
        new = self._base.put_if_match(key, data, etag)
        self._after_write(key)
        return new

    def delete(self, key: str, if_match: str | None = None) -> None:
        self._enter(key, write=True)
        self._base.delete(key, if_match=if_match)

    def list(self, prefix: str = "") -> list[str]:
        self._enter(prefix, write=False)
        return self._base.list(prefix)

    def exists(self, key: str) -> bool:
        self._enter(key, write=False)
        return self._base.exists(key)


def _is_guarded(key: str) -> bool:
    """Writes only the shard leader may make (instance records, dynamic groups), not election locks."""
    return "/instance/" in key or key.endswith("/groups.jsonc") or "/certlog/" in key


class SimDatabase:
    """A server's SQLite cache behind its gate (a dead process writes nothing more)."""

    def __init__(self, inner: Database, gate: Gate) -> None:
        self._inner = inner
        self._gate = gate

    @contextlib.contextmanager
    def session(self) -> Iterator[Any]:
        self._gate.check()
        with self._inner.session() as session:
            yield session

    @contextlib.contextmanager
    def read_session(self) -> Iterator[Any]:
        self._gate.check()
        with self._inner.read_session() as session:
            yield session

    @contextlib.contextmanager
    def write_connection(self) -> Iterator[Any]:
        self._gate.check()
        with self._inner.write_connection() as conn:
            yield conn

    @contextlib.contextmanager
    def read_connection(self) -> Iterator[Any]:
        self._gate.check()
        with self._inner.read_connection() as conn:
            yield conn

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    @property
    def on_corrupt(self) -> Any:
        return self._inner.on_corrupt

    @on_corrupt.setter
    def on_corrupt(self, hook: Any) -> None:
        self._inner.on_corrupt = hook


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

    async def create_instance(self, request: CreateRequest) -> ProviderInstance:
        self._world.nonces[request.instance_id] = request.nonce
        self._world.check_quota(request)
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


# ---- servers ---------------------------------------------------------------------------------


@dataclass(eq=False)
class Incarnation:
    """One run of one server process, from start to crash or end."""

    server: str
    number: int
    gate: Gate
    tasks: set[asyncio.Task[Any]] = field(default_factory=set)
    elector: Elector | None = None
    shard: Shard | None = None
    registrar: Registrar | None = None

    @property
    def name(self) -> str:
        return f"{self.server}#{self.number}"

    def api(self) -> Shard:
        """The server's Shard (what its gRPC servicers call)."""
        assert self.shard is not None, "an incarnation has its Shard from the start"
        return self.shard

    def registration(self) -> Registrar:
        """The server's Registrar."""
        assert self.registrar is not None, "an incarnation has its Registrar from the start"
        return self.registrar

    def leads(self) -> bool:
        """Alive, elected and past recovery: agents and the operator talk to this one."""
        return (
            self.gate.alive
            and self.elector is not None
            and self.elector.is_leader()
            and self.shard is not None
            and self.shard.leading
        )


class SimServer:
    """One server id; it may crash and restart as a new ``Incarnation``."""

    def __init__(self, world: World, name: str) -> None:
        self.world = world
        self.name = name
        self.db_path = world.tmp / f"{name}.db"
        self.current: Incarnation | None = None
        self.count = 0
        self.clock = leader_faults.SkewedClock(world.clock)  # the host's clock: outlives incarnations

    def start(self, *, keep_db: bool) -> Incarnation:
        world = self.world
        self.count += 1
        inc = Incarnation(self.name, self.count, Gate(f"{self.name}#{self.count}"))
        self.current = inc
        if not keep_db or not self.db_path.exists():
            shutil.copyfile(world.template_db, self.db_path)
        inner_db = open_database(self.db_path, migrate=False)
        world.closers.append(inner_db.close)
        store = SimStore(world, inc)
        shard_store = ScopedObjectStore(store, f"shard/{SHARD}/")
        cluster_store = ScopedObjectStore(store, "cluster/")
        cache = world.tmp / f"{inc.name}-config"
        state = ConfigState(shard_store, cache, clock=self.clock)
        elector = Elector(
            shard_store,
            "leader.json",
            elector_id=self.name,
            address=f"{self.name}:8991",
            config=world.election,
            clock=self.clock,
            on_change=lambda leading: self._on_change(inc, leading),
            name="shard",
        )
        built = build_shard(
            identity=world.identity,
            store=shard_store,
            cluster_store=cluster_store,
            db=SimDatabase(inner_db, inc.gate),  # type: ignore[arg-type]
            config=state,
            provider=SimCloud(world, inc),
            nonce_key=world.nonce_key,
            ca=world.ca,
            clock=self.clock,
            limiter=CreateLimiter(clock=self.clock, max_concurrent=8),
            leadership=ElectorLeadership(elector),
            faults=world.on_fault_point,
        )
        ctx, shard, registrar = built.ctx, built.shard, built.registrar
        sink = world.instance_event_sink(ctx.events.instances.publish)
        ctx.events.instances.publish = sink  # type: ignore[method-assign, assignment]
        inc.elector, inc.shard, inc.registrar = elector, shard, registrar
        world.spawn(inc, self._boot(inc, state, elector), "boot")
        world.trace(f"start {inc.name} ({'kept' if keep_db else 'fresh'} SQLite)")
        return inc

    async def _boot(self, inc: Incarnation, state: ConfigState, elector: Elector) -> None:
        delay = 0.5
        while True:
            try:
                await asyncio.to_thread(state.load, True)
                break
            except NstanceError:
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)
        self.world.spawn(inc, elector.run(), "election")

    def _on_change(self, inc: Incarnation, leading: bool) -> None:
        if not inc.gate.alive or inc.shard is None:
            return
        self.world.trace(f"{inc.name} {'leads' if leading else 'stops leading'}")
        self.world.leader_changes += 1
        coro = inc.shard.start_leading() if leading else inc.shard.stop_leading(grace=2.0)
        self.world.spawn(inc, coro, "leadership")

    def crash(self, why: str) -> None:
        inc = self.current
        if inc is None or not inc.gate.alive:
            return
        leader_faults.resume(self.world, inc)  # a stopped process can be killed too
        inc.gate.alive = False
        self.world.trace(f"crash {inc.name}: {why}")
        self.world.stats["crashes"] += 1
        for task in list(inc.tasks):
            task.cancel()


# ---- agents ----------------------------------------------------------------------------------


@dataclass
class AgentState:
    instance_id: str
    crashed: bool = False
    stuck: bool = False  # refused for good (e.g. its nonce was claimed by a registration it never saw)
    registered: bool = False
    blip_until: float = -math.inf
    reports: int = 0
    vm_gone_at: float | None = None  # when the agent stopped because its VM was deleted


# ---- the world -------------------------------------------------------------------------------


@dataclass
class Scenario:
    """What one seed runs: sizes, timings and fault rates, all drawn from the seed."""

    servers: int
    groups: dict[str, int]
    drain_timeouts: dict[str, str]
    with_lb: str
    boot_time: float
    not_found_after_create: float
    lb_deregistration_delay: float
    fault_phase: float
    calm_phase: float
    fault_mean_gap: float
    store_fault_rate: float
    store_timeout_rate: float
    #: The kinds of fault the fault phase draws from (tests narrow it to one class of fault).
    fault_kinds: tuple[str, ...] = FAULT_KINDS

    @classmethod
    def draw(cls, rng: random.Random) -> Scenario:
        groups = {f"g{i}": rng.randint(0, 3) for i in range(1, rng.randint(1, 3) + 1)}
        scenario = cls(
            servers=rng.choice((2, 3)),
            groups=groups,
            drain_timeouts={g: rng.choice(("0s", "20s", "45s")) for g in groups},
            with_lb=rng.choice([*groups, ""]),
            boot_time=rng.uniform(2.0, 15.0),
            not_found_after_create=rng.choice((0.0, 0.0, 3.0, 10.0)),
            lb_deregistration_delay=rng.choice((0.0, 5.0, 20.0)),
            fault_phase=rng.uniform(600.0, 900.0),
            calm_phase=420.0,
            fault_mean_gap=rng.uniform(25.0, 60.0),
            store_fault_rate=rng.choice((0.0, 0.01, 0.03)),
            store_timeout_rate=rng.choice((0.0, 0.005, 0.02)),
        )
        return dataclasses.replace(scenario, calm_phase=max(scenario.calm_phase, scenario.settle_time()))

    def settle_time(self) -> float:
        """Simulated seconds the calm phase needs before every group must be whole with working agents.

        Derived from the configuration, not guessed: a takeover (a dead leader's lock times out), the
        first missed-report window of the new leadership plus the silence limit itself, a mass-silence
        hold of the brake's full ``max_hold``, the longest drain timeout (a crashed agent never
        acknowledges its drain), a replacement's boot, and a margin for reconcile and provider latency.
        """
        election = LeaderElectionConfig()
        takeover = (election.infrequent_interval + election.leader_timeout).total_seconds()
        window = MISSED_REPORTS * HEALTH_INTERVAL
        max_hold = DeletionBrakeConfig().max_hold.total_seconds()
        drain = max((parse_duration(t).total_seconds() for t in self.drain_timeouts.values()), default=0.0)
        return takeover + 2 * window + max_hold + drain + self.boot_time + 30.0


@dataclass
class UpsertAttempt:
    group: str
    size: int
    at: float
    acknowledged: bool


class World:
    """Everything one seed simulates (see the module docstring)."""

    def __init__(
        self, seed: int, tmp: Path, template_db: Path, *, fault_kinds: tuple[str, ...] | None = None
    ) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.scenario = Scenario.draw(random.Random(f"{seed}:scenario"))
        if fault_kinds is not None:
            self.scenario = dataclasses.replace(self.scenario, fault_kinds=fault_kinds)
        self.tmp = tmp
        self.template_db = template_db
        self.clock = ManualClock()
        self.base_store = MemoryObjectStore()
        self.cloud = SimProvider(
            clock=self.clock,
            seed=seed,
            latency=0.05,
            latency_jitter=0.5,
            boot_time=self.scenario.boot_time,
            not_found_after_create=self.scenario.not_found_after_create,
            lb_deregistration_delay=self.scenario.lb_deregistration_delay,
        )
        self.election = LeaderElectionConfig()  # production defaults: 5 s / 30 s / 15 s
        self.ca = create_ca(cluster_id=CLUSTER)
        self.nonce_key = Ed25519PrivateKey.generate()
        self.identity = ShardIdentity(
            cluster_id=CLUSTER,
            shard=SHARD,
            provider_kind="sim",
            region="sim",
            zone=SHARD,
            registration_addr="leader:8992",
            agent_addr="leader:8994",
            operator_addr="leader:8993",
            ca_pem=self.ca.cert_pem,
        )
        self.store_fault_rate = 0.0
        self.store_timeout_rate = 0.0
        self.servers = [SimServer(self, f"s{i + 1}") for i in range(self.scenario.servers)]
        self.nonces: dict[str, str] = {}
        self.agents: dict[str, AgentState] = {}
        self.upserts: list[UpsertAttempt] = []
        self.armed: str | None = None
        self.violations: list[str] = []
        self.events: list[tuple[float, str, str, str]] = []  # (t, instance, status, reason)
        self.trace_lines: list[str] = []
        self.stats: dict[str, int] = dict.fromkeys(
            (
                "crashes",
                "fault_point_crashes",
                "partitions",
                "agent_crashes",
                "blips",
                "store_faults",
                "store_timeouts",
                "upserts",
                "acks",
                "lost_create_responses",
                "throttle_windows",
                "pauses",
                "provider_losses",
                "wall_steps",
                "duplicate_acks",
                "late_acks",
                "floods",
                "flood_calls",
                "flood_clone_streams",
            ),
            0,
        )
        self.closers: list[Callable[[], None]] = []
        self._background: set[asyncio.Task[Any]] = set()
        self.start_mono = self.clock.monotonic()
        self.storage = StorageNemeses(self, SHARD, drawn=fault_kinds is None)
        self.floods = FloodNemesis(self, drawn=fault_kinds is None)
        #: Monotonic time of the last fault that may cost a server its leadership (floods must not).
        self.disrupted_at = -math.inf
        self.leader_changes = 0
        self.quota_refusals = 0

    # -- bookkeeping ------------------------------------------------------------------------

    def now(self) -> float:
        return self.clock.monotonic() - self.start_mono

    def trace(self, line: str) -> None:
        self.trace_lines.append(f"{self.now():8.2f} {line}")

    def spawn(self, inc: Incarnation | None, coro: Awaitable[Any], name: str) -> asyncio.Task[Any]:
        token = _CURRENT.set(inc)
        try:
            task: asyncio.Task[Any] = asyncio.get_running_loop().create_task(_awaited(coro), name=name)
        finally:
            _CURRENT.reset(token)
        if inc is None:
            self._background.add(task)
            task.add_done_callback(self._background.discard)
        return task

    def incarnations(self) -> list[Incarnation]:
        return [s.current for s in self.servers if s.current is not None and s.current.gate.alive]

    def leader(self) -> Incarnation | None:
        leading = [inc for inc in self.incarnations() if inc.leads()]
        return leading[0] if len(leading) == 1 else None

    def check_acting(self, inc: Incarnation, what: str) -> None:
        """A leader-only action: the one acting must be the only elector that leads right now."""
        leaders = [i for i in self.incarnations() if i.elector is not None and i.elector.is_leader()]
        if inc not in leaders or len(leaders) > 1:
            names = ", ".join(i.name for i in leaders) or "nobody"
            self.violations.append(
                f"t={self.now():.2f}: {inc.name} did '{what}' while the leaders were: {names}"
            )

    def check_quota(self, request: CreateRequest) -> None:
        """The simulated account's quota: a create beyond it breaks a promise and is refused."""
        quota = QUOTA_FACTOR * MAX_GROUP_SIZE
        live = sum(
            1
            for vm in self.cloud.vms.values()
            if vm.group == request.group
            and vm.status not in (InstanceStatus.DELETED, InstanceStatus.DELETING)
        )
        if live < quota:
            return
        self.quota_refusals += 1
        if self.quota_refusals == 1:
            self.violations.append(
                f"t={self.now():.2f}: the cloud was asked for more than {quota} VMs in group {request.group} "
                f"({QUOTA_FACTOR} x shard.limits.max_group_size)"
            )
        raise ProviderUnavailable(f"simulated quota: {live} VMs run in group {request.group}")

    def instance_event_sink(
        self, publish: Callable[[InstanceEventData], None]
    ) -> Callable[[InstanceEventData], None]:
        def sink(event: InstanceEventData) -> None:
            self.events.append((self.now(), event.instance_id, event.status, event.reason))
            publish(event)

        return sink

    def on_fault_point(self, name: str) -> None:
        """Crash the server that reached an armed fault point (installed as the server's fault hook)."""
        inc = _CURRENT.get()
        if self.armed != name or inc is None or not inc.gate.alive:
            return
        self.armed = None
        self.stats["fault_point_crashes"] += 1
        server = next(s for s in self.servers if s.current is inc)
        server.crash(f"fault point {name}")
        raise SimCrash(inc.name)

    # -- configuration -------------------------------------------------------------------------

    def config_document(self) -> dict[str, Any]:
        sc = self.scenario
        groups: dict[str, Any] = {}
        for name, size in sc.groups.items():
            group: dict[str, Any] = {
                "template": "app",
                "size": size,
                "drain_timeout": sc.drain_timeouts[name],
            }
            if name == sc.with_lb:
                group["load_balancers"] = ["web"]
            groups[name] = group
        return {
            "cluster": {"id": CLUSTER, "secrets": {"provider": "memory"}},
            "shard": {
                "id": SHARD,
                "infra": {"provider": "sim", "region": "sim", "zone": SHARD},
                "bind": {a: f"0.0.0.0:{8990 + i}" for i, a in enumerate(_ADDRS)},
                "advertise": {a: f"leader:{8990 + i}" for i, a in enumerate(_ADDRS)},
                "subnet_pools": {"default": ["net-1"]},
                "health_check_interval": f"{int(HEALTH_INTERVAL)}s",
                "default_drain_timeout": "30s",
                "garbage_collection": {
                    "interval": "30s",
                    "registration_timeout": "2m",
                    "deleted_record_retention": "5m",
                },
                "request_timeout": "10s",
                "limits": {"max_group_size": MAX_GROUP_SIZE},
                "shutdown_timeout": "2s",
            },
            "load_balancers": {
                "web": {"provider": "aws", "target_groups": [{"arn": "arn:sim:tg/web", "target_port": 80}]}
            },
            "templates": {
                "app": {
                    "kind": "app",
                    "arch": "amd64",
                    "subnet_pool": "default",
                    "instance_type": "m7i.large",
                    "userdata": {"content": "#!/bin/sh\n# {{ .Instance.ID }} {{ .Nonce }}\n"},
                }
            },
            "groups": {TENANT: groups},
        }

    # -- drivers -------------------------------------------------------------------------------

    async def agent_manager(self) -> None:
        """Start an agent for every VM that boots (once per instance; a crashed agent stays down)."""
        while True:
            for vm in self.cloud.vms.values():
                iid = vm.instance_id
                if vm.status != InstanceStatus.RUNNING or iid in self.agents or iid not in self.nonces:
                    continue
                state = AgentState(iid)
                self.agents[iid] = state
                self.spawn(None, self.agent(state, vm.provider_id), f"agent-{iid}")
            await asyncio.sleep(1.0)

    def _vm_alive(self, provider_id: str) -> bool:
        vm = self.cloud.vms.get(provider_id)
        return vm is not None and vm.status not in (InstanceStatus.DELETED, InstanceStatus.DELETING)

    async def _call_leader(self, fn: Callable[[Incarnation], Awaitable[T]]) -> T:
        """Call ``fn`` on the leader as its client would; any failure (crash included) is an NstanceError."""
        inc = self.leader()
        if inc is None:
            raise ProviderUnavailable("no leader")
        token = _CURRENT.set(inc)  # what the server starts while serving the call belongs to it
        try:
            return await fn(inc)
        except SimCrash as exc:
            raise ProviderUnavailable(f"{inc.name} died during the call") from exc
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the caller itself is being stopped
            # A task of the server that served the call was cancelled (it crashed or stopped leading):
            # a real client sees its call fail (UNAVAILABLE), it does not die with the server.
            raise ProviderUnavailable(f"{inc.name} dropped the call") from None
        finally:
            _CURRENT.reset(token)

    async def agent(self, state: AgentState, provider_id: str) -> None:
        iid = state.instance_id
        key = generate_private_key("ecdsa-p256")
        pem = public_key_to_pem(key)
        nonce = self.nonces[iid]
        delay = 1.0
        while not state.registered:
            if not self._vm_alive(provider_id) or state.crashed:
                state.vm_gone_at = None if state.crashed else self.now()
                return
            try:
                await self._call_leader(
                    lambda inc: inc.registration().register_agent(
                        nonce_jwt=nonce, public_key_pem=pem, private_ipv4="", private_ipv6="", hostname=""
                    )
                )
                state.registered = True
            except (AlreadyExists, Unauthenticated) as exc:
                state.stuck = True
                self.trace(f"agent {iid} cannot register: {exc}")
                return
            except NstanceError:
                await asyncio.sleep(delay)
                delay = min(delay * 2, 15.0)
        while self._vm_alive(provider_id) and not state.crashed:
            if self.clock.monotonic() < state.blip_until:
                await asyncio.sleep(state.blip_until - self.clock.monotonic())
                continue
            inc = self.leader()
            if inc is None:
                await asyncio.sleep(1.0)
                continue
            with contextlib.suppress(NstanceError):
                await self._call_leader(lambda leader: self._stream(state, leader, provider_id))
            await asyncio.sleep(1.0)
        if not state.crashed:
            state.vm_gone_at = self.now()  # the agent stopped because its VM was deleted

    async def _stream(self, state: AgentState, inc: Incarnation, provider_id: str) -> None:
        token = _STREAMING.set(True)  # the agent's end of the stream is not stopped with a paused server
        try:
            await inc.api().agents.health(state.instance_id, self._reports(state, inc, provider_id))
        finally:
            _STREAMING.reset(token)

    async def _reports(
        self, state: AgentState, inc: Incarnation, provider_id: str
    ) -> AsyncIterator[HealthReport]:
        while (
            self._vm_alive(provider_id) and not state.crashed and self.clock.monotonic() >= state.blip_until
        ):
            if not await leader_faults.reachable(self, inc):
                return  # keepalive gave up on a stopped server: the agent reconnects to the leader
            if not inc.leads():
                return
            state.reports += 1
            yield HealthReport(instance_id=state.instance_id, count=state.reports)
            await asyncio.sleep(HEALTH_INTERVAL)

    async def operator(self, until: float) -> None:
        """Change group sizes now and then; acknowledge drains after a while (as a node drain would).

        Some acknowledgements come late (after the drain timeout, maybe to another leader, maybe for
        an instance deleted by then) and some come twice, as from an operator that retried.
        """
        rng = random.Random(f"{self.seed}:operator")
        next_upsert = self.clock.monotonic() + rng.uniform(20, 90)
        acked: set[str] = set()
        while True:
            now = self.clock.monotonic()
            if now >= next_upsert and now < until:
                group = rng.choice(sorted(self.scenario.groups))
                size = rng.randint(0, 4)
                self.stats["upserts"] += 1
                try:
                    update = GroupUpdate(size=size)
                    await self._call_leader(functools.partial(_upsert, group=group, update=update))
                    self.upserts.append(UpsertAttempt(group, size, self.now(), True))
                    self.trace(f"operator: {group} size {size}")
                except NstanceError as exc:
                    self.upserts.append(UpsertAttempt(group, size, self.now(), False))
                    self.trace(f"operator: {group} size {size} failed: {exc}")
                next_upsert = now + rng.uniform(20, 120)
            with contextlib.suppress(NstanceError):
                draining = await self._call_leader(
                    lambda inc: asyncio.to_thread(inc.api().draining_instances, TENANT)
                )
                for view, _reason, _delete_at in draining:
                    iid = view.instance_id
                    if iid in acked or rng.random() < 0.5:
                        continue
                    acked.add(iid)
                    if rng.random() < 0.2:
                        self.stats["late_acks"] += 1
                        self.spawn(None, self._ack_later(iid, rng.uniform(20.0, 120.0)), "late-ack")
                        continue
                    with contextlib.suppress(NstanceError):
                        await self._call_leader(functools.partial(_acknowledge, instance_id=iid))
                        self.stats["acks"] += 1
                    if rng.random() < 0.25:
                        self.stats["duplicate_acks"] += 1
                        self.spawn(None, self._ack_later(iid, rng.uniform(0.0, 60.0)), "duplicate-ack")
            await asyncio.sleep(15.0)

    async def _ack_later(self, instance_id: str, delay: float) -> None:
        await asyncio.sleep(delay)
        with contextlib.suppress(NstanceError):
            await self._call_leader(functools.partial(_acknowledge, instance_id=instance_id))
            self.trace(f"operator: acknowledged the drain of {instance_id} after {delay:.1f}s")

    async def faults(self, until: float) -> None:
        """Inject one fault at a time, at random, until ``until`` (virtual monotonic seconds)."""
        rng = random.Random(f"{self.seed}:faults")
        sc = self.scenario
        self.store_fault_rate = sc.store_fault_rate
        self.store_timeout_rate = sc.store_timeout_rate
        while True:
            await asyncio.sleep(rng.expovariate(1.0 / sc.fault_mean_gap))
            if self.clock.monotonic() >= until:
                return
            kind = rng.choice(sc.fault_kinds)
            if kind not in HARMLESS_TO_SERVERS:
                self.disrupted_at = self.clock.monotonic()
            if kind == "flood":
                self.floods.strike()
            elif kind == "pause":
                leader_faults.inject_pause(self, rng)
            elif kind == "provider-loss":
                leader_faults.inject_provider_loss(self, rng)
            elif kind == "wall-step":
                leader_faults.inject_wall_step(self, rng)
            elif kind == "crash":
                server = rng.choice(self.servers)
                server.crash("killed at a random moment")
                self.spawn(
                    None, self._restart_later(server, rng.uniform(2, 40), rng.random() < 0.7), "restart"
                )
            elif kind == "fault-point":
                self.armed = rng.choice(FAULT_POINTS)
                self.trace(f"armed fault point {self.armed}")
            elif kind == "partition":
                live = [s.current for s in self.servers if s.current is not None and s.current.gate.alive]
                if live:
                    inc = rng.choice(live)
                    length = rng.uniform(5, 45)
                    inc.gate.partitioned_until = self.clock.monotonic() + length
                    self.stats["partitions"] += 1
                    self.trace(f"partition {inc.name} from object storage for {length:.1f}s")
            elif kind in ("agent-crash", "blip"):
                reporting = [
                    a for a in self.agents.values() if a.registered and not a.crashed and not a.stuck
                ]
                if reporting:
                    agent = rng.choice(sorted(reporting, key=lambda a: a.instance_id))
                    if kind == "agent-crash":
                        agent.crashed = True
                        self.stats["agent_crashes"] += 1
                        self.trace(f"agent {agent.instance_id} crashed")
                    else:
                        length = rng.uniform(1.0, 2 * HEALTH_INTERVAL - 5.0)
                        agent.blip_until = self.clock.monotonic() + length
                        self.stats["blips"] += 1
                        self.trace(f"agent {agent.instance_id} blips for {length:.1f}s")
            elif kind == "lost-create":
                self.cloud.fail_next(
                    "create_instance", ProviderUnavailable("simulated: response lost"), after_effect=True
                )
                self.stats["lost_create_responses"] += 1
            elif kind == "throttle":
                self.cloud.set_throttle_probability(0.3)
                self.stats["throttle_windows"] += 1
                self.spawn(None, self._unthrottle_later(rng.uniform(5, 30)), "unthrottle")

    async def _restart_later(self, server: SimServer, delay: float, keep_db: bool) -> None:
        await asyncio.sleep(delay)
        if server.current is None or not server.current.gate.alive:
            server.start(keep_db=keep_db)

    async def _unthrottle_later(self, delay: float) -> None:
        await asyncio.sleep(delay)
        self.cloud.set_throttle_probability(0.0)

    def calm_down(self) -> None:
        """End of the fault phase: no more injected faults; every server is (re)started."""
        self.store_fault_rate = 0.0
        self.store_timeout_rate = 0.0
        self.armed = None
        self.cloud.set_throttle_probability(0.0)
        leader_faults.resume_all(self)
        self.disrupted_at = self.clock.monotonic()
        for server in self.servers:
            inc = server.current
            if inc is None or not inc.gate.alive:
                server.start(keep_db=True)
            else:
                inc.gate.partitioned_until = -math.inf
                inc.gate.provider_lost_until = -math.inf
        self.trace("calm: faults stopped")

    # -- the run -------------------------------------------------------------------------------

    async def run(self) -> None:
        self.base_store.put(f"shard/{SHARD}/config.jsonc", json.dumps(self.config_document()).encode())
        for server in self.servers:
            server.start(keep_db=False)
        sc = self.scenario
        fault_end = self.clock.monotonic() + sc.fault_phase
        self.spawn(None, self.agent_manager(), "agents")
        self.spawn(None, self.operator(fault_end), "operator")
        self.spawn(None, self.faults(fault_end), "faults")
        self.spawn(None, self.storage.run(fault_end), "storage-nemeses")
        self.spawn(None, self.floods.run(fault_end), "floods")
        await asyncio.sleep(sc.fault_phase)
        self.calm_down()
        await asyncio.sleep(sc.calm_phase)

    async def shutdown(self) -> None:
        leader_faults.resume_all(self)
        for server in self.servers:
            if server.current is not None and server.current.gate.alive:
                server.current.gate.alive = False
                for task in list(server.current.tasks):
                    task.cancel()
        for task in list(self._background):
            task.cancel()
        pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)


async def _upsert(inc: Incarnation, *, group: str, update: GroupUpdate) -> None:
    await inc.api().upsert_group(TENANT, group, update)


async def _acknowledge(inc: Incarnation, *, instance_id: str) -> None:
    await inc.api().acknowledge_drained(TENANT, instance_id)


async def _awaited(awaitable: Awaitable[T]) -> T:
    return await awaitable


_ADDRS = ("health_addr", "election_addr", "registration_addr", "operator_addr", "agent_addr")


def _owner_of(context: contextvars.Context) -> Incarnation | None:
    """The server incarnation a callback runs for (what ``VirtualTimeLoop.pause`` holds back)."""
    return None if context.get(_STREAMING) else context.get(_CURRENT)


def _task_factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
    if _STREAMING.get():  # a task the server starts while serving a stream is the server's, pausable
        context = kwargs.get("context") or contextvars.copy_context()
        context.run(_STREAMING.set, False)
        kwargs["context"] = context
    task: asyncio.Task[Any] = asyncio.Task(coro, loop=loop, **kwargs)
    inc = _CURRENT.get()
    if inc is not None:
        inc.tasks.add(task)
        task.add_done_callback(inc.tasks.discard)
    return task


@contextlib.contextmanager
def deterministic(seed: int, clock: ManualClock) -> Iterator[None]:
    """Seed every random source the server code draws from, and install the fault hook."""
    rngs = random.Random(f"{seed}:backoff")
    ids = random.Random(f"{seed}:ids")
    saved_ids = ids_module._default_generator
    saved_workers = records_module.LIST_WORKERS
    saved_state = random.getstate()
    random.seed(f"{seed}:global")
    backoff_module.set_default_rng_source(lambda: random.Random(rngs.getrandbits(64)))
    ids_module._default_generator = ids_module.PuidGenerator(
        now_ms=lambda: int(clock.now().timestamp() * 1000), randbytes=ids.randbytes
    )
    records_module.LIST_WORKERS = 1
    saved_metrics = shard_module.METRICS_INTERVAL
    shard_module.METRICS_INTERVAL = 60.0  # gauges nobody reads here; every 5 s costs a tenth of a run
    try:
        yield
    finally:
        backoff_module.set_default_rng_source(None)
        ids_module._default_generator = saved_ids
        records_module.LIST_WORKERS = saved_workers
        shard_module.METRICS_INTERVAL = saved_metrics
        random.setstate(saved_state)


_TEMPLATE: dict[str, Path] = {}


def template_database(tmp_root: Path) -> Path:
    """A migrated empty SQLite file, made once per process and copied for every simulated server."""
    path = _TEMPLATE.get("db")
    if path is None or not path.exists():
        path = tmp_root / "template.db"
        open_database(path).close()
        _TEMPLATE["db"] = path
    return path


def scratch_root() -> Path:
    """Where simulations keep SQLite files (tmpfs when the machine has one)."""
    shm = Path("/dev/shm")
    base = shm if shm.is_dir() else Path(tempfile.gettempdir())
    root = Path(tempfile.mkdtemp(prefix="nstance-sim-", dir=base))
    return root
