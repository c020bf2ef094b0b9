"""Copy the cluster's certificate deny-list from object storage into this server's SQLite cache.

``nstance-admin cert revoke`` writes one object per revoked serial in the cluster scope,
``revoked/{serial}.json`` with ``{"serial", "revoked_at", "reason"}`` (serial in canonical lowercase
hex). ``sync_revocations`` lists ``revoked/``, reads only the objects whose serial SQLite does not know
yet, and adds them with ``repo.add_revoked_serial``. Each pass then hands every serial SQLite holds to
a ``DenyList``, the in-memory copy the auth interceptor asks on every call: a set lookup, where a
SQLite read on the event loop let a worker thread take the GIL for as long as its turn lasted (about
0.6 ms per call in a burst of UpsertGroups). ``revocation_loop`` repeats this every interval for as
long as the server runs, on leaders and standbys alike, and survives storage errors.

The deny-list fails closed: an entry whose body is not JSON, or whose ``serial`` field differs from its
name, still revokes every serial it names (the object name and, when readable, the body's field), with
a warning; only an object whose name and body name no serial at all is skipped. A missing or
unreadable ``revoked_at`` does not stop the revocation (the sync time is used instead). The server
runs one sync before it opens its gRPC ports (``app``), so a restart with an empty cache never
accepts a revoked certificate in the meantime. This module never writes to object storage and never removes an
entry from the deny-list.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime

from nstance.core.clock import Clock
from nstance.core.errors import InvalidArgument, NstanceError
from nstance.db import repo
from nstance.db.engine import Database
from nstance.objectstore.base import ObjectNotFound, ObjectStore
from nstance.pki.revocation_record import (
    RECORD_SUFFIX,
    REVOKED_PREFIX,
    Revocation,
    parse_revocation,
    serial_of_key,
    serials_claimed,
)

log = logging.getLogger(__name__)


class DenyList:
    """The revoked certificate serials as the auth path checks them (see the module docstring).

    Empty until a sync pass fills it: the server opens no port before its first pass. A pass replaces
    the whole set at once, so a reader on another thread sees the old set or the new one.
    """

    def __init__(self) -> None:
        self._serials: frozenset[str] = frozenset()

    def replace(self, serials: frozenset[str]) -> None:
        """Hold ``serials`` (in ``repo.revoked_serials``' normalised form) from now on."""
        self._serials = serials

    def revoked(self, serial: str) -> bool:
        """Whether ``serial`` (any spelling ``repo.normalize_serial`` accepts) is on the list."""
        return repo.normalize_serial(serial) in self._serials


def _sync_blocking(
    cluster_store: ObjectStore, db: Database, now: datetime
) -> tuple[int, list[str], frozenset[str]]:
    """One pass (blocking I/O): how many serials were new, one problem sentence per skipped object, and
    every serial on the deny list afterwards."""
    keys = [key for key in cluster_store.list(REVOKED_PREFIX) if key.endswith(RECORD_SUFFIX)]
    with db.read_session() as session:
        known = repo.revoked_serials(session)
    problems: list[str] = []
    pending: dict[str, Revocation] = {}
    for key in keys:
        try:
            named: str | None = serial_of_key(key)
        except InvalidArgument:
            named = None  # the body may still name one
        if named is not None and (named in known or named in pending):
            continue
        try:
            data, _ = cluster_store.get(key)
        except ObjectNotFound:
            continue  # removed since the listing
        try:
            entry = parse_revocation(key, data)
            pending[entry.serial] = entry
        except InvalidArgument as exc:
            claimed = serials_claimed(key, data) - known
            if not claimed:
                problems.append(f"skipped deny-list object {exc}: it names no certificate serial")
                continue
            for serial in claimed:
                pending.setdefault(serial, Revocation(serial, None, f"unreadable deny-list entry {key}"))
            problems.append(
                f"deny-list object {exc}; revoking {', '.join(sorted(claimed))} anyway (fail closed)"
            )
    added = 0
    if pending:
        with db.session() as session:
            for entry in pending.values():
                if repo.add_revoked_serial(
                    session, entry.serial, now=entry.revoked_at or now, reason=entry.reason
                ):
                    added += 1
    # What SQLite now holds, without reading it again: what it held, and what this pass added to it.
    return added, problems, frozenset(known | {repo.normalize_serial(serial) for serial in pending})


async def _sync(
    cluster_store: ObjectStore, db: Database, clock: Clock, deny: DenyList | None
) -> tuple[int, list[str]]:
    added, problems, serials = await asyncio.to_thread(_sync_blocking, cluster_store, db, clock.now())
    if deny is not None:
        deny.replace(serials)
    if added:
        log.info("certificate deny-list: %d new revoked serial(s) from object storage", added)
    return added, problems


async def sync_revocations(
    cluster_store: ObjectStore, db: Database, *, clock: Clock, deny: DenyList | None = None
) -> int:
    """Add every serial in ``revoked/`` that SQLite lacks, and then hand them all to ``deny``; return
    how many were new.

    Corrupt objects still revoke the serials they name, with a warning; storage errors (Unavailable)
    propagate (and ``deny`` keeps what it held).
    """
    added, problems = await _sync(cluster_store, db, clock, deny)
    for problem in problems:
        log.warning("%s", problem)
    return added


async def revocation_loop(
    cluster_store: ObjectStore,
    db: Database,
    *,
    clock: Clock,
    interval: float,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    deny: DenyList | None = None,
) -> None:
    """Sync now and then every ``interval`` seconds until cancelled; errors are logged, never fatal.

    A skipped object is warned about when it first shows up, not on every pass.
    """
    if interval <= 0:
        raise InvalidArgument(f"revocation sync interval must be positive, got {interval}")
    reported: set[str] = set()
    while True:
        try:
            _, problems = await _sync(cluster_store, db, clock, deny)
            for problem in problems:
                if problem not in reported:
                    log.warning("%s", problem)
            reported = set(problems)
        except NstanceError as exc:
            log.warning("certificate deny-list sync failed (retrying in %.0fs): %s", interval, exc)
        except Exception:
            log.exception("certificate deny-list sync failed unexpectedly (retrying in %.0fs)", interval)
        await sleep(interval)
