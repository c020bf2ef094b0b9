"""Object storage as one simulated server sees it: the shared store behind its gate, with faults.

All servers share one ``MemoryObjectStore`` (``World.base_store``); each incarnation reaches it
through its own ``SimStore``, which

* raises ``SimCrash`` once the incarnation is dead (a dead process writes nothing more);
* fails every call while the incarnation is partitioned from storage (``Gate.partitioned_until``);
* injects 503s and 409s (not applied) at ``StoreFaults.fault_rate``, and timeouts at
  ``StoreFaults.timeout_rate``: before the write (not applied) or after it (applied: an ambiguous
  outcome);
* checks every write only a leader may make (instance records, dynamic groups, the certificate log)
  with ``World.check_acting`` as it happens.

It draws its faults from the world's main stream (``World.rng``) and must not change what the base
store does: storage damage is ``nemeses``' job, and the fault rates are set by ``faults``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from nstance.objectstore.base import Conflict, ObjectInfo, Throttled

if TYPE_CHECKING:
    from nstance.simulation.servers import Incarnation
    from nstance.simulation.world import World


@dataclass
class StoreFaults:
    """How often storage calls fail: zero outside the fault phase."""

    fault_rate: float = 0.0
    timeout_rate: float = 0.0


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
        if world.rng.random() < world.store_faults.fault_rate:
            kind = world.rng.choice(("503", "409") if write else ("503",))
            world.stats["store_faults"] += 1
            if kind == "409":
                raise Conflict(f"simulated 409 ConditionalRequestConflict on {key}")
            raise Throttled(f"simulated 503 SlowDown on {key}")
        if write and _is_guarded(key):
            world.check_acting(self._inc, f"write {key}")

    def _after_write(self, key: str) -> None:
        world = self._world
        if world.rng.random() < world.store_faults.timeout_rate:
            world.stats["store_timeouts"] += 1
            raise Throttled(f"simulated timeout writing {key} (the write was applied)")

    def _maybe_lost(self, key: str) -> None:
        """A timeout before the write reached the store (not applied)."""
        world = self._world
        if world.rng.random() < world.store_faults.timeout_rate:
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
