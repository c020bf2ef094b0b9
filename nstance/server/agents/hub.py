"""Agent sessions on the shard leader: health reports in, files and key requests out.

Each connected agent has an ``AgentSession`` (keyed by instance id, the CN of its certificate) that
lives while any of its streams is open. Per health report the hub:

* buffers ``health_at``, the report and the reported runtime hash for one batched SQLite write (many
  reports land in one transaction; runtime state never goes to object storage);
* compares the reported runtime hash with the group's and the reported files with the template's: on
  a difference it renders the files (``agentfiles``) and pushes them followed by a commit carrying
  the group's runtime hash, once per hash (again after ``REPUSH_AFTER`` reports if it did not take).
  The group's legacy runtime hash (``nstance.config.hashes``: what earlier versions of this project
  pushed for the same config) counts as the group's: an upgrade does not push every file again;
* asks the agent for the key pairs its certificate files need (``ReceiveKeyRequests``) and, when the
  public keys arrive, pushes the certificate files issued for them;
* on a spot termination notice, writes the report at once and marks the group for reconcile (the
  planner replaces and drains the instance); the notice stays in every later report of the session,
  so a report without it (from another stream) cannot hide it from the planner;
* notes the instance for registration with its group's load balancers (``loadbalancers``), so a VM
  joins them once its agent is up.

SQLite work stays off the event loop except one indexed plain-SQL read per stream that opens (its
instance row, tens of microseconds, so the stream owns its session before anything interleaves);
the follow-ups' rows are read in bulk in a worker thread (``BatchReader``), pushes and key checks
read in a thread, and writes go to the shard's database-writer thread.

When the health stream ends, the hub checks the VM with the provider at growing intervals (3 s, 6 s,
12 s, 24 s, then every 30 s, with jitter) until the agent is back: a VM that is stopped or gone is
recorded as such and its group reconciled (replacement without drain); a VM that runs is left to
the planner, which replaces it with drain once the agent has been silent for three health intervals.

Deciding replacements is not done here (``nstance.core.plan``); this module only records and pushes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from nstance.config import MergedGroupConfig, infra_hash, legacy_runtime_hash, runtime_hash
from nstance.core.errors import NotFound, NstanceError
from nstance.core.ids import GroupKey
from nstance.db import repo
from nstance.db.rows import InstanceRow
from nstance.providers.base import UNHEALTHY_STATUSES, InstanceNotFound, InstanceStatus
from nstance.secrets.base import SecretStore
from nstance.server.agents.batchread import BatchReader
from nstance.server.agents.files import InstanceFacts, render_files, required_agent_keys
from nstance.server.reconcile.loadbalancers import LoadBalancerSync
from nstance.server.state.context import ShardContext
from nstance.server.state.events import ErrorEventData

log = logging.getLogger(__name__)

#: Instance rows read per query when sessions are checked against a rebuilt cache.
REVALIDATE_BATCH = 500
#: Delays (seconds) between provider checks after an agent's health stream ended.
FOLLOW_UP_DELAYS = (3.0, 6.0, 12.0, 24.0, 30.0, 30.0, 30.0, 30.0)
#: Seconds between batched health writes: an agent's reports in between collapse into one row update.
HEALTH_FLUSH_INTERVAL = 0.5
#: Reports after a push before the same files are pushed again if they still do not match.
REPUSH_AFTER = 3


@dataclass(frozen=True, slots=True)
class FileReport:
    """What the agent says about one received file: when it was written, or why it is not."""

    last_modified: datetime | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class TerminationNotice:
    """A spot or preemption notice the agent saw on its metadata endpoint."""

    action: str
    deadline: datetime | None = None


@dataclass(frozen=True, slots=True)
class HealthReport:
    """One health report, decoded from the wire."""

    instance_id: str
    count: int = 0
    uptime: str = ""
    metrics: Mapping[str, Any] = field(default_factory=dict)
    files: Mapping[str, FileReport] = field(default_factory=dict)
    termination: TerminationNotice | None = None
    config_hash: str = ""


@dataclass(frozen=True, slots=True)
class Delivery:
    """A file to send, or (``name`` empty) the commit that applies the files sent before it."""

    name: str
    content: bytes = b""
    config_hash: str = ""


def health_document(report: HealthReport, now: datetime) -> dict[str, Any]:
    """The JSON kept in ``instances.health`` for a report."""
    files: dict[str, dict[str, str]] = {}
    for name, status in report.files.items():
        if status.error is not None:
            files[name] = {"error": status.error}
        elif status.last_modified is not None:
            files[name] = {"last_modified": status.last_modified.isoformat()}
        else:
            files[name] = {}
    notice = None
    if report.termination is not None:
        notice = {
            "action": report.termination.action,
            "deadline": report.termination.deadline.isoformat() if report.termination.deadline else None,
        }
    return {
        "reported_at": now.isoformat(),
        "count": report.count,
        "uptime": report.uptime,
        "metrics": dict(report.metrics),
        "files": files,
        "termination_notice": notice,
        "config_hash": report.config_hash,
    }


def files_needing_push(template_files: Mapping[str, object], reported: Mapping[str, FileReport]) -> list[str]:
    """Template files the agent lacks or could not write."""
    needed = []
    for name in template_files:
        status = reported.get(name)
        if status is None or status.error is not None or status.last_modified is None:
            needed.append(name)
    return needed


class AgentSession:
    """One connected agent: its pending deliveries and key requests, and what was pushed to it."""

    def __init__(self, instance_id: str, tenant: str, group: str) -> None:
        self.instance_id = instance_id
        self.tenant = tenant
        self.group = group
        self.streams = 0
        self.health_streams = 0
        self._files: dict[str, Delivery] = {}
        self._commit: str | None = None
        self._files_ready = asyncio.Event()
        self._keys: set[str] = set()
        self._keys_ready = asyncio.Event()
        self.pushed_hash: str | None = None
        self.reports_since_push = 0
        self.pushing = False
        self.keys_checked = False
        #: The first termination notice this agent reported (``health_document``'s form), kept for the
        #: rest of the session: a notice is never withdrawn - the cloud takes the VM all the same.
        self.termination_notice: dict[str, Any] | None = None
        #: The rebuilt cache of a new leadership holds no active instance for this agent: its streams end.
        self.revoked = False

    def revoke(self) -> None:
        """End this session: streams waiting for files or key requests wake up and see ``revoked``."""
        self.revoked = True
        self._files_ready.set()
        self._keys_ready.set()

    def deliver(self, files: Mapping[str, bytes], commit_hash: str) -> None:
        """Queue files (at most one pending delivery per name) and the commit that applies them."""
        for name, content in files.items():
            self._files[name] = Delivery(name, content)
        self._commit = commit_hash
        self._files_ready.set()

    def request_keys(self, names: list[str]) -> None:
        self._keys.update(names)
        self._keys_ready.set()

    async def next_files(self) -> list[Delivery]:
        """Wait for queued files; return them followed by their commit."""
        await self._files_ready.wait()
        self._files_ready.clear()
        batch = list(self._files.values())
        self._files.clear()
        if self._commit is not None:
            batch.append(Delivery("", b"", self._commit))
            self._commit = None
        return batch

    async def next_keys(self) -> list[str]:
        await self._keys_ready.wait()
        self._keys_ready.clear()
        names = sorted(self._keys)
        self._keys.clear()
        return names


class GroupSignals(Protocol):
    """Told when an agent's report means its group should be reconciled now (the shard)."""

    def group_changed(self, key: GroupKey) -> None: ...


