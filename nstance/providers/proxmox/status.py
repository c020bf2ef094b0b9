"""Map what Proxmox VE says about a VM (status, lock, QMP status, HA state) to ``InstanceStatus``.

Pure function over the fields of ``/cluster/resources`` and ``status/current``; no I/O, no decisions.
"""

from __future__ import annotations

from nstance.providers.base import InstanceStatus

#: Config locks that mean the VM is still being made.
_CREATING_LOCKS = frozenset({"clone", "create"})
#: HA states in which the HA manager is recovering the VM rather than serving it.
_REPAIRING_HA = frozenset({"recovery", "fence", "error", "migrate", "relocate"})


def map_status(
    status: str | None,
    *,
    lock: str | None = None,
    qmpstatus: str | None = None,
    hastate: str | None = None,
) -> InstanceStatus:
    """The normalised status of one VM.

    ``status`` is PVE's ``running``/``stopped``/``unknown`` (unknown when its node is offline),
    ``lock`` the config lock (``clone``, ``destroyed``, ``suspending``, ``suspended``, ``backup``...),
    ``qmpstatus`` the QEMU state from ``status/current`` (``paused`` for a live-suspended VM).
    """
    if lock in _CREATING_LOCKS:
        return InstanceStatus.PENDING
    if lock == "destroyed":
        return InstanceStatus.DELETING
    if lock == "suspending":
        return InstanceStatus.SUSPENDING
    if lock == "suspended":
        return InstanceStatus.SUSPENDED
    if hastate in _REPAIRING_HA:
        return InstanceStatus.REPAIRING
    if status == "running":
        if qmpstatus in ("paused", "suspended", "prelaunch"):
            return InstanceStatus.SUSPENDED if qmpstatus != "prelaunch" else InstanceStatus.PENDING
        return InstanceStatus.RUNNING
    if status == "stopped":
        return InstanceStatus.STOPPED
    return InstanceStatus.UNKNOWN
