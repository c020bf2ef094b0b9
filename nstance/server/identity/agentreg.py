"""Agent registration: a single-use nonce and a public key in, an agent certificate out (shard leader only).

The nonce (kind ``agent``, this cluster, this shard) is consumed by one conditional SQLite UPDATE
(``repo.claim_agent_registration``; the claims of one event-loop turn share one transaction on the
shard's database writer, ``writebatch``), so of any number of concurrent or replayed registrations
exactly one succeeds; the others get ALREADY_EXISTS and change nothing. The winner's certificate
facts are then written to the instance record in object storage (compare-and-swap); if that write
fails, the SQLite claim is undone (guarded by the certificate serial) and the agent gets
UNAVAILABLE, so it can retry with the same nonce.

The record has the last word. A claim can succeed on a cache row that is behind its record (another
leader registered the agent while this server could not read the record); it then meets that other
registration in the record, is refused ALREADY_EXISTS, and the row takes the record's word. A
registration this process wrote and undid (a write that failed but may have landed) is not another
one: its certificate was never handed out, so a retry may replace it.

The claim and the record write are one step that finishes even when the caller goes away. A
registration that finished for a caller who had left is released (``_release``): its certificate
never reached the agent, which retries with the same nonce.

A registration is reported to the shard through ``RegistrationEvents``. Renewal is ``renewal``;
operators are ``operatorreg``.

On a store whose calls wait on no network (``records.is_local``: the ``file://`` default) the record
writes of the registrations that reach that point in one loop turn are one job of a worker thread too,
made one after another (``records.modify_records``): under load, a thread hand-over per record cost
more than the write (``docs/benchmarks.md``). On a remote store each record is written in a thread of
its own, so that their round trips overlap.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import ipaddress
import logging
from concurrent.futures import Executor
from datetime import datetime
from typing import NamedTuple, Protocol

from nstance.core.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    Unauthenticated,
    Unavailable,
)
from nstance.core.hostport import hostname_problem
from nstance.core.ids import validate_puid
from nstance.db import repo
from nstance.db.models import RECORD_FAILED
from nstance.db.rows import InstanceRow
from nstance.pki.certs import IssuedCertificate
from nstance.pki.nonce import NonceClaims, verify_nonce
from nstance.server.identity import issuing
from nstance.server.identity.writebatch import WriteBatcher
from nstance.server.reconcile import recovery
from nstance.server.state import records
from nstance.server.state.context import ShardContext
from nstance.server.state.records import InstanceRecord

log = logging.getLogger(__name__)

UNDONE_KEPT = 10_000
"""Instances whose undone claims' serials ``AgentRegistration`` remembers at most (oldest dropped)."""


class RegistrationEvents(Protocol):
    """Told of every successful agent registration (the shard: judge the agent's health from now on)."""

    def agent_registered(self, tenant: str, group: str, instance_id: str) -> None: ...


def _check_reported(private_ipv4: str, private_ipv6: str, hostname: str) -> None:
    """Refuse agent-reported addresses that are not what their field says (before anything is claimed)."""
    if private_ipv4:
        try:
            ipaddress.IPv4Address(private_ipv4)
        except ValueError:
            raise InvalidArgument(f"private_ipv4 {private_ipv4!r} is not an IPv4 address") from None
    if private_ipv6:
        try:
            ipaddress.IPv6Address(private_ipv6)
        except ValueError:
            raise InvalidArgument(f"private_ipv6 {private_ipv6!r} is not an IPv6 address") from None
    if hostname and (problem := hostname_problem(hostname)) is not None:
        raise InvalidArgument(f"hostname {hostname[:64]!r} {problem}")


class _ClaimRequest(NamedTuple):
    """One agent registration's claim, as queued for the database writer."""

    nonce_jwt: str
    claims: NonceClaims
    pem: str
    issued: IssuedCertificate
    now: datetime
    reported: tuple[str, str, str]


