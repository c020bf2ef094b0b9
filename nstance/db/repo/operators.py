"""The ``operators`` table: registered Nstance Operator identities and their single-use nonces.

``claim_operator_nonce`` decides a registration race with one ``INSERT ... ON CONFLICT(nonce) DO
NOTHING`` (the one insert that lands wins); ``upsert_operator`` refreshes a row from its
object-storage record or a renewal without ever clearing a stored nonce.

Must not touch agent (instance) registrations, which live in ``agent_registration``.
"""

from __future__ import annotations

import enum
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.dialects.sqlite import insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from nstance.core.errors import AlreadyExists
from nstance.db.models import Operator
from nstance.db.repo._sql import normalize_serial, rowcount


class NonceClaim(enum.Enum):
    """Outcome of ``claim_operator_nonce``."""

    CLAIMED = "claimed"  # this call bound the nonce to the key
    SAME_KEY = "same_key"  # bound earlier to the same public key: a retry, allowed
    TAKEN = "taken"  # bound earlier to a different key: refuse


def claim_operator_nonce(
    session: Session,
    *,
    nonce: str,
    operator_id: str,
    cluster_id: str,
    tenant: str,
    public_key: str,
    now: datetime,
    cert_serial: int | str | None = None,
    cert_expires_at: datetime | None = None,
) -> tuple[NonceClaim, Operator]:
    """Bind an operator registration nonce to a public key, once.

    ``INSERT ... ON CONFLICT(nonce) DO NOTHING`` decides the race: the one insert that lands gets
    CLAIMED. Everyone else learns whether the stored key equals theirs (compare PEM text normalised
    the same way by the caller). Returns the outcome and the row now holding the nonce.
    """
    statement = (
        insert(Operator)
        .values(
            id=operator_id,
            cluster_id=cluster_id,
            tenant=tenant,
            nonce=nonce,
            public_key=public_key,
            cert_serial=None if cert_serial is None else normalize_serial(cert_serial),
            cert_expires_at=cert_expires_at,
            registered_at=now,
            created_at=now,
            updated_at=now,
        )
        .on_conflict_do_nothing(index_elements=[Operator.nonce])
    )
    try:
        with session.begin_nested():
            inserted = rowcount(session, statement) == 1
    except IntegrityError as exc:
        raise AlreadyExists(f"operator {operator_id!r} already exists") from exc
    holder = session.scalars(
        select(Operator).where(Operator.nonce == nonce), execution_options={"populate_existing": True}
    ).one()
    if inserted:
        return NonceClaim.CLAIMED, holder
    return (NonceClaim.SAME_KEY if holder.public_key == public_key else NonceClaim.TAKEN), holder


def upsert_operator(
    session: Session,
    *,
    operator_id: str,
    cluster_id: str,
    tenant: str,
    public_key: str,
    registered_at: datetime,
    now: datetime,
    cert_serial: int | str | None = None,
    cert_expires_at: datetime | None = None,
    renewed_at: datetime | None = None,
    nonce: str | None = None,
) -> None:
    """Create or refresh an operator row (cache rebuild from object storage, certificate renewal).

    A stored nonce is never cleared by an upsert without one (object-storage records carry none).
    """
    statement = insert(Operator).values(
        id=operator_id,
        cluster_id=cluster_id,
        tenant=tenant,
        nonce=nonce,
        public_key=public_key,
        cert_serial=None if cert_serial is None else normalize_serial(cert_serial),
        cert_expires_at=cert_expires_at,
        registered_at=registered_at,
        renewed_at=renewed_at,
        created_at=now,
        updated_at=now,
    )
    excluded = statement.excluded
    statement = statement.on_conflict_do_update(
        index_elements=[Operator.id],
        set_={
            "cluster_id": excluded.cluster_id,
            "tenant": excluded.tenant,
            "nonce": func.coalesce(excluded.nonce, Operator.nonce),
            "public_key": excluded.public_key,
            "cert_serial": excluded.cert_serial,
            "cert_expires_at": excluded.cert_expires_at,
            "registered_at": excluded.registered_at,
            "renewed_at": excluded.renewed_at,
            "updated_at": excluded.updated_at,
        },
    )
    try:
        with session.begin_nested():
            session.execute(statement)
    except IntegrityError as exc:
        raise AlreadyExists(f"operator {operator_id!r}: nonce already bound to another operator") from exc


def get_operator(session: Session, operator_id: str) -> Operator | None:
    """The operator row with this id, or None."""
    return session.get(Operator, operator_id)


def list_operators(session: Session, *, tenant: str | None = None) -> list[Operator]:
    """Registered operators (optionally of one tenant), oldest registration first."""
    statement = select(Operator).order_by(Operator.registered_at, Operator.id)
    if tenant is not None:
        statement = statement.where(Operator.tenant == tenant)
    return list(session.scalars(statement))


def count_operators(session: Session) -> int:
    """How many operator rows the cache holds (0 means: backfill from object storage)."""
    return int(session.scalar(select(func.count()).select_from(Operator)) or 0)
