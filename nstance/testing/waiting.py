"""Waiting in tests for state that background tasks or other processes change (no event to await).

``eventually`` (in a coroutine) and ``eventually_sync`` (in a thread, for tests that drive blocking
clients) call a check every ``every`` seconds until it returns something truthy, and return that value.
When ``within`` seconds pass first they fail the test with an AssertionError that names ``what`` (a
string, or a function called only then so it can describe the state it sees), the last value the check
returned when that says more than True/False/None, the last exception ``ignoring`` let through, and
``log()`` (a process log, say) when given. ``wake`` is an Event the code under test or a subscription
sets when something changed: the check then runs again at once instead of at the next poll.

Time inside the code under test is injected; this wall clock only bounds how long a test waits for
work that runs concurrently with it.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar, overload

T = TypeVar("T")

Describe = str | Callable[[], str]
Errors = type[BaseException] | tuple[type[BaseException], ...]

_SHOWN = 500
"""Characters of the last value or error quoted in a failure message."""


class _Attempts:
    """The deadline, and what the last attempt saw (for the failure message)."""

    def __init__(self, within: float, what: Describe, log: Callable[[], str] | None) -> None:
        self.within = within
        self.deadline = time.monotonic() + within
        self.what = what
        self.log = log
        self.last: object = None
        self.error: BaseException | None = None

    def saw(self, value: object) -> None:
        self.last, self.error = value, None

    def failed(self, error: BaseException) -> None:
        self.last, self.error = None, error

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def pause(self, every: float) -> float:
        """Seconds until the next check; the failure once the time is up."""
        remaining = self.remaining()
        if remaining < 0:
            raise self.timed_out() from self.error
        return min(every, remaining)

    def timed_out(self, note: str = "") -> AssertionError:
        what = self.what() if callable(self.what) else self.what
        message = f"timed out after {self.within:g}s waiting for {what}{note}"
        if self.error is not None:
            message += f"; last error: {_short(repr(self.error))}"
        elif self.last is not None and not isinstance(self.last, bool):
            message += f"; last saw: {_short(repr(self.last))}"
        if self.log is not None:
            message += f"\n--- log ---\n{self.log()}"
        return AssertionError(message)


def _short(text: str) -> str:
    return text if len(text) <= _SHOWN else text[:_SHOWN] + "..."


@overload
async def eventually(
    check: Callable[[], Awaitable[T | None]],
    *,
    within: float = ...,
    what: Describe = ...,
    log: Callable[[], str] | None = ...,
    every: float = ...,
    wake: asyncio.Event | None = ...,
    ignoring: Errors = ...,
) -> T: ...


@overload
async def eventually(
    check: Callable[[], T | None],
    *,
    within: float = ...,
    what: Describe = ...,
    log: Callable[[], str] | None = ...,
    every: float = ...,
    wake: asyncio.Event | None = ...,
    ignoring: Errors = ...,
) -> T: ...


async def eventually(
    check: Callable[[], object],
    *,
    within: float = 20.0,
    what: Describe = "condition",
    log: Callable[[], str] | None = None,
    every: float = 0.05,
    wake: asyncio.Event | None = None,
    ignoring: Errors = (),
) -> object:
    """The first truthy result of ``check()`` (plain or async); AssertionError after ``within`` seconds.

    An async check still running when the time is up is cancelled (it gets at least ``every``).
    Exceptions of the ``ignoring`` types count as "not yet". With ``wake``, the check runs again as
    soon as the event is set, and at least every ``every`` seconds; the event is cleared before each
    check, so it must signal changes (a check of the event itself would never hold).
    """
    attempts = _Attempts(within, what, log)
    while True:
        if wake is not None:
            wake.clear()  # before the check: a change while it runs sets it again
        cut = asyncio.timeout(max(attempts.remaining(), every))
        try:
            result = check()
            if inspect.isawaitable(result):
                async with cut:
                    result = await result
        except Exception as exc:
            if cut.expired():
                raise attempts.timed_out(" (its last check was still running)") from None
            if not isinstance(exc, ignoring):
                raise
            attempts.failed(exc)
        else:
            if result:
                return result
            attempts.saw(result)
        pause = attempts.pause(every)
        if wake is None:
            await asyncio.sleep(pause)
            continue
        try:
            async with asyncio.timeout(pause):
                await wake.wait()
        except TimeoutError:
            pass


def eventually_sync(
    check: Callable[[], T | None],
    *,
    within: float = 20.0,
    what: Describe = "condition",
    log: Callable[[], str] | None = None,
    every: float = 0.05,
    ignoring: Errors = (),
) -> T:
    """``eventually`` for a test that runs in a thread (no event loop): it sleeps between checks."""
    attempts = _Attempts(within, what, log)
    while True:
        try:
            result = check()
        except ignoring as exc:
            attempts.failed(exc)
        else:
            if result:
                return result
            attempts.saw(result)
        time.sleep(attempts.pause(every))
