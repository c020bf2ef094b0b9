"""ORM models of the SQLite cache (SQLAlchemy 2 typed declarative mapping).

One class per table. The schema follows the Go implementation's cache (reference §4.2) with these
changes: provider status, kind, template, subnet, instance type and both config hashes are real
columns instead of JSON blobs (they are filtered on); a ``record_state`` column makes the
pre-insert-before-provider-call step explicit; drain progress carries its reason and deadline; and
``revoked_certs`` holds the certificate deny list. Every timestamp is a timezone-aware UTC datetime
(see ``nstance.db.types``); certificate serials are lowercase hex strings without leading zeros.

This module declares tables only. Queries live in ``nstance.db.repo``; schema changes need a new
alembic revision in ``migrations/versions`` (a test compares the migrated database with these models).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Final

from sqlalchemy import (
    JSON,
    Boolean,
    CheckConstraint,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    false,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from nstance.db.types import UTCDateTime

# Deterministic constraint names, so migrations (and SQLite's batch table rebuilds) can refer to them.
NAMING_CONVENTION: Final[dict[str, str]] = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# instances.record_state values.
RECORD_PENDING: Final = "pending"  # row written, provider create not (yet) confirmed
RECORD_PROVISIONED: Final = "provisioned"  # provider instance id recorded
RECORD_FAILED: Final = "failed"  # provider create failed for good; GC cleans up
RECORD_STATES: Final = (RECORD_PENDING, RECORD_PROVISIONED, RECORD_FAILED)

# Normalised provider statuses after which an instance no longer counts as active.
INACTIVE_PROVIDER_STATUSES: Final = ("deleting", "deleted")

# lb_instances.status values.
LB_STATUSES: Final = ("pending", "registered", "deregistered", "failed")


class Base(DeclarativeBase):
    """Declarative base; its ``metadata`` is what alembic compares migrations against."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class Instance(Base):
    """A VM this shard created (or adopted): identity, provider view, registration, health, drain."""

    __tablename__ = "instances"

    id: Mapped[str] = mapped_column(String, primary_key=True)  # puidv7
    tenant: Mapped[str] = mapped_column(String)
    group_key: Mapped[str] = mapped_column(String)
    kind: Mapped[str] = mapped_column(String)  # template kind = puidv7 prefix
    template: Mapped[str | None] = mapped_column(String)
    on_demand: Mapped[bool] = mapped_column(Boolean, server_default=false())
    record_state: Mapped[str] = mapped_column(String, server_default=RECORD_PENDING)
    # Sent with the provider create call so a retry after a crash cannot launch a second VM.
    idempotency_token: Mapped[str | None] = mapped_column(String, unique=True)

    subnet_id: Mapped[str | None] = mapped_column(String)
    instance_type: Mapped[str | None] = mapped_column(String)
    provider_id: Mapped[str | None] = mapped_column(String)
    provider_status: Mapped[str | None] = mapped_column(String)  # normalised: pending, running, ...
    provider_at: Mapped[datetime | None] = mapped_column(UTCDateTime)  # last provider sync

    hostname: Mapped[str | None] = mapped_column(String)
    fqdn: Mapped[str | None] = mapped_column(String)
    ip4: Mapped[str | None] = mapped_column(String)
    ip6: Mapped[str | None] = mapped_column(String)

    nonce: Mapped[str] = mapped_column(Text, unique=True)  # the full registration JWT
    issued_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    instance_pub: Mapped[str | None] = mapped_column(Text)  # identity public key (PEM)
    registered_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    cert_serial: Mapped[str | None] = mapped_column(String)
    cert_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    certificates_at: Mapped[datetime | None] = mapped_column(UTCDateTime)  # last workload cert batch

    health_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    health: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    infra_config_hash: Mapped[str | None] = mapped_column(String)  # set at provision, never updated
    runtime_config_hash: Mapped[str | None] = mapped_column(String)  # last reported by the agent

    drain_reason: Mapped[str | None] = mapped_column(String)
    drain_started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    drain_acked_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    delete_at: Mapped[datetime | None] = mapped_column(UTCDateTime)  # drain deadline

    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)
    deleted_at: Mapped[datetime | None] = mapped_column(UTCDateTime)

    __table_args__ = (
        CheckConstraint(
            "record_state IN ('pending', 'provisioned', 'failed')",
            name="record_state",
        ),
        # Leftmost prefixes serve lookups by tenant and by (tenant, group); the trailing (created_at,
        # id) returns a tenant's or a group's instances oldest first without a sort, and lets a page
        # of ListInstances start where the previous one ended (a range seek, not a scan of the tenant).
        Index("ix_instances_tenant_group_key_created_at_id", "tenant", "group_key", "created_at", "id"),
        Index("ix_instances_tenant_created_at_id", "tenant", "created_at", "id"),
        Index("ix_instances_created_at", "created_at"),
        Index("ix_instances_registered_at", "registered_at"),
        Index("ix_instances_updated_at", "updated_at"),
        Index("ix_instances_deleted_at", "deleted_at"),
        Index("ix_instances_provider_id", "provider_id"),
        Index("ix_instances_provider_at", "provider_at"),
    )

    def __repr__(self) -> str:
        return f"Instance(id={self.id!r}, tenant={self.tenant!r}, group_key={self.group_key!r})"


