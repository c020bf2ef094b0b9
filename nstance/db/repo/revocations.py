"""The ``revoked_certs`` table: the certificate deny list the auth path checks.

Serials are stored in ``normalize_serial``'s form, so any spelling of a serial finds its entry.
Entries are copied from the ``revoked/`` objects in object storage, which stay the source of truth.

Must not decide whether a certificate is valid otherwise (expiry, chain): that is the TLS layer's job.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.dialects.sqlite import insert
from sqlalchemy.orm import Session

from nstance.db.models import RevokedCert
from nstance.db.repo._sql import normalize_serial, rowcount


def add_revoked_serial(
    session: Session,
    serial: int | str,
    *,
    now: datetime,
    reason: str = "",
    expires_at: datetime | None = None,
) -> bool:
    """Put a certificate serial on the deny list; True if it was not there yet."""
    statement = (
        insert(RevokedCert)
        .values(serial=normalize_serial(serial), revoked_at=now, reason=reason, expires_at=expires_at)
        .on_conflict_do_nothing(index_elements=[RevokedCert.serial])
    )
    return rowcount(session, statement) == 1


def revoked_serials(session: Session) -> set[str]:
    """Every serial on the deny list, normalised (the auth path checks a copy in memory,
    ``revocations.DenyList``)."""
    return set(session.scalars(select(RevokedCert.serial)))
