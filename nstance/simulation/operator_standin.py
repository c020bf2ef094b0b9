"""The operator's stand-in: group size changes through ``UpsertGroup`` and drain acknowledgements.

During the fault phase it sets a random group to a random size (0-4) every 20-120 s and records each
attempt and whether the client saw it acknowledged (``UpsertAttempt``: the invariants check that no
acknowledged update was lost). Throughout the run it lists the leader's draining instances every
15 s and acknowledges some of them, as a node drain would: some acknowledgements come late (after the
drain timeout, maybe to another leader, maybe for an instance deleted by then) and some come twice,
as from an operator that retried.

It draws from its own stream (``{seed}:operator``) and, like the real operator, only calls the
leader's Operator API (``World.call_leader``); it must not read or change a server's state directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

from nstance.config import GroupUpdate
from nstance.core.errors import NstanceError
from nstance.simulation.scenario import TENANT

if TYPE_CHECKING:
    from nstance.simulation.servers import Incarnation
    from nstance.simulation.world import World


@dataclass
class UpsertAttempt:
    """One call that set a group's size (``None``: a ``DeleteGroup``), and whether it was acknowledged."""

    group: str
    size: int | None
    at: float
    acknowledged: bool


async def run_operator(world: World, until: float) -> None:
    """Change group sizes until ``until``; acknowledge drains throughout (see the module docstring)."""
    rng = random.Random(f"{world.seed}:operator")
    next_upsert = world.clock.monotonic() + rng.uniform(20, 90)
    acked: set[str] = set()
    while True:
        now = world.clock.monotonic()
        if now >= next_upsert and now < until:
            group = rng.choice(sorted(world.scenario.groups))
            size = rng.randint(0, 4)
            world.stats["upserts"] += 1
            try:
                update = GroupUpdate(size=size)
                await world.call_leader(functools.partial(call_upsert, group=group, update=update))
                world.upserts.append(UpsertAttempt(group, size, world.now(), True))
                world.trace(f"operator: {group} size {size}")
            except NstanceError as exc:
                world.upserts.append(UpsertAttempt(group, size, world.now(), False))
                world.trace(f"operator: {group} size {size} failed: {exc}")
            next_upsert = now + rng.uniform(20, 120)
        with contextlib.suppress(NstanceError):
            draining = await world.call_leader(
                lambda inc: asyncio.to_thread(inc.api().draining_instances, TENANT)
            )
            for view, _reason, _delete_at in draining:
                iid = view.instance_id
                if iid in acked or rng.random() < 0.5:
                    continue
                acked.add(iid)
                if rng.random() < 0.2:
                    world.stats["late_acks"] += 1
                    world.spawn(None, _ack_later(world, iid, rng.uniform(20.0, 120.0)), "late-ack")
                    continue
                with contextlib.suppress(NstanceError):
                    await world.call_leader(functools.partial(_acknowledge, instance_id=iid))
                    world.stats["acks"] += 1
                if rng.random() < 0.25:
                    world.stats["duplicate_acks"] += 1
                    world.spawn(None, _ack_later(world, iid, rng.uniform(0.0, 60.0)), "duplicate-ack")
        await asyncio.sleep(15.0)


async def _ack_later(world: World, instance_id: str, delay: float) -> None:
    await asyncio.sleep(delay)
    with contextlib.suppress(NstanceError):
        await world.call_leader(functools.partial(_acknowledge, instance_id=instance_id))
        world.trace(f"operator: acknowledged the drain of {instance_id} after {delay:.1f}s")


async def call_upsert(inc: Incarnation, *, group: str, update: GroupUpdate) -> None:
    """``UpsertGroup`` on ``inc``, as the operator calls it."""
    await inc.api().upsert_group(TENANT, group, update)


async def _acknowledge(inc: Incarnation, *, instance_id: str) -> None:
    await inc.api().acknowledge_drained(TENANT, instance_id)
