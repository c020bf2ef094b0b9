"""An asyncio event loop whose time is a ManualClock and which never waits for real.

``VirtualTimeLoop`` is a normal selector loop except that ``time()`` reads the injected clock and its
selector, instead of blocking for ``timeout`` seconds, advances the clock by that much: when every
task is waiting, time jumps to the next timer. ``run_in_executor`` (and so ``asyncio.to_thread``)
runs the function at once on the loop's thread, so no real thread ever interleaves with the
simulation. Together with seeded randomness this makes a run a pure function of its seed: the ready
queue is FIFO and nothing else decides the order of events.

A loop where every task waits and no timer is scheduled can never make progress; ``select`` then
raises ``SimulationStalled`` instead of hanging. This module must not be used by production code.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any, TypeVar

from nstance.core.clock import ManualClock

T = TypeVar("T")


class SimulationStalled(RuntimeError):
    """Every task waits for something no timer or task will ever do."""


class _VirtualSelector(selectors.SelectSelector):
    """A selector that reports no I/O and lets the clock jump over the wait instead."""

    def __init__(self, clock: ManualClock) -> None:
        super().__init__()
        self._clock = clock

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:
            raise SimulationStalled("every task is waiting and no timer is scheduled")
        if timeout > 0:
            self._clock.advance(timeout)
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """The event loop of a simulation (see the module docstring)."""

    def __init__(self, clock: ManualClock) -> None:
        super().__init__(selector=_VirtualSelector(clock))
        self._virtual_clock = clock
        self._clock_resolution = 1e-6

    def time(self) -> float:
        return self._virtual_clock.monotonic()

    def run_in_executor(  # type: ignore[override]
        self, executor: Executor | None, func: Callable[..., T], *args: Any
    ) -> asyncio.Future[T]:
        future: asyncio.Future[T] = self.create_future()
        try:
            future.set_result(func(*args))
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task, as a thread would
            future.set_exception(exc)
        return future
