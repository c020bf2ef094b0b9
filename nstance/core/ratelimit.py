"""Token buckets: the rate limits cloud APIs apply, and the ones Nstance applies to itself.

A bucket holds up to ``capacity`` tokens and gains ``refill_per_second`` tokens continuously. Taking
``n`` tokens succeeds when that many are there; otherwise the caller learns how long to wait. Time
comes from an injected Clock (its monotonic seconds), so tests and the simulator drive it by hand.

Pure and thread-safe; no sleeping here — callers (sim provider, reconciler limiter) do the waiting.
"""

from __future__ import annotations

import threading

from nstance.core.clock import Clock


class TokenBucket:
    """A continuously refilled token bucket."""

    def __init__(
        self, capacity: float, refill_per_second: float, clock: Clock, *, initial: float | None = None
    ) -> None:
        if capacity <= 0:
            raise ValueError(f"bucket capacity must be positive, got {capacity}")
        if refill_per_second < 0:
            raise ValueError(f"refill rate must not be negative, got {refill_per_second}")
        self.capacity = float(capacity)
        self.refill_per_second = float(refill_per_second)
        self._clock = clock
        self._tokens = self.capacity if initial is None else min(float(initial), self.capacity)
        self._stamp = clock.monotonic()
        self._lock = threading.Lock()

    def _refill(self) -> None:
        now = self._clock.monotonic()
        elapsed = max(0.0, now - self._stamp)
        self._stamp = now
        self._tokens = min(self.capacity, self._tokens + elapsed * self.refill_per_second)

    def available(self) -> float:
        """Tokens in the bucket now."""
        with self._lock:
            self._refill()
            return self._tokens

    def try_take(self, n: float = 1.0) -> float:
        """Take ``n`` tokens and return 0.0, or take nothing and return the seconds until ``n`` are there.

        Asking for more than the capacity can never succeed and raises ValueError; with a refill rate of
        0 and too few tokens the wait is ``inf``.
        """
        if n > self.capacity:
            raise ValueError(f"cannot take {n} tokens from a bucket of capacity {self.capacity}")
        with self._lock:
            self._refill()
            if self._tokens >= n:
                self._tokens -= n
                return 0.0
            if self.refill_per_second == 0:
                return float("inf")
            return (n - self._tokens) / self.refill_per_second
