"""On-demand instances the operator asks for and removes (a pod's own VM), under the run's faults.

On half of the seeds of the default fault mix (drawn from the seed's own stream, so the other parts of
a seed are unchanged), and on every seed a test asks for it, the operator's stand-in calls the
leader's Operator API every 40-150 s of the fault phase, as the real operator does for pods annotated
for a VM of their own:

* **CreateInstance** in a static group with an instance id of its own choosing, retried with the same
  id (up to three more times, 5-20 s apart) when the call fails, as the operator retries a pod's VM;
* **DeleteInstance** of one it asked for (the pod went away).

The promises (``check``), beside the usual end-state invariants (on-demand VMs count toward no
group's size, and a dead agent's on-demand VM is the operator's to remove, not the shard's to
replace):

* a retried CreateInstance never makes a second VM (the duplicate check) and an instance id is never
  used by two groups;
* an on-demand instance whose create was acknowledged, that no DeleteInstance named, and whose agent
  registered and still lives, still runs at the end: nothing but the operator removes it (a VM whose
  agent never registered is the registration timeout's; so is one whose agent died, once its record
  was lost and the VM adopted: nothing then says it ever registered);
* an instance an acknowledged DeleteInstance named runs no VM at the end, unless the storage nemesis
  deleted the instance records after it: the record that said ``deleting`` is lost, and a VM whose
  record is lost is adopted, never deleted.

This module calls only the leader's Operator API, as the operator would; it reads no server state.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from nstance.core.errors import NstanceError
from nstance.core.ids import PuidGenerator
from nstance.providers.base import ProviderInstance
from nstance.server.shard.api import InstanceRequest
from nstance.simulation.scenario import TENANT

if TYPE_CHECKING:
    from nstance.simulation.world import World

#: Attempts of one CreateInstance (the first and its retries with the same instance id).
CREATE_ATTEMPTS = 4


@dataclass
class OnDemandAsk:
    """One on-demand instance the operator asked for, and what became of its calls."""

    instance_id: str
    group: str
    created: bool = False  # a CreateInstance for it was acknowledged
    delete_asked: bool = False  # a DeleteInstance named it (whatever its outcome)
    deleted: bool = False  # a DeleteInstance for it was acknowledged
    deleted_at: float | None = None  # when (``World.now``)


class OnDemandRequests:
    """One seed's on-demand instances and the promises about them (see the module docstring)."""

    def __init__(self, world: World, *, drawn: bool = True, forced: bool | None = None) -> None:
        self.world = world
        self.rng = random.Random(f"{world.seed}:on-demand")
        drawn_on = self.rng.random() < 1 / 2
        self.enabled = forced if forced is not None else drawn and drawn_on
        self.ids = PuidGenerator(
            now_ms=lambda: int(world.clock.now().timestamp() * 1000), randbytes=self.rng.randbytes
        )
        self.asks: dict[str, OnDemandAsk] = {}

    async def run(self, until: float) -> None:
        """One call every 40-150 s of virtual time until ``until`` (monotonic seconds), when enabled."""
        world = self.world
        while self.enabled:
            await asyncio.sleep(self.rng.uniform(40.0, 150.0))
            if world.clock.monotonic() >= until:
                return
            live = sorted(iid for iid, ask in self.asks.items() if not ask.deleted)
            if live and self.rng.random() < 0.4:
                await self._delete(self.asks[self.rng.choice(live)])
            else:
                group = self.rng.choice(sorted(world.scenario.groups))
                ask = OnDemandAsk(str(self.ids.new("app")), group)
                self.asks[ask.instance_id] = ask
                await self._create(ask)

    async def _create(self, ask: OnDemandAsk) -> None:
        world = self.world
        request = InstanceRequest(group=ask.group, instance_id=ask.instance_id)
        for attempt in range(CREATE_ATTEMPTS):
            if attempt:
                await asyncio.sleep(self.rng.uniform(5.0, 20.0))
            world.stats["on_demand_calls"] += 1
            try:
                await world.call_leader(lambda inc: inc.api().create_instance(TENANT, request))
            except NstanceError as exc:
                world.trace(f"operator: on-demand {ask.instance_id} in {ask.group} failed: {exc}")
                continue
            ask.created = True
            world.trace(f"operator: on-demand {ask.instance_id} in {ask.group}")
            return

    async def _delete(self, ask: OnDemandAsk) -> None:
        world = self.world
        ask.delete_asked = True
        world.stats["on_demand_calls"] += 1
        try:
            status = await world.call_leader(lambda inc: inc.api().delete_instance(TENANT, ask.instance_id))
        except NstanceError as exc:
            world.trace(f"operator: delete of on-demand {ask.instance_id} failed: {exc}")
            return
        ask.deleted = True
        ask.deleted_at = world.now()
        world.trace(f"operator: delete of on-demand {ask.instance_id}: {status}")

    def check(self, live: Iterable[ProviderInstance]) -> list[str]:
        """On-demand instances lost or kept against the operator's calls (``live``: the VMs running)."""
        running = {vm.instance_id: vm for vm in live}
        problems: list[str] = []
        for iid, ask in sorted(self.asks.items()):
            vm = running.get(iid)
            if vm is not None and vm.group != ask.group:
                problems.append(f"on-demand {iid} was asked for in {ask.group} but runs in {vm.group}")
            lost = any(
                ask.deleted_at is not None and t >= ask.deleted_at for t in self.world.storage.records_lost
            )
            if ask.deleted and vm is not None and not lost:
                problems.append(f"on-demand {iid} still runs after an acknowledged DeleteInstance")
            agent = self.world.agents.get(iid)
            working = agent is not None and agent.registered and not agent.crashed and not agent.stuck
            if ask.created and not ask.delete_asked and working and vm is None:
                problems.append(
                    f"on-demand {iid} ({ask.group}) is gone, but the operator never deleted it and its "
                    "agent registered and still lives"
                )
        return problems

    def ids_asked(self) -> frozenset[str]:
        """Every instance id the operator asked for (on-demand VMs are the operator's, not the group's)."""
        return frozenset(self.asks)
