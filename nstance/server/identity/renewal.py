"""Agent certificate renewal: an agent with its current certificate gets a new one for a new key.

An authenticated agent presenting its *current* certificate (serial equal to the instance's
``cert_serial``) gets a new certificate; the serial swap in SQLite is a compare-and-swap, so a
superseded certificate can never renew, and two renewals racing leave exactly one winner. The new
certificate is then written to the instance record; if that fails, the swap is undone and the agent
retries with the certificate it still holds. Swap and record are one step that finishes even when the
caller goes away; a renewal that finished for a caller who had left is given back (the caller never
got the new certificate, and only the current one can renew).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
from datetime import datetime

from nstance.core.errors import PermissionDenied, Unavailable
from nstance.db import repo
from nstance.db.rows import InstanceRow
from nstance.pki.certs import IssuedCertificate
from nstance.pki.peer import PeerIdentity
from nstance.server.identity import issuing
from nstance.server.state import records
from nstance.server.state.context import ShardContext

log = logging.getLogger(__name__)


class AgentRenewal:
    """Renews agent certificates of one shard (see the module docstring)."""

    def __init__(self, ctx: ShardContext) -> None:
        self.ctx = ctx

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
        issued = issuing.issue(
            ctx, public_key_pem, client_id=peer.client_id, tenant=peer.tenant, role="agent"
        )
        pem = issuing.canonical_pem(issued)
        old_pem = with_row.instance_pub or ""
        old_expiry = with_row.cert_expires_at or peer.not_after

        ctx.fence()
        undo = (old_pem, current, old_expiry)
        # Swap and record (or swap back) as one step that finishes even if the caller goes away
        # meanwhile; a renewal made for a caller that left is then given back (``_give_back``): the
        # agent never got the new certificate, and only the current one can renew.
        await issuing.uncancellable(
            self._swap_and_record(peer, pem, issued, ctx.clock.now(), undo),
            undo_if_left=functools.partial(self._give_back, peer, issued, undo),
        )
        log.info(
            "agent certificate renewed",
            extra={"instance_id": peer.client_id, "old_serial": current, "cert_serial": issued.serial_hex},
        )
        return issued

    async def _swap_and_record(
        self,
        peer: PeerIdentity,
        pem: str,
        issued: IssuedCertificate,
        now: datetime,
        undo: tuple[str, str, datetime],
    ) -> None:
        """The serial swap in SQLite (PermissionDenied if another renewal won), then the instance record;
        the swap is undone if the record cannot be written (Unavailable)."""
        ctx = self.ctx
        old_pem, old_serial, old_expiry = undo
        swapped = await asyncio.to_thread(
            self._swap_certificate, peer.client_id, old_serial, pem, issued.serial_hex, issued.not_after, now
        )
        if not swapped:
            raise PermissionDenied(
                f"certificate serial {peer.serial} is no longer the current certificate of instance "
                f"{peer.client_id} (renewed concurrently); only the newest certificate can renew"
            )
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

    async def _give_back(
        self, peer: PeerIdentity, issued: IssuedCertificate, undo: tuple[str, str, datetime]
    ) -> None:
        """Make the certificate the caller still holds current again (SQLite, then the record, each only
        if it still names the renewal's serial), so the agent's retry with it renews."""
        ctx = self.ctx
        old_pem, old_serial, old_expiry = undo
        serial = issued.serial_hex

        def restored(rec: records.InstanceRecord) -> records.InstanceRecord:
            if rec.cert_serial != serial:
                return rec
            return dataclasses.replace(
                rec,
                public_key_pem=old_pem,
                cert_serial=old_serial,
                cert_expires_at=old_expiry,
                last_updated=ctx.clock.now(),
            )

        try:
            ctx.fence()
            swapped = await asyncio.to_thread(
                self._swap_certificate,
                peer.client_id,
                serial,
                old_pem,
                old_serial,
                old_expiry,
                ctx.clock.now(),
            )
            if swapped:
                await asyncio.to_thread(
                    records.modify_record, ctx.store, peer.tenant, peer.client_id, restored
                )
        except Exception as exc:  # noqa: BLE001 - no caller is left to tell
            log.warning(
                "agent %s: its renewal call ended before the answer; giving certificate %s back failed (%s)",
                peer.client_id,
                serial,
                exc,
            )
            return
        log.warning(
            "agent %s: its renewal call ended before the answer; %s",
            peer.client_id,
            f"certificate {old_serial} is current again, so a retry with it renews"
            if swapped
            else f"certificate {serial} had already been replaced",
        )

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