class AgentHub:
    """All agent sessions of this shard server; see the module docstring."""

    def __init__(
        self,
        ctx: ShardContext,
        *,
        db_writer: Executor,
        secrets: SecretStore | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        lbs: LoadBalancerSync | None = None,
        signals: GroupSignals | None = None,
    ) -> None:
        self._ctx = ctx
        self._signals = signals
        self._lbs = lbs
        self._db_writer = db_writer
        self._secrets = secrets
        self._sleep = sleep
        self.sessions: dict[str, AgentSession] = {}
        self._health: dict[str, dict[str, Any]] = {}
        self._flush_task: asyncio.Task[None] | None = None
        self._flushed = asyncio.Event()
        #: Set while someone waits for the buffered reports (a spot notice): no pause between writes.
        self._urgent = False
        self._hashes: dict[GroupKey, tuple[object, MergedGroupConfig | None, str, str]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        #: Instance rows of agents opening a stream: a reconnect burst is read in bulk, off the loop.
        self._rows: BatchReader[str, InstanceRow] = BatchReader(self._read_rows)
        self.reports = 0

    # --- sessions -----------------------------------------------------------------------------

    def _read_rows(self, instance_ids: list[str]) -> dict[str, InstanceRow]:
        """The rows of these instances (a worker thread)."""
        with self._ctx.db.read_connection() as db:
            return {row.id: row for row in repo.get_instances(db, instance_ids)}

    async def _open(self, instance_id: str) -> AgentSession:
        session = self.sessions.get(instance_id)
        if session is None:
            # One indexed plain-SQL read on the loop (tens of microseconds), so a stream owns its
            # session before anything can interleave. A batched read in a thread here let a stream
            # wait across a takeover or a pause, and the simulation then saw live agents go silent.
            with self._ctx.db.read_connection() as db:
                row = repo.get_instance(db, instance_id)
            if row is None or row.deleted_at is not None:
                raise self._not_active(instance_id)
            session = AgentSession(instance_id, row.tenant, row.group_key)
            self.sessions[instance_id] = session
        elif session.revoked:
            raise self._not_active(instance_id)
        session.streams += 1
        return session

    def _not_active(self, instance_id: str) -> NotFound:
        shard = self._ctx.identity.shard
        return NotFound(f"instance {instance_id} is not an active instance of shard {shard}")

    async def revalidate(self) -> None:
        """A leadership's cache was just rebuilt: end the sessions of agents it holds no active instance for.

        Sessions outlive a change of leadership on this server (a step down to repair the cache, a lease
        that lapsed and was won back), and each was opened against the cache as it was then. An instance
        the rebuilt cache does not hold (its record was deleted or is unreadable) must not go on
        reporting through a session opened before: its streams end at their next message, and a new
        stream is refused as for any unknown instance. Rows are read in bulk in a worker thread; if they
        cannot be read the sessions stay as they are (logged), and the leadership goes on.
        """
        ids = list(self.sessions)
        rows: dict[str, InstanceRow] = {}
        try:
            for start in range(0, len(ids), REVALIDATE_BATCH):
                rows.update(await asyncio.to_thread(self._read_rows, ids[start : start + REVALIDATE_BATCH]))
        except Exception as exc:  # noqa: BLE001 - the leadership goes on; a corrupt cache is repaired apart
            log.warning("cannot check %d agent sessions against the rebuilt cache: %s", len(ids), exc)
            return
        for iid in ids:
            row = rows.get(iid)
            session = self.sessions.get(iid)
            if session is not None and (row is None or row.deleted_at is not None):
                log.warning("instance %s: not active in the rebuilt cache; ending its streams", iid)
                session.revoke()

    def _close(self, session: AgentSession) -> None:
        session.streams -= 1
        if session.streams <= 0 and self.sessions.get(session.instance_id) is session:
            del self.sessions[session.instance_id]

    def connected(self, instance_id: str) -> bool:
        """Whether the agent's health stream is open."""
        session = self.sessions.get(instance_id)
        return session is not None and session.health_streams > 0

    # --- streams ------------------------------------------------------------------------------

    async def files(self, instance_id: str) -> AsyncIterator[Delivery]:
        """The file deliveries for one agent, for as long as the stream is open."""
        self._ctx.fence()
        session = await self._open(instance_id)
        session.pushed_hash = None  # a new stream: whatever was pushed before may not have arrived
        try:
            while True:
                batch = await session.next_files()
                if session.revoked:
                    raise self._not_active(instance_id)
                for delivery in batch:
                    yield delivery
        finally:
            self._close(session)

    async def key_requests(self, instance_id: str) -> AsyncIterator[list[str]]:
        """Key names the agent should generate, batch by batch."""
        self._ctx.fence()
        session = await self._open(instance_id)
        session.keys_checked = False
        try:
            while True:
                names = await session.next_keys()
                if session.revoked:
                    raise self._not_active(instance_id)
                yield names
        finally:
            self._close(session)

    async def submit_public_keys(self, instance_id: str, keys: Mapping[str, bytes]) -> None:
        """Store the agent's public keys; then push the certificate files issued for them."""
        ctx = self._ctx
        ctx.fence()
        now = ctx.clock.now()

        def store() -> None:
            with ctx.db.session() as db:
                for name, pem in keys.items():
                    repo.upsert_public_key(
                        db, instance_id=instance_id, filename=name, public_key_pem=pem.decode(), now=now
                    )

        await asyncio.get_running_loop().run_in_executor(self._db_writer, store)
        session = self.sessions.get(instance_id)
        if session is None:
            return
        merged, desired, _ = self._group(session)
        if merged is None:
            return
        names = {n.removesuffix(".pub") for n in keys}
        wanted = [
            fname
            for fname, fcfg in merged.files.items()
            if fcfg.kind == "certificate"
            and fcfg.key is not None
            and fcfg.key.name.removesuffix(".pub") in names
        ]
        if wanted:
            self._spawn(self._push(session, merged, desired, only=wanted))

    async def health(self, instance_id: str, reports: AsyncIterator[HealthReport]) -> None:
        """Process one agent's health stream until it ends."""
        self._ctx.fence()
        session = await self._open(instance_id)
        session.health_streams += 1
        try:
            async for report in reports:
                self._ctx.fence()
                if session.revoked:
                    raise self._not_active(instance_id)
                self._process(session, report)
        finally:
            session.health_streams -= 1
            self._close(session)
            if self._ctx.is_leader() and not self.connected(instance_id):
                self._spawn(self._follow_up(instance_id))

    # --- one report ---------------------------------------------------------------------------

    def _group(self, session: AgentSession) -> tuple[MergedGroupConfig | None, str, str]:
        """The session's merged group config, its runtime hash and its legacy runtime hash.

        Cached per config snapshot. The legacy hash is what earlier versions of this project pushed for
        the same config: an agent that reports it has the current files (``_process``).
        """
        key = (session.tenant, session.group)
        snapshot = self._ctx.config.snapshot()
        cached = self._hashes.get(key)
        if cached is not None and cached[0] is snapshot:
            return cached[1], cached[2], cached[3]
        merged = snapshot.merged(*key) if snapshot is not None else None
        desired = runtime_hash(merged) if merged is not None else ""
        legacy = legacy_runtime_hash(merged) if merged is not None else ""
        self._hashes[key] = (snapshot, merged, desired, legacy)
        if merged is not None:
            self._spawn(self._store_group_hashes(key, desired, infra_hash(merged)))
        return merged, desired, legacy

    async def _store_group_hashes(self, key: GroupKey, runtime: str, infra: str) -> None:
        ctx = self._ctx
        now = ctx.clock.now()

        def store() -> None:
            with ctx.db.write_connection() as db:
                repo.upsert_group_hashes(
                    db,
                    tenant=key[0],
                    group_key=key[1],
                    runtime_config_hash=runtime,
                    infra_config_hash=infra,
                    now=now,
                )

        await asyncio.get_running_loop().run_in_executor(self._db_writer, store)

    def _process(self, session: AgentSession, report: HealthReport) -> None:
        now = self._ctx.clock.now()
        self.reports += 1
        document = health_document(report, now)
        first_notice = report.termination if session.termination_notice is None else None
        if first_notice is not None:
            session.termination_notice = document["termination_notice"]
        elif document["termination_notice"] is None:
            # A later report without the notice (another stream of this instance, a metadata read that
            # failed) must not hide it from the planner before the drain has started.
            document["termination_notice"] = session.termination_notice
        self._health[session.instance_id] = {
            "instance_id": session.instance_id,
            "health_at": now,
            "health": document,
            "runtime_config_hash": report.config_hash or None,
        }
        self._schedule_flush()
        if first_notice is not None:
            log.info(
                "instance %s: termination notice (%s); replacing it",
                session.instance_id,
                first_notice.action,
            )
            self._spawn(self._after_flush(lambda: self._group_changed(session)))
        merged, desired, legacy = self._group(session)
        if merged is None:
            return
        if self._lbs is not None:
            self._lbs.on_health(session.instance_id, merged)
        session.reports_since_push += 1
        missing = files_needing_push(merged.files, report.files)
        drifted = report.config_hash not in (desired, legacy)
        due = session.pushed_hash != desired or session.reports_since_push > REPUSH_AFTER
        if (missing or drifted) and due and not session.pushing:
            self._spawn(self._push(session, merged, desired, only=None if drifted else missing))
        if not session.keys_checked:
            session.keys_checked = True
            needed = required_agent_keys(merged)
            if needed:
                self._spawn(self._request_missing_keys(session, needed))

    def _group_changed(self, session: AgentSession) -> None:
        if self._signals is not None:
            self._signals.group_changed((session.tenant, session.group))

    def _key_names(self, instance_id: str) -> set[str]:
        """The names of the public keys stored for an instance (a worker thread)."""
        with self._ctx.db.read_connection() as db:
            return {k.filename.removesuffix(".pub") for k in repo.list_public_keys(db, instance_id)}

    def _push_inputs(self, instance_id: str) -> tuple[InstanceRow | None, dict[str, bytes]]:
        """The instance's row and its stored public keys by name (a worker thread)."""
        with self._ctx.db.read_connection() as db:
            row = repo.get_instance(db, instance_id)
            keys = {
                k.filename.removesuffix(".pub"): k.public_key_pem.encode()
                for k in repo.list_public_keys(db, instance_id)
            }
        return row, keys

    async def _request_missing_keys(self, session: AgentSession, needed: list[str]) -> None:
        have = await asyncio.to_thread(self._key_names, session.instance_id)
        missing = [name for name in needed if name not in have]
        if missing:
            session.request_keys(missing)

    async def _push(
        self, session: AgentSession, merged: MergedGroupConfig, desired: str, *, only: list[str] | None
    ) -> None:
        ctx = self._ctx
        session.pushing = True
        try:
            row, keys = await asyncio.to_thread(self._push_inputs, session.instance_id)
            snapshot = ctx.config.snapshot()
            if row is None or snapshot is None:
                return
            facts = InstanceFacts(
                instance_id=row.id,
                tenant=row.tenant,
                group=row.group_key,
                shard=ctx.identity,
                hostname=row.hostname or "",
                fqdn=row.fqdn or "",
                ipv4=row.ip4 or "",
                ipv6=row.ip6 or "",
                instance_type=row.instance_type or "",
                images=ctx.resolved_images,
            )
            result = await render_files(
                merged=merged,
                instance=facts,
                public_keys=keys,
                secrets=self._secrets,
                store=ctx.store,
                ca=ctx.ca,
                clock=ctx.clock,
                certificates=snapshot.config.certificates or {},
                only=only,
            )
            for name, problem in result.errors.items():
                self._report(session, f"file {name}: {problem}")
            session.deliver({f.name: f.content for f in result.files}, desired)
            session.pushed_hash = desired
            session.reports_since_push = 0
            log.info(
                "instance %s: pushed %d file(s) with config hash %s",
                session.instance_id,
                len(result.files),
                desired,
            )
        except NstanceError as exc:
            self._report(session, f"cannot render files: {exc}")
        finally:
            session.pushing = False

    def _report(self, session: AgentSession, message: str) -> None:
        log.warning("instance %s: %s", session.instance_id, message)
        self._ctx.events.errors.publish(
            ErrorEventData(
                tenant=session.tenant,
                group=session.group,
                instance_id=session.instance_id,
                error=message,
                timestamp=self._ctx.clock.now(),
            )
        )

    # --- batched health writes ----------------------------------------------------------------

    def _schedule_flush(self) -> None:
        if self._flush_task is None or self._flush_task.done():
            self._flushed.clear()
            self._flush_task = asyncio.get_running_loop().create_task(self._flush())

    async def _flush(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._health:
                batch, self._health = list(self._health.values()), {}
                try:
                    await loop.run_in_executor(self._db_writer, self._write_health, batch)
                    if self._health and not self._urgent:
                        await asyncio.sleep(HEALTH_FLUSH_INTERVAL)
                except Exception:
                    log.exception(
                        "cannot store %d health reports; the next reports carry the same facts", len(batch)
                    )
        finally:
            self._flushed.set()

    def _write_health(self, batch: list[dict[str, Any]]) -> None:
        with self._ctx.db.write_connection() as db:
            repo.record_health_many(db, batch)

    async def flushed(self) -> None:
        """Return once every buffered report is in SQLite."""
        self._urgent = True
        try:
            while self._flush_task is not None and not self._flush_task.done():
                await self._flushed.wait()
        finally:
            self._urgent = False

    async def _after_flush(self, then: Callable[[], None]) -> None:
        await self.flushed()
        then()

    # --- stream loss --------------------------------------------------------------------------

    async def _follow_up(self, instance_id: str) -> None:
        """Check the VM with the provider until the agent is back or the VM is known to be down."""
        ctx = self._ctx
        for delay in FOLLOW_UP_DELAYS:
            await self._sleep(delay * random.uniform(0.8, 1.2))
            if self.connected(instance_id) or not ctx.is_leader():
                return
            row = await self._rows.get(instance_id)
            if row is None or row.deleted_at is not None or row.drain_started_at is not None:
                return
            if row.provider_id is None:
                continue
            try:
                vm = await ctx.provider.get_instance(instance_id, row.provider_id)
                status = vm.status
            except InstanceNotFound:
                status = InstanceStatus.DELETED
            except NstanceError as exc:
                log.info("instance %s: provider check after stream loss failed: %s", instance_id, exc)
                continue
            if status == InstanceStatus.RUNNING or status == InstanceStatus.PENDING:
                continue
            await asyncio.get_running_loop().run_in_executor(
                self._db_writer, self._set_provider_status, instance_id, status.value, ctx.clock.now()
            )
            log.info(
                "instance %s: agent gone and the provider says %s; replacing it", instance_id, status.value
            )
            if self._signals is not None and (
                status in UNHEALTHY_STATUSES or status == InstanceStatus.DELETED
            ):
                self._signals.group_changed((row.tenant, row.group_key))
            return

    def _set_provider_status(self, instance_id: str, status: str, now: datetime) -> None:
        with self._ctx.db.write_connection() as db:
            repo.set_provider_status(db, instance_id, status, now=now)

    # --- housekeeping -------------------------------------------------------------------------

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        """Cancel follow-ups and pushes; write what is buffered."""
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self.flushed()
