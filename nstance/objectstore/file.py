"""The ``file://DIR`` object store: the embedded default, with real conditional-write semantics.

Each key is one file under the root directory (``shard/a/leader.json`` -> ``ROOT/shard/a/leader.json``).
Writes are atomic and durable: the bytes go to a temporary file in the target's own directory, which
is fsynced, renamed over the target with ``os.replace`` and followed by an fsync of the directory.
Readers therefore see the old or the new content, never a mix, and a crash leaves at most an orphaned
temporary file, which no read or listing ever shows.

Every write and delete runs under two exclusive ``fcntl.flock`` locks, always taken in this order, so
that neither servers of this project nor upstream's Go servers sharing the directory can interleave
with a read-compare-write:

1. one of ``LOCK_STRIPES`` lock files in ``ROOT/.nstance-locks/`` (``stripe-NN.lock``, chosen by a
   hash of the key): what earlier versions of this store take, so they and this one exclude each
   other during an upgrade. There are never more than ``LOCK_STRIPES`` of them;
2. upstream's per-key lock, ``<real path of ROOT>.locks/<md5 hex of the key>.lock`` (a directory
   *beside* the root, created with mode 0700 when first needed; lock files 0600): the one lock a Go
   server takes around its ``PutIfMatch``. The root's real path (symlinks resolved, ``..`` removed)
   names it, as Go's does, so both name the same file whatever path each was given. Like Go, these
   files are never deleted: one per key ever written stays behind.

Go holds one lock at a time and this store always takes the stripe first, so no wait cycle can form.
flock locks belong to an open file description: they exclude other threads of this process as well as
other processes on the same host. Lock files are never deleted while in use (deleting one that someone
waits on would break mutual exclusion); per-key lock files left in ``.nstance-locks`` by older versions
of this project (40 hex digits + ``.lock``) are removed when a store is opened. When the directory
beside the root cannot be created or used (its parent is read-only to this user), no Go server with
the same rights can be writing there either: the store logs one warning and relies on the stripes.

Create-only writes (``put_if_match(key, data, None)``) publish with ``os.link`` of a fsynced temporary
file, which fails when the key exists, so they are atomic even against a writer that takes no lock at
all (a Go server's plain ``Put``); file systems without hard links fall back to check-then-replace
under the locks.

ETags are ``content_etag`` (quoted MD5 of the content), the same as the memory backend and as S3 for
plain puts. For objects of at least ``KNOWN_MIN_BYTES`` (a shard's ``groups.jsonc`` with thousands of
groups) the store remembers the last content it read or wrote at a few keys with its ETag, and
reuses the ETag when the bytes it reads are equal to those, byte for byte: a conditional write then
hashes only the new content, not the current one as well. The new content of such an object is
hashed in a helper thread while this one takes the locks, compares and writes (MD5 and file I/O both
run without the GIL), so its ETag costs no time of its own: for a megabyte ``groups.jsonc`` the hash
took as long as the write (about 1 ms each), one after the other, on the way from an UpsertGroup to
the create it causes.

Names that begin with ``.nstance-`` are reserved for the lock directory and temporary files (ours are
``.nstance-tmp-*``, a Go server's ``.nstance-create-*``, ``.nstance-update-*`` and ``.nstance-put-*``);
no listing shows them and keys using them are refused, as are keys that could escape the root or
alias another key (empty, absolute, ``.``/``..`` or empty segments, backslashes, NUL).
``validate_key`` applies the same rules on every backend that wants keys to stay portable to this one.

This module must not be used on network file systems without working flock, must not follow keys
outside the root, and caches no content: every read goes to the file system. POSIX only.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import fcntl
import hashlib
import logging
import os
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

from nstance.core.atomicfile import directory_problem, fsync_dir, write_atomic
from nstance.core.errors import InvalidArgument
from nstance.objectstore.base import ObjectInfo, ObjectNotFound, PreconditionFailed
from nstance.objectstore.memory import content_etag

RESERVED_PREFIX = ".nstance-"
"""File and key-segment names starting with this belong to the store itself."""

MAX_KEY_BYTES = 1024
"""S3's limit on key length (UTF-8 bytes); applied everywhere so keys stay portable."""

LOCK_STRIPES = 64
"""How many lock files guard all keys (keys share them by hash)."""

READ_CHUNK = 64 * 1024
"""Bytes asked for by a read's first ``read`` call (an instance record takes that one and one more that
finds the end; a larger object asks for the rest at once). Below glibc's threshold for a buffer of its
own mapping, which would cost two more system calls."""

KNOWN_MIN_BYTES = 64 * 1024
"""Objects at least this large have their last seen content's ETag remembered (see ``_etag``)."""

