"""Atomic file writes: a temp file in the same directory, fsync, chmod, rename, fsync of the directory.

The one way every program here puts a whole file on disk, so that a reader (or a crash) sees the old
file or the new one, never half of either: the agent's pushed files and identity, the server's config
cache, the admin's identities and nonces, the local and sim providers' state, the Proxmox VMID mark,
and the ``file://`` object store. It decides nothing about what may be written where.

Temp files are named ``<temp_prefix><name>.<7 random hex digits>`` (``TEMP_NAME_EXTRA`` bytes longer
than the name plus the prefix, as much as the process id the agent once used), created exclusively, so
two writers of one path never share a temp file.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from datetime import datetime
from pathlib import Path

TEMP_PREFIX = ".nstance-tmp-"
#: How many bytes the random suffix adds to a temp file's name (``.`` and 7 hex digits).
TEMP_NAME_EXTRA = 8


def ensure_dir(path: Path, mode: int = 0o750) -> None:
    """Create ``path`` and missing parents with ``mode`` (existing directories are left as they are)."""
    if path.is_dir():
        return
    ensure_dir(path.parent, mode)
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=mode)
        os.chmod(path, mode)  # mkdir's mode is filtered by the umask


def directory_problem(path: Path, exc: OSError) -> str:
    """Why creating directory ``path`` failed with ``exc``, said plainly: "is not a directory" when a
    file has its name, else the system's reason (a parent that is a file, no permission)."""
    if path.exists() and not path.is_dir():
        return "is not a directory"
    return exc.strerror or str(exc)


def fsync_dir(path: Path) -> None:
    """Make a rename or create inside directory ``path`` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(
    path: Path,
    data: bytes,
    *,
    mode: int = 0o600,
    dir_mode: int | None = 0o750,
    mtime: datetime | None = None,
    temp_prefix: str = TEMP_PREFIX,
    name_temp: bool = True,
    create_only: bool = False,
    make_parents: bool = True,
) -> None:
    """Replace ``path`` with ``data``, permissions ``mode`` (and modification time ``mtime`` when given).

    Missing parent directories are created with ``dir_mode``, or with the process's default mode when
    it is None; ``make_parents=False`` is for a caller that made them (each check is a system call).
    ``name_temp=False`` leaves the file's name out of the temp name (``<temp_prefix><16 hex>``), for a
    caller whose names may use all of NAME_MAX. ``create_only=True`` publishes with a hard link
    instead of a rename, so an existing ``path`` is never replaced, whoever wrote it and whatever lock
    they hold: FileExistsError then (and the OSError of a file system without hard links, for the
    caller to handle). On any failure the temp file is removed and ``path`` is left as it was.
    """
    if make_parents:
        if dir_mode is None:
            path.parent.mkdir(parents=True, exist_ok=True)
        else:
            ensure_dir(path.parent, dir_mode)
    suffix = f"{path.name}.{secrets.token_hex(4)[:7]}" if name_temp else secrets.token_hex(8)
    tmp = path.with_name(temp_prefix + suffix)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fchmod(fd, mode)  # the create mode is filtered by the umask
            os.fsync(fd)
        finally:
            os.close(fd)
        if mtime is not None:
            stamp = mtime.timestamp()
            os.utime(tmp, (stamp, stamp))
        if create_only:
            os.link(tmp, path)
            tmp.unlink()
        else:
            os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    fsync_dir(path.parent)
