"""Copy the cluster's certificate deny-list from object storage into this server's SQLite cache.

``nstance-admin cert revoke`` writes one object per revoked serial in the cluster scope,
``revoked/{serial}.json`` with ``{"serial", "revoked_at", "reason"}`` (serial in canonical lowercase
hex). ``sync_revocations`` lists ``revoked/``, reads only the objects whose serial SQLite does not know
yet, and adds them with ``repo.add_revoked_serial``; the auth interceptor then refuses those
certificates (``repo.is_serial_revoked``). ``revocation_loop`` repeats this every interval for as long
as the server runs, on leaders and standbys alike, and survives storage errors.

An object whose name is not a serial, whose body is not JSON, or whose ``serial`` field differs from its
name is skipped with a warning. A missing or unreadable ``revoked_at`` does not stop the revocation
(the sync time is used instead). This module never writes to object storage and never removes an
entry from the deny-list.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from nstance.core.clock import Clock
from nstance.core.errors import InvalidArgument, NstanceError
from nstance.db import repo
from nstance.db.engine import Database
from nstance.objectstore.base import ObjectNotFound, ObjectStore
from nstance.pki.serial import parse_serial_hex, serial_hex

log = logging.getLogger(__name__)

REVOKED_PREFIX = "revoked/"
"""Where the deny-list lives inside the cluster scope."""

_SUFFIX = ".json"


@dataclass(frozen=True, slots=True)
class Revocation:
    """One deny-list entry as stored."""

    serial: str
    revoked_at: datetime | None
    reason: str


def serial_of_key(key: str) -> str:
    """The canonical serial a ``revoked/{serial}.json`` key names; InvalidArgument if it names none."""
    if not key.startswith(REVOKED_PREFIX) or not key.endswith(_SUFFIX):
        raise InvalidArgument(f"{key!r} is not a deny-list key (revoked/{{serial}}.json)")
    name = key[len(REVOKED_PREFIX) : -len(_SUFFIX)]
    try:
        return serial_hex(parse_serial_hex(name))
    except InvalidArgument as exc:
        raise InvalidArgument(f"{key}: the name is not a certificate serial ({exc})") from None


def _timestamp(raw: object) -> datetime | None:
    if not isinstance(raw, str):
        return None
    try:
        value = datetime.fromisoformat(raw)
    except ValueError:
        return None
    return value.astimezone(UTC) if value.tzinfo is not None else None


def parse_revocation(key: str, data: bytes) -> Revocation:
    """Parse a stored entry; InvalidArgument naming ``key`` and the problem if it cannot be used."""
    serial = serial_of_key(key)
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidArgument(f"{key}: not valid UTF-8 JSON ({exc})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("serial"), str):
        raise InvalidArgument(f'{key}: must be a JSON object with a "serial" string')
    try:
        body_serial = serial_hex(parse_serial_hex(doc["serial"]))
    except InvalidArgument as exc:
        raise InvalidArgument(f'{key}: field "serial": {exc}') from None
    if body_serial != serial:
        raise InvalidArgument(f'{key}: field "serial" is {body_serial} but the object name says {serial}')
    reason = doc.get("reason")
    return Revocation(serial, _timestamp(doc.get("revoked_at")), reason if isinstance(reason, str) else "")


def _sync_blocking(cluster_store: ObjectStore, db: Database, now: datetime) -> tuple[int, list[str]]:
    """One pass (blocking I/O): how many serials were new, and one problem sentence per skipped object."""
    keys = [key for key in cluster_store.list(REVOKED_PREFIX) if key.endswith(_SUFFIX)]
    with db.read_session() as session:
        known = repo.revoked_serials(session)
    problems: list[str] = []
    pending: dict[str, Revocation] = {}
    for key in keys:
        try:
            serial = serial_of_key(key)
            if serial in known or serial in pending:
                continue
            data, _ = cluster_store.get(key)
            pending[serial] = parse_revocation(key, data)
        except ObjectNotFound:
            continue  # removed since the listing
        except InvalidArgument as exc:
            problems.append(f"skipped deny-list object {exc}")
    added = 0
    if pending:
        with db.session() as session:
            for entry in pending.values():
                if repo.add_revoked_serial(
                    session, entry.serial, now=entry.revoked_at or now, reason=entry.reason
                ):
                    added += 1
    return added, problems


async def _sync(cluster_store: ObjectStore, db: Database, clock: Clock) -> tuple[int, list[str]]:
    added, problems = await asyncio.to_thread(_sync_blocking, cluster_store, db, clock.now())
    if added:
        log.info("certificate deny-list: %d new revoked serial(s) from object storage", added)
    return added, problems


async def sync_revocations(cluster_store: ObjectStore, db: Database, *, clock: Clock) -> int:
    """Add every serial in ``revoked/`` that SQLite lacks; return how many were new.

    Corrupt objects are skipped with a warning; storage errors (Unavailable) propagate.
    """
    added, problems = await _sync(cluster_store, db, clock)
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
) -> None:
    """Sync now and then every ``interval`` seconds until cancelled; errors are logged, never fatal.

    A skipped object is warned about when it first shows up, not on every pass.
    """
    if interval <= 0:
        raise InvalidArgument(f"revocation sync interval must be positive, got {interval}")
    reported: set[str] = set()
    while True:
        try:
            _, problems = await _sync(cluster_store, db, clock)
            for problem in problems:
                if problem not in reported:
                    log.warning("%s", problem)
            reported = set(problems)
        except NstanceError as exc:
            log.warning("certificate deny-list sync failed (retrying in %.0fs): %s", interval, exc)
        except Exception:
            log.exception("certificate deny-list sync failed unexpectedly (retrying in %.0fs)", interval)
        await sleep(interval)
