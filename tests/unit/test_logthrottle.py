"""``LogThrottle``: a repeated warning passes a few times a window, then is counted, not written."""

from __future__ import annotations

import logging

from nstance.core.logformat import JsonFormatter
from nstance.core.logthrottle import LogThrottle


def record(msg: str, level: int = logging.ERROR, name: str = "asyncio") -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, msg, (), None)


def test_repeats_beyond_the_burst_are_dropped_and_counted_on_the_next_window() -> None:
    now = [0.0]
    throttle = LogThrottle(burst=3, window=60.0, monotonic=lambda: now[0])
    passed = [throttle.filter(record("socket.accept() out of system resource")) for _ in range(34_100)]
    assert sum(passed) == 3
    assert throttle.filter(record("another message"))  # other lines are not held back
    assert throttle.filter(record("quiet", logging.INFO))
    now[0] = 61.0
    first = record("socket.accept() out of system resource")
    assert throttle.filter(first)
    assert first.suppressed == 34_097  # type: ignore[attr-defined]
    assert '"suppressed": 34097' in JsonFormatter().format(first)


def test_info_and_debug_are_never_dropped() -> None:
    throttle = LogThrottle(burst=1)
    assert all(throttle.filter(record("tick", logging.INFO)) for _ in range(100))


def test_the_number_of_keys_is_bounded() -> None:
    now = [0.0]
    throttle = LogThrottle(burst=1, max_keys=10, monotonic=lambda: now[0])
    for i in range(1_000):
        now[0] = float(i)
        assert throttle.filter(record(f"distinct {i}"))
    assert len(throttle._seen) == 10
