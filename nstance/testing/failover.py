"""Test and benchmark helpers for shard-leader failover between real server processes.

Responsible for:

* ``FailoverShard``: several ``nstance-server`` processes of one shard on one bucket - a ``file://``
  directory or an S3 bucket on a ``MotoServer`` - each on its own loopback address (127.0.0.2, .3, ...)
  with the ``sim`` provider sharing one ``state_file`` (one simulated cloud) and one ``calls_file``
  (who made which mutating call, and when). It starts, SIGKILLs and restarts servers, keeping every
  *incarnation* (one process: server id, pid, its own log file, when it started and ended), finds the
  leader through ``/leader/health``, scales a group over the Operator API, and reads the ground truth:
  the sim's VMs and the instance records in the bucket.
* The double-leader audit, from two independent sources: leadership terms parsed from each
  incarnation's JSON log (``shard election: now leading`` / ``no longer leading``; a killed process's
  term ends when it was killed) and the sim's call log. ``find_double_acting`` is the check (see its
  docstring); ``log_overlaps`` lists terms whose *log lines* overlap, which fencing allows as long as
  the old leader made no call once the new one led.

Every time is wall-clock Unix seconds (``time.time()``; the servers and the sim run on this host, so
their clocks agree). Must not: import the server (it drives it only as a process, over HTTP and gRPC),
change what a server does, or leave a process behind (``close`` stops every server and only those).
"""

from __future__ import annotations

import json
import math
import signal
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf.empty_pb2 import Empty

from nstance.objectstore.base import ObjectStore
from nstance.rpc import operator_pb2, operator_pb2_grpc
from nstance.testing.motoserver import MotoServer
from nstance.testing.procs import free_port
from nstance.testing.shardproc import LocalCluster, ServerProcess, server_addrs, shard_config

if TYPE_CHECKING:
    from nstance.objectstore.s3 import S3ObjectStore

TERM_START = "shard election: now leading"
TERM_END = "shard election: no longer leading"
#: Log times are written with millisecond precision (truncated); comparisons allow this much.
LOG_RESOLUTION = 0.002
S3_REGION = "us-east-1"
#: Election timings short enough for CI: takeover within 2 s + 300 ms (+ a 150 ms grace gap).
FAST_ELECTION = {"frequent_interval": "300ms", "infrequent_interval": "2s", "leader_timeout": "2s"}
S3_KEYS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}


# ---- the audit (pure) ------------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    """One mutating provider call as the sim logged it (``nstance.providers.sim``, ``calls_file``)."""

    t: float  # when it took effect
    started: float  # when it reached the sim (the server's fence check is just before)
    method: str
    server: str
    pid: int
    instance_ids: tuple[str, ...] = ()

    def describe(self) -> str:
        ids = ",".join(self.instance_ids) or "-"
        return f"{self.method}({ids}) by {self.server or '?'} pid {self.pid} at {self.t:.3f}"


@dataclass(frozen=True)
class Term:
    """One leadership term of one incarnation, as its log tells it; ``end`` is inf while it lasts."""

    server: str
    pid: int
    start: float
    end: float
    ended_by: str  # "log", "exit" (the process ended without logging it: killed) or "open"

    def describe(self) -> str:
        end = "open" if math.isinf(self.end) else f"{self.end:.3f} ({self.ended_by})"
        return f"{self.server} pid {self.pid} led {self.start:.3f} .. {end}"


