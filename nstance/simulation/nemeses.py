"""Storage nemeses: damaged and lost state in object storage and in a server's SQLite cache.

On a third of the seeds of the default fault mix (drawn from the seed, so the other faults of a seed
are unchanged; never when a run names its fault kinds), during the fault phase, every so often one of:

* **corrupt-record** - an instance record's bytes are replaced by garbage, nothing, or a document
  with a field of the wrong type; a person restores it 5-90 s later (only if nobody rewrote it);
* **delete-records** - the whole ``instance/`` prefix is deleted and never restored: the leader must
  rebuild the records by adopting the VMs from their tags;
* **corrupt-cache** - the leading server's SQLite file gets junk over every page after the first: it
  must step down, move the file aside, rebuild from object storage and lead again.

The promise checked (``check``): a VM whose agent was registered and reporting when storage was
damaged is never deleted without a lifecycle decision (an instance event that says why: scale-down,
unhealthy, expiry...). An orphan deletion of such a VM, caused by unreadable or missing state, is a
violation. The usual end-state invariants (sizes, no leaks) show that the fleet converges.
"""

from __future__ import annotations

import asyncio
import random
import sqlite3
from typing import TYPE_CHECKING

from nstance.providers.base import InstanceStatus

if TYPE_CHECKING:
    from nstance.simulation.world import World

KINDS = ("corrupt-record", "corrupt-record", "delete-records", "corrupt-cache")
DAMAGE = (b"\x00\xffnot json", b"", b'{"instance_id": 42, "tenant": "default", "group": "g1"}')


class StorageNemeses:
    """One seed's storage damage and the instances that must survive it."""

    def __init__(self, world: World, shard: str, *, drawn: bool = True) -> None:
        self.world = world
        self.prefix = f"shard/{shard}/instance/"
        self.rng = random.Random(f"{world.seed}:storage")
        # Drawn per seed in the default fault mix; off when a run asks for particular fault kinds.
        self.enabled = drawn and self.rng.random() < 1 / 3
        #: instance id -> provider id of VMs that were healthy when storage was damaged.
        self.protected: dict[str, str] = {}
        #: key -> the last good bytes seen of a record this nemesis damaged.
        self.good: dict[str, bytes] = {}
        self.strikes = 0
        #: When (``World.now``) the ``instance/`` prefix was deleted: what a record said then is lost.
        self.records_lost: list[float] = []

    async def run(self, until: float) -> None:
        """Strike every 60-180 s of virtual time until ``until`` (monotonic seconds)."""
        world = self.world
        while self.enabled:
            await asyncio.sleep(self.rng.uniform(60.0, 180.0))
            if world.clock.monotonic() >= until:
                return
            self._protect_healthy()
            kind = self.rng.choice(KINDS)
            self.strikes += 1
            world.disrupted_at = world.clock.monotonic()
            world.stats["storage_damage"] = world.stats.get("storage_damage", 0) + 1
            if kind == "corrupt-record":
                self._corrupt_record()
            elif kind == "delete-records":
                keys = world.base_store.list(self.prefix)
                for key in keys:
                    world.base_store.delete(key)
                self.records_lost.append(world.now())
                world.trace(f"nemesis: deleted {len(keys)} instance records")
            else:
                self._corrupt_cache()

    def _protect_healthy(self) -> None:
        world = self.world
        for vm in world.cloud.vms.values():
            agent = world.agents.get(vm.instance_id)
            alive = agent is not None and agent.registered and not agent.crashed and not agent.stuck
            if vm.status is InstanceStatus.RUNNING and alive:
                self.protected.setdefault(vm.instance_id, vm.provider_id)

    def _corrupt_record(self) -> None:
        world = self.world
        keys = sorted(world.base_store.list(self.prefix))
        if not keys:
            return
        key = self.rng.choice(keys)
        current, _ = world.base_store.get(key)
        if current in DAMAGE and key in self.good:
            original = self.good[key]  # damaged again before its restore: the person restores the good bytes
        else:
            original = self.good[key] = current
        garbage = self.rng.choice(DAMAGE)
        world.base_store.put(key, garbage)
        world.trace(f"nemesis: corrupted {key}")
        world.spawn(None, self._restore_later(key, original, garbage, self.rng.uniform(5.0, 90.0)), "restore")

    async def _restore_later(self, key: str, original: bytes, garbage: bytes, delay: float) -> None:
        await asyncio.sleep(delay)
        store = self.world.base_store
        if key in store.list(self.prefix) and store.get(key)[0] == garbage:
            store.put(key, original)
            self.world.trace(f"nemesis: restored {key}")

    def _corrupt_cache(self) -> None:
        world = self.world
        leader = world.leader()
        if leader is None:
            return
        server = next(s for s in world.servers if s.current is leader)
        path = server.db_path
        try:
            conn = sqlite3.connect(path)
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            conn.close()
        except sqlite3.Error:
            return
        size = path.stat().st_size
        with path.open("r+b") as f:
            f.seek(4096)
            f.write(b"\xa5" * max(0, size - 4096))
        world.trace(f"nemesis: corrupted the SQLite cache of {leader.name}")

    def check(self) -> list[str]:
        """Protected VMs deleted with no instance event giving a reason (see the module docstring)."""
        decided = {
            iid for _, iid, status, _ in self.world.events if status in ("deleting", "pending_deletion")
        }
        problems: list[str] = []
        for iid, provider_id in sorted(self.protected.items()):
            vm = self.world.cloud.vms.get(provider_id)
            if vm is not None and vm.status is InstanceStatus.DELETED and iid not in decided:
                problems.append(
                    f"VM {provider_id} ({iid}) was healthy when storage was damaged and was deleted "
                    "without a lifecycle decision"
                )
        return problems
