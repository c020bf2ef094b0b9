"""One simulated shard, driven by a seed: the ``World`` owns the clock, the random streams, the
trace and the tasks, and composes the simulated parts.

A ``World`` builds everything from its seed and runs it on a ``VirtualTimeLoop``. The parts, one
module each:

* ``scenario`` - what the seed runs (sizes, timings, fault rates) and the shard's configuration;
* ``servers`` - 2 or 3 servers running the real ``Shard``, ``Elector``, ``Registrar`` and ``AgentHub``
  code, each incarnation behind a gate that a crash closes;
* ``store`` - object storage: one ``MemoryObjectStore`` shared by all, seen by each server through a
  ``SimStore`` with injected 503s, 409s, timeouts and partitions;
* ``cloud`` - one ``SimProvider`` shared by all, seen by each server through a fenced ``SimCloud``;
* ``agents`` - an agent per booted VM: registration with the create request's nonce, health streams;
* ``operator_standin`` - group size changes through ``UpsertGroup`` and drain acknowledgements;
* ``group_edits`` - the operator's other edits: dynamic groups made and deleted, instance types changed;
* ``on_demand`` - on-demand instances the operator asks for and deletes;
* ``faults`` - one fault at a time until the calm phase, then every fault off;
* ``leader_faults``, ``nemeses``, ``floods`` - process faults, storage damage, floods of hostile calls.

The world itself keeps what the parts share and what the checks read: the leader-only check made as
each write or provider call happens (``check_acting``: the server making it must be the only one whose
elector says it leads), the instance events, the trace and the stats. After the fault phase a calm
phase lets the shard converge, then ``invariants`` checks the end state. This module must not
simulate a part itself or inject faults; it is test tooling, and the server never imports it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import json
import math
import os
import random
import tempfile
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from nstance.config.cluster import LeaderElectionConfig
from nstance.core import backoff as backoff_module
from nstance.core import ids as ids_module
from nstance.core.clock import ManualClock
from nstance.objectstore.memory import MemoryObjectStore
from nstance.pki.ca import create_ca
from nstance.providers.base import ProviderUnavailable
from nstance.providers.sim import SimProvider
from nstance.server.state import records as records_module
from nstance.server.state.events import InstanceEventData
from nstance.server.state.provisioning import ShardIdentity
from nstance.simulation import faults, leader_faults
from nstance.simulation.agents import AgentState, manage_agents
from nstance.simulation.floods import FloodNemesis
from nstance.simulation.group_edits import GroupEdits
from nstance.simulation.nemeses import StorageNemeses
from nstance.simulation.on_demand import OnDemandRequests
from nstance.simulation.operator_standin import UpsertAttempt, run_operator
from nstance.simulation.scenario import CLUSTER, SHARD, Scenario
from nstance.simulation.servers import CURRENT, Incarnation, SimCrash, SimServer
from nstance.simulation.store import StoreFaults

T = TypeVar("T")


class World:
    """Everything one seed simulates (see the module docstring)."""

    def __init__(
        self,
        seed: int,
        tmp: Path,
        template_db: Path,
        *,
        fault_kinds: tuple[str, ...] | None = None,
        group_edits: bool | None = None,
        on_demand: bool | None = None,
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
        self.store_faults = StoreFaults()
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
                "group_edits",
                "on_demand_calls",
            ),
            0,
        )
        self.closers: list[Callable[[], None]] = []
        self._background: set[asyncio.Task[Any]] = set()
        self.start_mono = self.clock.monotonic()
        self.storage = StorageNemeses(self, SHARD, drawn=fault_kinds is None)
        self.floods = FloodNemesis(self, drawn=fault_kinds is None)
        #: The operator's edits beyond resizes (None: drawn from the seed when the fault mix is the default).
        self.group_edits = GroupEdits(self, drawn=fault_kinds is None, forced=group_edits)
        #: The operator's on-demand instances (None: drawn from the seed, as the edits are).
        self.on_demand = OnDemandRequests(self, drawn=fault_kinds is None, forced=on_demand)
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
        token = CURRENT.set(inc)
        try:
            # A coroutine becomes the task itself: a task cancelled before its first step (a crash
            # right after the spawn) then closes it, where a wrapper would leave it never awaited.
            runs = coro if inspect.iscoroutine(coro) else _awaited(coro)
            task: asyncio.Task[Any] = asyncio.get_running_loop().create_task(runs, name=name)
        finally:
            CURRENT.reset(token)
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

    def instance_event_sink(
        self, publish: Callable[[InstanceEventData], None]
    ) -> Callable[[InstanceEventData], None]:
        def sink(event: InstanceEventData) -> None:
            self.events.append((self.now(), event.instance_id, event.status, event.reason))
            publish(event)

        return sink

    async def call_leader(self, fn: Callable[[Incarnation], Awaitable[T]]) -> T:
        """Call ``fn`` on the leader as its client would; any failure (crash included) is an NstanceError."""
        inc = self.leader()
        if inc is None:
            raise ProviderUnavailable("no leader")
        token = CURRENT.set(inc)  # what the server starts while serving the call belongs to it
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
            CURRENT.reset(token)

    # -- the run -------------------------------------------------------------------------------

    async def run(self) -> None:
        config = self.scenario.config_document()
        self.base_store.put(f"shard/{SHARD}/config.jsonc", json.dumps(config).encode())
        for server in self.servers:
            server.start(keep_db=False)
        sc = self.scenario
        fault_end = self.clock.monotonic() + sc.fault_phase
        self.spawn(None, manage_agents(self), "agents")
        self.spawn(None, run_operator(self, fault_end), "operator")
        self.spawn(None, faults.inject_faults(self, fault_end), "faults")
        self.spawn(None, self.storage.run(fault_end), "storage-nemeses")
        self.spawn(None, self.floods.run(fault_end), "floods")
        self.spawn(None, self.group_edits.run(fault_end), "group-edits")
        self.spawn(None, self.on_demand.run(fault_end), "on-demand")
        await asyncio.sleep(sc.fault_phase)
        faults.calm_down(self)
        await asyncio.sleep(sc.calm_phase + self.group_edits.settle_extra())

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


async def _awaited(awaitable: Awaitable[T]) -> T:
    return await awaitable


@contextlib.contextmanager
def deterministic(seed: int, clock: ManualClock) -> Iterator[None]:
    """Seed every random source the server code draws from (and restore them afterwards)."""
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
    try:
        yield
    finally:
        backoff_module.set_default_rng_source(None)
        ids_module._default_generator = saved_ids
        records_module.LIST_WORKERS = saved_workers
        random.setstate(saved_state)


SCRATCH_ENV = "NSTANCE_SIM_SCRATCH"
"""Names the directory under which simulations keep their files (default: /dev/shm, else the temp dir)."""


def scratch_root() -> Path:
    """A new directory for a simulation's SQLite files (tmpfs when the machine has one)."""
    shm = Path("/dev/shm")
    chosen = os.environ.get(SCRATCH_ENV)
    base = Path(chosen) if chosen else shm if shm.is_dir() else Path(tempfile.gettempdir())
    return Path(tempfile.mkdtemp(prefix="nstance-sim-", dir=base))
