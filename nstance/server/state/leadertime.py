"""The shard's clock: wall-clock-shaped time that moves only with the monotonic clock within a leadership.

Everything the leader decides by elapsed time - an agent silent for three health intervals, a drain
that timed out, a VM that never registered, a new VM the provider does not list yet - compares
timestamps the leader wrote with "now". If "now" were the wall clock, an NTP step of 30 minutes or a
VM resumed two hours late would make every agent look silent and every drain due at once. So the
shard reads time from a ``LeaderClock``: at each acquisition of leadership (``restart``) it takes the
wall clock once, and from then on ``now()`` is that instant plus the monotonic time elapsed since. A
wall-clock step during a leadership changes nothing; the next acquisition picks the new wall time up.

Timestamps this leadership did not write (another server's, or this one's in an earlier frame) are
not comparable with this frame. One that lies outside the frame - before its start, or after its
"now" (a clock that was ahead) - is read as the start of the leadership (``in_term``): time before it
counts as zero, which can only make a timeout later, never earlier.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from nstance.core.clock import Clock


class LeaderClock:
    """A ``Clock`` whose wall time follows the monotonic clock from the last ``restart``."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._wall0 = clock.now()
        self._mono0 = clock.monotonic()

    @property
    def source(self) -> Clock:
        """The clock this one reads (the system clock in a server)."""
        return self._clock

    def restart(self) -> None:
        """Start a new frame at the current wall time (called when leadership is acquired)."""
        self._wall0 = self._clock.now()
        self._mono0 = self._clock.monotonic()

    @property
    def term_start(self) -> datetime:
        """The wall time this frame started at (the start of the current or last leadership)."""
        return self._wall0

    def now(self) -> datetime:
        return self._wall0 + timedelta(seconds=self._clock.monotonic() - self._mono0)

    def monotonic(self) -> float:
        return self._clock.monotonic()

    def since_term(self, when: datetime) -> timedelta:
        """Time elapsed since ``when``, read with ``in_term`` (never counted from before this leadership)."""
        now = self.now()
        return now - in_term(when, self._wall0, now)


def in_term(when: datetime, start: datetime, now: datetime | None) -> datetime:
    """``when`` if the leadership that started at ``start`` could have written it by ``now``, else ``start``.

    ``now`` None means no upper bound (only timestamps from before ``start`` are replaced).
    """
    if when < start or (now is not None and when > now):
        return start
    return when


def since_term(clock: Clock, when: datetime) -> timedelta:
    """``clock.since_term(when)`` for a LeaderClock; plain elapsed wall time for any other clock."""
    if isinstance(clock, LeaderClock):
        return clock.since_term(when)
    return clock.now() - when


def term_start(clock: Clock) -> datetime | None:
    """When the current leadership's frame started, or None for a clock that is not a LeaderClock."""
    return clock.term_start if isinstance(clock, LeaderClock) else None
