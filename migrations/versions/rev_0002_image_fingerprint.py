"""Images remember which lookup they answered.

Revision ID: 0002
Revises: 0001
Created: 2026-11-24

``images.fingerprint`` is a hash of the ``images.<name>`` config entry (filters, owners, sort, order)
the cached id was looked up with. When the entry changes, the cached id no longer answers it and is
looked up again instead of being reused; rows from before this revision have none and are trusted.

Self-contained on purpose: do not import nstance.db.models here, a revision must keep describing
the schema as it was when it was written.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("images") as batch:
        batch.add_column(sa.Column("fingerprint", sa.String(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("images") as batch:
        batch.drop_column("fingerprint")
