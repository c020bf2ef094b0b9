"""Registration of agents and operators, and agent certificate renewal (the RegistrationService logic).

``Registrar`` turns a single-use registration nonce JWT plus an ECDSA P-256 or Ed25519 public key
into a client certificate signed by the cluster CA, and records the registration durably:

* **Agents** (``register_agent``, shard leader only): the nonce (kind ``agent``, this cluster, this
  shard) is consumed by one conditional SQLite UPDATE (``repo.claim_agent_registration``), so of any
  number of concurrent or replayed registrations exactly one succeeds; the others get ALREADY_EXISTS
  and change nothing. The winner's certificate facts are then written to the instance record in
  object storage (compare-and-swap); if that write fails, the SQLite claim is undone (guarded by the
  certificate serial) and the agent gets UNAVAILABLE, so it can retry with the same nonce.
* **Operators** (``register_operator``, cluster leader only): the nonce (kind ``operator``,
  ``sub == cluster_id``) is bound to the first public key presented by a create-only write of
  ``operator-nonce/{sha256hex(nonce)}.pem`` in cluster storage. The same key may retry (and gets a
  fresh certificate); any other key is refused. The registration is cached in SQLite (``operators``)
  and written to the operator record ``operator/{tenant}.{cluster_id}.json``.
* **Agent renewal** (``renew_agent``): an authenticated agent presenting its *current* certificate
  (serial equal to the instance's ``cert_serial``) gets a new certificate for a new key; the serial
  swap is a compare-and-swap, so a superseded certificate can never renew.
* ``backfill_operators`` fills an empty ``operators`` table from the operator records in storage.

Blocking work (SQLite, object storage) runs in worker threads; the event loop only verifies the
JWT and signs the certificate (well under a millisecond each). Errors are ``nstance.core.errors``
exceptions; the gRPC interceptor maps them to status codes. This module must not import generated
gRPC code (the servicer translates), decide anything about an instance's lifecycle, or write to
stores other than the ones named above. See ``docs/registration.md``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import ipaddress
import json
import logging
from collections.abc import Coroutine
from concurrent.futures import Executor, ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple, Protocol

from nstance.core.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    Unauthenticated,
    Unavailable,
)
from nstance.core.ids import new_puid, parse_puid
from nstance.db import repo
from nstance.db.rows import InstanceRow
from nstance.objectstore.base import ObjectNotFound, PreconditionFailed
from nstance.pki.certs import DEFAULT_CLIENT_TTL, IssuedCertificate, issue_client_certificate
from nstance.pki.keys import load_any_public_key_pem, public_key_to_der, public_key_to_pem
from nstance.pki.nonce import NonceClaims, verify_nonce
from nstance.pki.operator_record import operator_record, operator_record_key
from nstance.pki.peer import PeerIdentity
from nstance.server.identity.writebatch import WriteBatcher
from nstance.server.state import records
from nstance.server.state.context import ShardContext
from nstance.server.state.records import InstanceRecord

log = logging.getLogger(__name__)

OPERATOR_NONCE_PREFIX = "operator-nonce/"
"""Where operator nonce -> public key bindings live in the cluster scope."""

OPERATOR_RECORD_PREFIX = "operator/"
"""Where operator registration records live in the cluster scope."""

MAX_HOSTNAME_LENGTH = 253


class RegistrationEvents(Protocol):
    """Told of every successful agent registration (the shard: judge the agent's health from now on)."""

    def agent_registered(self, tenant: str, group: str, instance_id: str) -> None: ...


def operator_nonce_key(nonce_jwt: str) -> str:
    """``operator-nonce/{sha256hex(nonce)}.pem``: the binding object of an operator nonce."""
    digest = hashlib.sha256(nonce_jwt.encode("utf-8")).hexdigest()
    return f"{OPERATOR_NONCE_PREFIX}{digest}.pem"


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
    if hostname and (
        len(hostname) > MAX_HOSTNAME_LENGTH
        or not hostname.isprintable()
        or any(c.isspace() for c in hostname)
    ):
        raise InvalidArgument(
            f"hostname {hostname[:64]!r} is not a host name (printable, no spaces, "
            f"at most {MAX_HOSTNAME_LENGTH} characters)"
        )


def _consume_result(task: asyncio.Task[None]) -> None:
    """Retrieve a finished task's outcome (its caller may have gone away) so nothing is lost silently."""
    if not task.cancelled() and task.exception() is not None:
        log.debug("registration step finished after its caller left: %s", task.exception())


async def _uncancellable(step: Coroutine[Any, Any, None]) -> None:
    """Run ``step`` to completion even if the awaiting RPC is cancelled; re-raise its error if awaited."""
    task = asyncio.ensure_future(step)
    task.add_done_callback(_consume_result)
    await asyncio.shield(task)


def _parse_time(raw: object) -> datetime | None:
    if not isinstance(raw, str) or not raw:
        return None
    try:
        value = datetime.fromisoformat(raw)
    except ValueError:
        return None
    return value.astimezone(UTC) if value.tzinfo else value.replace(tzinfo=UTC)


class _ClaimRequest(NamedTuple):
    """One agent registration's claim, as queued for the database writer."""

    nonce_jwt: str
    claims: NonceClaims
    pem: str
    issued: IssuedCertificate
    now: datetime
    reported: tuple[str, str, str]


class Registrar:
    """The registration logic of one shard server (see the module docstring)."""

    def __init__(
        self,
        ctx: ShardContext,
        *,
        db_writer: Executor | None = None,
        events: RegistrationEvents | None = None,
    ) -> None:
        self.ctx = ctx
        self._events = events
        # SQLite writes of the hot path go to one thread: dozens of I/O threads queueing on SQLite's
        # write lock (busy_timeout polling) made registration latency seconds long under load. The
        # server passes the shard's single database writer, shared with the create path and health.
        self._db_writer = db_writer or ThreadPoolExecutor(max_workers=1, thread_name_prefix="nstance-reg-db")
        # Claims that reach the writer in one loop turn share one job and one transaction.
        self._claims: WriteBatcher[_ClaimRequest, repo.AgentClaim] = WriteBatcher(
            self._db_writer, self._claim_many
        )

    # --- shared helpers -----------------------------------------------------------------------

    def _client_ttl(self, name: str) -> timedelta:
        """``certificates.<name>.ttl`` hours from the shard config, else 8760 h."""
        snapshot = self.ctx.config.snapshot()
        if snapshot is not None:
            entry = snapshot.config.certificates.get(name)
            if entry is not None:
                return timedelta(hours=entry.ttl)
        return DEFAULT_CLIENT_TTL

    def _issue(self, public_key_pem: bytes, *, client_id: str, tenant: str, role: str) -> IssuedCertificate:
        """Check the key (ECDSA P-256 or Ed25519 PEM, InvalidArgument otherwise) and sign a certificate."""
        if not public_key_pem:
            raise InvalidArgument(
                "public_key_pem is empty; send the ECDSA P-256 or Ed25519 public key "
                "(SubjectPublicKeyInfo PEM)"
            )
        try:
            return issue_client_certificate(
                self.ctx.ca,
                public_key_pem,
                client_id=client_id,
                tenant=tenant,
                role=role,
                ttl=self._client_ttl(role),
                clock=self.ctx.clock,
            )
        except InvalidArgument as exc:
            if "ECDSA P-256" in str(exc):
                raise
            raise InvalidArgument(
                f"{exc}; an ECDSA P-256 or Ed25519 public key (SubjectPublicKeyInfo PEM) is required"
            ) from None

    @staticmethod
    def _canonical_pem(issued: IssuedCertificate) -> str:
        """The certified public key as SubjectPublicKeyInfo PEM (one spelling for every stored copy)."""
        return public_key_to_pem(issued.certificate.public_key()).decode("ascii")  # type: ignore[arg-type]

    def _require_cluster_leader(self) -> None:
        cluster = self.ctx.cluster_leadership
        if cluster is None or cluster.is_leader():
            return
        addr = cluster.leader_address()
        where = f"the cluster leader is at {addr}" if addr else "no cluster leader is known yet"
        raise Unavailable(f"operator registration is served by the cluster leader; {where}; retry there")

    # --- agents -------------------------------------------------------------------------------

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
            parse_puid(instance_id)
        except InvalidArgument as exc:
            raise Unauthenticated(
                f"registration nonce subject {instance_id!r} is not an instance id: {exc}"
            ) from None
        _check_reported(private_ipv4, private_ipv6, hostname)
        # The certificate is signed before the claim (the claim stores its serial); the JWT's tenant is
        # the one the claim requires the row to have. A key refused here still reports a problem with
        # the nonce's row first, as the documented order of checks says.
        try:
            issued = self._issue(public_key_pem, client_id=instance_id, tenant=claims.tenant, role="agent")
        except InvalidArgument:
            await self._explain_unclaimed(nonce_jwt, claims, refused_key=True)
            raise
        pem = self._canonical_pem(issued)

        ctx.fence()
        now = ctx.clock.now()
        reported = (private_ipv4, private_ipv6, hostname)
        claim = await self._claims.submit(_ClaimRequest(nonce_jwt, claims, pem, issued, now, reported))
        if not claim.claimed:
            await self._explain_unclaimed(nonce_jwt, claims, refused_key=False)
        # The claim is ours: finish (record, or undo) even if the client goes away meanwhile, so a
        # cancelled call never leaves SQLite and the record disagreeing.
        await _uncancellable(self._finish_agent(claims.tenant, instance_id, pem, issued, now, reported))
        log.info(
            "agent registered",
            extra={"instance_id": instance_id, "tenant": claims.tenant, "cert_serial": issued.serial_hex},
        )
        if self._events is not None:
            try:
                self._events.agent_registered(claims.tenant, claim.group_key, instance_id)
            except Exception:  # the registration is done; a failing listener must not undo the reply
                log.exception("agent %s: telling the shard of its registration failed", instance_id)
        return issued

    async def _explain_unclaimed(self, nonce_jwt: str, claims: NonceClaims, *, refused_key: bool) -> None:
        """Raise why the nonce's row cannot be claimed; with ``refused_key``, return if nothing is wrong."""
        row = await asyncio.to_thread(self._read_instance, nonce_jwt)
        self._check_instance(row, claims)
        assert row is not None  # _check_instance refuses None
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
        try:
            ctx.fence()
            await asyncio.to_thread(
                records.modify_record,
                ctx.store,
                tenant,
                instance_id,
                lambda rec: self._registered_record(rec, pem, issued, now, ip4, ip6, hostname),
            )
        except Exception as exc:
            undone = await loop.run_in_executor(self._db_writer, self._unclaim, instance_id, issued, now)
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

    @staticmethod
    def _registered_record(
        rec: InstanceRecord,
        pem: str,
        issued: IssuedCertificate,
        now: datetime,
        ip4: str,
        ip6: str,
        hostname: str,
    ) -> InstanceRecord:
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

    # --- agent renewal ------------------------------------------------------------------------

    async def renew_agent(self, peer: PeerIdentity, public_key_pem: bytes) -> IssuedCertificate:
        """Issue a new agent certificate for the caller's instance, if it presented its current one."""
        ctx = self.ctx
        if peer.role != "agent":
            raise PermissionDenied(f"{peer.role} {peer.client_id!r} may not renew an agent certificate")
        ctx.fence()
        with_row = await asyncio.to_thread(self._read_instance_by_id, peer.client_id)
        if with_row is None or with_row.deleted_at is not None or with_row.tenant != peer.tenant:
            raise PermissionDenied(f"instance {peer.client_id} is not an active instance of this shard")
        if with_row.registered_at is None or not with_row.cert_serial:
            raise PermissionDenied(f"instance {peer.client_id} has not registered; it cannot renew")
        current = repo.normalize_serial(with_row.cert_serial)
        if repo.normalize_serial(peer.serial) != current:
            raise PermissionDenied(
                f"certificate serial {peer.serial} is not the current certificate of instance "
                f"{peer.client_id} (it was superseded by serial {current}); only the newest "
                "certificate can renew"
            )
        issued = self._issue(public_key_pem, client_id=peer.client_id, tenant=peer.tenant, role="agent")
        pem = self._canonical_pem(issued)
        old_pem = with_row.instance_pub or ""
        old_expiry = with_row.cert_expires_at or peer.not_after

        ctx.fence()
        now = ctx.clock.now()
        swapped = await asyncio.to_thread(
            self._swap_certificate, peer.client_id, current, pem, issued.serial_hex, issued.not_after, now
        )
        if not swapped:
            raise PermissionDenied(
                f"certificate serial {peer.serial} is no longer the current certificate of instance "
                f"{peer.client_id} (renewed concurrently); only the newest certificate can renew"
            )
        undo = (old_pem, current, old_expiry)
        await _uncancellable(self._finish_renewal(peer, pem, issued, now, undo))
        log.info(
            "agent certificate renewed",
            extra={"instance_id": peer.client_id, "old_serial": current, "cert_serial": issued.serial_hex},
        )
        return issued

    async def _finish_renewal(
        self,
        peer: PeerIdentity,
        pem: str,
        issued: IssuedCertificate,
        now: datetime,
        undo: tuple[str, str, datetime],
    ) -> None:
        """After the serial swap: write the instance record; swap back if that fails."""
        ctx = self.ctx
        try:
            ctx.fence()
            await asyncio.to_thread(
                records.modify_record,
                ctx.store,
                peer.tenant,
                peer.client_id,
                lambda rec: dataclasses.replace(
                    rec,
                    public_key_pem=pem,
                    cert_serial=issued.serial_hex,
                    cert_expires_at=issued.not_after,
                    last_updated=now,
                ),
            )
        except Exception as exc:
            old_pem, old_serial, old_expiry = undo
            await asyncio.to_thread(
                self._swap_certificate,
                peer.client_id,
                issued.serial_hex,
                old_pem,
                old_serial,
                old_expiry,
                now,
            )
            log.warning("agent %s: renewal not recorded in object storage (%s); undone", peer.client_id, exc)
            raise Unavailable(
                f"could not record the renewed certificate of instance {peer.client_id} ({exc}); "
                "retry with the current certificate"
            ) from exc

    def _read_instance_by_id(self, instance_id: str) -> InstanceRow | None:
        with self.ctx.db.read_connection() as session:
            return repo.get_instance(session, instance_id)

    def _swap_certificate(
        self, instance_id: str, expected: str, pem: str, serial: str, expires_at: datetime, now: datetime
    ) -> bool:
        with self.ctx.db.write_connection() as session:
            return repo.replace_agent_certificate(
                session,
                instance_id=instance_id,
                expected_serial=expected,
                public_key_pem=pem,
                cert_serial=serial,
                cert_expires_at=expires_at,
                now=now,
            )

    # --- operators ----------------------------------------------------------------------------

    async def register_operator(self, *, nonce_jwt: str, public_key_pem: bytes) -> IssuedCertificate:
        """Exchange an operator nonce for an operator certificate (CN = cluster id, O = tenant)."""
        ctx = self.ctx
        self._require_cluster_leader()
        cluster_id = ctx.identity.cluster_id
        claims = verify_nonce(
            nonce_jwt,
            ctx.nonce_key.public_key(),
            expected_kind="operator",
            cluster_id=cluster_id,
            clock=ctx.clock,
        )
        tenant = claims.tenant
        issued = self._issue(public_key_pem, client_id=cluster_id, tenant=tenant, role="operator")
        pem = self._canonical_pem(issued)

        self._require_cluster_leader()
        binding = operator_nonce_key(nonce_jwt)
        await asyncio.to_thread(self._bind_operator_nonce, binding, pem)

        now = ctx.clock.now()
        operator_id = await asyncio.to_thread(
            self._cache_operator, nonce_jwt, cluster_id, tenant, pem, issued, now
        )
        self._require_cluster_leader()
        data = operator_record(
            cluster_id=cluster_id,
            tenant=tenant,
            operator_id=operator_id,
            public_key_pem=pem,
            issued=issued,
            now=now,
        )
        try:
            await asyncio.to_thread(ctx.cluster_store.put, operator_record_key(tenant, cluster_id), data)
        except Unavailable as exc:
            raise Unavailable(
                f"could not record the operator registration ({exc}); retry with the same nonce and key"
            ) from exc
        log.info(
            "operator registered",
            extra={"operator_id": operator_id, "tenant": tenant, "cert_serial": issued.serial_hex},
        )
        return issued

    def _bind_operator_nonce(self, key: str, pem: str) -> None:
        """Create the nonce -> key binding, or accept an existing binding to the same key."""
        store = self.ctx.cluster_store
        try:
            store.put_if_match(key, pem.encode("ascii"), None)
            return
        except PreconditionFailed:
            pass
        try:
            bound, _ = store.get(key)
        except ObjectNotFound:  # pragma: no cover - bindings are never deleted
            raise Unavailable(f"operator nonce binding {key} vanished while registering; retry") from None
        try:
            same = public_key_to_der(load_any_public_key_pem(bound)) == public_key_to_der(  # type: ignore[arg-type]
                load_any_public_key_pem(pem)  # type: ignore[arg-type]
            )
        except InvalidArgument:
            same = False
        if not same:
            raise AlreadyExists(
                "registration nonce already used by a different public key: an operator nonce is bound "
                "to the first key registered with it (retry with that key, or create a new nonce with "
                "`nstance-admin cluster nonce`)"
            )

    def _cache_operator(
        self, nonce_jwt: str, cluster_id: str, tenant: str, pem: str, issued: IssuedCertificate, now: datetime
    ) -> str:
        with self.ctx.db.session() as session:
            outcome, holder = repo.claim_operator_nonce(
                session,
                nonce=nonce_jwt,
                operator_id=str(new_puid("opr")),
                cluster_id=cluster_id,
                tenant=tenant,
                public_key=pem,
                now=now,
                cert_serial=issued.serial_hex,
                cert_expires_at=issued.not_after,
            )
            if outcome is repo.NonceClaim.TAKEN:
                raise AlreadyExists(
                    f"registration nonce already used by operator {holder.id} with a different public key"
                )
            if outcome is repo.NonceClaim.SAME_KEY:
                repo.upsert_operator(
                    session,
                    operator_id=holder.id,
                    cluster_id=cluster_id,
                    tenant=tenant,
                    public_key=pem,
                    registered_at=holder.registered_at,
                    now=now,
                    cert_serial=issued.serial_hex,
                    cert_expires_at=issued.not_after,
                    renewed_at=now,
                    nonce=nonce_jwt,
                )
            return holder.id

    # --- operator cache backfill --------------------------------------------------------------

    async def backfill_operators(self) -> int:
        """Fill an empty ``operators`` table from ``operator/*.json`` in cluster storage; rows restored."""
        return await asyncio.to_thread(self._backfill_operators)

    def _backfill_operators(self) -> int:
        with self.ctx.db.read_session() as session:
            if repo.count_operators(session) > 0:
                return 0
        store = self.ctx.cluster_store
        rows: list[dict[str, Any]] = []
        for key in store.list(OPERATOR_RECORD_PREFIX):
            if not key.endswith(".json"):
                continue
            try:
                data, _ = store.get(key)
            except ObjectNotFound:
                continue
            row = self._operator_row(key, data)
            if row is not None:
                rows.append(row)
        if not rows:
            return 0
        now = self.ctx.clock.now()
        with self.ctx.db.session() as session:
            for row in rows:
                repo.upsert_operator(session, now=now, **row)
        log.info("restored %d operator registration(s) from cluster storage", len(rows))
        return len(rows)

    def _operator_row(self, key: str, data: bytes) -> dict[str, Any] | None:
        """The upsert arguments for one operator record, or None (logged) if it is unusable."""
        try:
            doc = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            log.warning("skipped operator record %s: not JSON (%s)", key, exc)
            return None
        if not isinstance(doc, dict):
            log.warning("skipped operator record %s: not a JSON object", key)
            return None
        # Upstream writes three shapes here: its renewal's (cluster_id, public_key, renewed_at), its
        # server registration's (client_id = cluster id, public_key_pem, registered_at) and its admin's
        # register-operator (client_id = operator id, registered_by, at {tenant}.{last 8 of the id}).
        by_admin = "cluster_id" not in doc and doc.get("registered_by") == "nstance-admin"
        cluster_id = (
            self.ctx.identity.cluster_id if by_admin else doc.get("cluster_id") or doc.get("client_id")
        )
        tenant = doc.get("tenant")
        public_key = doc.get("public_key") or doc.get("public_key_pem")
        if not (
            isinstance(cluster_id, str)
            and isinstance(tenant, str)
            and isinstance(public_key, str)
            and cluster_id
            and tenant
            and public_key
        ):
            log.warning("skipped operator record %s: cluster_id, tenant and public_key are required", key)
            return None
        if cluster_id != self.ctx.identity.cluster_id:
            log.warning("skipped operator record %s: it belongs to cluster %r", key, cluster_id)
            return None
        operator_id = doc.get("client_id") if by_admin else doc.get("operator_id")
        if not isinstance(operator_id, str) or not operator_id or operator_id == cluster_id:
            # Records written before operator ids existed (or by a renewal that used the CN) are keyed
            # by what names them uniquely: tenant and cluster.
            operator_id = f"{tenant}.{cluster_id}"
        serial = doc.get("cert_serial")
        renewed_at = _parse_time(doc.get("renewed_at")) or _parse_time(doc.get("registered_at"))
        return {
            "operator_id": operator_id,
            "cluster_id": cluster_id,
            "tenant": tenant,
            "public_key": public_key,
            "registered_at": renewed_at or self.ctx.clock.now(),
            "cert_serial": serial if isinstance(serial, str) and serial else None,
            "cert_expires_at": _parse_time(doc.get("expires_at")),
            "renewed_at": renewed_at,
        }
