"""Operator registration (cluster leader only) and the operators table's refill from storage.

The nonce (kind ``operator``, ``sub == cluster_id``) is bound to the first public key presented by a
create-only write of ``operator-nonce/{sha256hex(nonce)}.pem`` in cluster storage. The same key may
retry (and gets a fresh certificate); any other key is refused. The registration is cached in
SQLite (``operators``) and written to the operator record ``operator/{tenant}.{cluster_id}.json``.
``backfill_operators`` fills an empty ``operators`` table from those records (upstream's three
record shapes are read).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from datetime import UTC, datetime
from typing import Any

from nstance.core.errors import AlreadyExists, InvalidArgument, Unavailable
from nstance.core.ids import new_puid
from nstance.db import repo
from nstance.objectstore.base import ObjectNotFound, PreconditionFailed
from nstance.pki.certs import IssuedCertificate
from nstance.pki.keys import load_any_public_key_pem, public_key_to_der
from nstance.pki.nonce import verify_nonce
from nstance.pki.operator_record import operator_record, operator_record_key
from nstance.server.identity import issuing
from nstance.server.state.context import ShardContext

log = logging.getLogger(__name__)

OPERATOR_NONCE_PREFIX = "operator-nonce/"
"""Where operator nonce -> public key bindings live in the cluster scope."""

OPERATOR_RECORD_PREFIX = "operator/"
"""Where operator registration records live in the cluster scope."""


def operator_nonce_key(nonce_jwt: str) -> str:
    """``operator-nonce/{sha256hex(nonce)}.pem``: the binding object of an operator nonce."""
    digest = hashlib.sha256(nonce_jwt.encode("utf-8")).hexdigest()
    return f"{OPERATOR_NONCE_PREFIX}{digest}.pem"


def _parse_time(raw: object) -> datetime | None:
    if not isinstance(raw, str) or not raw:
        return None
    try:
        value = datetime.fromisoformat(raw)
    except ValueError:
        return None
    return value.astimezone(UTC) if value.tzinfo else value.replace(tzinfo=UTC)


class OperatorRegistration:
    """Registers operators of the cluster (see the module docstring)."""

    def __init__(self, ctx: ShardContext) -> None:
        self.ctx = ctx

    def _require_cluster_leader(self) -> None:
        cluster = self.ctx.cluster_leadership
        if cluster is None or cluster.is_leader():
            return
        addr = cluster.leader_address()
        where = f"the cluster leader is at {addr}" if addr else "no cluster leader is known yet"
        raise Unavailable(f"operator registration is served by the cluster leader; {where}; retry there")

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
        issued = issuing.issue(ctx, public_key_pem, client_id=cluster_id, tenant=tenant, role="operator")
        pem = issuing.canonical_pem(issued)

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

    # --- the operators table, refilled from storage -----------------------------------------

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