class Group(Base):
    """Per-group config hashes, computed from the merged config (drift detection without storage reads)."""

    __tablename__ = "groups"

    tenant: Mapped[str] = mapped_column(String, primary_key=True)
    group_key: Mapped[str] = mapped_column(String, primary_key=True)
    runtime_config_hash: Mapped[str] = mapped_column(String)
    infra_config_hash: Mapped[str] = mapped_column(String)
    hashes_updated_at: Mapped[datetime] = mapped_column(UTCDateTime)  # when either hash last changed
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)

    def __repr__(self) -> str:
        return f"Group(tenant={self.tenant!r}, group_key={self.group_key!r})"


class PublicKey(Base):
    """A workload public key an agent submitted for one of its template files (certificate requests)."""

    __tablename__ = "public_keys"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    instance_id: Mapped[str] = mapped_column(String, ForeignKey("instances.id", ondelete="CASCADE"))
    filename: Mapped[str] = mapped_column(String)
    public_key_pem: Mapped[str] = mapped_column(Text)
    certificate_name: Mapped[str | None] = mapped_column(String)
    certificate_serial: Mapped[str | None] = mapped_column(String)
    certificate_issued_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    submitted_at: Mapped[datetime] = mapped_column(UTCDateTime)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)

    __table_args__ = (UniqueConstraint("instance_id", "filename"),)

    def __repr__(self) -> str:
        return f"PublicKey(instance_id={self.instance_id!r}, filename={self.filename!r})"


class Operator(Base):
    """A registered Nstance Operator identity (cached from ``cluster/operator/*`` records)."""

    __tablename__ = "operators"

    id: Mapped[str] = mapped_column(String, primary_key=True)  # puidv7 with kind "opr"
    cluster_id: Mapped[str] = mapped_column(String)
    tenant: Mapped[str] = mapped_column(String)
    # The registration JWT this identity consumed. NULL for rows rebuilt from object-storage records,
    # which do not carry it (single use is then enforced by the object-storage nonce binding).
    nonce: Mapped[str | None] = mapped_column(Text, unique=True)
    public_key: Mapped[str] = mapped_column(Text)  # PEM
    cert_serial: Mapped[str | None] = mapped_column(String)
    cert_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    registered_at: Mapped[datetime] = mapped_column(UTCDateTime)
    renewed_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)

    __table_args__ = (Index("ix_operators_tenant", "tenant"),)

    def __repr__(self) -> str:
        return f"Operator(id={self.id!r}, tenant={self.tenant!r})"


class Image(Base):
    """A resolved image name (e.g. an AMI lookup), when it was resolved, and for which config entry."""

    __tablename__ = "images"

    name: Mapped[str] = mapped_column(String, primary_key=True)
    image_id: Mapped[str] = mapped_column(String)
    resolved_at: Mapped[datetime] = mapped_column(UTCDateTime)
    # Hash of the images.<name> entry the id was looked up with; None for rows older than revision 0002.
    fingerprint: Mapped[str | None] = mapped_column(String)

    def __repr__(self) -> str:
        return f"Image(name={self.name!r}, image_id={self.image_id!r})"


class LbInstance(Base):
    """Membership of an instance in a load balancer target group (ephemeral; rebuilt from the provider)."""

    __tablename__ = "lb_instances"

    lb_key: Mapped[str] = mapped_column(String, primary_key=True)
    instance_id: Mapped[str] = mapped_column(
        String, ForeignKey("instances.id", ondelete="CASCADE"), primary_key=True
    )
    status: Mapped[str] = mapped_column(String)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)

    __table_args__ = (
        CheckConstraint(
            "status IN ('pending', 'registered', 'deregistered', 'failed')",
            name="status",
        ),
        Index("ix_lb_instances_status", "status"),
        # The primary key covers lookups by lb_key; this one serves instance deletes (FK cascade).
        Index("ix_lb_instances_instance_id", "instance_id"),
    )

    def __repr__(self) -> str:
        return f"LbInstance(lb_key={self.lb_key!r}, instance_id={self.instance_id!r}, status={self.status!r})"


class RevokedCert(Base):
    """A client certificate serial on the deny list (checked by the auth interceptor)."""

    __tablename__ = "revoked_certs"

    serial: Mapped[str] = mapped_column(String, primary_key=True)  # lowercase hex, no leading zeros
    revoked_at: Mapped[datetime] = mapped_column(UTCDateTime)
    reason: Mapped[str] = mapped_column(String)
    # The certificate's own expiry; once past, the entry can be pruned (an expired cert fails anyway).
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime)

    __table_args__ = (Index("ix_revoked_certs_expires_at", "expires_at"),)

    def __repr__(self) -> str:
        return f"RevokedCert(serial={self.serial!r})"
