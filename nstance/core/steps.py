"""The ordered-steps runner (FoundationDB-style subreconcilers): every operator controller and the drain
coordinator are lists of steps it runs. It lives beside the work queue (``core.workqueue``) because it
knows nothing of Kubernetes or shards.

A controller is a tuple of small steps (``STEPS`` for the live object, ``DELETE_STEPS`` once it is being
deleted). Each step looks at the current state, does at most one kind of I/O, and either returns (the
next step runs), raises ``Requeue`` (stop now and run the whole list again after a delay), or raises
``Done`` (stop now, nothing more to do until the next change). A step may also ask for a *soft*
requeue with ``StepState.requeue_within`` and let the following steps run. ``run_steps`` runs the
list in order, logs every step's name and duration at debug and the step that stopped the run at
info, and returns when (if ever) the object wants to be looked at again.

Every step must be safe to run again from the top at any time (steps read the live objects, not what
a previous run remembered), because the process may stop between any two of them.

Must not: talk to Kubernetes or shards itself, know about any particular controller, or catch errors
other than ``Requeue``/``Done`` (unexpected failures propagate to the work queue, which retries with
backoff).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

Logger = logging.Logger | logging.LoggerAdapter[logging.Logger]


class Requeue(Exception):
    """Stop this run; run the steps again after ``after`` seconds (0 = as soon as possible)."""

    def __init__(self, after: float, reason: str) -> None:
        super().__init__(reason)
        self.after = max(0.0, float(after))
        self.reason = reason


class Done(Exception):
    """Stop this run without error; nothing more to do until the object (or a watched one) changes."""

    def __init__(self, reason: str = "") -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass
class StepState:
    """Base of every controller's per-run state: carries the soft requeue request."""

    requeue_after: float | None = field(default=None, init=False)

    def requeue_within(self, after: float) -> None:
        """Ask to be run again within ``after`` seconds without stopping the run."""
        after = max(0.0, float(after))
        self.requeue_after = after if self.requeue_after is None else min(self.requeue_after, after)


S_contra = TypeVar("S_contra", bound=StepState, contravariant=True)
S = TypeVar("S", bound=StepState)


class Step(Protocol[S_contra]):
    """One small piece of a reconcile; ``name`` is what the logs show."""

    @property
    def name(self) -> str: ...

    async def __call__(self, state: S_contra) -> None: ...


@dataclass(frozen=True)
class RunResult:
    """How a run ended: when to run again (None = only on the next change) and who stopped it."""

    requeue_after: float | None
    stopped_by: str | None = None
    reason: str = ""
    durations: tuple[tuple[str, float], ...] = ()


def _earliest(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)


async def run_steps(
    steps: Sequence[Step[S]],
    state: S,
    logger: Logger,
    *,
    monotonic: Callable[[], float] = time.monotonic,
) -> RunResult:
    """Run ``steps`` in order on ``state``; see the module docstring for the rules."""
    durations: list[tuple[str, float]] = []
    for step in steps:
        started = monotonic()
        try:
            await step(state)
        except Requeue as exc:
            elapsed = monotonic() - started
            durations.append((step.name, elapsed))
            logger.info(
                "step %s stopped the run after %.1f ms: %s (again in %.1fs)",
                step.name,
                elapsed * 1000,
                exc.reason,
                exc.after,
            )
            return RunResult(
                _earliest(exc.after, state.requeue_after), step.name, exc.reason, tuple(durations)
            )
        except Done as exc:
            elapsed = monotonic() - started
            durations.append((step.name, elapsed))
            logger.info("step %s finished the run after %.1f ms: %s", step.name, elapsed * 1000, exc.reason)
            return RunResult(state.requeue_after, step.name, exc.reason, tuple(durations))
        except Exception as exc:
            exc.add_note(f"in step {step.name}")
            raise
        elapsed = monotonic() - started
        durations.append((step.name, elapsed))
        logger.debug("step %s took %.1f ms", step.name, elapsed * 1000)
    return RunResult(state.requeue_after, None, "", tuple(durations))
