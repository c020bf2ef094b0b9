"""An asyncio event loop whose time is a ManualClock and which never waits for real.

``VirtualTimeLoop`` is a normal selector loop except that ``time()`` reads the injected clock and its
selector, instead of blocking for ``timeout`` seconds, advances the clock by that much: when every
task is waiting, time jumps to the next timer. ``run_in_executor`` (and so ``asyncio.to_thread``)
runs the function at once on the loop's thread, so no real thread ever interleaves with the
simulation. Together with seeded randomness this makes a run a pure function of its seed: the ready
queue is FIFO and nothing else decides the order of events.

A loop where every task waits and no timer is scheduled can never make progress; ``select`` then
raises ``SimulationStalled`` instead of hanging. This module must not be used by production code.

``pause(owner)`` stops a simulated process the way SIGSTOP does: every callback whose context belongs
to ``owner`` (``owner_of`` reads that from the callback's contextvars) is held back when its turn
comes - task steps, timers, future callbacks alike - while time and every other process go on;
``resume(owner)`` puts the held callbacks back in the ready queue in their original order. The
process then sees its monotonic clock jump, as a stopped and continued process does.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import selectors
from collections.abc import Callable, Hashable
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


class _ReadyQueue(collections.deque[asyncio.Handle]):
    """The loop's ready queue; a handle of a paused owner is parked instead of being run."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        super().__init__()
        self._loop = loop
        self._skip = asyncio.Handle(lambda: None, (), loop)
        self._skip.cancel()  # the loop drops cancelled handles without running them

    def popleft(self) -> asyncio.Handle:
        handle = super().popleft()
        loop = self._loop
        if loop.paused and not handle.cancelled():
            context: contextvars.Context | None = getattr(handle, "_context", None)
            owner = loop.owner_of(context) if context is not None else None
            if owner is not None and owner in loop.paused:
                loop.parked.setdefault(owner, []).append(handle)
                return self._skip
        return handle


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """The event loop of a simulation (see the module docstring)."""

    def __init__(
        self, clock: ManualClock, *, owner_of: Callable[[contextvars.Context], Hashable | None] | None = None
    ) -> None:
        super().__init__(selector=_VirtualSelector(clock))
        self._virtual_clock = clock
        self._clock_resolution = 1e-6
        self.owner_of: Callable[[contextvars.Context], Hashable | None] = owner_of or (lambda _ctx: None)
        self.paused: set[Hashable] = set()
        self.parked: dict[Hashable, list[asyncio.Handle]] = {}
        self._ready: collections.deque[asyncio.Handle] = _ReadyQueue(self)

    def pause(self, owner: Hashable) -> None:
        """Hold back every callback of ``owner`` from now on (a stopped process)."""
        self.paused.add(owner)

    def resume(self, owner: Hashable) -> None:
        """Run ``owner``'s held callbacks again, in their order (a continued process)."""
        self.paused.discard(owner)
        for handle in self.parked.pop(owner, []):
            self._ready.append(handle)

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
