"""The VMID allocator: new VMIDs are monotonic, at least 10000, and never handed out twice.

The next VMID is one more than the largest of: the floor minus one, the high-water mark (the last VMID this
allocator handed out), and the largest VMID the cluster shows now. The high-water mark is written to a
JSON file (atomically, mode 0600) *before* the VMID is returned, so a crash after a clone never leads to
that VMID being handed out again by a restarted server, even if the VM was since deleted. Without a
state file the mark lives only in memory.

It must not call the PVE API (the caller passes the cluster's maximum) and must not decide placement.
Thread-safe: the provider calls it from worker threads.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

from nstance.core.atomicfile import write_atomic

DEFAULT_FLOOR = 10_000
MAX_VMID = 999_999_999  # PVE's upper bound for a VMID


class VmidExhausted(Exception):
    """No VMID is left below PVE's maximum."""


class VmidStateError(Exception):
    """The high-water-mark file cannot be read or written."""


class VmidAllocator:
    """Hands out VMIDs; see the module docstring."""

    def __init__(self, state_path: Path | None, *, floor: int = DEFAULT_FLOOR) -> None:
        if not 100 <= floor <= MAX_VMID:
            raise ValueError(f"VMID floor must be between 100 and {MAX_VMID} (got {floor})")
        self._path = state_path
        self._floor = floor
        self._lock = threading.Lock()
        self._mark = self._load()

    @property
    def high_water_mark(self) -> int:
        """The last VMID handed out (floor - 1 before the first)."""
        with self._lock:
            return self._mark

    def allocate(self, cluster_max: int) -> int:
        """A fresh VMID above every one seen; persisted before it is returned."""
        with self._lock:
            vmid = max(self._floor, self._mark + 1, cluster_max + 1)
            if vmid > MAX_VMID:
                raise VmidExhausted(f"no VMID left above {self._mark} (PVE allows at most {MAX_VMID})")
            self._store(vmid)
            self._mark = vmid
            return vmid

    def _load(self) -> int:
        start = self._floor - 1
        if self._path is None:
            return start
        try:
            doc = json.loads(self._path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return start
        except (OSError, ValueError) as exc:
            raise VmidStateError(f"cannot read the VMID state file {self._path}: {exc}") from exc
        mark = doc.get("last_vmid") if isinstance(doc, dict) else None
        if isinstance(mark, bool) or not isinstance(mark, int) or mark < 0:
            raise VmidStateError(
                f"{self._path}: 'last_vmid' must be a non-negative integer (got {mark!r}); fix or remove "
                "the file (the allocator then restarts above the cluster's highest VMID)"
            )
        return max(start, mark)

    def _store(self, vmid: int) -> None:
        if self._path is None:
            return
        path = self._path
        try:
            write_atomic(path, json.dumps({"last_vmid": vmid}).encode(), mode=0o600, dir_mode=None)
        except OSError as exc:
            raise VmidStateError(f"cannot write the VMID state file {path}: {exc}") from exc
