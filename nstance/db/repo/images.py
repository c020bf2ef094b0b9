"""The ``images`` table: the cached resolution of each ``images.<name>`` config entry.

Stores the provider image id, when it was resolved and a fingerprint of the entry it answered.

Must not resolve images itself (``server/reconcile/images`` asks the provider) or decide when an
answer is stale (``providers/images``).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.dialects.sqlite import insert
from sqlalchemy.orm import Session

from nstance.db.models import Image


def get_image(session: Session, name: str) -> Image | None:
    """The cached resolution of ``images.<name>``, or None."""
    return session.get(Image, name)


def put_image(
    session: Session, name: str, *, image_id: str, resolved_at: datetime, fingerprint: str | None
) -> None:
    """Store (or replace) the resolution of ``images.<name>``."""
    statement = insert(Image).values(
        name=name, image_id=image_id, resolved_at=resolved_at, fingerprint=fingerprint
    )
    session.execute(
        statement.on_conflict_do_update(
            index_elements=[Image.name],
            set_={"image_id": image_id, "resolved_at": resolved_at, "fingerprint": fingerprint},
        )
    )
