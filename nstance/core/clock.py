"""Injected time.

Every component that waits, times out or ages things takes a Clock, so tests drive time by hand
(ManualClock) instead of sleeping. Times are timezone-aware UTC datetimes; ``monotonic`` is seconds.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    """Source of wall-clock and monotonic time."""

    def now(self) -> datetime:
        """Current wall-clock time, timezone-aware UTC."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes backwards."""
        ...


class SystemClock:
    """The real clock."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    def monotonic(self) -> float:
        return time.monotonic()


class ManualClock:
    """A clock that moves only when told to; thread-safe."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2026, 1, 1, tzinfo=UTC)
        self._mono = 1000.0
        self._lock = threading.Lock()

    def now(self) -> datetime:
        with self._lock:
            return self._now

    def monotonic(self) -> float:
        with self._lock:
            return self._mono

    def step_wall(self, delta: timedelta) -> None:
        """Move only the wall clock, forwards or back (an NTP step); the monotonic clock stays put."""
        with self._lock:
            self._now += delta

    def advance(self, delta: timedelta | float) -> None:
        """Move both clocks forward by ``delta`` (a timedelta or seconds)."""
        seconds = delta.total_seconds() if isinstance(delta, timedelta) else float(delta)
        if seconds < 0:
            raise ValueError("a clock cannot go backwards")
        with self._lock:
            self._now += timedelta(seconds=seconds)
            self._mono += seconds
