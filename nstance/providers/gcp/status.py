"""Mapping of GCE instance ``status`` strings to Nstance's normalised ``InstanceStatus``.

GCE's ``TERMINATED`` means *stopped* (the VM still exists and can be started), not deleted; a deleted
VM simply answers 404. ``PROVISIONING`` and ``STAGING`` are the boot phases. Pure data; no I/O.
"""

from __future__ import annotations

from nstance.providers.base import InstanceStatus

_STATUSES: dict[str, InstanceStatus] = {
    "PROVISIONING": InstanceStatus.PENDING,
    "STAGING": InstanceStatus.PENDING,
    "RUNNING": InstanceStatus.RUNNING,
    "PENDING_STOP": InstanceStatus.STOPPING,
    "STOPPING": InstanceStatus.STOPPING,
    "STOPPED": InstanceStatus.STOPPED,
    "TERMINATED": InstanceStatus.STOPPED,
    "SUSPENDING": InstanceStatus.SUSPENDING,
    "SUSPENDED": InstanceStatus.SUSPENDED,
    "REPAIRING": InstanceStatus.REPAIRING,
}


def map_status(status: str) -> InstanceStatus:
    """The normalised status of a GCE status string (``unknown`` for anything unrecognised)."""
    return _STATUSES.get(status.upper(), InstanceStatus.UNKNOWN)