KNOWN_KEYS = 8
"""How many such objects are remembered at once (the oldest is forgotten first)."""

_HASHER = ThreadPoolExecutor(max_workers=2, thread_name_prefix="nstance-etag")
"""Hashes the new content of large objects while their write runs (see the module docstring)."""

GO_LOCK_DIR_SUFFIX = ".locks"
"""Upstream's per-key lock directory is the root's real path with this appended (``/data`` ->
``/data.locks``)."""

_LOCK_DIR = RESERVED_PREFIX + "locks"
_TMP_PREFIX = RESERVED_PREFIX + "tmp-"
_HEX = frozenset("0123456789abcdef")
_NO_HARD_LINKS = frozenset({errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS})

log = logging.getLogger(__name__)


def go_lock_dir(root: Path | str) -> Path:
    """Where upstream's Go server keeps the per-key locks of a store rooted at ``root`` (which must
    exist): its real path plus ``GO_LOCK_DIR_SUFFIX``."""
    return Path(os.path.realpath(root) + GO_LOCK_DIR_SUFFIX)


def go_lock_name(key: str) -> str:
    """The name of upstream's lock file for ``key``: the MD5 of the key's bytes in hex, ``.lock``."""
    digest = hashlib.md5(key.encode("utf-8", "surrogatepass"), usedforsecurity=False).hexdigest()
    return digest + ".lock"


