"""Shared, in-memory state of one agent run: what /healthz and the health reports read.

Responsible only for holding facts (registered, health stream up, termination notice) and a way to
ask the reporter for an early report. It does no I/O and makes no decisions.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import datetime


@dataclass(frozen=True, slots=True)
class TerminationNotice:
    """The platform announced that it will reclaim this machine."""

    action: str
    deadline: datetime | None = None


@dataclass(slots=True)
class AgentState:
    """Mutable facts about the running agent; only the asyncio loop thread touches it."""

    registered: bool = False
    health_stream_up: bool = False
    reports_enabled: bool = True
    problem: str = "starting"
    termination_notice: TerminationNotice | None = None
    report_now: asyncio.Event = field(default_factory=asyncio.Event)

    def healthz(self) -> tuple[bool, str]:
        """Whether /healthz answers 200, and the one-line reason."""
        if not self.registered:
            return False, f"not registered: {self.problem}"
        if self.reports_enabled and not self.health_stream_up:
            return False, f"health stream down: {self.problem}"
        return True, "ok"

    def nudge(self) -> None:
        """Ask the health reporter to send a report now (after a commit or a termination notice)."""
        self.report_now.set()