class AgentRegistration:
    """Registers agents of one shard (see the module docstring)."""

    def __init__(self, ctx: ShardContext, *, db_writer: Executor, events: RegistrationEvents | None) -> None:
        self.ctx = ctx
        self._events = events
        self._db_writer = db_writer
        # Claims that reach the writer in one loop turn share one job and one transaction.
        self._claims: WriteBatcher[_ClaimRequest, repo.AgentClaim] = WriteBatcher(
            self._db_writer, self._claim_many
        )
        #: The record writes' batcher on a local store (None on a remote one); its counts are read by tests.
        self.record_writes: WriteBatcher[records.RecordChange, InstanceRecord | Exception] | None = None
        if records.is_local(ctx.store):
            self.record_writes = WriteBatcher(None, functools.partial(records.modify_records, ctx.store))
        #: Per instance, the serials of this process's claims undone after their record write failed.
        #: Such a write may still have landed (a timeout after the store took it), and its certificate
        #: was never handed out, so a retry may overwrite it; any other registration in the record is
        #: a nonce already used (``_registered_record``).
        self._undone: dict[str, set[str]] = {}
        #: Per instance, the registration attempts under way in this process (``_attempt``).
        self._attempts: dict[str, list[asyncio.Future[bool]]] = {}

    async def register_agent(
        self,
        *,
        nonce_jwt: str,
        public_key_pem: bytes,
        private_ipv4: str,
        private_ipv6: str,
        hostname: str,
    ) -> IssuedCertificate:
        """Exchange an agent nonce for an agent certificate (CN = instance id, O = tenant)."""
        ctx = self.ctx
        ctx.fence()
        claims = verify_nonce(
            nonce_jwt,
            ctx.nonce_key.public_key(),
            expected_kind="agent",
            cluster_id=ctx.identity.cluster_id,
            shard=ctx.identity.shard,
            clock=ctx.clock,
        )
        instance_id = claims.sub
        try:
            validate_puid(instance_id)
        except InvalidArgument as exc:
            raise Unauthenticated(
                f"registration nonce subject {instance_id!r} is not an instance id: {exc}"
            ) from None
        _check_reported(private_ipv4, private_ipv6, hostname)
        # The certificate is signed before the claim (the claim stores its serial); the JWT's tenant is
        # the one the claim requires the row to have. A key refused here still reports a problem with
        # the nonce's row first, as the documented order of checks says.
        try:
            issued = issuing.issue(
                ctx, public_key_pem, client_id=instance_id, tenant=claims.tenant, role="agent"
            )
        except InvalidArgument:
            await self._explain_unclaimed(nonce_jwt, claims, refused_key=True)
            raise
        pem = issuing.canonical_pem(issued)

        ctx.fence()
        request = _ClaimRequest(
            nonce_jwt, claims, pem, issued, ctx.clock.now(), (private_ipv4, private_ipv6, hostname)
        )
        # Claim and record (or undo) as one step that finishes even if the caller goes away meanwhile,
        # so a cancelled call never leaves SQLite and the record disagreeing; a registration made for a
        # caller that left is then released, as its certificate was never handed out.
        stands = self._attempt(instance_id)
        try:
            group_key = await issuing.uncancellable(
                self._claim_and_record(request, stands),
                undo_if_left=functools.partial(self._release, request, stands),
            )
        except asyncio.CancelledError:
            raise  # the step goes on; its outcome is settled when it (and any release) is over
        except BaseException:
            _settle(stands, False)
            raise
        _settle(stands, True)
        self._undone.pop(instance_id, None)
        log.info(
            "agent registered",
            extra={"instance_id": instance_id, "tenant": claims.tenant, "cert_serial": issued.serial_hex},
        )
        if self._events is not None:
            try:
                self._events.agent_registered(claims.tenant, group_key, instance_id)
            except Exception:  # the registration is done; a failing listener must not undo the reply
                log.exception("agent %s: telling the shard of its registration failed", instance_id)
        return issued

    def _attempt(self, instance_id: str) -> asyncio.Future[bool]:
        """A new registration attempt of ``instance_id`` in this process: its future says, once settled,
        whether its registration stands (True) or was refused, undone or released (False)."""
        stands: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        attempts = self._attempts.setdefault(instance_id, [])
        attempts.append(stands)

        def gone(_: asyncio.Future[bool]) -> None:
            attempts.remove(stands)
            if not attempts and self._attempts.get(instance_id) is attempts:
                del self._attempts[instance_id]

        stands.add_done_callback(gone)
        return stands

    async def _claim_and_record(self, r: _ClaimRequest, stands: asyncio.Future[bool]) -> str:
        """Claim the nonce, then record the registration (undone if that fails); the row's group."""
        try:
            claim = await self._claims.submit(r)
            if not claim.claimed:
                _settle(stands, False)  # first: a rival that lost as well may be waiting for this one
                rivals = [f for f in self._attempts.get(r.claims.sub, []) if f is not stands]
                await self._explain_unclaimed(r.nonce_jwt, r.claims, refused_key=False, rivals=rivals)
            await self._finish_agent(r.claims.tenant, r.claims.sub, r.pem, r.issued, r.now, r.reported)
        except BaseException:
            _settle(stands, False)
            raise
        return claim.group_key

    async def _release(self, r: _ClaimRequest, stands: asyncio.Future[bool]) -> None:
        """Undo a registration whose certificate never reached its caller, so the agent's retry with the
        same nonce registers: the claim in SQLite (guarded by the serial), then the record's registration
        if it is still this one. Should the record keep it (a failed write), this process still lets the
        retry replace it (``_undone``); only a new leader would then refuse the nonce as used."""
        instance_id, serial = r.claims.sub, r.issued.serial_hex
        what = "its registration call ended before the answer"
        self._remember_undone(instance_id, serial)  # first: a retry may claim as soon as the claim is undone
        undone = False
        try:
            self.ctx.fence()
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(
                self._db_writer, self._unclaim, instance_id, r.issued, self.ctx.clock.now()
            )
            undone = True
        except Exception as exc:  # noqa: BLE001 - no caller is left to tell
            log.warning(
                "agent %s: %s; undoing the claim of certificate %s failed (%s)",
                instance_id,
                what,
                serial,
                exc,
            )
            return
        finally:
            # The claim is undone now, or it stays (failed, or cut off): rivals waiting may go on.
            _settle(stands, not undone)
        try:
            await self._write_record(
                (
                    r.claims.tenant,
                    instance_id,
                    lambda rec: _unregistered_record(rec, serial, self.ctx.clock.now()),
                )
            )
        except Exception as exc:  # noqa: BLE001 - no caller is left to tell
            log.warning(
                "agent %s: %s; claim of certificate %s undone, but its record still names it (%s): "
                "a retry with the same nonce registers while this server leads",
                instance_id,
                what,
                serial,
                exc,
            )
            return
        log.warning(
            "agent %s: %s; certificate %s released, so a retry with the same nonce registers",
            instance_id,
            what,
            serial,
        )

    async def _explain_unclaimed(
        self,
        nonce_jwt: str,
        claims: NonceClaims,
        *,
        refused_key: bool,
        rivals: list[asyncio.Future[bool]] | None = None,
    ) -> None:
        """Raise why the nonce's row cannot be claimed; with ``refused_key``, return if nothing is wrong.

        ``rivals`` are the other attempts of this instance under way in this process. A claim lost to
        one of them is a used nonce only if that registration stands: once they are over, the row is
        read again, and if it is not registered (the winner was undone, or released because its caller
        left before the answer) this caller is told to retry (UNAVAILABLE) rather than refused for good,
        as an agent stops calling on ALREADY_EXISTS.
        """
        row = await asyncio.to_thread(self._read_instance, nonce_jwt)
        self._check_instance(row, claims)
        assert row is not None  # _check_instance refuses None
        if rivals:
            await asyncio.gather(*(asyncio.shield(f) for f in rivals))
            row = await asyncio.to_thread(self._read_instance, nonce_jwt)
            self._check_instance(row, claims)
            assert row is not None
            if row.registered_at is None:
                raise Unavailable(
                    f"another registration of instance {claims.sub} was under way here and has been "
                    "undone; retry with the same nonce"
                )
        if row.registered_at is not None or not refused_key:
            raise self._replayed(claims.sub)

    @staticmethod
    def _replayed(instance_id: str) -> AlreadyExists:
        return AlreadyExists(
            f"registration nonce already used: instance {instance_id} is already registered, and a "
            "nonce registers one agent once (a registered agent renews with RenewAgentCertificate)"
        )

    async def _finish_agent(
        self,
        tenant: str,
        instance_id: str,
        pem: str,
        issued: IssuedCertificate,
        now: datetime,
        reported: tuple[str, str, str],
    ) -> None:
        """After the claim (it stored the reported addresses): write the instance record; undo on failure."""
        ctx = self.ctx
        ip4, ip6, hostname = reported
        loop = asyncio.get_running_loop()
        self.ctx.fault_point("after-registration-claim")
        ours = frozenset(self._undone.get(instance_id, ())) | {issued.serial_hex}
        try:
            ctx.fence()
            await self._write_record(
                (
                    tenant,
                    instance_id,
                    lambda rec: _registered_record(rec, ours, pem, issued, now, ip4, ip6, hostname),
                )
            )
        except _UsedInRecord as exc:
            # The cache row was behind its record: it takes the record's word (which replaces this
            # claim, and the addresses the caller reported with it).
            await loop.run_in_executor(self._db_writer, self._refresh_row, exc.record)
            log.warning(
                "agent %s: registration refused: %s; its cache row is refreshed from the record",
                instance_id,
                exc,
            )
            raise
        except Exception as exc:
            undone = await loop.run_in_executor(self._db_writer, self._unclaim, instance_id, issued, now)
            self._remember_undone(instance_id, issued.serial_hex)
            log.warning(
                "agent %s: registration not recorded in object storage (%s); nonce claim %s",
                instance_id,
                exc,
                "undone" if undone else "NOT undone",
            )
            if isinstance(exc, NotFound):
                raise FailedPrecondition(
                    f"instance {instance_id} has no record in object storage; it cannot register"
                ) from exc
            raise Unavailable(
                f"could not record the registration of instance {instance_id} ({exc}); "
                "retry with the same nonce"
            ) from exc

    async def _write_record(self, change: records.RecordChange) -> None:
        """``records.modify_record`` in a worker thread: batched on a local store, alone otherwise."""
        if self.record_writes is None:
            await asyncio.to_thread(records.modify_record, self.ctx.store, *change)
            return
        result = await self.record_writes.submit(change)
        if isinstance(result, Exception):
            raise result

    def _read_instance(self, nonce_jwt: str) -> InstanceRow | None:
        with self.ctx.db.read_connection() as session:
            return repo.get_instance_by_nonce(session, nonce_jwt)

    def _check_instance(self, row: InstanceRow | None, claims: NonceClaims) -> None:
        if row is None:
            raise NotFound(
                f"instance {claims.sub} has no pending registration on shard {self.ctx.identity.shard} "
                "(unknown nonce: the instance was never created here or has been purged)"
            )
        if row.id != claims.sub or row.tenant != claims.tenant:
            raise Unauthenticated(
                f"registration nonce names instance {claims.sub} of tenant {claims.tenant!r}, "
                f"but it was issued to instance {row.id} of tenant {row.tenant!r}"
            )
        if row.deleted_at is not None:
            raise FailedPrecondition(f"instance {row.id} has been deleted; it cannot register")
        if row.record_state == RECORD_FAILED and row.registered_at is None:
            raise FailedPrecondition(
                f"instance {row.id}: its provider create failed (the leader never had the VM confirmed); "
                "it cannot register, and its VM is deleted when a provider listing finds it"
            )

    def _claim_many(self, requests: list[_ClaimRequest]) -> list[repo.AgentClaim]:
        """The claims of one batch, each its own conditional UPDATE, in one transaction (DB writer)."""
        with self.ctx.db.write_connection() as conn:
            return [
                repo.claim_agent_registration(
                    conn,
                    nonce=r.nonce_jwt,
                    instance_id=r.claims.sub,
                    tenant=r.claims.tenant,
                    public_key_pem=r.pem,
                    cert_serial=r.issued.serial_hex,
                    cert_expires_at=r.issued.not_after,
                    now=r.now,
                    ip4=r.reported[0],
                    ip6=r.reported[1],
                    hostname=r.reported[2],
                )
                for r in requests
            ]

    def _unclaim(self, instance_id: str, issued: IssuedCertificate, now: datetime) -> bool:
        with self.ctx.db.write_connection() as session:
            return repo.unmark_registered(
                session, instance_id=instance_id, cert_serial=issued.serial_hex, now=now
            )

    def _refresh_row(self, rec: InstanceRecord) -> None:
        with self.ctx.db.write_connection() as conn:
            recovery.refresh_rows(conn, [rec])

    def _remember_undone(self, instance_id: str, serial: str) -> None:
        """Note a claim undone after a failed record write (at most ``UNDONE_KEPT`` instances)."""
        self._undone.setdefault(instance_id, set()).add(serial)
        while len(self._undone) > UNDONE_KEPT:
            del self._undone[next(iter(self._undone))]


