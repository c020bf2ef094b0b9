"""Map an EC2 instance state to Nstance's normalised ``InstanceStatus``.

Pure mapping, no I/O. EC2 reports a state name (``pending``, ``running``, ``shutting-down``,
``terminated``, ``stopping``, ``stopped``) and a numeric code whose low byte carries the same meaning;
the name wins, the code is the fallback, anything else is ``unknown``. This module must not guess a
state EC2 did not report (a missing state is ``unknown``, never ``running``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nstance.providers.base import InstanceStatus

STATE_NAMES: Mapping[str, InstanceStatus] = {
    "pending": InstanceStatus.PENDING,
    "running": InstanceStatus.RUNNING,
    "shutting-down": InstanceStatus.DELETING,
    "terminated": InstanceStatus.DELETED,
    "stopping": InstanceStatus.STOPPING,
    "stopped": InstanceStatus.STOPPED,
}

# EC2 documents the low byte of State.Code: 0 pending, 16 running, 32 shutting-down, 48 terminated,
# 64 stopping, 80 stopped.
STATE_CODES: Mapping[int, InstanceStatus] = {
    0: InstanceStatus.PENDING,
    16: InstanceStatus.RUNNING,
    32: InstanceStatus.DELETING,
    48: InstanceStatus.DELETED,
    64: InstanceStatus.STOPPING,
    80: InstanceStatus.STOPPED,
}

#: State names DescribeInstances is filtered to when listing live instances (terminated excluded).
LISTED_STATE_NAMES: tuple[str, ...] = ("pending", "running", "shutting-down", "stopping", "stopped")


def status_from_state(state: Mapping[str, Any] | None) -> InstanceStatus:
    """The normalised status of an EC2 ``State`` structure (``{"Name": ..., "Code": ...}``)."""
    if not state:
        return InstanceStatus.UNKNOWN
    name = state.get("Name")
    if isinstance(name, str) and name in STATE_NAMES:
        return STATE_NAMES[name]
    code = state.get("Code")
    if isinstance(code, int) and not isinstance(code, bool):
        return STATE_CODES.get(code & 0xFF, InstanceStatus.UNKNOWN)
    return InstanceStatus.UNKNOWN
