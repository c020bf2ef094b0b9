"""The ``lb_instances`` table: which instance is in which load balancer, with what status.

Ephemeral state, rebuilt from the provider; rows go with their instance (foreign-key cascade).
Plain SQL returning ``LbRow``.

Must not call a provider: it records what the load-balancer reconciler did or saw.
"""

from __future__ import annotations

from datetime import datetime

from nstance.core.errors import InvalidArgument
from nstance.db.models import LB_STATUSES
from nstance.db.repo._sql import Bind, plain
from nstance.db.rows import LB_INSTANCES, LbRow, sqlite_time


def set_lb_status(bind: Bind, lb_key: str, instance_ids: list[str], *, status: str, now: datetime) -> None:
    """Record ``status`` (one of LB_STATUSES) for each instance in load balancer ``lb_key``."""
    if status not in LB_STATUSES:
        raise InvalidArgument(
            f"load balancer status must be one of {', '.join(LB_STATUSES)} (got {status!r})"
        )
    sql = (
        "INSERT INTO lb_instances (lb_key, instance_id, status, updated_at) VALUES (?, ?, ?, ?) "
        "ON CONFLICT (lb_key, instance_id) DO UPDATE SET status = excluded.status, "
        "updated_at = excluded.updated_at"
    )
    stamp = sqlite_time(now)
    plain(bind).executemany(sql, [(lb_key, instance_id, status, stamp) for instance_id in instance_ids])


def _lb_rows(bind: Bind, column: str, value: str) -> list[LbRow]:
    sql = f"SELECT {LB_INSTANCES.columns} FROM lb_instances WHERE {column} = ?"
    return [LB_INSTANCES.row(values) for values in plain(bind).execute(sql, (value,)).fetchall()]


def lb_memberships(bind: Bind, instance_id: str) -> list[LbRow]:
    """Every load balancer row of one instance."""
    return _lb_rows(bind, "instance_id", instance_id)


def lb_members(bind: Bind, lb_key: str) -> list[LbRow]:
    """Every instance row of one load balancer."""
    return _lb_rows(bind, "lb_key", lb_key)


def delete_lb_memberships(bind: Bind, instance_id: str) -> None:
    """Forget one instance's load balancer rows (its deregistration was confirmed)."""
    plain(bind).execute("DELETE FROM lb_instances WHERE instance_id = ?", (instance_id,))