def _settle(stands: asyncio.Future[bool], value: bool) -> None:
    """Say whether an attempt's registration stands (the first word counts)."""
    if not stands.done():
        stands.set_result(value)


def _unregistered_record(rec: InstanceRecord, serial: str, now: datetime) -> InstanceRecord:
    """``rec`` without the registration of certificate ``serial``; unchanged if it holds another."""
    if rec.cert_serial != serial:
        return rec
    return dataclasses.replace(
        rec, registered_at=None, public_key_pem="", cert_serial="", cert_expires_at=None, last_updated=now
    )


class _UsedInRecord(AlreadyExists):
    """The instance record holds another registration: the nonce was used (``record`` is that record)."""

    def __init__(self, record: InstanceRecord) -> None:
        super().__init__(
            f"registration nonce already used: the record of instance {record.instance_id} holds the "
            f"registration of certificate {record.cert_serial}, and a nonce registers one agent once "
            "(a registered agent renews with RenewAgentCertificate)"
        )
        self.record = record


def _registered_record(
    rec: InstanceRecord,
    ours: frozenset[str],
    pem: str,
    issued: IssuedCertificate,
    now: datetime,
    ip4: str,
    ip6: str,
    hostname: str,
) -> InstanceRecord:
    """``rec`` with this registration's facts; AlreadyExists if it holds another registration.

    The record is the durable word on whether a nonce was used: a claim in this server's SQLite can
    succeed on a row that is behind its record (the record was unreadable when this server took over,
    and another leader registered the agent meanwhile). ``ours`` are the serials this process wrote
    or may have written for the instance (this claim's, and those of claims undone after a failed
    write): those certificates were never handed out, so they do not make the nonce used.
    """
    if rec.cert_serial and rec.cert_serial not in ours:
        raise _UsedInRecord(rec)
    return dataclasses.replace(
        rec,
        registered_at=now,
        public_key_pem=pem,
        cert_serial=issued.serial_hex,
        cert_expires_at=issued.not_after,
        private_ipv4=ip4 or rec.private_ipv4,
        private_ipv6=ip6 or rec.private_ipv6,
        hostname=hostname or rec.hostname,
        last_updated=now,
    )
