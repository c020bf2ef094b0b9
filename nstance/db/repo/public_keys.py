"""The ``public_keys`` table: the workload public keys an agent submitted for its template files.

A resubmitted key keeps its issued-certificate fields, a different key clears them (that
certificate belongs to the old key). Rows go with their instance (foreign-key cascade).

Must not issue certificates or read instance rows; only the key an agent submitted is stored here.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import case
from sqlalchemy.dialects.sqlite import insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from nstance.core.errors import NotFound
from nstance.db.models import PublicKey
from nstance.db.repo._sql import Bind, plain
from nstance.db.rows import PUBLIC_KEYS, PublicKeyRow


def upsert_public_key(
    session: Session,
    *,
    instance_id: str,
    filename: str,
    public_key_pem: str,
    now: datetime,
    certificate_name: str | None = None,
) -> PublicKey:
    """Store the public key an agent submitted for ``filename``.

    A different key than the stored one clears the issued-certificate fields (that certificate
    belongs to the old key); resubmitting the same key keeps them. Raises NotFound for an unknown
    instance.
    """
    statement = insert(PublicKey).values(
        instance_id=instance_id,
        filename=filename,
        public_key_pem=public_key_pem,
        certificate_name=certificate_name,
        submitted_at=now,
        created_at=now,
        updated_at=now,
    )
    same_key = PublicKey.public_key_pem == statement.excluded.public_key_pem
    statement = statement.on_conflict_do_update(
        index_elements=[PublicKey.instance_id, PublicKey.filename],
        set_={
            "public_key_pem": statement.excluded.public_key_pem,
            "certificate_name": statement.excluded.certificate_name,
            "certificate_serial": case((same_key, PublicKey.certificate_serial), else_=None),
            "certificate_issued_at": case((same_key, PublicKey.certificate_issued_at), else_=None),
            "submitted_at": statement.excluded.submitted_at,
            "updated_at": statement.excluded.updated_at,
        },
    )
    returning = statement.returning(PublicKey)
    try:
        with session.begin_nested():
            return session.scalars(returning, execution_options={"populate_existing": True}).one()
    except IntegrityError as exc:
        raise NotFound(f"instance {instance_id!r} is not in the cache") from exc


def list_public_keys(bind: Bind, instance_id: str) -> list[PublicKeyRow]:
    """The public keys an instance submitted, by filename."""
    sql = f"SELECT {PUBLIC_KEYS.columns} FROM public_keys WHERE instance_id = ? ORDER BY filename"
    return [PUBLIC_KEYS.row(values) for values in plain(bind).execute(sql, (instance_id,)).fetchall()]
