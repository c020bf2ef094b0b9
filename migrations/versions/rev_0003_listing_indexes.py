"""Instance listings page by (created_at, id) without a scan.

Revision ID: 0003
Revises: 0002
Created: 2026-11-27

ListInstances reads a tenant's (or a group's) instances oldest first, a page at a time, each page
starting after the last (``created_at``, ``id``) of the previous one. With an index ending in
``created_at`` alone, SQLite read every instance of the tenant and sorted them for each page: at
100,000 instances a page cost about 60 ms and a full listing grew with the square of the count.
Both indexes now end in (``created_at``, ``id``), the order of the listing, so a page is a range seek.

Self-contained on purpose: do not import nstance.db.models here, a revision must keep describing
the schema as it was when it was written.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.drop_index("ix_instances_tenant_group_key_created_at", table_name="instances")
    op.create_index(
        "ix_instances_tenant_group_key_created_at_id",
        "instances",
        ["tenant", "group_key", "created_at", "id"],
    )
    op.create_index("ix_instances_tenant_created_at_id", "instances", ["tenant", "created_at", "id"])


def downgrade() -> None:
    op.drop_index("ix_instances_tenant_created_at_id", table_name="instances")
    op.drop_index("ix_instances_tenant_group_key_created_at_id", table_name="instances")
    op.create_index(
        "ix_instances_tenant_group_key_created_at",
        "instances",
        ["tenant", "group_key", "created_at"],
    )
