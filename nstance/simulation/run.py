"""Running seeds: one ``World`` per seed on a virtual-time loop, its invariants, and a report.

``run_seed`` builds the world, runs it to the end of its calm phase, shuts it down and checks the
invariants; it returns a ``SeedResult`` with the problems found, counts of what was injected, the
wall time, and a digest of everything that happened (two runs of one seed in one process give the
same digest: that is what "deterministic" means here; across processes set ``PYTHONHASHSEED=0``,
which the command line does). Server logs go to a bounded buffer shown only for failing seeds.
"""

from __future__ import annotations

import atexit
import collections
import hashlib
import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from nstance.simulation.invariants import check_end_state
from nstance.simulation.loop import VirtualTimeLoop
from nstance.simulation.servers import owner_of, task_factory, template_database
from nstance.simulation.world import World, deterministic, scratch_root

LOG_LINES = 400


@dataclass
class SeedResult:
    """The outcome of one seed."""

    seed: int
    problems: list[str]
    stats: dict[str, int]
    wall: float
    digest: str
    trace: list[str] = field(default_factory=list)
    log_tail: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


class _Buffer(logging.Handler):
    def __init__(self, world: World) -> None:
        super().__init__()
        self.lines: collections.deque[str] = collections.deque(maxlen=LOG_LINES)
        self._world = world

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(
            f"{self._world.now():8.2f} {record.levelname:7} {record.name}: {record.getMessage()}"
        )


_ROOT: dict[str, Path] = {}


def _root() -> Path:
    root = _ROOT.get("root")
    if root is None or not root.exists():
        root = scratch_root()
        _ROOT["root"] = root
        atexit.register(_remove_root, root, os.getpid())
    return root


def _remove_root(root: Path, creator: int) -> None:
    # Forked workers inherit this handler; only the process that made the directory removes it.
    if os.getpid() == creator:
        shutil.rmtree(root, ignore_errors=True)


def prepare_scratch() -> None:
    """Make the scratch directory and the template database now, before worker processes fork from
    this one: they share both, and this process removes them when it exits (a pool's workers are
    terminated, so nothing of theirs would)."""
    template_database(_root())


def run_seed(
    seed: int,
    *,
    verbose: bool = False,
    before_check: Callable[[World], None] | None = None,
    fault_kinds: tuple[str, ...] | None = None,
    group_edits: bool | None = None,
    on_demand: bool | None = None,
) -> SeedResult:
    """Simulate one seed and check its invariants.

    Tests may tamper with the end state (``before_check``), narrow the faults to some kinds
    (``fault_kinds``, from ``scenario.FAULT_KINDS``) or turn the operator's config edits on or off
    (``group_edits``; by default drawn from the seed, see ``group_edits``) and its on-demand
    instances (``on_demand``, likewise).
    """
    started = time.perf_counter()
    root = _root()
    tmp = root / f"seed-{seed}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    world = World(
        seed,
        tmp,
        template_database(root),
        fault_kinds=fault_kinds,
        group_edits=group_edits,
        on_demand=on_demand,
    )
    handler = _Buffer(world)
    logger = logging.getLogger()
    saved_level, saved_handlers = logger.level, logger.handlers[:]
    logger.handlers[:] = [handler]
    logger.setLevel(logging.INFO if verbose else logging.WARNING)
    loop = VirtualTimeLoop(world.clock, owner_of=owner_of)
    loop.set_task_factory(task_factory)
    problems: list[str] = []
    try:
        with deterministic(seed, world.clock):
            try:
                loop.run_until_complete(world.run())
            except Exception as exc:  # noqa: BLE001 - a crash of the harness or the code under test
                problems.append(f"the run itself failed: {type(exc).__name__}: {exc}")
            finally:
                loop.run_until_complete(world.shutdown())
            if not problems:
                if before_check is not None:
                    before_check(world)
                problems = check_end_state(world, tmp / "final-config")
    finally:
        loop.close()
        for close in world.closers:
            close()
        logger.handlers[:] = saved_handlers
        logger.setLevel(saved_level)
        shutil.rmtree(tmp, ignore_errors=True)
    digest = hashlib.sha256(
        "\n".join(
            [*world.trace_lines, *(f"{t:.6f} {i} {s} {r}" for t, i, s, r in world.events), *problems]
        ).encode()
    ).hexdigest()[:16]
    return SeedResult(
        seed=seed,
        problems=problems,
        stats=dict(world.stats),
        wall=time.perf_counter() - started,
        digest=digest,
        trace=world.trace_lines,
        log_tail=list(handler.lines),
    )


def reproduce_command(seed: int) -> str:
    """The shell command that runs exactly this seed again, with its trace."""
    return f"PYTHONHASHSEED=0 .venv/bin/python -m nstance.simulation --seed {seed} --trace"
