"""Creating instances, crash-safe: intent, launch, adopt, then the record follow-ups.

The create path writes its intent before acting: a SQLite row and a ``pending`` record in object storage,
then - fenced by leadership and admitted by the create limiter - the provider call with the instance id
as idempotency token, then the provider id into the row at once (``adopt``, batched on the shard's one
database writer thread) and into the record shortly after (``followups``: those writes wait for a burst
of creates to end). A crash at any point leaves either nothing at the provider (the pending record is
cleaned up) or a VM tagged with an id that the records explain (adopted on restart, see ``recovery``).

A burst of creates can be called off: ``create_many`` takes ``wanted``, asked before each batch of
intents and again right before each provider call; once it answers False (the group was scaled down
or deleted meanwhile) no further intent is written and every create not yet sent to the provider is
retired as ``create-cancelled`` - within one batch's time, not after the whole burst. A create
already sent completes and is then handled like any other instance. A batch whose intent cannot be
written (for example because fencing failed) ends the burst at once; the loop yields between batches.

Deciding *how many* to create is not done here (``nstance.core.plan``); retiring is ``retire``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from nstance.config import MergedGroupConfig
from nstance.config.errors import RenderError
from nstance.config.shard import ShardConfig
from nstance.core.backoff import Backoff
from nstance.core.errors import AlreadyExists, Unavailable
from nstance.db import repo
from nstance.providers.base import ProviderInstance, ProviderThrottled, ProviderUnavailable
from nstance.server.reconcile.followups import RecordFollowUps
from nstance.server.reconcile.images import explain_missing_image
from nstance.server.reconcile.owedstatus import OwedStatuses
from nstance.server.state import records
from nstance.server.state.context import ShardContext
from nstance.server.state.provisioning import PreparedInstance, prepare_instance

log = logging.getLogger(__name__)


#: Provider create attempts per instance before the create is given up (same idempotency token each time).
CREATE_ATTEMPTS = 4
#: Seconds a "subnet has room" answer is trusted.
CAPACITY_TTL = 10.0


class CreateCancelled(Unavailable):
    """The group no longer wants this instance: the create was called off before the provider call."""


def _always() -> bool:
    return True


#: Seconds between checks of ``wanted`` while creates wait for the limiter.
CALL_OFF_POLL = 0.25
#: The cancel message of a create called off by ``wanted`` (told apart from a shutdown's cancel).
CALL_OFF_MESSAGE = "nstance: create called off"


@dataclass(frozen=True, slots=True)
class Created:
    """Outcome of a create: the instance id and its provider status."""

    instance_id: str
    status: str


class Creator:
    """Creates instances of a group: every step fenced by shard leadership (see the module docstring)."""

    def __init__(self, ctx: ShardContext, owed: OwedStatuses, *, backoff: Backoff | None = None) -> None:
        self._ctx = ctx
        self._owed = owed
        self._backoff = backoff or Backoff(base=0.2, cap=5.0)
        #: Instance ids whose provider create is in flight (GC and re-list must not touch them).
        self.in_flight: set[str] = set()
        self._capacity_ok: dict[str, float] = {}
        self._capacity_checks: dict[str, asyncio.Future[bool]] = {}
        self._adopt_queue: list[tuple[str, ProviderInstance, asyncio.Future[None]]] = []
        self._adopt_task: asyncio.Task[None] | None = None
        # One thread for the batch cache writes: SQLite has one writer anyway, and the event loop keeps
        # serving provider completions while a batch is written.
        self.db_writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nstance-db")
        #: Instance ids whose provider create was sent (at least once): never called off after that.
        self._sent: set[str] = set()
        #: ``create_many`` calls running; while any is, record follow-ups wait (see ``followups``).
        self._creating = 0
        self.followups = RecordFollowUps(ctx.store, busy=lambda: self._creating > 0, fence=ctx.fence)

    async def _has_capacity(self, subnet_id: str) -> bool:
        """Subnet capacity, asking the provider at most once per ``CAPACITY_TTL`` while it has room.

        A burst of creates would otherwise spend one (rate-limited) provider read per VM; a "full"
        answer is never cached, so the next create looks again.
        """
        now = self._ctx.clock.monotonic()
        checked = self._capacity_ok.get(subnet_id)
        if checked is not None and now - checked < CAPACITY_TTL:
            return True
        pending = self._capacity_checks.get(subnet_id)
        if pending is not None:  # one provider read answers every create waiting on it
            return await asyncio.shield(pending)
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._capacity_checks[subnet_id] = future
        try:
            ok = await self._ctx.provider.check_subnet_capacity(subnet_id)
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: waiters re-raise it, nobody else must
            raise
        finally:
            self._capacity_checks.pop(subnet_id, None)
        future.set_result(ok)
        if ok:
            self._capacity_ok[subnet_id] = now
        else:
            self._capacity_ok.pop(subnet_id, None)
        return ok

    async def create(
        self, merged: MergedGroupConfig, *, on_demand: bool = False, instance_id: str = ""
    ) -> Created:
        """Create one instance of ``merged``; see the module docstring for the crash-safe ordering."""
        result = (await self.create_many(merged, 1, on_demand=on_demand, instance_id=instance_id))[0]
        if isinstance(result, BaseException):
            raise result
        return result

    async def create_many(
        self,
        merged: MergedGroupConfig,
        count: int,
        *,
        on_demand: bool = False,
        instance_id: str = "",
        wanted: Callable[[], bool] = _always,
    ) -> list[Created | BaseException]:
        """Create up to ``count`` instances of ``merged``, pipelined in batches.

        One result per instance attempted; when the burst ends early (``wanted`` turned False, or a
        batch's intent could not be written) one more exception stands for the rest.
        Intent is written for a batch at a time (one SQLite transaction, records in parallel), and at
        most two batches are prepared ahead of the provider calls, so the first VM is asked for
        promptly and the cache work is spread over the run instead of blocking the loop up front.
        """
        self._creating += 1
        try:
            return await self._create_pipelined(
                merged, count, on_demand=on_demand, instance_id=instance_id, wanted=wanted
            )
        finally:
            self._creating -= 1
            if not self._creating:
                self.followups.wake()

    async def _create_pipelined(
        self,
        merged: MergedGroupConfig,
        count: int,
        *,
        on_demand: bool,
        instance_id: str,
        wanted: Callable[[], bool],
    ) -> list[Created | BaseException]:
        ctx = self._ctx
        batch = max(1, ctx.limiter.max_concurrent)
        window = asyncio.Semaphore(2 * batch)
        launches: list[asyncio.Task[Created]] = []
        failures: list[BaseException] = []
        unsent: dict[asyncio.Task[Created], str] = {}
        watcher = None
        if wanted is not _always:
            watcher = asyncio.create_task(
                self._call_off_when_unwanted(wanted, unsent), name="create-call-off"
            )
        try:
            return await self._create_batches(
                merged, count, on_demand, instance_id, wanted, window, unsent, batch, launches, failures
            )
        finally:
            if watcher is not None:
                watcher.cancel()

    async def _call_off_when_unwanted(
        self, wanted: Callable[[], bool], unsent: dict[asyncio.Task[Created], str]
    ) -> None:
        """Cancel every create not yet sent to the provider as soon as ``wanted`` answers False."""
        # Polled: config, leadership and queue state have no single event to wait on.
        while wanted():  # noqa: ASYNC110
            await asyncio.sleep(CALL_OFF_POLL)
        for task, iid in list(unsent.items()):
            if iid not in self._sent and not task.done():
                task.cancel(CALL_OFF_MESSAGE)

    async def _create_batches(
        self,
        merged: MergedGroupConfig,
        count: int,
        on_demand: bool,
        instance_id: str,
        wanted: Callable[[], bool],
        window: asyncio.Semaphore,
        unsent: dict[asyncio.Task[Created], str],
        batch: int,
        launches: list[asyncio.Task[Created]],
        failures: list[BaseException],
    ) -> list[Created | BaseException]:
        remaining = count
        ramp = 4  # small first batches: the first provider call goes out after a few intents, not 64
        while remaining > 0:
            size = min(batch, remaining, ramp)
            ramp *= 2
            for _ in range(size):
                await window.acquire()
            await asyncio.sleep(0)  # an uncontended acquire does not yield; the loop must get a turn
            if not wanted():
                for _ in range(size):
                    window.release()
                failures.append(CreateCancelled(f"{remaining} creates called off: the group wants fewer now"))
                break
            remaining -= size
            try:
                ready = await self._write_intent(merged, size, on_demand=on_demand, instance_id=instance_id)
            except Exception as exc:  # noqa: BLE001 - reported to the caller
                for _ in range(size):
                    window.release()
                failures.extend([exc] * size)
                if remaining:
                    log.warning(
                        "%d creates of %s/%s not started: %s", remaining, merged.tenant, merged.group, exc
                    )
                break
            for _ in range(size - len(ready)):
                window.release()
            for prepared, etag, record in ready:
                task = asyncio.create_task(self._launch(merged, prepared, etag, record, window, wanted))
                unsent[task] = prepared.request.instance_id
                task.add_done_callback(unsent.pop)
                launches.append(task)
        results: list[Created | BaseException] = []
        for result in await asyncio.gather(*launches, return_exceptions=True):
            if isinstance(result, asyncio.CancelledError) and CALL_OFF_MESSAGE in result.args:
                result = CreateCancelled("create called off before the provider call: the group wants fewer")
            results.append(result)
        return results + failures

    async def _prepare(
        self,
        merged: MergedGroupConfig,
        size: int,
        shard_cfg: ShardConfig,
        on_demand: bool,
        instance_id: str,
    ) -> list[PreparedInstance]:
        ctx = self._ctx
        pools = {k: list(v) for k, v in shard_cfg.subnet_pools.items()}
        return list(
            await asyncio.gather(
                *(
                    prepare_instance(
                        merged,
                        shard=ctx.identity,
                        nonce_key=ctx.nonce_key,
                        has_capacity=self._has_capacity,
                        subnet_pools=pools,
                        registration_timeout=shard_cfg.garbage_collection.registration_timeout,
                        clock=ctx.clock,
                        on_demand=on_demand,
                        instance_id=instance_id,
                        images=ctx.resolved_images,
                    )
                    for _ in range(size)
                )
            )
        )

    async def _write_intent(
        self, merged: MergedGroupConfig, size: int, *, on_demand: bool, instance_id: str
    ) -> list[tuple[PreparedInstance, str, records.InstanceRecord]]:
        """Prepare ``size`` instances and record the intent for all of them (row + pending record)."""
        ctx = self._ctx
        ctx.fence()
        snapshot = ctx.config.snapshot()
        if snapshot is None:
            raise Unavailable("the shard config is not loaded yet")
        shard_cfg = snapshot.config.shard
        try:
            prepared_list = await self._prepare(merged, size, shard_cfg, on_demand, instance_id)
        except RenderError as exc:
            raise RenderError(explain_missing_image(str(exc), ctx.image_errors)) from None
        ids = [p.request.instance_id for p in prepared_list]
        busy = [iid for iid in ids if iid in self.in_flight]
        if busy:
            raise AlreadyExists(f"instance {busy[0]} is already being created")
        now = ctx.clock.now()
        ctx.fence()
        rows = [
            {
                "instance_id": p.request.instance_id,
                "tenant": merged.tenant,
                "group_key": merged.group,
                "kind": merged.kind,
                "template": merged.template,
                "nonce": p.nonce,
                "on_demand": on_demand,
                "subnet_id": p.request.subnet_id,
                "instance_type": p.request.instance_type,
                "infra_config_hash": p.infra_hash,
                "idempotency_token": p.request.idempotency_token,
                "issued_at": now,
            }
            for p in prepared_list
        ]
        config_doc = records.config_document(merged)
        recs = [
            records.InstanceRecord(
                instance_id=p.request.instance_id,
                tenant=merged.tenant,
                group=merged.group,
                on_demand=on_demand,
                subnet_id=p.request.subnet_id,
                instance_type=p.request.instance_type,
                status="pending",
                created_at=now,
                last_updated=now,
                registration_jwt=p.nonce,
                config=config_doc,
                tags=dict(p.request.tags),
                infra_config_hash=p.infra_hash,
            )
            for p in prepared_list
        ]
        # The cache rows and the pending records are written at the same time: both must exist before
        # the provider is asked for a VM, and neither needs the other (a record without its row is
        # restored into the cache by recovery; a row without its record is soft-deleted below).
        self.in_flight.update(ids)
        insert = asyncio.get_running_loop().run_in_executor(self.db_writer, self._insert_rows, rows, now)
        writes = (asyncio.to_thread(records.write_record, ctx.store, r, create_only=True) for r in recs)
        (inserted,), etags = await asyncio.gather(
            asyncio.gather(insert, return_exceptions=True),
            asyncio.gather(*writes, return_exceptions=True),
        )
        if isinstance(inserted, BaseException):
            self.in_flight.difference_update(ids)
            await self._intent_abandoned(
                [r for r, etag in zip(recs, etags, strict=True) if not isinstance(etag, BaseException)]
            )
            raise inserted
        ready: list[tuple[PreparedInstance, str, records.InstanceRecord]] = []
        unwritten: list[str] = []
        for p, etag, r in zip(prepared_list, etags, recs, strict=True):
            if isinstance(etag, BaseException):
                unwritten.append(p.request.instance_id)
                log.warning("instance %s: intent record not written: %s", p.request.instance_id, etag)
            else:
                ready.append((p, etag, r))
        if unwritten:
            with ctx.db.write_connection() as session:
                for iid in unwritten:
                    repo.soft_delete(session, iid, now=ctx.clock.now())
            self.in_flight.difference_update(unwritten)
            if not ready:
                raise Unavailable(f"cannot write instance records: {etags[0]}")
        return ready

    async def _intent_abandoned(self, written: list[records.InstanceRecord]) -> None:
        """The cache refused a batch whose records were written: mark those records failed (no VM exists)."""
        for record in written:
            await self._mark_record_failed(record.tenant, record.instance_id)

    async def _launch(
        self,
        merged: MergedGroupConfig,
        prepared: PreparedInstance,
        etag: str,
        record: records.InstanceRecord,
        window: asyncio.Semaphore,
        wanted: Callable[[], bool] = _always,
    ) -> Created:
        """Provider create for one recorded intent, then the provider id into record and cache."""
        ctx = self._ctx
        iid = prepared.request.instance_id
        try:
            try:
                self._ctx.fault_point("before-provider-create")
                vm = await self._provider_create(prepared.request, wanted)
            finally:
                window.release()
        except BaseException:
            self.in_flight.discard(iid)
            self._sent.discard(iid)
            await self._create_failed(merged.tenant, iid)
            raise
        self._sent.discard(iid)
        self._ctx.fault_point("after-provider-create")
        await self._record_provider(record, etag, vm)
        ctx.metrics.record_provider_create()
        return Created(iid, vm.status.value)

    async def _provider_create(self, request: Any, wanted: Callable[[], bool] = _always) -> ProviderInstance:
        ctx = self._ctx
        attempt = 0
        while True:
            async with ctx.limiter.slot():
                ctx.fence()
                if not wanted():
                    raise CreateCancelled(
                        f"create of {request.instance_id} called off: the group wants fewer now"
                    )
                self._sent.add(request.instance_id)
                try:
                    return await ctx.provider.create_instance(request)
                except (ProviderThrottled, ProviderUnavailable) as exc:
                    attempt += 1
                    if attempt >= CREATE_ATTEMPTS:
                        raise
                    log.warning(
                        "create of %s: %s (attempt %d of %d); retrying with the same idempotency token",
                        request.instance_id,
                        exc,
                        attempt,
                        CREATE_ATTEMPTS,
                    )
            await asyncio.sleep(self._backoff.delay(attempt - 1))

    async def _create_failed(self, tenant: str, iid: str) -> None:
        """The create did not succeed: the row stops counting; any VM it made is found by the re-list.

        Unless the instance's agent registered while the call was out: then the create made a VM after
        all (its answer was lost), and the row stays, to be completed by a listing (by tag)."""
        ctx = self._ctx
        now = ctx.clock.now()
        with ctx.db.write_connection() as session:
            marked = repo.mark_create_failed(session, iid, now=now)
            row = None if marked else repo.get_instance(session, iid)
        if row is not None and row.deleted_at is None and row.registered_at is not None:
            log.warning(
                "create of %s reported a failure, but its agent has registered: the VM exists; "
                "a provider listing fills in its id",
                iid,
            )
            return
        await self._mark_record_failed(tenant, iid)

    async def _mark_record_failed(self, tenant: str, iid: str) -> None:
        """Status ``failed`` into the instance's record, if still leading; owed when it cannot be written
        now (``owedstatus``). A deposed leader leaves the pending record to the next leader, which adopts
        the VM by tag if the create went through after all, or retires it."""
        await self._owed.write(tenant, iid, "failed")

    async def _record_provider(self, record: records.InstanceRecord, etag: str, vm: ProviderInstance) -> None:
        """The provider's answer into the cache now, and queued for the record (``followups``)."""
        updated = dataclasses.replace(
            record,
            provider_instance_id=vm.provider_id,
            status=vm.status.value,
            private_ipv4=vm.ip4,
            private_ipv6=vm.ip6,
            hostname=vm.hostname,
            last_updated=self._ctx.clock.now(),
        )
        await self._adopt_batched(record.instance_id, vm)
        self.followups.add(updated, etag)

    def _insert_rows(self, rows: list[dict[str, Any]], now: datetime) -> None:
        with self._ctx.db.write_connection() as conn:
            repo.insert_instances(conn, rows, now=now)

    async def _adopt_batched(self, iid: str, vm: ProviderInstance) -> None:
        """Store the provider id in the cache; concurrent callers are written in one transaction."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        self._adopt_queue.append((iid, vm, done))
        if self._adopt_task is None or self._adopt_task.done():
            self._adopt_task = loop.create_task(self._flush_adoptions())
        await done

    async def _flush_adoptions(self) -> None:
        loop = asyncio.get_running_loop()
        while self._adopt_queue:
            queue, self._adopt_queue = self._adopt_queue, []
            error: BaseException | None = None
            try:
                await loop.run_in_executor(
                    self.db_writer, self._write_adoptions, [(iid, vm) for iid, vm, _ in queue]
                )
            except Exception as exc:  # noqa: BLE001 - handed to every waiter
                error = exc
            finally:
                self.in_flight.difference_update(iid for iid, _, _ in queue)
            for _, _, done in queue:
                if not done.done():
                    if error is None:
                        done.set_result(None)
                    else:
                        done.set_exception(error)

    def _write_adoptions(self, queue: list[tuple[str, ProviderInstance]]) -> None:
        ctx = self._ctx
        with ctx.db.write_connection() as session:
            repo.set_provider_details_many(
                session,
                [
                    {
                        "instance_id": iid,
                        "provider_id": vm.provider_id,
                        "provider_status": vm.status.value,
                        "hostname": vm.hostname or None,
                        "ip4": vm.ip4 or None,
                        "ip6": vm.ip6 or None,
                    }
                    for iid, vm in queue
                ],
                now=ctx.clock.now(),
            )

    def adopt(self, iid: str, vm: ProviderInstance) -> None:
        """Store what the provider says about one of our VMs in the cache."""
        self._write_adoptions([(iid, vm)])
