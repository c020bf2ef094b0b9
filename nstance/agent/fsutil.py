"""Atomic file writes for the agent: temp file in the same directory, fsync, chmod, rename.

Responsible only for getting bytes onto disk so that a reader sees the old file or the new one, never
half of either. It does not decide what may be written where (files.py and identity.py do).
"""

from __future__ import annotations

import contextlib
import os
from datetime import datetime
from pathlib import Path

TEMP_PREFIX = ".nstance-tmp-"


def ensure_dir(path: Path, mode: int = 0o750) -> None:
    """Create ``path`` and missing parents with ``mode`` (existing directories are left as they are)."""
    if path.is_dir():
        return
    ensure_dir(path.parent, mode)
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=mode)
        os.chmod(path, mode)  # mkdir's mode is filtered by the umask


def atomic_write(
    path: Path,
    data: bytes,
    *,
    mode: int = 0o600,
    dir_mode: int = 0o750,
    mtime: datetime | None = None,
) -> None:
    """Write ``data`` to ``path`` atomically with permissions ``mode`` (and ``mtime`` when given)."""
    ensure_dir(path.parent, dir_mode)
    tmp = path.with_name(f"{TEMP_PREFIX}{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            os.fchmod(fd, mode)
            os.fsync(fd)
        finally:
            os.close(fd)
        if mtime is not None:
            stamp = mtime.timestamp()
            os.utime(tmp, (stamp, stamp))
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
