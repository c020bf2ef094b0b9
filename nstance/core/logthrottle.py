"""A logging filter that lets a repeated warning or error through a few times a minute, not thousands.

A flood (of connections, of failing calls) can make the same line fire thousands of times a second,
each with a traceback: the log grows by megabytes and the disk and the reader drown. ``LogThrottle``
keys records at WARNING and above by (logger, level, message template) and passes at most ``burst`` of
each key per ``window`` seconds; the first record of a key let through after a quiet spell carries
``suppressed`` (how many were dropped before it), which ``JsonFormatter`` prints. INFO and DEBUG are
never dropped. It keeps at most ``max_keys`` keys (the oldest window is forgotten first). Only
filtering: no I/O, no handlers.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable


class LogThrottle(logging.Filter):
    """Drops repeats of the same warning or error beyond ``burst`` per ``window`` seconds."""

    def __init__(
        self,
        *,
        burst: int = 10,
        window: float = 60.0,
        max_keys: int = 1024,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self._burst = burst
        self._window = window
        self._max_keys = max_keys
        self._monotonic = monotonic
        self._lock = threading.Lock()
        #: key -> [window start, passed in this window, suppressed since the last record passed]
        self._seen: dict[tuple[str, int, str], list[float]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        key = (record.name, record.levelno, str(record.msg))
        now = self._monotonic()
        with self._lock:
            state = self._seen.get(key)
            if state is None or now - state[0] >= self._window:
                suppressed = int(state[2]) if state is not None else 0
                if state is None and len(self._seen) >= self._max_keys:
                    oldest = min(self._seen, key=lambda k: self._seen[k][0])
                    del self._seen[oldest]
                self._seen[key] = [now, 1, 0]
                if suppressed:
                    record.suppressed = suppressed
                return True
            if state[1] < self._burst:
                state[1] += 1
                return True
            state[2] += 1
            return False
