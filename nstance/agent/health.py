"""Build one HealthReportRequest from what the agent knows; pure (no I/O, no clock of its own).

Responsible for the report's field mapping only: version, instance ID, timestamp, sequence, uptime
(time since the agent process started, as a Go duration string truncated to whole seconds), CPU and
memory usage, file statuses, the termination notice and the applied config hash. Gathering the inputs
and sending the report belong to streams.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from nstance import __version__
from nstance.agent.files import FileState
from nstance.agent.metrics import Usage
from nstance.agent.state import TerminationNotice
from nstance.core.durations import format_duration
from nstance.rpc import agent_pb2


@dataclass(frozen=True, slots=True)
class ReportInputs:
    """Everything one report says."""

    instance_id: str
    now: datetime
    count: int
    uptime: timedelta
    usage: Usage
    files: Mapping[str, FileState]
    termination_notice: TerminationNotice | None
    config_hash: str
    version: str = __version__


def format_uptime(uptime: timedelta) -> str:
    """Go-style duration string in whole seconds (``1h2m3s``)."""
    return format_duration(timedelta(seconds=int(max(uptime.total_seconds(), 0))))


def build_report(inputs: ReportInputs) -> agent_pb2.HealthReportRequest:
    """The wire message for ``inputs``."""
    report = agent_pb2.HealthReportRequest(
        version=inputs.version,
        instance_id=inputs.instance_id,
        count=inputs.count,
        uptime=format_uptime(inputs.uptime),
        config_hash=inputs.config_hash,
    )
    report.timestamp.FromDatetime(inputs.now)
    usage = inputs.usage
    if usage.cpu_usage is not None:
        report.metrics.cpu_usage = usage.cpu_usage
    report.metrics.cpu_core_usage.extend(usage.cpu_core_usage)
    if usage.memory_usage is not None:
        report.metrics.memory_usage = usage.memory_usage
    report.metrics.SetInParent()
    for name, state in sorted(inputs.files.items()):
        status = report.files[name]
        if state.error is not None:
            status.error = state.error
        elif state.last_modified is not None:
            status.last_modified.FromDatetime(state.last_modified)
    notice = inputs.termination_notice
    if notice is not None:
        report.termination_notice.action = notice.action
        if notice.deadline is not None:
            report.termination_notice.deadline.FromDatetime(notice.deadline)
    return report