def validate_key(key: str) -> str:
    """Return ``key`` if it is a portable object key, else raise InvalidArgument saying why."""
    if not key:
        raise InvalidArgument("object key must not be empty")
    if "\x00" in key:
        raise InvalidArgument(f"object key {key!r} must not contain NUL")
    if "\\" in key:
        raise InvalidArgument(f"object key {key!r} must not contain backslashes")
    if key.startswith("/"):
        raise InvalidArgument(f"object key {key!r} must be relative (no leading '/')")
    if len(key.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES:
        raise InvalidArgument(f"object key is longer than {MAX_KEY_BYTES} bytes")
    for segment in key.split("/"):
        if segment == "":
            raise InvalidArgument(f"object key {key!r} has an empty path segment")
        if segment in (".", ".."):
            raise InvalidArgument(f"object key {key!r} must not contain '.' or '..' segments")
        if segment.startswith(RESERVED_PREFIX):
            raise InvalidArgument(f"object key {key!r} uses the reserved name prefix {RESERVED_PREFIX!r}")
    return key


class FileObjectStore:
    """Objects as files under ``root``; see the module docstring for the guarantees."""

    #: Bulk readers (the cache rebuild) run two threads here, not one per slow request as for a
    #: remote store: a local read is mostly Python work under the GIL, and more threads only took the
    #: GIL from the event loop (bench/takeover_scale.py, docs/benchmarks.md).
    reader_threads = 2

    #: Calls wait on local files, not on a network: a caller with many small writes makes them one
    #: after another in one thread rather than each in its own (``records.is_local``).
    local = True

    def __init__(self, root: Path | str) -> None:
        self._root = Path(root).expanduser().absolute()
        self._locks = self._root / _LOCK_DIR
        try:
            self._root.mkdir(parents=True, exist_ok=True)
            self._locks.mkdir(exist_ok=True)
        except OSError as exc:  # a file of that name, a parent that is a file, no permission
            raise InvalidArgument(f"storage directory {root}: {directory_problem(self._root, exc)}") from None
        self._go_locks = go_lock_dir(self._root)
        self._go_locks_unusable = False
        self._remove_legacy_locks()
        self._known: dict[str, tuple[bytes, str]] = {}
        self._known_lock = threading.Lock()

    @property
    def root(self) -> Path:
        """The directory holding the objects."""
        return self._root

    def close(self) -> None:
        """Nothing to release (no descriptors are held between calls); here for symmetry with S3."""

    def __repr__(self) -> str:
        return f"FileObjectStore({str(self._root)!r})"

    # -- reads ---------------------------------------------------------------------------------

    def get(self, key: str) -> tuple[bytes, str]:
        data = self._read(self._path(key))
        if data is None:
            raise ObjectNotFound(f"object {key!r} not found")
        return data, self._etag(key, data)

    def head(self, key: str) -> ObjectInfo:
        path = self._path(key)
        try:
            with open(path, "rb") as f:
                st = os.fstat(f.fileno())
                data = f.read()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise ObjectNotFound(f"object {key!r} not found") from None
        return ObjectInfo(
            key=key,
            etag=self._etag(key, data),
            size=len(data),
            last_modified=datetime.fromtimestamp(st.st_mtime, UTC),
        )

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    # -- writes --------------------------------------------------------------------------------

    def put(self, key: str, data: bytes) -> str:
        path = self._path(key)
        new_etag = self._new_etag(data)
        with self._locked(key):
            self._write_atomic(key, path, data)
        return self._written(key, data, new_etag)

    def put_if_match(self, key: str, data: bytes, etag: str | None) -> str:
        path = self._path(key)
        new_etag = self._new_etag(data)
        with self._locked(key):
            if etag is None:
                self._create(key, path, data)
            else:
                current = self._read(path)
                if current is None or self._etag(key, current) != etag:
                    raise PreconditionFailed(f"object {key!r} changed (etag mismatch)")
                self._write_atomic(key, path, data)
        return self._written(key, data, new_etag)

    def delete(self, key: str, if_match: str | None = None) -> None:
        path = self._path(key)
        with self._locked(key):
            if if_match is not None:
                current = self._read(path)
                if current is None:
                    raise ObjectNotFound(f"object {key!r} not found")
                if self._etag(key, current) != if_match:
                    raise PreconditionFailed(f"object {key!r} changed (etag mismatch)")
            try:
                os.unlink(path)
            except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
                return  # absent (or only a "directory" of other keys): nothing to delete
            fsync_dir(path.parent)

    # -- listing -------------------------------------------------------------------------------

    def list(self, prefix: str = "") -> list[str]:
        found: list[str] = []
        self._walk(str(self._root), "", prefix, found)
        found.sort()
        return found

    # -- internals -----------------------------------------------------------------------------

    def _walk(self, dirpath: str, key_prefix: str, prefix: str, found: builtins.list[str]) -> None:
        try:
            entries = os.scandir(dirpath)
        except (FileNotFoundError, NotADirectoryError):
            return  # removed while we walked
        with entries:
            for entry in entries:
                if entry.name.startswith(RESERVED_PREFIX):
                    continue  # lock directory, temporary files (including a crash's leftovers)
                key = key_prefix + entry.name
                if entry.is_dir(follow_symlinks=False):
                    sub = key + "/"
                    # Descend only where keys starting with ``prefix`` can live.
                    if sub.startswith(prefix) or prefix.startswith(sub):
                        self._walk(entry.path, sub, prefix, found)
                elif entry.is_file(follow_symlinks=False) and key.startswith(prefix):
                    found.append(key)

    def _etag(self, key: str, data: bytes) -> str:
        """``content_etag(data)``; for a large object, not hashed again if ``data`` equals the content
        last read or written at ``key`` (the bytes are compared, so a changed object is always hashed)."""
        if len(data) < KNOWN_MIN_BYTES:
            return content_etag(data)
        with self._known_lock:
            known = self._known.get(key)
        if known is not None and known[0] == data:
            return known[1]
        return self._remember(key, data, content_etag(data))

    def _remember(self, key: str, data: bytes, etag: str) -> str:
        """Note ``etag`` as the ETag of ``data`` at ``key`` (the oldest of ``KNOWN_KEYS`` is forgotten)."""
        with self._known_lock:
            self._known.pop(key, None)
            self._known[key] = (data, etag)
            while len(self._known) > KNOWN_KEYS:
                del self._known[next(iter(self._known))]
        return etag

    @staticmethod
    def _new_etag(data: bytes) -> Future[str] | None:
        """For a large object, its ETag being computed in a helper thread (None for a small one)."""
        if len(data) < KNOWN_MIN_BYTES:
            return None
        return _HASHER.submit(content_etag, data)

    def _written(self, key: str, data: bytes, new_etag: Future[str] | None) -> str:
        """The ETag of ``data``, just written at ``key`` (``new_etag``: from ``_new_etag``), remembered."""
        if new_etag is None:
            return content_etag(data)
        return self._remember(key, data, new_etag.result())

    def _path(self, key: str) -> Path:
        validate_key(key)
        return self._root.joinpath(*key.split("/"))

    @staticmethod
    def _read(path: Path) -> bytes | None:
        """The file's bytes, or None if there is none (a key that is only a prefix of others included).

        Plain descriptor calls: ``open()`` adds five system calls (stats, a terminal check, seeks) to
        the four a small object needs here, and each gives the GIL away (``docs/benchmarks.md``).
        """
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError):
            return None
        try:
            chunks = [os.read(fd, READ_CHUNK)]
            if len(chunks[0]) == READ_CHUNK:  # a large object: the rest in one call
                chunks.append(os.read(fd, max(1, os.fstat(fd).st_size - READ_CHUNK + 1)))
            while chunks[-1]:  # until a read finds the end
                chunks.append(os.read(fd, READ_CHUNK))
        except IsADirectoryError:
            return None
        finally:
            os.close(fd)
        return b"".join(chunks)

    def _remove_legacy_locks(self) -> None:
        """Delete the one-per-key lock files of older versions (``<40 hex digits>.lock``)."""
        with contextlib.suppress(OSError), os.scandir(self._locks) as entries:
            for entry in entries:
                stem = entry.name.removesuffix(".lock")
                if len(stem) == 40 and entry.name.endswith(".lock") and all(c in _HEX for c in stem):
                    with contextlib.suppress(OSError):
                        os.unlink(entry.path)

    @contextlib.contextmanager
    def _locked(self, key: str) -> Iterator[None]:
        """Hold this project's stripe lock, then upstream's per-key lock (see the module docstring)."""
        digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()
        name = f"stripe-{int.from_bytes(digest[:4], 'big') % LOCK_STRIPES:02d}.lock"
        try:
            stripe = os.open(self._locks / name, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except FileNotFoundError:  # someone removed the lock directory; recreate it
            self._locks.mkdir(exist_ok=True)
            stripe = os.open(self._locks / name, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(stripe, fcntl.LOCK_EX)  # blocks without holding the GIL
            per_key = self._open_go_lock(key)
            try:
                if per_key is not None:
                    fcntl.flock(per_key, fcntl.LOCK_EX)
                yield
            finally:
                if per_key is not None:
                    os.close(per_key)
        finally:
            os.close(stripe)  # closing a descriptor releases its lock

    def _open_go_lock(self, key: str) -> int | None:
        """A descriptor on upstream's lock file for ``key``, or None if its directory is unusable."""
        if self._go_locks_unusable:
            return None
        path = self._go_locks / go_lock_name(key)
        flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC
        try:
            try:
                return os.open(path, flags, 0o600)
            except FileNotFoundError:
                os.makedirs(self._go_locks, mode=0o700, exist_ok=True)
                return os.open(path, flags, 0o600)
        except OSError as exc:
            if exc.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
                raise
            self._go_locks_unusable = True
            log.warning(
                "cannot use %s for upstream's per-key locks (%s); conditional writes to %s exclude "
                "other servers of this project but not a Go nstance-server sharing the directory",
                self._go_locks,
                exc.strerror,
                self._root,
            )
            return None

    def _create(self, key: str, path: Path, data: bytes) -> None:
        """Publish ``data`` at ``path`` only if nothing is there (PreconditionFailed otherwise), with
        ``os.link`` of a fsynced temporary file, so even a writer that takes no lock cannot be
        overwritten."""
        try:
            self._write_atomic(key, path, data, create_only=True)
        except FileExistsError:
            raise PreconditionFailed(f"object {key!r} already exists") from None
        except OSError as exc:
            if exc.errno not in _NO_HARD_LINKS:
                raise
            self._create_without_links(key, path, data)

    def _create_without_links(self, key: str, path: Path, data: bytes) -> None:
        """Create-only for a file system without hard links: check, then replace, under the locks."""
        if path.exists():
            raise PreconditionFailed(f"object {key!r} already exists")
        self._write_atomic(key, path, data)

    def _ensure_dir(self, key: str, directory: Path) -> None:
        if directory.is_dir():
            return
        missing: list[Path] = []
        probe = directory
        while not probe.exists():
            missing.append(probe)
            probe = probe.parent
        if not probe.is_dir():
            raise InvalidArgument(f"object key {key!r} lies under existing object {self._key_of(probe)!r}")
        for new_dir in reversed(missing):
            try:
                new_dir.mkdir()
            except FileExistsError:
                if not new_dir.is_dir():
                    raise InvalidArgument(
                        f"object key {key!r} lies under existing object {self._key_of(new_dir)!r}"
                    ) from None
                continue  # created concurrently by another writer
            fsync_dir(new_dir.parent)

    def _key_of(self, path: Path) -> str:
        return path.relative_to(self._root).as_posix()

    def _write_atomic(self, key: str, path: Path, data: bytes, *, create_only: bool = False) -> None:
        directory = path.parent
        self._ensure_dir(key, directory)
        if path.is_dir():
            raise InvalidArgument(f"object key {key!r} is a prefix of other keys and cannot hold data")
        try:
            write_atomic(
                path,
                data,
                dir_mode=None,
                make_parents=False,  # _ensure_dir made them
                temp_prefix=_TMP_PREFIX,
                name_temp=False,
                create_only=create_only,
            )
        except OSError as exc:
            if exc.errno == errno.ENAMETOOLONG:
                raise InvalidArgument(
                    f"object key {key!r} has a segment too long for the file system"
                ) from exc
            raise
