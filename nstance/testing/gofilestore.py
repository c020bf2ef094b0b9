"""A stand-in for upstream's Go ``FileStorage`` (internal/server/storage/file.go), for racing tests.

Written in Python from what the Go server does on disk, not from our store's code, so a test can check
that our ``file://`` store and a Go server sharing one directory exclude each other:

* the base directory is created (mode 0755), then normalised: symlinks resolved, made absolute;
* an object's ETag is the lowercase hex MD5 of its bytes, unquoted;
* ``put_if_match`` creates the object's directory (0755), then holds an exclusive BSD ``flock`` on
  ``<base>.locks/<hex MD5 of the key>.lock`` (directory 0700, file 0600, both created when missing)
  for the whole read-compare-write, and nothing else;
* create-only (empty ETag): a temporary file ``.nstance-create-<random>`` in the object's directory,
  mode 0644, written and closed (not fsynced), hard-linked to the object's path (an existing object
  makes the link fail: precondition failed), then removed;
* update: the current bytes are read and hashed; a different ETag (or no object) is a precondition
  failure; otherwise a temporary file ``.nstance-update-<random>`` (0644) is written, fsynced, closed
  and renamed over the object.

Only what the race tests need is here.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import secrets


class GoPreconditionFailed(Exception):
    """What Go's ``ErrPrecondition`` stands for."""


class GoFileStorage:
    """Upstream's conditional writes on a base directory, as a Go server performs them."""

    def __init__(self, base_dir: str) -> None:
        os.makedirs(base_dir, mode=0o755, exist_ok=True)
        self.base_dir = os.path.abspath(os.path.realpath(base_dir))

    def lock_path(self, key: str) -> str:
        digest = hashlib.md5(key.encode(), usedforsecurity=False).hexdigest()
        return os.path.join(self.base_dir + ".locks", digest + ".lock")

    def get(self, key: str) -> tuple[bytes, str]:
        with open(os.path.join(self.base_dir, key), "rb") as f:
            data = f.read()
        return data, hashlib.md5(data, usedforsecurity=False).hexdigest()

    def put_if_match(self, key: str, data: bytes, etag: str) -> None:
        path = os.path.join(self.base_dir, key)
        directory = os.path.dirname(path)
        os.makedirs(directory, mode=0o755, exist_ok=True)
        lock_path = self.lock_path(key)
        os.makedirs(os.path.dirname(lock_path), mode=0o700, exist_ok=True)
        fd = os.open(lock_path, os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if etag == "":
                self._create(directory, path, data)
            else:
                self._update(directory, path, data, etag)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    @staticmethod
    def _temp(directory: str, prefix: str, data: bytes, *, sync: bool) -> str:
        temp = os.path.join(directory, prefix + str(secrets.randbelow(10**10)))
        fd = os.open(temp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        try:
            os.fchmod(fd, 0o644)
            os.write(fd, data)
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        return temp

    def _create(self, directory: str, path: str, data: bytes) -> None:
        temp = self._temp(directory, ".nstance-create-", data, sync=False)
        try:
            os.link(temp, path)
        except FileExistsError:
            raise GoPreconditionFailed(path) from None
        finally:
            os.remove(temp)

    def _update(self, directory: str, path: str, data: bytes, etag: str) -> None:
        try:
            with open(path, "rb") as f:
                current = hashlib.md5(f.read(), usedforsecurity=False).hexdigest()
        except FileNotFoundError:
            current = ""
        if current != etag:
            raise GoPreconditionFailed(path)
        temp = self._temp(directory, ".nstance-update-", data, sync=True)
        try:
            os.rename(temp, path)
        except BaseException:
            os.remove(temp)
            raise
