"""The ``local`` provider: every instance is an ``nstance-agent`` process on this machine.

An instance lives in ``{base_dir}/{instance_id}/``: ``userdata`` (the rendered bytes),
``identity/nonce.jwt`` and ``identity/ca.crt`` (the agent's bootstrap identity), ``instance.json``
(who it is, where its server is, its pid and status) and ``agent.log`` (the agent's stdout and
stderr). Files are mode 0600 and directories 0700. The agent runs as
``python -m nstance.agent --instance-dir DIR`` in its own session (process group), so a delete can
signal everything it started and a Ctrl-C in the server's terminal does not reach it.

The directories are the provider's state, so a restarted server sees the same instances: a process
counts as running only when ``os.kill(pid, 0)`` succeeds *and* ``/proc/{pid}/cmdline`` names the
instance directory (defence against pid reuse; without ``/proc`` the first check alone decides). A dead
process reads as ``stopped``. Delete marks ``instance.json`` deleted first (so a crash mid-delete reads
as ``deleting`` and the next delete finishes the job), sends SIGTERM to the process group, waits up to
``stop_timeout`` seconds, then SIGKILL. It then removes the userdata and identity files but keeps
``instance.json`` and ``agent.log`` as a tombstone for ``deleted_retention`` seconds (default one hour,
like EC2's terminated instances): ``get_instance`` reports ``deleted``, a retried create with the same
idempotency token returns the deleted VM instead of launching again, and the log stays readable. Older
tombstones are removed when the directory is next scanned. Deleted instances never appear in
``list_instances``.

Waiting for a process to exit uses real time (``time.monotonic`` and ``asyncio.sleep``), because real
processes do not follow an injected clock; the injected clock dates records and tombstones. This module
must not decide whether to create or delete, and must never signal a process it cannot prove it started.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import nstance
from nstance.core.atomicfile import write_atomic
from nstance.core.clock import Clock
from nstance.providers import options as opt
from nstance.providers.base import (
    CreateRequest,
    InstanceNotFound,
    InstanceStatus,
    ProviderInstance,
    ProviderInvalidRequest,
    ProviderUnavailable,
)

PROVIDER_ID_PREFIX = "local-"
INSTANCE_FILE = "instance.json"
LOG_FILE = "agent.log"
OPTION_KEYS: tuple[str, ...] = ("instances_dir", "stop_instances_on_close")

_SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_POLL_INTERVAL = 0.02
_KILL_WAIT = 5.0

#: Agent processes started by any LocalProvider in this process and not yet reaped, pid -> instance
#: directory. Only these are ever reaped with waitpid (we never steal another child's exit status), and
#: while a pid is here it cannot have been reused, so it is known to be that directory's agent even
#: while it is starting or exiting (when /proc/{pid}/cmdline is briefly empty).
_SPAWNED: dict[int, str] = {}


@dataclass(slots=True)
class _Meta:
    """The contents of ``instance.json``."""

    instance_id: str
    provider_id: str
    idempotency_token: str
    cluster_id: str
    shard: str
    group: str
    kind: str
    instance_type: str
    subnet_id: str
    created_at: str
    server_registration_addr: str
    server_agent_addr: str
    pid: int | None
    status: str  # "pending" (not started yet), "running" (started), "deleted"
    deleted_at: str | None = None
    tenant: str = ""
    template: str = ""
    on_demand: bool = False


class LocalProvider:
    """VMs as local agent processes; see the module docstring."""

    def __init__(
        self,
        base_dir: Path,
        *,
        clock: Clock,
        stop_instances_on_close: bool = False,
        python: str = sys.executable,
        stop_timeout: float = 5.0,
        deleted_retention: float = 3600.0,
        zone: str = "",
    ) -> None:
        self._base_dir = Path(os.path.abspath(base_dir))
        self._clock = clock
        self._stop_on_close = stop_instances_on_close
        self._python = python
        self._stop_timeout = stop_timeout
        self._deleted_retention = timedelta(seconds=deleted_retention)
        self._zone = zone
        self._lock = asyncio.Lock()

    @property
    def kind(self) -> str:
        return "local"

    @property
    def base_dir(self) -> Path:
        """Where the instance directories live."""
        return self._base_dir

    def instance_dir(self, instance_id: str) -> Path:
        """The directory of one instance (it may not exist)."""
        return self._base_dir / _check_id(instance_id)

    # ---- the Provider protocol -------------------------------------------------------------

    async def create_instance(self, request: CreateRequest) -> ProviderInstance:
        _check_id(request.instance_id)
        async with self._lock:
            meta = self._find_replay(request)
            if meta is None:
                meta = self._prepare(request)
            if meta.status == "pending":
                self._spawn(meta)
            return self._to_instance(meta)

    async def delete_instance(self, instance_id: str, provider_id: str) -> None:
        instance_id = _resolve_id(instance_id, provider_id)
        async with self._lock:
            meta = self._read(instance_id)
            if meta is None:
                return
            if meta.status != "deleted":
                meta.status = "deleted"
                meta.deleted_at = self._clock.now().isoformat()
                self._write_meta(meta)
        # Not under the lock: other creates and deletes go on while this agent shuts down.
        await self._stop_process(meta)
        directory = self._base_dir / instance_id
        with contextlib.suppress(FileNotFoundError):
            (directory / "userdata").unlink()
        shutil.rmtree(directory / "identity", ignore_errors=True)

    async def get_instance(self, instance_id: str, provider_id: str) -> ProviderInstance:
        instance_id = _resolve_id(instance_id, provider_id)
        meta = self._read(instance_id)
        if meta is None or self._prune_if_old(meta):
            raise InstanceNotFound(f"local: no instance {instance_id} in {self._base_dir}")
        return self._to_instance(meta)

    async def list_instances(self, cluster_id: str, shard: str) -> list[ProviderInstance]:
        out: list[ProviderInstance] = []
        for meta in self._scan():
            if meta.cluster_id != cluster_id or meta.shard != shard:
                continue
            instance = self._to_instance(meta)
            if instance.status != InstanceStatus.DELETED:
                out.append(instance)
        return out

    async def check_subnet_capacity(self, subnet_id: str) -> bool:
        return True

    def running_agents(self) -> list[str]:
        """The instances in this directory (any cluster or shard) whose agent process is alive, by the
        rule the statuses follow (a recorded pid that is this instance's agent, not a reused one); for
        a caller that counts processes rather than asks about one instance."""
        return [m.instance_id for m in self._scan() if _alive(m.pid, self._base_dir / m.instance_id)]

    async def close(self) -> None:
        """Stop every instance when asked to at construction; always reap exited agent children."""
        if self._stop_on_close:
            metas = [m for m in self._scan() if m.pid is not None]
            await asyncio.gather(*(self._stop_process(m) for m in metas))
        _reap_exited()

    # ---- directory state -------------------------------------------------------------------

    def _find_replay(self, request: CreateRequest) -> _Meta | None:
        """The instance an earlier create with this token made, or None; refuse conflicting reuse."""
        meta = self._read(request.instance_id)
        if meta is not None:
            if request.idempotency_token and meta.idempotency_token == request.idempotency_token:
                return meta
            raise ProviderInvalidRequest(
                f"local: instance {request.instance_id} already exists in {self._base_dir}, created "
                "with another idempotency token (or none); retry with its original token or choose a "
                "new instance id"
            )
        if request.idempotency_token:
            for other in self._scan():
                if other.idempotency_token == request.idempotency_token:
                    raise ProviderInvalidRequest(
                        f"idempotency token {request.idempotency_token!r} was already used to create "
                        f"instance {other.instance_id}; a new instance needs a new token"
                    )
        return None

    def _prepare(self, request: CreateRequest) -> _Meta:
        directory = self._base_dir / request.instance_id
        try:
            _make_dir(self._base_dir)
            _make_dir(directory)
            _make_dir(directory / "identity")
            _write_private(directory / "userdata", request.userdata)
            _write_private(directory / "identity" / "nonce.jwt", request.nonce.encode("utf-8"))
            _write_private(directory / "identity" / "ca.crt", request.ca_pem)
        except OSError as exc:
            raise ProviderUnavailable(f"local: cannot prepare {directory}: {exc}") from exc
        meta = _Meta(
            instance_id=request.instance_id,
            provider_id=PROVIDER_ID_PREFIX + request.instance_id,
            idempotency_token=request.idempotency_token,
            cluster_id=request.cluster_id,
            shard=request.shard,
            group=request.group,
            kind=request.kind,
            instance_type=request.instance_type,
            subnet_id=request.subnet_id,
            created_at=self._clock.now().isoformat(),
            server_registration_addr=request.server_registration_addr,
            server_agent_addr=request.server_agent_addr,
            pid=None,
            status="pending",
            tenant=request.tenant,
            template=request.template,
            on_demand=request.on_demand,
        )
        self._write_meta(meta)
        return meta

    def _spawn(self, meta: _Meta) -> None:
        directory = self._base_dir / meta.instance_id
        env = dict(os.environ)
        # Run the same nstance the server runs, even when it is not installed.
        package_root = str(Path(os.path.abspath(nstance.__file__)).parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
        env.update(
            {
                "NSTANCE_INSTANCE_ID": meta.instance_id,
                "NSTANCE_INSTANCE_KIND": meta.kind,
                "NSTANCE_IDENTITY_DIR": str(directory / "identity"),
                "NSTANCE_SERVER_REGISTRATION_ADDR": meta.server_registration_addr,
                "NSTANCE_SERVER_AGENT_ADDR": meta.server_agent_addr,
            }
        )
        argv = [self._python, "-m", "nstance.agent", "--instance-dir", str(directory)]
        actions = [
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
            (
                os.POSIX_SPAWN_OPEN,
                1,
                str(directory / LOG_FILE),
                os.O_WRONLY | os.O_CREAT | os.O_APPEND,
                0o600,
            ),
            (os.POSIX_SPAWN_DUP2, 1, 2),
        ]
        try:
            pid = os.posix_spawnp(self._python, argv, env, file_actions=actions, setsid=True)
        except OSError as exc:
            raise ProviderUnavailable(f"local: cannot start the agent for {meta.instance_id}: {exc}") from exc
        _SPAWNED[pid] = str(directory)
        meta.pid = pid
        meta.status = "running"
        self._write_meta(meta)

    def _read(self, instance_id: str) -> _Meta | None:
        path = self._base_dir / instance_id / INSTANCE_FILE
        try:
            doc = json.loads(path.read_bytes())
            return _Meta(**doc)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError) as exc:
            raise ProviderUnavailable(f"local: cannot read {path}: {exc}") from exc

    def _scan(self) -> list[_Meta]:
        try:
            names = sorted(os.listdir(self._base_dir))
        except FileNotFoundError:
            return []
        out: list[_Meta] = []
        for name in names:
            if not _SAFE_ID.match(name) or not (self._base_dir / name).is_dir():
                continue
            try:
                meta = self._read(name)
            except ProviderUnavailable:
                continue  # a half-written or foreign directory: not an instance
            if meta is not None and not self._prune_if_old(meta):
                out.append(meta)
        return out

    def _prune_if_old(self, meta: _Meta) -> bool:
        """Remove a deleted instance's tombstone once its retention is over; True if removed."""
        if meta.status != "deleted" or meta.deleted_at is None:
            return False
        if self._clock.now() < datetime.fromisoformat(meta.deleted_at) + self._deleted_retention:
            return False
        if _alive(meta.pid, self._base_dir / meta.instance_id):
            return False  # a crash interrupted the delete; keep it visible as "deleting"
        shutil.rmtree(self._base_dir / meta.instance_id, ignore_errors=True)
        return True

    def _write_meta(self, meta: _Meta) -> None:
        path = self._base_dir / meta.instance_id / INSTANCE_FILE
        try:
            _write_private(path, json.dumps(asdict(meta), indent=1).encode("utf-8"))
        except OSError as exc:
            raise ProviderUnavailable(f"local: cannot write {path}: {exc}") from exc

    def _status(self, meta: _Meta) -> InstanceStatus:
        alive = _alive(meta.pid, self._base_dir / meta.instance_id)
        if meta.status == "deleted":
            return InstanceStatus.DELETING if alive else InstanceStatus.DELETED
        if meta.status == "pending":
            return InstanceStatus.PENDING
        return InstanceStatus.RUNNING if alive else InstanceStatus.STOPPED

    def _to_instance(self, meta: _Meta) -> ProviderInstance:
        return ProviderInstance(
            instance_id=meta.instance_id,
            provider_id=meta.provider_id,
            status=self._status(meta),
            cluster_id=meta.cluster_id,
            shard=meta.shard,
            group=meta.group,
            kind=meta.kind,
            tenant=meta.tenant,
            template=meta.template,
            on_demand=meta.on_demand,
            instance_type=meta.instance_type,
            subnet_id=meta.subnet_id,
            ip4="127.0.0.1",
            hostname=meta.instance_id,
            zone=self._zone,
            launched_at=datetime.fromisoformat(meta.created_at),
        )

    # ---- processes -------------------------------------------------------------------------

    async def _stop_process(self, meta: _Meta) -> None:
        """SIGTERM the agent's process group, SIGKILL it after ``stop_timeout``, reap it if ours."""
        pid = meta.pid
        directory = self._base_dir / meta.instance_id
        if pid is None or not _alive(pid, directory):
            return
        _signal_group(pid, signal.SIGTERM)
        if not await _wait_gone(pid, directory, self._stop_timeout):
            _signal_group(pid, signal.SIGKILL)
            if not await _wait_gone(pid, directory, _KILL_WAIT):
                raise ProviderUnavailable(
                    f"local: agent {pid} of {meta.instance_id} survived SIGKILL for {_KILL_WAIT:g}s"
                )


def _check_id(instance_id: str) -> str:
    if not _SAFE_ID.match(instance_id) or instance_id in (".", ".."):
        raise ProviderInvalidRequest(
            f"local: instance id {instance_id!r} cannot name a directory; use letters, digits, '-', '_' "
            "and '.' (at most 128, not starting with a symbol)"
        )
    return instance_id


def _resolve_id(instance_id: str, provider_id: str) -> str:
    if provider_id:
        if not provider_id.startswith(PROVIDER_ID_PREFIX):
            raise ProviderInvalidRequest(f"local: {provider_id!r} is not a local provider id (local-...)")
        from_provider = provider_id[len(PROVIDER_ID_PREFIX) :]
        if instance_id and instance_id != from_provider:
            raise ProviderInvalidRequest(
                f"local: provider id {provider_id} belongs to instance {from_provider}, not {instance_id}"
            )
        instance_id = from_provider
    if not instance_id:
        raise ProviderInvalidRequest("local: give an instance id or a provider id")
    return _check_id(instance_id)


def _make_dir(path: Path) -> None:
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    os.chmod(path, 0o700)


def _write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically, mode 0600."""
    write_atomic(path, data, mode=0o600, dir_mode=None)


def _reap(pid: int) -> None:
    """Collect the exit status of an agent we started, if it has exited."""
    if pid not in _SPAWNED:
        return
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        _SPAWNED.pop(pid, None)  # not our child (anymore), or already reaped
        return
    if done:
        _SPAWNED.pop(pid, None)


def _reap_exited() -> None:
    for pid in list(_SPAWNED):
        _reap(pid)


def _alive(pid: int | None, directory: Path) -> bool:
    """Whether ``pid`` is running and is the agent of ``directory`` (not a reused pid, not a zombie)."""
    if pid is None:
        return False
    _reap(pid)
    if pid in _SPAWNED:
        return _SPAWNED[pid] == str(directory)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False  # someone else's process now has this pid
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return not Path("/proc/self").exists()  # no procfs: the signal check is all we have
    except OSError:
        return False
    return str(directory).encode() in cmdline.split(b"\0")


async def _wait_gone(pid: int, directory: Path, within: float) -> bool:
    """Poll until the agent has exited (True) or ``within`` real seconds pass (False)."""
    deadline = time.monotonic() + within
    while True:
        if not _alive(pid, directory):
            return True
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(_POLL_INTERVAL)


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


# ---- construction from config ------------------------------------------------------------------


def local_provider_from_options(
    options: Mapping[str, Any], *, clock: Clock, base_dir: Path, zone: str = ""
) -> LocalProvider:
    """Build a LocalProvider from ``shard.infra.options``; refuse unknown keys and bad values by path."""
    opt.check_known(options, OPTION_KEYS, "local")
    instances_dir = opt.path(options, "instances_dir", base_dir, "local-instances")
    assert instances_dir is not None  # it has a default
    stop = opt.flag(options, "stop_instances_on_close")
    return LocalProvider(instances_dir, clock=clock, stop_instances_on_close=stop, zone=zone)
