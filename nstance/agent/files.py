"""Files the server pushes on ReceiveFiles: validate, stage, and write them on commit.

Responsible for the receive directory: which names are acceptable (a clean relative path that stays
inside RECV_DIR), which contents are acceptable (by extension, as upstream), staging deliveries until
a commit message, writing them atomically on commit followed by ``identity/config.hash`` and the
completion marker ``RECV_DIR/write-files.last`` (the commit's time in Unix milliseconds, as upstream's
agent writes it: what watchers on the machine wait for before they apply the files), and the
per-file status the health report carries. The validators are pure functions; ``FileReceiver`` does
the disk I/O. Nothing here speaks gRPC (streams.py converts messages) or writes outside RECV_DIR and
the config.hash file.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization

from nstance.core.atomicfile import TEMP_NAME_EXTRA, TEMP_PREFIX, write_atomic
from nstance.core.errors import InvalidArgument

log = logging.getLogger("nstance.agent.files")

MAX_NAME_LENGTH = 255 * 4
#: Written into RECV_DIR after every applied commit (upstream's name); no pushed file may take it.
COMPLETION_MARKER = "write-files.last"
#: Longest path component, in UTF-8 bytes: NAME_MAX (255) less what the temporary file adds around it
#: (``TEMP_PREFIX`` and a random suffix), so a name that validates can also be written.
MAX_COMPONENT_BYTES = 255 - len(TEMP_PREFIX) - TEMP_NAME_EXTRA
_ENV_KEY = re.compile(r"[A-Z0-9_]+")
_PEM_BEGIN = re.compile(rb"-----BEGIN ([A-Z0-9 ]+)-----")


# --- pure validation -------------------------------------------------------------------------------


def validate_file_name(name: str) -> str:
    """Return ``name`` if it is a clean relative path; raise InvalidArgument saying what is wrong.

    Refused: empty names, names longer than MAX_NAME_LENGTH characters or with a component longer
    than MAX_COMPONENT_BYTES, NUL, backslashes, absolute paths, ``..`` or ``.`` components, empty
    components (``a//b``, trailing ``/``), and names of our temporary files. The length is checked
    first, so no message quotes more than MAX_NAME_LENGTH characters of a name.
    """
    if not name:
        raise InvalidArgument("file name is empty")
    if len(name) > MAX_NAME_LENGTH:
        raise InvalidArgument(f"file name is longer than {MAX_NAME_LENGTH} characters")
    if "\x00" in name:
        raise InvalidArgument("file name contains a NUL character")
    if "\\" in name:
        raise InvalidArgument(f"file name {name!r} contains a backslash; use '/' between directories")
    if name.startswith("/"):
        raise InvalidArgument(f"file name {name!r} is absolute; names are relative to the receive directory")
    parts = name.split("/")
    if any(len(part.encode("utf-8", "surrogatepass")) > MAX_COMPONENT_BYTES for part in parts):
        raise InvalidArgument(
            f"file name {name[:64]!r}... has a component longer than {MAX_COMPONENT_BYTES} bytes"
        )
    if ".." in parts:
        raise InvalidArgument(f"file name {name!r} contains '..'; it must stay inside the receive directory")
    if any(part in ("", ".") for part in parts):
        raise InvalidArgument(f"file name {name!r} is not a clean path (empty or '.' component)")
    if parts[-1].startswith(TEMP_PREFIX):
        raise InvalidArgument(f"file name {name!r} uses the agent's temporary-file prefix")
    if name == COMPLETION_MARKER:
        raise InvalidArgument(f"file name {name!r} is the agent's completion marker")
    return name


def _pem_types(content: bytes) -> list[str]:
    return [m.group(1).decode("ascii") for m in _PEM_BEGIN.finditer(content)]


def validate_file_content(name: str, content: bytes) -> None:
    """Check ``content`` by the extension of ``name``; raise InvalidArgument when it does not fit.

    ``.crt`` one or more PEM certificates, ``.key`` a PEM ``PRIVATE KEY`` (PKCS#8), ``.pub`` a PEM
    ``PUBLIC KEY``, ``.json`` valid JSON, ``.env`` ``KEY=value`` lines (KEY ``[A-Z0-9_]+``, ``#``
    comments and blank lines allowed). Other extensions are accepted as they are.
    """
    suffix = name.rsplit("/", 1)[-1].rpartition(".")[2].lower() if "." in name.rsplit("/", 1)[-1] else ""
    if suffix == "crt":
        types = _pem_types(content)
        if not types or any(t != "CERTIFICATE" for t in types):
            raise InvalidArgument(f"{name}: expected PEM CERTIFICATE blocks, found {types or 'no PEM'}")
        try:
            x509.load_pem_x509_certificates(content)
        except ValueError as exc:
            raise InvalidArgument(f"{name}: certificate does not parse: {exc}") from exc
    elif suffix == "key":
        types = _pem_types(content)
        if types != ["PRIVATE KEY"]:
            raise InvalidArgument(
                f"{name}: expected one PEM PRIVATE KEY (PKCS#8) block, found {types or 'no PEM'}"
            )
        try:
            serialization.load_pem_private_key(content, password=None)
        except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
            raise InvalidArgument(f"{name}: private key does not parse: {exc}") from exc
    elif suffix == "pub":
        types = _pem_types(content)
        if types != ["PUBLIC KEY"]:
            raise InvalidArgument(f"{name}: expected one PEM PUBLIC KEY block, found {types or 'no PEM'}")
        try:
            serialization.load_pem_public_key(content)
        except (ValueError, UnsupportedAlgorithm) as exc:
            raise InvalidArgument(f"{name}: public key does not parse: {exc}") from exc
    elif suffix == "json":
        try:
            json.loads(content.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise InvalidArgument(f"{name}: not valid JSON: {exc}") from exc
    elif suffix == "env":
        try:
            text = content.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidArgument(f"{name}: not UTF-8 text: {exc}") from exc
        for number, line in enumerate(text.splitlines(), start=1):
            stripped = line.strip()
            if not stripped or stripped.startswith("#"):
                continue
            key, sep, _ = stripped.partition("=")
            if not sep or not _ENV_KEY.fullmatch(key):
                raise InvalidArgument(f"{name}: line {number} is not KEY=value with KEY of [A-Z0-9_]+")


# --- staging and writing ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Delivery:
    """One FileTransfer message, without the wire types."""

    filename: str
    content: bytes = b""
    last_modified: datetime | None = None
    config_hash: str = ""

    @property
    def is_commit(self) -> bool:
        return not self.filename and bool(self.config_hash)


@dataclass(frozen=True, slots=True)
class FileState:
    """What the health report says about one file: modified time, an error, or neither (missing)."""

    last_modified: datetime | None = None
    error: str | None = None


@dataclass(slots=True)
class CommitResult:
    """What a commit did."""

    written: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    config_hash_written: bool = False


class FileReceiver:
    """Stages deliveries and writes them into ``recv_dir`` when a commit arrives."""

    def __init__(
        self,
        recv_dir: Path,
        config_hash_path: Path,
        *,
        mode: int = 0o640,
        dir_mode: int = 0o750,
        hash_mode: int = 0o600,
        on_commit: Callable[[str], None] | None = None,
    ) -> None:
        self._recv_dir = recv_dir
        self._config_hash_path = config_hash_path
        self._mode = mode
        self._dir_mode = dir_mode
        self._hash_mode = hash_mode
        self._on_commit = on_commit
        self._staged: dict[str, Delivery] = {}
        self._errors: dict[str, str] = {}
        self._known: set[str] = set()
        self._lock = threading.RLock()  # receive() may run in a worker thread while a report is built

    @property
    def staged(self) -> list[str]:
        with self._lock:
            return sorted(self._staged)

    def _target(self, name: str) -> Path:
        root = self._recv_dir.resolve()
        target = (self._recv_dir / name).resolve()
        if not target.is_relative_to(root) or target == root:
            raise InvalidArgument(f"file name {name!r} resolves outside the receive directory")
        return target

    def receive(self, delivery: Delivery) -> CommitResult | None:
        """Stage a file, or commit the staged ones; returns the commit result for a commit message.

        A file that fails validation is not staged; its error is kept for the health report. A file
        that carries a config hash (older Go servers send no commit) is committed at once with it.
        """
        with self._lock:
            return self._receive(delivery)

    def _receive(self, delivery: Delivery) -> CommitResult | None:
        if delivery.is_commit:
            return self.commit(delivery.config_hash)
        if not delivery.filename:
            log.warning("ignoring a file delivery with neither a file name nor a config hash")
            return None
        try:
            validate_file_name(delivery.filename)
            self._target(delivery.filename)
            validate_file_content(delivery.filename, delivery.content)
        except InvalidArgument as exc:
            log.warning("refused file %r: %s", delivery.filename, exc)
            self._errors[delivery.filename] = str(exc)
            self._staged.pop(delivery.filename, None)
        else:
            self._staged[delivery.filename] = delivery
        if delivery.config_hash:
            # Go servers before the commit message sent every file with the group's hash and never a
            # commit; their agent wrote each file and the hash at once. Such a file is its own patch.
            return self._commit(delivery.config_hash)
        return None

    def commit(self, config_hash: str) -> CommitResult:
        """Write every staged file atomically, then ``config.hash`` (only when all writes succeeded)."""
        with self._lock:
            return self._commit(config_hash)

    def _commit(self, config_hash: str) -> CommitResult:
        result = CommitResult()
        staged, self._staged = self._staged, {}
        for name, delivery in sorted(staged.items()):
            try:
                target = self._target(name)
                write_atomic(
                    target,
                    delivery.content,
                    mode=self._mode,
                    dir_mode=self._dir_mode,
                    mtime=delivery.last_modified,
                )
            except (OSError, InvalidArgument) as exc:
                message = f"cannot write {name}: {exc}"
                log.error("%s", message)
                self._errors[name] = message
                result.failed[name] = message
                continue
            self._errors.pop(name, None)
            self._known.add(name)
            result.written.append(name)
        if result.failed:
            log.error(
                "config %s not applied: %d file(s) failed; config.hash left unchanged",
                config_hash,
                len(result.failed),
            )
            return result
        write_atomic(self._config_hash_path, config_hash.encode(), mode=self._hash_mode, dir_mode=0o700)
        result.config_hash_written = True
        # Last, as upstream's agent: a watcher that sees the marker change finds the files and the hash.
        stamp = str(int(datetime.now(UTC).timestamp() * 1000)).encode()
        write_atomic(self._recv_dir / COMPLETION_MARKER, stamp, mode=self._mode, dir_mode=self._dir_mode)
        log.info("applied config %s (%d file(s) written)", config_hash, len(result.written))
        if self._on_commit is not None:
            self._on_commit(config_hash)
        return result

    def statuses(self) -> dict[str, FileState]:
        """Every file in the receive directory, every file written this run, and every refused one."""
        with self._lock:
            return self._statuses()

    def _statuses(self) -> dict[str, FileState]:
        out: dict[str, FileState] = {}
        root = self._recv_dir
        names = set(self._known)
        if root.is_dir():
            for path in root.rglob("*"):
                if path.is_file() and not path.name.startswith(TEMP_PREFIX):
                    names.add(path.relative_to(root).as_posix())
            names.discard(COMPLETION_MARKER)  # the agent's own file, not one the server pushed
        for name in names:
            try:
                stamp = (root / name).stat().st_mtime
            except OSError:
                out[name] = FileState()
                continue
            out[name] = FileState(last_modified=datetime.fromtimestamp(stamp, UTC))
        for name, error in self._errors.items():
            out[name] = FileState(error=error)
        return out
