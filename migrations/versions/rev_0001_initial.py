"""Initial schema of the SQLite cache.

Revision ID: 0001
Revises:
Created: 2026-01-01

Tables: instances, groups, public_keys, operators, images, lb_instances, revoked_certs.
Timestamps are DATETIME columns holding naive UTC (the models' UTCDateTime type adds the zone back).
Constraint names follow the models' naming convention (pk_/uq_/fk_/ck_/ix_<table>_<columns>);
op.f() marks a check constraint name as final so the convention is not applied twice.

Self-contained on purpose: do not import nstance.db.models here, a revision must keep describing
the schema as it was when it was written.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "instances",
        sa.Column("id", sa.String(), nullable=False),
        sa.Column("tenant", sa.String(), nullable=False),
        sa.Column("group_key", sa.String(), nullable=False),
        sa.Column("kind", sa.String(), nullable=False),
        sa.Column("template", sa.String(), nullable=True),
        sa.Column("on_demand", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("record_state", sa.String(), server_default="pending", nullable=False),
        sa.Column("idempotency_token", sa.String(), nullable=True),
        sa.Column("subnet_id", sa.String(), nullable=True),
        sa.Column("instance_type", sa.String(), nullable=True),
        sa.Column("provider_id", sa.String(), nullable=True),
        sa.Column("provider_status", sa.String(), nullable=True),
        sa.Column("provider_at", sa.DateTime(), nullable=True),
        sa.Column("hostname", sa.String(), nullable=True),
        sa.Column("fqdn", sa.String(), nullable=True),
        sa.Column("ip4", sa.String(), nullable=True),
        sa.Column("ip6", sa.String(), nullable=True),
        sa.Column("nonce", sa.Text(), nullable=False),
        sa.Column("issued_at", sa.DateTime(), nullable=True),
        sa.Column("instance_pub", sa.Text(), nullable=True),
        sa.Column("registered_at", sa.DateTime(), nullable=True),
        sa.Column("cert_serial", sa.String(), nullable=True),
        sa.Column("cert_expires_at", sa.DateTime(), nullable=True),
        sa.Column("certificates_at", sa.DateTime(), nullable=True),
        sa.Column("health_at", sa.DateTime(), nullable=True),
        sa.Column("health", sa.JSON(), nullable=True),
        sa.Column("infra_config_hash", sa.String(), nullable=True),
        sa.Column("runtime_config_hash", sa.String(), nullable=True),
        sa.Column("drain_reason", sa.String(), nullable=True),
        sa.Column("drain_started_at", sa.DateTime(), nullable=True),
        sa.Column("drain_acked_at", sa.DateTime(), nullable=True),
        sa.Column("delete_at", sa.DateTime(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.Column("deleted_at", sa.DateTime(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_instances"),
        sa.UniqueConstraint("nonce", name="uq_instances_nonce"),
        sa.UniqueConstraint("idempotency_token", name="uq_instances_idempotency_token"),
        sa.CheckConstraint(
            "record_state IN ('pending', 'provisioned', 'failed')", name=op.f("ck_instances_record_state")
        ),
    )
    op.create_index(
        "ix_instances_tenant_group_key_created_at", "instances", ["tenant", "group_key", "created_at"]
    )
    op.create_index("ix_instances_created_at", "instances", ["created_at"])
    op.create_index("ix_instances_registered_at", "instances", ["registered_at"])
    op.create_index("ix_instances_updated_at", "instances", ["updated_at"])
    op.create_index("ix_instances_deleted_at", "instances", ["deleted_at"])
    op.create_index("ix_instances_provider_id", "instances", ["provider_id"])
    op.create_index("ix_instances_provider_at", "instances", ["provider_at"])

    op.create_table(
        "groups",
        sa.Column("tenant", sa.String(), nullable=False),
        sa.Column("group_key", sa.String(), nullable=False),
        sa.Column("runtime_config_hash", sa.String(), nullable=False),
        sa.Column("infra_config_hash", sa.String(), nullable=False),
        sa.Column("hashes_updated_at", sa.DateTime(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("tenant", "group_key", name="pk_groups"),
    )

    op.create_table(
        "public_keys",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("instance_id", sa.String(), nullable=False),
        sa.Column("filename", sa.String(), nullable=False),
        sa.Column("public_key_pem", sa.Text(), nullable=False),
        sa.Column("certificate_name", sa.String(), nullable=True),
        sa.Column("certificate_serial", sa.String(), nullable=True),
        sa.Column("certificate_issued_at", sa.DateTime(), nullable=True),
        sa.Column("submitted_at", sa.DateTime(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_public_keys"),
        sa.ForeignKeyConstraint(
            ["instance_id"],
            ["instances.id"],
            name="fk_public_keys_instance_id_instances",
            ondelete="CASCADE",
        ),
        sa.UniqueConstraint("instance_id", "filename", name="uq_public_keys_instance_id_filename"),
    )

    op.create_table(
        "operators",
        sa.Column("id", sa.String(), nullable=False),
        sa.Column("cluster_id", sa.String(), nullable=False),
        sa.Column("tenant", sa.String(), nullable=False),
        sa.Column("nonce", sa.Text(), nullable=True),
        sa.Column("public_key", sa.Text(), nullable=False),
        sa.Column("cert_serial", sa.String(), nullable=True),
        sa.Column("cert_expires_at", sa.DateTime(), nullable=True),
        sa.Column("registered_at", sa.DateTime(), nullable=False),
        sa.Column("renewed_at", sa.DateTime(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_operators"),
        sa.UniqueConstraint("nonce", name="uq_operators_nonce"),
    )
    op.create_index("ix_operators_tenant", "operators", ["tenant"])

    op.create_table(
        "images",
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("image_id", sa.String(), nullable=False),
        sa.Column("resolved_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_images"),
    )

    op.create_table(
        "lb_instances",
        sa.Column("lb_key", sa.String(), nullable=False),
        sa.Column("instance_id", sa.String(), nullable=False),
        sa.Column("status", sa.String(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("lb_key", "instance_id", name="pk_lb_instances"),
        sa.ForeignKeyConstraint(
            ["instance_id"],
            ["instances.id"],
            name="fk_lb_instances_instance_id_instances",
            ondelete="CASCADE",
        ),
        sa.CheckConstraint(
            "status IN ('pending', 'registered', 'deregistered', 'failed')",
            name=op.f("ck_lb_instances_status"),
        ),
    )
    op.create_index("ix_lb_instances_status", "lb_instances", ["status"])
    op.create_index("ix_lb_instances_instance_id", "lb_instances", ["instance_id"])

    op.create_table(
        "revoked_certs",
        sa.Column("serial", sa.String(), nullable=False),
        sa.Column("revoked_at", sa.DateTime(), nullable=False),
        sa.Column("reason", sa.String(), nullable=False),
        sa.Column("expires_at", sa.DateTime(), nullable=True),
        sa.PrimaryKeyConstraint("serial", name="pk_revoked_certs"),
    )
    op.create_index("ix_revoked_certs_expires_at", "revoked_certs", ["expires_at"])


def downgrade() -> None:
    # Children first: public_keys and lb_instances reference instances.
    for table in ("revoked_certs", "lb_instances", "images", "operators", "public_keys", "groups"):
        op.drop_table(table)
    op.drop_table("instances")
