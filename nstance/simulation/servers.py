"""The simulated server processes: each server id, its incarnations, their gates and their tasks.

A ``SimServer`` is one server id on its own host (its ``SkewedClock`` outlives its processes). Each
start is a new ``Incarnation``: the real ``Elector`` and the shard from ``build_shard`` (``Shard``,
``Registrar``, ``AgentHub`` ...) over its own SQLite file (``SimDatabase``), its own ``SimStore`` and
its own ``SimCloud``, all behind the incarnation's ``Gate``. A restarted server keeps or loses its
SQLite file as its caller says (copied from a migrated ``template_database`` when lost).

Crashing an incarnation closes its gate (any I/O it still attempts raises ``SimCrash``, so no
``finally`` block can act after death) and cancels every task it started. Which incarnation a task
belongs to is carried by a context variable (``CURRENT``): ``task_factory`` files each new task under
it, and ``owner_of`` tells the ``VirtualTimeLoop`` what to hold back while a server is paused. An armed
fault point (``crash_at_fault_point``, the server's ``faults`` callback) crashes the incarnation that
reaches it.

This module runs the server code and ends it; it must not choose when a server crashes, pauses or
restarts (``faults`` and ``leader_faults`` do), nor check what the server does (``World.check_acting``
and ``invariants`` do).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import math
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nstance.core.errors import NstanceError
from nstance.db.engine import Database, open_database
from nstance.objectstore.scoped import ScopedObjectStore
from nstance.server.identity.registration import Registrar
from nstance.server.leadership.election import Elector, ElectorLeadership
from nstance.server.shard.build import build_shard
from nstance.server.shard.shard import Shard
from nstance.server.state.configstate import ConfigState
from nstance.server.state.limits import CreateLimiter
from nstance.simulation import leader_faults
from nstance.simulation.cloud import SimCloud
from nstance.simulation.scenario import SHARD
from nstance.simulation.store import SimStore

if TYPE_CHECKING:
    from nstance.simulation.world import World

#: Set while an agent's health stream runs: its end is not held back when the server it talks to is paused.
STREAMING: contextvars.ContextVar[bool] = contextvars.ContextVar("sim_streaming", default=False)
#: The incarnation the running code belongs to (``None``: the world's own tasks and clients).
CURRENT: contextvars.ContextVar[Incarnation | None] = contextvars.ContextVar("sim_server", default=None)


class SimCrash(BaseException):
    """The simulated server process is dead: raised out of its I/O so nothing more happens."""


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
            faults=lambda name: crash_at_fault_point(world, name),
            metrics_interval=60.0,  # gauges nobody reads here; every 5 s costs a tenth of a run
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


def crash_at_fault_point(world: World, name: str) -> None:
    """Crash the server that reached an armed fault point (installed as the server's fault hook)."""
    inc = CURRENT.get()
    if world.armed != name or inc is None or not inc.gate.alive:
        return
    world.armed = None
    world.stats["fault_point_crashes"] += 1
    server = next(s for s in world.servers if s.current is inc)
    server.crash(f"fault point {name}")
    raise SimCrash(inc.name)


def owner_of(context: contextvars.Context) -> Incarnation | None:
    """The server incarnation a callback runs for (what ``VirtualTimeLoop.pause`` holds back)."""
    return None if context.get(STREAMING) else context.get(CURRENT)


def task_factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
    """Make a task and file it under the incarnation that started it (a crash cancels it)."""
    if STREAMING.get():  # a task the server starts while serving a stream is the server's, pausable
        context = kwargs.get("context") or contextvars.copy_context()
        context.run(STREAMING.set, False)
        kwargs["context"] = context
    task: asyncio.Task[Any] = asyncio.Task(coro, loop=loop, **kwargs)
    inc = CURRENT.get()
    if inc is not None:
        inc.tasks.add(task)
        task.add_done_callback(inc.tasks.discard)
        task.add_done_callback(functools.partial(_seen_if_dead, inc))
    return task


def _seen_if_dead(inc: Incarnation, task: asyncio.Task[Any]) -> None:
    """A task of a crashed server ends with the crash (``SimCrash``, raised where it stood): mark its
    exception seen. The world already knows the process died, and nothing of it is left to await the
    task, so asyncio would report it as never retrieved. A live server's tasks are left alone."""
    if not inc.gate.alive and not task.cancelled():
        task.exception()


_TEMPLATE: dict[str, Path] = {}


def template_database(tmp_root: Path) -> Path:
    """A migrated empty SQLite file, made once per process and copied for every simulated server."""
    path = _TEMPLATE.get("db")
    if path is None or not path.exists():
        path = tmp_root / "template.db"
        open_database(path).close()
        _TEMPLATE["db"] = path
    return path
