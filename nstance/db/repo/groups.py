"""The ``groups`` table: each group's config hashes, for drift detection without object-storage reads.

``upsert_group_hashes`` writes only when a hash changed, so ``hashes_updated_at`` says when drift
began; the rest reads or forgets one group's hashes.

Must not hold group config itself (object storage is the source of truth) or touch instance rows.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from nstance.db.models import Group
from nstance.db.repo._sql import Bind, changed, rowcount
from nstance.db.rows import sqlite_time

_GROUP_HASHES_SQL = (
    "INSERT INTO groups (tenant, group_key, runtime_config_hash, infra_config_hash, hashes_updated_at, "
    "created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (tenant, group_key) DO UPDATE SET "
    "runtime_config_hash = excluded.runtime_config_hash, infra_config_hash = excluded.infra_config_hash, "
    "hashes_updated_at = excluded.hashes_updated_at, updated_at = excluded.updated_at "
    "WHERE groups.runtime_config_hash != excluded.runtime_config_hash "
    "OR groups.infra_config_hash != excluded.infra_config_hash"
)


def upsert_group_hashes(
    bind: Bind,
    *,
    tenant: str,
    group_key: str,
    runtime_config_hash: str,
    infra_config_hash: str,
    now: datetime,
) -> bool:
    """Store a group's config hashes; True if the group is new or either hash changed.

    ``hashes_updated_at`` moves only when a hash actually changes, so it says when drift began.
    """
    stamp = sqlite_time(now)
    params = (tenant, group_key, runtime_config_hash, infra_config_hash, stamp, stamp, stamp)
    return changed(bind, _GROUP_HASHES_SQL, params) == 1


def get_group_hashes(session: Session, tenant: str, group_key: str) -> Group | None:
    """The stored hashes of one group, or None if none were stored."""
    return session.get(Group, (tenant, group_key))


def list_groups(session: Session, *, tenant: str | None = None) -> list[Group]:
    """Every group with stored hashes (optionally of one tenant), ordered by tenant and key."""
    statement = select(Group).order_by(Group.tenant, Group.group_key)
    if tenant is not None:
        statement = statement.where(Group.tenant == tenant)
    return list(session.scalars(statement))


def delete_group_hashes(session: Session, tenant: str, group_key: str) -> bool:
    """Forget a removed group's hashes; True if there were any."""
    statement = delete(Group).where(Group.tenant == tenant, Group.group_key == group_key)
    return rowcount(session, statement) == 1
