"""The fault schedule: one fault at a time, drawn from the seed, until the calm phase.

``inject_faults`` waits an exponentially distributed gap (``Scenario.fault_mean_gap``), draws a kind
from ``Scenario.fault_kinds`` and applies it to the part it concerns:

* **crash** - a random server is killed and restarted 2-40 s later, keeping its SQLite file 70 % of
  the time;
* **fault-point** - one of ``FAULT_POINTS`` is armed: the next server to reach it crashes there
  (``servers.crash_at_fault_point``);
* **partition** - a live server cannot reach object storage for 5-45 s (it loses leadership);
* **agent-crash** / **blip** - a reporting agent dies for good (its VM keeps running: it must be
  replaced), or its stream breaks for less than the missed-report window (nothing may be replaced);
* **lost-create** / **throttle** - the cloud loses the response of the next create after launching
  the VM, or throttles 30 % of calls for 5-30 s;
* **pause**, **provider-loss**, **wall-step** - process faults (``leader_faults``); **flood** - a burst
  of hostile calls (``floods``).

It also turns storage faults on for the fault phase (``StoreFaults``) and, in ``calm_down``, turns
every fault off and restarts whatever is down. It draws from its own stream (``{seed}:faults``) and
must not check anything: what must hold is ``World.check_acting``'s and ``invariants``' job.
"""

from __future__ import annotations

import asyncio
import math
import random
from typing import TYPE_CHECKING

from nstance.providers.base import ProviderUnavailable
from nstance.simulation import leader_faults
from nstance.simulation.scenario import HEALTH_INTERVAL

if TYPE_CHECKING:
    from nstance.simulation.servers import SimServer
    from nstance.simulation.world import World

#: Fault points the server code has (``fault_point(...)`` calls).
FAULT_POINTS = (
    "before-provider-create",
    "after-provider-create",
    "after-provider-delete",
    "after-registration-claim",
    "after-groups-write",
)
#: Longest agent outage of one blip (seconds). With up to one report interval since the agent's last report
#: before it, the gap between two reports stays under the missed-report window (3 intervals), so a blip
#: must never cause a replacement.
BLIP_MAX = 2 * HEALTH_INTERVAL - 5.0
#: Fault kinds that leave the servers (and so leadership) alone.
HARMLESS_TO_SERVERS = frozenset({"agent-crash", "blip", "lost-create", "throttle", "flood"})


async def inject_faults(world: World, until: float) -> None:
    """Inject one fault at a time, at random, until ``until`` (virtual monotonic seconds)."""
    rng = random.Random(f"{world.seed}:faults")
    sc = world.scenario
    world.store_faults.fault_rate = sc.store_fault_rate
    world.store_faults.timeout_rate = sc.store_timeout_rate
    while True:
        await asyncio.sleep(rng.expovariate(1.0 / sc.fault_mean_gap))
        if world.clock.monotonic() >= until:
            return
        kind = rng.choice(sc.fault_kinds)
        if kind not in HARMLESS_TO_SERVERS:
            world.disrupted_at = world.clock.monotonic()
        if kind == "flood":
            world.floods.strike()
        elif kind == "pause":
            leader_faults.inject_pause(world, rng)
        elif kind == "provider-loss":
            leader_faults.inject_provider_loss(world, rng)
        elif kind == "wall-step":
            leader_faults.inject_wall_step(world, rng)
        elif kind == "crash":
            server = rng.choice(world.servers)
            server.crash("killed at a random moment")
            world.spawn(None, _restart_later(server, rng.uniform(2, 40), rng.random() < 0.7), "restart")
        elif kind == "fault-point":
            world.armed = rng.choice(FAULT_POINTS)
            world.trace(f"armed fault point {world.armed}")
        elif kind == "partition":
            live = [s.current for s in world.servers if s.current is not None and s.current.gate.alive]
            if live:
                inc = rng.choice(live)
                length = rng.uniform(5, 45)
                inc.gate.partitioned_until = world.clock.monotonic() + length
                world.stats["partitions"] += 1
                world.trace(f"partition {inc.name} from object storage for {length:.1f}s")
        elif kind in ("agent-crash", "blip"):
            agent_fault(world, rng, kind)
        elif kind == "lost-create":
            world.cloud.fail_next(
                "create_instance", ProviderUnavailable("simulated: response lost"), after_effect=True
            )
            world.stats["lost_create_responses"] += 1
        elif kind == "throttle":
            world.cloud.set_throttle_probability(0.3)
            world.stats["throttle_windows"] += 1
            world.spawn(None, _unthrottle_later(world, rng.uniform(5, 30)), "unthrottle")


def agent_fault(world: World, rng: random.Random, kind: str) -> None:
    """An ``agent-crash`` (for good) or a ``blip`` (an outage of up to ``BLIP_MAX``) of a reporting agent."""
    reporting = [a for a in world.agents.values() if a.registered and not a.crashed and not a.stuck]
    if not reporting:
        return
    agent = rng.choice(sorted(reporting, key=lambda a: a.instance_id))
    if kind == "agent-crash":
        agent.crashed = True
        world.stats["agent_crashes"] += 1
        world.trace(f"agent {agent.instance_id} crashed")
        return
    length = rng.uniform(1.0, BLIP_MAX)
    now = world.clock.monotonic()
    if agent.blip_until > now:
        # Another blip would extend this one: two overlapping blips once kept an agent away for 22.7 s,
        # 32 s between two of its reports, past the missed-report window (seed 948000217). One blip at
        # a time keeps the promise's premise.
        world.trace(f"agent {agent.instance_id} is still in a blip: no second one")
        return
    agent.blip_until = now + length
    world.stats["blips"] += 1
    world.trace(f"agent {agent.instance_id} blips for {length:.1f}s")


async def _restart_later(server: SimServer, delay: float, keep_db: bool) -> None:
    await asyncio.sleep(delay)
    if server.current is None or not server.current.gate.alive:
        server.start(keep_db=keep_db)


async def _unthrottle_later(world: World, delay: float) -> None:
    await asyncio.sleep(delay)
    world.cloud.set_throttle_probability(0.0)


def calm_down(world: World) -> None:
    """End of the fault phase: no more injected faults; every server is (re)started."""
    world.store_faults.fault_rate = 0.0
    world.store_faults.timeout_rate = 0.0
    world.armed = None
    world.cloud.set_throttle_probability(0.0)
    leader_faults.resume_all(world)
    world.disrupted_at = world.clock.monotonic()
    for server in world.servers:
        inc = server.current
        if inc is None or not inc.gate.alive:
            server.start(keep_db=True)
        else:
            inc.gate.partitioned_until = -math.inf
            inc.gate.provider_lost_until = -math.inf
    world.trace("calm: faults stopped")
