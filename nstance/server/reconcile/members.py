"""What the cache's instance rows mean to the planner and to clients; reading them, no decisions.

``member_of`` turns one SQLite row into the planner's ``Member`` (``nstance.core.plan``), with the
timestamps put into this leadership's frame (``leadertime.in_term``); ``read_group`` reads one
group's active rows and makes its managed and on-demand members (run it in a worker thread);
``status_of`` is the word ListInstances shows for an instance and ``provider_status_of`` the one
GetInstanceStatus and CreateInstance answer with. Deciding what to do with the members is
the planner's job, and changing instances is ``create`` and ``retire``'s.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import TypeVar

from nstance.core.plan import Member
from nstance.db import repo
from nstance.db.engine import Database
from nstance.db.models import RECORD_FAILED
from nstance.db.rows import InstanceRow, SyncRow
from nstance.providers.base import UNHEALTHY_STATUSES, InstanceStatus
from nstance.server.state.leadertime import in_term

#: What a query read in a worker thread returns.
T = TypeVar("T")


def member_of(
    row: InstanceRow,
    *,
    seen_since: datetime | None = None,
    now: datetime | None = None,
    term_start: datetime | None = None,
) -> Member:
    """The planner's view of one SQLite row.

    ``seen_since`` is when this server started leading: an agent cannot have reported to it before
    then (its reports went to the previous leader, or nowhere while no server led), so its silence is
    counted from that moment at the earliest - a failover or an outage of the leader never makes
    healthy instances look silent. A drain started outside this leadership's frame is timed from
    ``term_start`` (default ``seen_since``). ``now`` (the leader clock) bounds the frame: a timestamp
    after it was written on a clock that was ahead and is read as the start as well
    (``leadertime.in_term``).
    """
    status = row.provider_status
    last_seen = row.health_at or row.registered_at
    delete_at = row.delete_at
    if seen_since is not None:
        if last_seen is not None:
            last_seen = in_term(last_seen, seen_since, now)
        if delete_at is not None and row.drain_started_at is not None:
            start = seen_since if term_start is None else term_start
            delete_at = in_term(row.drain_started_at, start, now) + (delete_at - row.drain_started_at)
    return Member(
        instance_id=row.id,
        created_at=row.created_at,
        # An agent that reports health holds a certificate: registered, even when its record was rebuilt.
        registered=row.registered_at is not None or row.health_at is not None,
        unhealthy=status is not None and InstanceStatus(status) in UNHEALTHY_STATUSES,
        failed=row.record_state == RECORD_FAILED,
        draining=row.drain_started_at is not None,
        drain_acked=row.drain_acked_at is not None,
        delete_at=delete_at,
        infra_hash=row.infra_config_hash,
        last_seen=last_seen,
        spot_notice=bool((row.health or {}).get("termination_notice")),
        instance_type=row.instance_type or "",
        template=row.template or "",
    )


def provider_status_of(row: InstanceRow) -> str:
    """The provider's word for the machine, as GetInstanceStatus answers (upstream's meaning).

    Upstream's server answers with the provider's live status, and its operator counts an on-demand
    machine ready exactly when that is ``running``: an instance whose agent registered or reports is
    still ``running`` here, and one being drained keeps its provider status. ``pending`` until the
    provider has reported; ``failed`` when its creation failed (there is no machine); ``deleted``.
    """
    if row.deleted_at is not None:
        return "deleted"
    if row.record_state == RECORD_FAILED:
        return "failed"
    return row.provider_status or "pending"


def status_of(row: InstanceRow) -> str:
    """One word for an instance's state as ListInstances and the live view show it.

    Richer than ``provider_status_of``: ``registered`` once the agent registered, ``healthy`` once it
    reports, ``draining`` while drained.
    """
    if row.deleted_at is not None:
        return "deleted"
    if row.drain_started_at is not None:
        return "draining"
    if row.record_state == RECORD_FAILED:
        return "failed"
    status = row.provider_status or "pending"
    if status == InstanceStatus.RUNNING.value:
        if row.health_at is not None:
            return "healthy"
        if row.registered_at is not None:
            return "registered"
    return status


def seen_since_of(
    instance_id: str,
    seen_since: datetime,
    rejoined: Mapping[str, datetime],
    silence_limit: timedelta | None,
) -> datetime:
    """``seen_since`` for one instance: later for a row that came back from a repaired record.

    While its record was unreadable the instance had no active cache row, so this leader refused
    its agent's streams: it could not report before the row came back (``recheck_unreadable``).
    Its silence counts from then plus one missed-report window (the agent's reconnect), as after
    a takeover - never from a health timestamp the repaired record or an old row carried.
    """
    back = rejoined.get(instance_id)
    if back is None:
        return seen_since
    return max(seen_since, back + (silence_limit or timedelta(0)))


def read_group(
    db: Database,
    tenant: str,
    group: str,
    *,
    now: datetime,
    seen_since: datetime,
    term: datetime,
    rejoined: Mapping[str, datetime],
    silence_limit: timedelta | None,
) -> tuple[list[InstanceRow], list[Member], list[Member]]:
    """The group's active rows and the planner's view of its managed and on-demand ones (a thread)."""
    with db.read_connection() as session:
        rows = repo.list_active_instances(session, tenant=tenant, group_key=group)

    def member(row: InstanceRow) -> Member:
        since = seen_since_of(row.id, seen_since, rejoined, silence_limit)
        return member_of(row, seen_since=since, now=now, term_start=term)

    managed = [member(row) for row in rows if not row.on_demand]
    on_demand = [member(row) for row in rows if row.on_demand]
    return rows, managed, on_demand


async def _read_in_thread(db: Database, query: Callable[[sqlite3.Connection], T]) -> T:
    """``query`` on a read connection, in a worker thread (with what it builds from the rows)."""

    def read() -> T:
        with db.read_connection() as conn:
            return query(conn)

    return await asyncio.to_thread(read)


async def read_unregistered_rows(db: Database) -> list[InstanceRow]:
    """``repo.list_unregistered_instances``, read in a worker thread."""
    return await _read_in_thread(db, repo.list_unregistered_instances)


async def read_sync_rows(db: Database) -> dict[str, SyncRow]:
    """``repo.sync_rows`` (every row, the provider sync's columns), read in a worker thread."""
    return await _read_in_thread(db, repo.sync_rows)


async def read_provider_ids(db: Database) -> dict[str, str | None]:
    """``repo.live_provider_ids``, read in a worker thread."""
    return await _read_in_thread(db, repo.live_provider_ids)
