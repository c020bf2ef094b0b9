"""The operator's config edits: dynamic groups made, resized and deleted; static groups' instance types.

A Cluster API operator does more than scale: MachinePools are created and deleted, and their instance
type changes. On half of the seeds of the default fault mix (drawn from the seed's own stream, so the
other parts of a seed are unchanged), and on every seed a test asks for it, the operator's stand-in
makes one such edit through the leader's Operator API every 30-120 s of the fault phase:

* **make or resize a dynamic group** (``d1`` or ``d2``; size 1-3 when made, 0-3 after) with
  ``UpsertGroup``, naming one of the two templates each time: a switch rotates the group's VMs;
* **delete a dynamic group** it made: ``DeleteGroup``;
* **change a static group's instance type** (``m7i.large`` or ``m7i.xlarge``): ``UpsertGroup``. Every
  VM of the group then runs an outdated config and is rotated, one at a time.

Sizes and deletions are recorded with the operator's resizes (``World.upserts``), so the end-state
check of lost updates covers dynamic groups too; instance types are recorded here. The promises:

* no instance type change is lost: a static group runs the instance type of the last acknowledged
  change, or of a later one whose outcome the client could not know (``check``);
* and, in ``invariants`` (they hold on every seed): a deleted group leaves no VM, and every VM runs
  its group's instance type (drift converges).

The calm phase is longer on these seeds (``settle_extra``): rotations run one at a time per group.
This module calls only the leader's Operator API, as the operator would; it reads no server state.
"""

from __future__ import annotations

import asyncio
import functools
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from nstance.config import GroupUpdate
from nstance.core.errors import NstanceError
from nstance.simulation.operator_standin import UpsertAttempt, call_upsert
from nstance.simulation.scenario import DEFAULT_DRAIN_TIMEOUT_S, INSTANCE_TYPE, TEMPLATES, TENANT

if TYPE_CHECKING:
    from nstance.simulation.servers import Incarnation
    from nstance.simulation.world import World

#: The dynamic groups the stand-in makes and deletes.
DYNAMIC_GROUPS = ("d1", "d2")
#: The largest size it gives a dynamic group (the resizes of static groups go up to 4).
MAX_DYNAMIC_SIZE = 3
#: The instance types it switches static groups between (both amd64, as the template).
INSTANCE_TYPES = (INSTANCE_TYPE, "m7i.xlarge")
#: The largest group any operator edit makes: rotations of that many members follow one another.
LARGEST_GROUP = 4


@dataclass
class TypeChange:
    """One ``UpsertGroup`` that set a static group's instance type, and whether it was acknowledged."""

    group: str
    instance_type: str
    at: float
    acknowledged: bool


class GroupEdits:
    """One seed's config edits by the operator and the promise about instance types (module docstring)."""

    def __init__(self, world: World, *, drawn: bool = True, forced: bool | None = None) -> None:
        self.world = world
        self.rng = random.Random(f"{world.seed}:group-edits")
        drawn_on = self.rng.random() < 1 / 2
        self.enabled = forced if forced is not None else drawn and drawn_on
        self.type_changes: list[TypeChange] = []
        #: When (``World.now``) an edit that may rotate VMs was made (an instance type, a template).
        self.drift_edits: list[float] = []
        #: Dynamic groups whose last acknowledged edit made or resized them (what the operator believes).
        self._made: set[str] = set()

    def settle_extra(self) -> float:
        """Seconds the calm phase needs beyond the scenario's: the rotations of the largest group after
        an instance type change (a replacement booted and registered, then the old VM drained, one at
        a time) and the drain of a deleted dynamic group's VMs."""
        if not self.enabled:
            return 0.0
        scenario = self.world.scenario
        drain = max(scenario.longest_drain(), DEFAULT_DRAIN_TIMEOUT_S)
        return LARGEST_GROUP * (scenario.boot_time + drain + 30.0) + DEFAULT_DRAIN_TIMEOUT_S

    async def run(self, until: float) -> None:
        """One edit every 30-120 s of virtual time until ``until`` (monotonic seconds), when enabled."""
        world = self.world
        while self.enabled:
            await asyncio.sleep(self.rng.uniform(30.0, 120.0))
            if world.clock.monotonic() >= until:
                return
            if self.rng.random() < 0.6:
                group = self.rng.choice(DYNAMIC_GROUPS)
                if group in self._made and self.rng.random() < 0.4:
                    await self._delete_dynamic(group)
                else:  # a new group gets at least one VM, so that deleting it later has VMs to remove
                    low = 0 if group in self._made else 1
                    await self._upsert_dynamic(group, self.rng.randint(low, MAX_DYNAMIC_SIZE))
            else:
                static = sorted(world.scenario.groups)
                await self._change_type(self.rng.choice(static), self.rng.choice(INSTANCE_TYPES))

    async def _upsert_dynamic(self, group: str, size: int) -> None:
        # The template is sent every time, so that the call makes the group again after a delete; when
        # it names the other template, every VM of the group has drifted.
        template = self.rng.choice(TEMPLATES)
        update = GroupUpdate(template=template, size=size)
        self.drift_edits.append(self.world.now())
        acknowledged = await self._call(
            functools.partial(call_upsert, group=group, update=update),
            f"{group} (dynamic) size {size} template {template}",
        )
        self.world.upserts.append(UpsertAttempt(group, size, self.world.now(), acknowledged))
        self.world.stats["group_edits"] += 1
        if acknowledged:
            self._made.add(group)

    async def _delete_dynamic(self, group: str) -> None:
        acknowledged = await self._call(functools.partial(_delete, group=group), f"{group} (dynamic) deleted")
        self.world.upserts.append(UpsertAttempt(group, None, self.world.now(), acknowledged))
        self.world.stats["group_edits"] += 1
        if acknowledged:
            self._made.discard(group)

    async def _change_type(self, group: str, instance_type: str) -> None:
        update = GroupUpdate(instance_type=instance_type)
        self.drift_edits.append(self.world.now())
        acknowledged = await self._call(
            functools.partial(call_upsert, group=group, update=update),
            f"{group} instance type {instance_type}",
        )
        self.type_changes.append(TypeChange(group, instance_type, self.world.now(), acknowledged))
        self.world.stats["group_edits"] += 1

    async def _call(self, call: Callable[[Incarnation], Awaitable[None]], what: str) -> bool:
        try:
            await self.world.call_leader(call)
        except NstanceError as exc:
            self.world.trace(f"operator: {what} failed: {exc}")
            return False
        self.world.trace(f"operator: {what}")
        return True

    def check(self, types: dict[str, str]) -> list[str]:
        """Static groups whose stored instance type no change explains (``types``: group -> type now)."""
        problems: list[str] = []
        for group in sorted(self.world.scenario.groups):
            changes = [c for c in self.type_changes if c.group == group]
            acked = [i for i, c in enumerate(changes) if c.acknowledged]
            if acked:
                last = acked[-1]
                allowed = {changes[last].instance_type} | {c.instance_type for c in changes[last + 1 :]}
            else:
                allowed = {INSTANCE_TYPE} | {c.instance_type for c in changes}
            if types.get(group) not in allowed:
                problems.append(
                    f"lost update: group {group} has instance type {types.get(group)}, expected one of "
                    f"{sorted(allowed)} after {len(changes)} instance type changes"
                )
        return problems


async def _delete(inc: Incarnation, *, group: str) -> None:
    await inc.api().delete_group(TENANT, group)
