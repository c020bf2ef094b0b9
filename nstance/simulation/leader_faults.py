"""Faults aimed at one server's process rather than at storage: pauses, provider loss, clock steps.

* **pause** - the process is stopped (SIGSTOP, a VM frozen by its hypervisor, a long GC pause) for
  20-60 s, longer than a takeover takes, and then continues: its timers and tasks resume where they
  were, its monotonic clock has jumped, and another server leads by then. Whatever it still tries to
  write or ask the cloud for must be refused by its own fencing (``VirtualTimeLoop.pause``).
* **provider loss** - the server cannot reach the cloud's API for 5-60 s but still reaches object
  storage, so it keeps leading: creates, deletes and listings fail and must be retried, and nothing
  may be decided from a listing that did not happen.
* **wall-clock step** - the server's wall clock jumps by 30 minutes or 2 hours, forwards or back (an
  NTP step, a VM restored from a snapshot). Its monotonic clock does not move, and nothing the leader
  decides by elapsed time (silence, drain timeouts, GC) may change because of it.

Each ``inject_*`` function draws from the fault stream's ``rng`` and records what it did in the
world's trace and stats. ``SkewedClock`` is the per-server clock that a wall-clock step moves.
"""

from __future__ import annotations

import asyncio
import random
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from nstance.core.clock import Clock
from nstance.simulation.loop import VirtualTimeLoop

if TYPE_CHECKING:
    from nstance.simulation.servers import Incarnation
    from nstance.simulation.world import World

#: Seconds after which an agent's stream to a stopped server breaks: gRPC keepalive pings every 20 s
#: and gives up after 10 s without an answer (``nstance.agent.channels``).
KEEPALIVE_WINDOW = 30.0

#: The wall-clock steps a ``wall-step`` fault draws from.
WALL_STEPS = (
    timedelta(minutes=30),
    timedelta(hours=2),
    timedelta(minutes=-30),
    timedelta(hours=-2),
)


class SkewedClock:
    """One server host's clock: the world's clock, with a wall-clock offset that steps may change."""

    def __init__(self, base: Clock) -> None:
        self._base = base
        self.offset = timedelta(0)

    def now(self) -> datetime:
        return self._base.now() + self.offset

    def monotonic(self) -> float:
        return self._base.monotonic()


def _target(world: World, rng: random.Random) -> Incarnation | None:
    """The leader most of the time (that is where these faults hurt), else any live server."""
    leader = world.leader()
    if leader is not None and rng.random() < 0.8:
        return leader
    live = world.incarnations()
    return rng.choice(live) if live else None


def inject_pause(world: World, rng: random.Random) -> None:
    """Stop a server's process for 20-60 s, then let it continue."""
    inc = _target(world, rng)
    if inc is None or inc in _loop().paused:
        return
    length = rng.uniform(20.0, 60.0)
    _loop().pause(inc)
    inc.gate.paused_since = world.clock.monotonic()
    world.stats["pauses"] += 1
    world.trace(f"pause {inc.name} for {length:.1f}s")
    world.spawn(None, _resume_later(world, inc, length), "resume")


async def _resume_later(world: World, inc: Incarnation, delay: float) -> None:
    await asyncio.sleep(delay)
    resume(world, inc)


def resume(world: World, inc: Incarnation) -> None:
    """Let a paused server's process continue (a no-op when it is not paused)."""
    loop = _loop()
    inc.gate.paused_since = None
    if inc in loop.paused:
        loop.resume(inc)
        world.trace(f"resume {inc.name}")


def resume_all(world: World) -> None:
    """Let every paused process continue (calm phase, crash, shutdown)."""
    for server in world.servers:
        if server.current is not None:
            resume(world, server.current)


async def reachable(world: World, inc: Incarnation) -> bool:
    """Whether an agent's stream to ``inc`` still works: at once unless ``inc`` is paused; then False
    once keepalive gives up (``KEEPALIVE_WINDOW`` after the pause began), True if it resumed before."""
    while inc.gate.paused_since is not None:
        left = inc.gate.paused_since + KEEPALIVE_WINDOW - world.clock.monotonic()
        if left <= 0:
            return False
        await asyncio.sleep(min(left, 1.0))
    return True


def inject_provider_loss(world: World, rng: random.Random) -> None:
    """Cut a server off from the cloud's API (not from storage) for 5-60 s."""
    inc = _target(world, rng)
    if inc is None:
        return
    length = rng.uniform(5.0, 60.0)
    inc.gate.provider_lost_until = world.clock.monotonic() + length
    world.stats["provider_losses"] += 1
    world.trace(f"{inc.name} loses the provider API for {length:.1f}s")


def inject_wall_step(world: World, rng: random.Random) -> None:
    """Step a server's wall clock (its monotonic clock does not move)."""
    inc = _target(world, rng)
    if inc is None:
        return
    server = next(s for s in world.servers if s.current is inc)
    step = rng.choice(WALL_STEPS)
    server.clock.offset += step
    world.stats["wall_steps"] += 1
    world.trace(f"{inc.name} wall clock steps {step} (offset now {server.clock.offset})")


def _loop() -> VirtualTimeLoop:
    loop = asyncio.get_running_loop()
    assert isinstance(loop, VirtualTimeLoop), "leader faults run on the simulation's loop"
    return loop
