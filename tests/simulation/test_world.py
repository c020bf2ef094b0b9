"""The simulated world's own bookkeeping: tasks it spawns for a server end cleanly however they end."""

from __future__ import annotations

import asyncio
import gc
import warnings
from pathlib import Path

from nstance.simulation.world import World


async def test_a_task_cancelled_before_it_starts_leaves_no_unawaited_coroutine(tmp_path: Path) -> None:
    # A 3,000-seed sweep printed "coroutine 'Shard.stop_leading' was never awaited": a server crashed
    # right after its leadership changed, before the task spawned for the change took a step.
    world = World(1, tmp_path, tmp_path / "template.db")

    async def job() -> None:
        return None

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        task = world.spawn(None, job(), "job")
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        gc.collect()
    assert [str(w.message) for w in caught if "never awaited" in str(w.message)] == []


async def test_a_spawned_task_still_runs_its_coroutine(tmp_path: Path) -> None:
    world = World(1, tmp_path, tmp_path / "template.db")

    async def job() -> int:
        return 7

    assert await world.spawn(None, job(), "job") == 7
