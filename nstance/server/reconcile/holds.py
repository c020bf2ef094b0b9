"""Safety holds: things the leader refuses to do right now because its own view may be what is wrong.

A hold has a topic (for example ``orphan-deletions default/web``) and a sentence. While any is set,
``/health`` answers "degraded" with the sentences (each kind is one component of the server's
``degraded.Degradations``) and ``nstance_safety_holds`` counts them by kind;
``set`` tells the caller when a hold is new or changed, so it is reported on ``WatchErrors`` once
rather than on every cycle. No I/O.
"""

from __future__ import annotations


class Holds:
    """The current holds by topic (the leader clears them when the condition is gone)."""

    def __init__(self) -> None:
        self._reasons: dict[str, str] = {}

    def set(self, topic: str, reason: str | None) -> bool:
        """Set (or with None, clear) the hold on ``topic``; True when it is new or its reason changed."""
        if reason is None:
            self._reasons.pop(topic, None)
            return False
        changed = self._reasons.get(topic) != reason
        self._reasons[topic] = reason
        return changed

    def reason(self, topic: str) -> str | None:
        """The reason of the hold on ``topic``, or None when there is none."""
        return self._reasons.get(topic)

    def clear_prefix(self, prefix: str) -> None:
        """Drop every hold whose topic starts with ``prefix``."""
        for topic in [t for t in self._reasons if t.startswith(prefix)]:
            del self._reasons[topic]

    def topics(self, prefix: str = "") -> list[str]:
        """The topics held, those starting with ``prefix`` only when given."""
        return sorted(t for t in self._reasons if t.startswith(prefix))

    def clear(self) -> None:
        self._reasons.clear()

    def counts(self) -> dict[str, int]:
        """Holds per kind (the topic's first word)."""
        out: dict[str, int] = {}
        for topic in self._reasons:
            kind = topic.split(" ", 1)[0]
            out[kind] = out.get(kind, 0) + 1
        return out

    def summary(self, kind: str = "") -> str | None:
        """The holds on one line, sorted by topic; None when there is none.

        With ``kind``, only that kind's holds, each named by the rest of its topic (the group, the VM).
        """
        topics = [t for t in sorted(self._reasons) if not kind or t.split(" ", 1)[0] == kind]
        if not topics:
            return None
        parts = []
        for topic in topics:
            label = topic.split(" ", 1)[1] if kind and " " in topic else "" if kind else topic
            parts.append(f"{label}: {self._reasons[topic]}" if label else self._reasons[topic])
        return "; ".join(parts)