def read_calls(path: Path) -> list[Call]:
    """The sim's call log (missing file: no calls)."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        doc = json.loads(line)
        out.append(
            Call(
                t=float(doc["t"]),
                started=float(doc["started"]),
                method=str(doc["method"]),
                server=str(doc["server"]),
                pid=int(doc["pid"]),
                instance_ids=tuple(str(i) for i in doc.get("instance_ids", [])),
            )
        )
    return out


def log_time(entry: Mapping[str, Any]) -> float:
    """The ``time`` of a server log line as Unix seconds."""
    return datetime.fromisoformat(str(entry["time"])).timestamp()


def leadership_terms(
    entries: Iterable[Mapping[str, Any]], *, server: str, pid: int, ended_at: float | None
) -> list[Term]:
    """The shard leadership terms in one incarnation's log lines.

    A term opens at ``now leading`` (logged at the very moment the elector's ``is_leader()`` turns
    true, before any leader work starts) and closes at ``no longer leading`` (logged at the elector's
    next step after it turned false: an upper bound), or at ``ended_at`` when the process ended
    without saying so (SIGKILL), or stays open.
    """
    terms: list[Term] = []
    start: float | None = None
    for entry in entries:
        msg = str(entry.get("msg", ""))
        if msg == TERM_START and start is None:
            start = log_time(entry)
        elif msg == TERM_END and start is not None:
            terms.append(Term(server, pid, start, log_time(entry), "log"))
            start = None
    if start is not None:
        if ended_at is None:
            terms.append(Term(server, pid, start, math.inf, "open"))
        else:
            terms.append(Term(server, pid, start, max(ended_at, start), "exit"))
    return terms


def find_double_acting(calls: Iterable[Call], terms: Sequence[Term]) -> list[str]:
    """Every mutating call that was not made by the one acting leader; [] when there is none.

    A call by incarnation X is correct when

    1. it was *issued* (``started``) inside one of X's terms: X's log said it led. Every provider call
       is fenced by ``is_leader()`` just before it starts, and a term's logged end is never earlier
       than the moment ``is_leader()`` turned false;
    2. it *took effect* (``t``) before any other incarnation's term started after X's term did. A
       new leader starts only after ``leader_timeout`` of silence, and a leader stops acting
       ``leader_timeout/2`` after its last successful renewal, so once another server's "now
       leading" is logged, X must not change anything any more - whatever X's own log says (a
       stalled process logs "no longer leading" late; that is allowed, acting is not).

    Calls from a pid that never led fail (1). Times are compared with ``LOG_RESOLUTION`` of slack.
    """
    eps = LOG_RESOLUTION
    problems = []
    for call in calls:
        own = [t for t in terms if t.pid == call.pid and t.start - eps <= call.started <= t.end + eps]
        if not own:
            led = [t.describe() for t in terms if t.pid == call.pid] or ["never"]
            problems.append(
                f"{call.describe()} (issued at {call.started:.3f}) outside every term of its "
                f"server (it led: {'; '.join(led)})"
            )
            continue
        term = own[-1]
        later = [o for o in terms if o.pid != call.pid and term.start < o.start < call.t - eps]
        if later:
            first = min(later, key=lambda o: o.start)
            problems.append(
                f"{call.describe()} took effect after another leader started: {first.describe()} "
                f"(the caller's term: {term.describe()})"
            )
    return problems


def log_overlaps(terms: Sequence[Term]) -> list[str]:
    """Terms of different incarnations whose log lines overlap (informational; see the module doc)."""
    ordered = sorted(terms, key=lambda t: t.start)
    out = []
    for i, a in enumerate(ordered):
        for b in ordered[i + 1 :]:
            if b.pid != a.pid and b.start < a.end:
                overlap = min(a.end, b.end) - b.start
                out.append(f"{a.describe()} overlaps {b.describe()} by {overlap:.3f}s in the logs")
    return out


# ---- processes ---------------------------------------------------------------------------------


@dataclass
class Incarnation:
    """One process of one server id; a restart is a new incarnation."""

    server: str
    host: str
    process: ServerProcess
    started_at: float
    ended_at: float | None = None

    @property
    def pid(self) -> int:
        assert self.process.proc is not None
        return self.process.proc.pid

    @property
    def alive(self) -> bool:
        return self.process.proc is not None and self.process.proc.poll() is None

    def terms(self) -> list[Term]:
        return leadership_terms(
            self.process.log_entries(), server=self.server, pid=self.pid, ended_at=self.ended_at
        )


@dataclass
class Kill:
    """One SIGKILL of a leader and what followed it."""

    server: str
    pid: int
    at: float  # just before the signal was sent
    new_leader: str = ""
    led_at: float | None = None  # the new leader's "now leading"
    first_call_at: float | None = None  # its first mutating provider call after the kill

    @property
    def to_lead_s(self) -> float | None:
        return None if self.led_at is None else self.led_at - self.at

    @property
    def to_first_call_s(self) -> float | None:
        return None if self.first_call_at is None else self.first_call_at - self.at


@dataclass
class FailoverShard:
    """Servers of one shard on one bucket with the shared sim cloud; see the module docstring.

    Use as a context manager (or call ``close``); ``storage`` is ``"file"`` or ``"s3"`` (then ``moto``
    must be a started ``MotoServer``; a fresh bucket is made on it).
    """

    root: Path
    servers: int = 3
    storage: str = "file"
    moto: MotoServer | None = None
    shard: str = "zone-a"
    election: Mapping[str, str] = field(default_factory=lambda: dict(FAST_ELECTION))
    sim_options: Mapping[str, Any] = field(default_factory=lambda: {"latency": "100ms"})
    groups: Mapping[str, Mapping[str, Any]] = field(
        default_factory=lambda: {"web": {"template": "app", "size": 0}}
    )
    shard_extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.ids = [f"s{i + 1}" for i in range(self.servers)]
        self.hosts = {sid: f"127.0.0.{i + 2}" for i, sid in enumerate(self.ids)}
        self.state_file = self.root / "sim-cloud.json"
        self.calls_file = self.root / "sim-calls.jsonl"
        self.env: dict[str, str] = {}
        self._s3: S3ObjectStore | None = None
        self.bucket: Path | str = self.root / "bucket"
        if self.storage == "s3":
            if self.moto is None:
                raise ValueError("storage s3 needs a started MotoServer")
            self._s3 = _s3_store(self.moto.endpoint_url, f"failover-{uuid.uuid4().hex[:12]}")
            self.bucket = self._s3.bucket
            self.env = {
                **S3_KEYS,
                "AWS_ENDPOINT_URL": self.moto.endpoint_url,
                "AWS_S3_USE_PATH_STYLE": "true",
                "AWS_DEFAULT_REGION": S3_REGION,
                "AWS_REGION": S3_REGION,
                "AWS_CONFIG_FILE": "/dev/null",
                "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
            }
        elif self.storage != "file":
            raise ValueError(f"storage must be file or s3, not {self.storage!r}")
        store: ObjectStore | None = self._s3
        self.cluster = LocalCluster(self.root / "bucket", store=store)
        self.cluster.init()
        self.addrs = server_addrs()
        config = shard_config(
            shard=self.shard,
            addrs=self.addrs,
            provider_options={
                **self.sim_options,
                "state_file": str(self.state_file),
                "calls_file": str(self.calls_file),
            },
            groups=self.groups,
            election=self.election,
            # Port-only: each server's --advertise-host (health, election) or --bind-host (the rest).
            shard_extra={
                "advertise": {name: ":" + addr.rsplit(":", 1)[1] for name, addr in self.addrs.items()},
                **self.shard_extra,
            },
        )
        self.cluster.write_config(self.shard, config)
        self.identity = self.cluster.operator_identity(self.root / "operator")
        self.incarnations: list[Incarnation] = []
        self.kills: list[Kill] = []
        self._channels: dict[str, grpc.Channel] = {}
        self._closed = False

    # -- lifecycle -------------------------------------------------------------------------------

    def __enter__(self) -> FailoverShard:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self, server: str) -> Incarnation:
        """Start a new incarnation of ``server`` (its cache directory is kept across restarts)."""
        if self.current(server) is not None:
            raise RuntimeError(f"{server} is still running")
        host = self.hosts[server]
        n = sum(1 for i in self.incarnations if i.server == server)
        process = ServerProcess(
            server_id=server,
            shard=self.shard,
            bucket=self.bucket,
            storage=self.storage,
            cachedir=self.root / f"cache-{server}",
            health_addr=f"{host}:{free_port()}",
            env=dict(self.env),
            args=["--bind-host", host, "--advertise-host", host],
            log_path=self.root / f"{server}-{n}.log",
        )
        started_at = time.time()
        process.start()
        incarnation = Incarnation(server, host, process, started_at)
        self.incarnations.append(incarnation)
        return incarnation

    def start_all(self, timeout: float = 60.0) -> None:
        for server in self.ids:
            self.start(server)
        for server in self.ids:
            self.wait_healthy(server, timeout)

    def wait_healthy(self, server: str, timeout: float = 60.0) -> str:
        incarnation = self.current(server)
        assert incarnation is not None, f"{server} is not running"
        return incarnation.process.wait_healthy(timeout)

    def current(self, server: str) -> Incarnation | None:
        """The running incarnation of ``server``, if any."""
        for incarnation in reversed(self.incarnations):
            if incarnation.server == server and incarnation.ended_at is None:
                return incarnation
        return None

    def kill(self, server: str) -> Kill:
        """SIGKILL ``server``'s running incarnation and wait until it is gone."""
        incarnation = self.current(server)
        assert incarnation is not None, f"{server} is not running"
        kill = Kill(server=server, pid=incarnation.pid, at=time.time())
        incarnation.process.stop(signal.SIGKILL)
        incarnation.ended_at = kill.at
        self.kills.append(kill)
        return kill

    def stop(self, server: str, sig: int = signal.SIGTERM) -> None:
        incarnation = self.current(server)
        if incarnation is None:
            return
        incarnation.process.stop(sig)
        incarnation.ended_at = time.time()

    def close(self) -> None:
        """Stop every server (standbys first, then the leader, so nobody takes over) and the channels."""
        if self._closed:
            return
        self._closed = True
        try:
            running = [i.server for i in self.incarnations if i.ended_at is None]
            leading = set(self.leaders())
            for server in sorted(running, key=lambda s: s in leading):
                self.stop(server)
        finally:
            for incarnation in self.incarnations:  # whatever happened above: nothing is left behind
                if incarnation.alive:
                    incarnation.process.stop(signal.SIGKILL)
                    incarnation.ended_at = incarnation.ended_at or time.time()
            for channel in self._channels.values():
                channel.close()
            self._channels.clear()
            if self._s3 is not None:
                self._s3.client.close()

    # -- leadership ------------------------------------------------------------------------------

    def leaders(self) -> list[str]:
        """Servers whose ``/leader/health`` answers 200 right now."""
        return [
            i.server
            for i in self.incarnations
            if i.ended_at is None and i.alive and i.process.http("/leader/health")[0] == 200
        ]

    def wait_leader(self, timeout: float, *, exclude: Iterable[str] = (), poll: float = 0.05) -> str:
        """The first server (not in ``exclude``) seen leading; TimeoutError after ``timeout`` seconds."""
        skip = set(exclude)
        deadline = time.monotonic() + timeout
        while True:
            found = [s for s in self.leaders() if s not in skip]
            if found:
                return found[0]
            if time.monotonic() > deadline:
                raise TimeoutError(f"no leader among {sorted(set(self.ids) - skip)} within {timeout:g}s")
            time.sleep(poll)

    def settle_kill(self, kill: Kill) -> Kill:
        """Fill in who led first after ``kill`` and when (from the logs) and its first mutating call."""
        after = [t for t in self.terms() if t.pid != kill.pid and t.start >= kill.at - LOG_RESOLUTION]
        if after:
            first = min(after, key=lambda t: t.start)
            kill.new_leader, kill.led_at = first.server, first.start
            calls = [c for c in self.calls() if c.pid == first.pid and c.t >= first.start]
            kill.first_call_at = min((c.t for c in calls), default=None)
        return kill

    # -- the Operator API --------------------------------------------------------------------------

    def stub(self, server: str) -> operator_pb2_grpc.OperatorServiceStub:
        host = self.hosts[server]
        channel = self._channels.get(host)
        if channel is None:
            target = f"{host}:{self.addrs['operator_addr'].rsplit(':', 1)[1]}"
            channel = self._channels[host] = LocalCluster.channel(self.identity, target)
        return operator_pb2_grpc.OperatorServiceStub(channel)

    def upsert(self, group: str, size: int, timeout: float = 30.0) -> str:
        """UpsertGroup ``size`` on whichever server leads (retried while leadership moves); its id."""
        deadline = time.monotonic() + timeout
        while True:
            leader = self.wait_leader(max(deadline - time.monotonic(), 0.1))
            request = operator_pb2.UpsertGroupRequest(key=group, config=operator_pb2.GroupConfig(size=size))
            try:
                self.stub(leader).UpsertGroup(request, timeout=10)
                return leader
            except grpc.RpcError as exc:
                retry = exc.code() in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.UNAVAILABLE)
                if not retry or time.monotonic() > deadline:
                    raise
            time.sleep(0.1)

    def actual_size(self, server: str, group: str) -> int:
        for status in self.stub(server).ListGroups(Empty(), timeout=10).groups:
            if status.key == group:
                return int(status.actual_size)
        raise KeyError(group)

    # -- ground truth ----------------------------------------------------------------------------

    def vms(self) -> list[dict[str, Any]]:
        """Every VM the simulated cloud has had, deleted ones included."""
        if not self.state_file.exists():
            return []
        vms: list[dict[str, Any]] = json.loads(self.state_file.read_text())["vms"]
        return vms

    def live_vms(self) -> list[dict[str, Any]]:
        return [vm for vm in self.vms() if vm["deleted_at"] is None]

    def records(self) -> dict[str, dict[str, Any]]:
        """The instance records in the bucket, by instance id."""
        store = self.cluster.shard_store(self.shard)
        out = {}
        for key in store.list("instance/"):
            doc = json.loads(store.get(key)[0])
            out[str(doc["instance_id"])] = doc
        return out

    def leaks(self) -> list[str]:
        """Live VMs without a live record, and instance ids with more than one live VM."""
        records = self.records()
        problems = []
        seen: dict[str, int] = {}
        for vm in self.live_vms():
            iid = vm["instance_id"]
            seen[iid] = seen.get(iid, 0) + 1
            record = records.get(iid)
            if record is None or record.get("status") in ("deleted", "failed"):
                state = "no record" if record is None else f"record {record.get('status')}"
                problems.append(f"VM {vm['provider_id']} of {iid}: {state}")
        problems += [f"{iid}: {n} live VMs" for iid, n in seen.items() if n > 1]
        return problems

    def converged(self, group: str, size: int) -> Callable[[], bool]:
        """A predicate: the sim runs exactly ``size`` VMs, none leaked, and the leader agrees."""

        def check() -> bool:
            if len(self.live_vms()) != size or self.leaks():
                return False
            leaders = self.leaders()
            try:
                return bool(leaders) and self.actual_size(leaders[0], group) == size
            except grpc.RpcError:
                return False  # leadership moved meanwhile: ask again

        return check

    # -- the audit -------------------------------------------------------------------------------

    def calls(self) -> list[Call]:
        return read_calls(self.calls_file)

    def terms(self) -> list[Term]:
        return [term for i in self.incarnations for term in i.terms()]

    def audit(self) -> tuple[list[str], list[str]]:
        """(double-acting problems, log overlaps) over everything that happened so far."""
        terms = self.terms()
        return find_double_acting(self.calls(), terms), log_overlaps(terms)


def _s3_store(endpoint_url: str, bucket: str) -> S3ObjectStore:
    """A new bucket on ``endpoint_url`` with fake keys (nothing read from the host's AWS config)."""
    import boto3  # only where an S3 bucket is asked for
    from botocore.config import Config

    from nstance.objectstore.s3 import S3ObjectStore

    session = boto3.session.Session(region_name=S3_REGION, **{k.lower(): v for k, v in S3_KEYS.items()})
    client = session.client(
        "s3",
        endpoint_url=endpoint_url,
        config=Config(
            s3={"addressing_style": "path"},
            retries={"total_max_attempts": 1, "mode": "standard"},
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        ),
    )
    client.create_bucket(Bucket=bucket)
    return S3ObjectStore(bucket, client=client)
