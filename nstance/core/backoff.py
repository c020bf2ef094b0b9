"""Exponential backoff with jitter: how long to wait before attempt ``n`` of a failing operation.

Pure arithmetic; the random source is injected so tests and the simulator are deterministic. Used by the
reconciler's per-group retries, config reload and provider-call retries. A Backoff made without an
``rng`` takes one from ``default_rng``, which the deterministic simulator (``nstance.simulation``)
points at a seeded source with ``set_default_rng_source``.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

_rng_source: Callable[[], random.Random] = random.Random


def default_rng() -> random.Random:
    """A random source for a Backoff made without one (OS-seeded unless a simulation set a source)."""
    return _rng_source()


def set_default_rng_source(source: Callable[[], random.Random] | None) -> None:
    """Make ``default_rng`` use ``source`` (None: OS-seeded ``random.Random`` again)."""
    global _rng_source
    _rng_source = source or random.Random


@dataclass(slots=True)
class Backoff:
    """``base * factor**attempt`` capped at ``cap``, then up to ``jitter`` (fraction) added at random."""

    base: float = 0.5
    cap: float = 60.0
    factor: float = 2.0
    jitter: float = 0.25
    rng: random.Random = field(default_factory=default_rng)

    def __post_init__(self) -> None:
        if self.base <= 0 or self.cap < self.base or self.factor < 1 or not 0 <= self.jitter <= 1:
            raise ValueError("backoff needs base > 0, cap >= base, factor >= 1 and 0 <= jitter <= 1")

    def delay(self, attempt: int) -> float:
        """Seconds to wait before retry number ``attempt`` (0 = first retry)."""
        exponent = min(max(attempt, 0), 64)
        raw = min(self.cap, self.base * self.factor**exponent)
        return raw + raw * self.jitter * self.rng.random()
