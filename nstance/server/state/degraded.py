"""Why a running server is degraded: named reasons kept for ``/health``, metrics and ``WatchErrors``.

A degraded server keeps running on its last good view (it does not crash, stop leading or act on
what it could not read) but must say so. Each part of the server that can fall back reports under a
fixed ``component`` name with a ``kind`` from a small fixed set (both become metric labels, so neither
may carry free text); the full human-readable reason travels alongside and is shown on ``/health``.

``Degradations`` is thread-safe (loads run in worker threads) and does no I/O; ``set`` and ``clear``
say whether anything changed, so callers publish an event only on a transition.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass

_LABEL = re.compile(r"^[a-z][a-z_]{0,31}$")


@dataclass(frozen=True, slots=True)
class Degradation:
    """One reason: ``component`` and ``kind`` are short fixed identifiers, ``reason`` is free text."""

    component: str
    kind: str
    reason: str


class Degradations:
    """The current set of reasons, one per component."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_component: dict[str, Degradation] = {}

    def set(self, component: str, kind: str, reason: str) -> bool:
        """Record that ``component`` is degraded; True if this is new or differs from the last report."""
        for value in (component, kind):
            if not _LABEL.match(value):
                raise ValueError(f"degradation labels must be short lowercase identifiers, not {value!r}")
        entry = Degradation(component, kind, reason)
        with self._lock:
            changed = self._by_component.get(component) != entry
            self._by_component[component] = entry
        return changed

    def clear(self, component: str) -> bool:
        """Record that ``component`` is healthy again; True if it was degraded."""
        with self._lock:
            return self._by_component.pop(component, None) is not None

    def current(self) -> list[Degradation]:
        """Every reason, sorted by component."""
        with self._lock:
            return [self._by_component[name] for name in sorted(self._by_component)]

    def summary(self) -> str | None:
        """``component: reason; ...`` on one line, or None when nothing is degraded."""
        entries = self.current()
        if not entries:
            return None
        return "; ".join(f"{e.component}: {' '.join(e.reason.split())}" for e in entries)
