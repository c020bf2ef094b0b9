"""Leader election on object storage (shard and cluster), with fencing.

One ``Elector`` competes for one lockfile (``shard/{shard}/leader.json`` or ``cluster/leader.json``
relative to the store it is given). The lockfile is upstream s3lect's JSON document
``{"leaderID", "leaderAddr", "lastUpdated"}`` (RFC 3339 UTC) plus optional extra string keys such as
``operatorAddr``; Go readers ignore the extra keys.

How it works:

* Every write is conditional: create with ``put_if_match(key, data, None)`` (If-None-Match), renew or
  take over with ``put_if_match(key, data, etag)`` (If-Match the last ETag we saw). Release is a
  conditional delete. The store is synchronous, so every call runs in a worker thread.
* Staleness is judged on the follower's own monotonic clock: a follower remembers the ETag it sees and
  when it first saw it; once that ETag has been unchanged for ``takeover_after`` it takes over with
  If-Match of that ETag. Wall clocks of different hosts are never compared.
* Fencing: ``is_leader()`` is True only after winning, after the grace gap, while no renewal has failed,
  and while the last successful write (measured from when it was *started*, on the monotonic clock) is
  younger than ``valid_for = leader_timeout / 2``. A follower first sees a write after it started, so
  the old leader has stopped by ``first sight + valid_for`` at the latest.
* ``takeover_after`` (``takeover_wait``: ``max(T - F, 0.6 T, min(1.5 F, T))`` for ``leader_timeout``
  T and ``frequent_interval`` F) is always more than F, so a leader that renews once per F - as
  upstream's s3lect leader does, one GET and one conditional PUT per tick - is never taken over while
  it keeps renewing; always more than ``valid_for``, so one of our leaders has stopped acting before a
  follower takes over (a margin of ``takeover_after - valid_for`` plus the new leader's grace gap: 3.5 s
  with the defaults 5 s / 15 s); and never more than T (10 s with the defaults).
* Timing: the leader renews every ``min(frequent_interval, 2/3 * valid_for)`` (= frequent_interval for
  the defaults). Followers read every ``frequent_interval / 2`` (and exactly when the lock is about to
  become stale), so they see a write at most half an interval late, and a dead leader is replaced
  between ``takeover_after`` and ``takeover_after + frequent_interval / 2`` after its last write, plus
  ``grace`` before the new leader acts: 11 to 13.5 s with the defaults. Followers do not slow down to
  ``infrequent_interval`` while a healthy leader renews: a follower only learns of a write when it
  reads, so a longer read gap would break that bound (``infrequent_interval`` is the step period when
  election is disabled). Failed store calls are retried after 0 s, 100 ms and 1 s, then every
  ``frequent_interval``.
* A lockfile whose ``lastUpdated`` is Go's zero time (``0001-01-01T00:00:00Z``) was resigned by an
  upstream leader, which writes it only after it stopped acting (on shutdown, or when its start-up
  hook failed): it is taken over at once (conditionally, with the normal grace gap), as upstream's
  followers do. Our own servers never write it (they delete their lock), and a missing or unreadable
  ``lastUpdated`` does not count as resigned.
* ``on_change(True)`` is called at the step that ends the grace gap and ``is_leader()`` turns True at
  that same moment; ``is_leader()`` turns False the instant a condition fails, even between steps,
  and ``on_change(False)`` follows at the next step (at once for failures seen by a step).
* A lockfile that carries our own ID (we restarted, or a renewal failed ambiguously) is resumed with a
  conditional write; when the content is not one this process wrote, the grace gap is stretched to
  ``valid_for`` so a previous incarnation still running cannot overlap with us. A corrupt lockfile is
  taken over at once, also with the stretched grace.
* ``resign()`` stops acting at once, deletes our lock, and keeps us from re-acquiring for
  ``leader_timeout`` so another server can take over.

This module must not decide anything but leadership: it does not start or stop services (callers
react to ``on_change`` or check ``is_leader()`` before each leader-only action), never writes
unconditionally, never compares wall clocks between hosts, and never blocks the event loop on I/O.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from nstance.config.cluster import LeaderElectionConfig
from nstance.core.clock import Clock
from nstance.core.errors import InvalidArgument, Unavailable
from nstance.objectstore.base import ObjectNotFound, ObjectStore, PreconditionFailed

log = logging.getLogger(__name__)

T = TypeVar("T")

LOCK_FIELDS = ("leaderID", "leaderAddr", "lastUpdated")
"""The lockfile fields upstream s3lect writes and reads; ``extra`` keys must not reuse them."""

RETRY_DELAYS = (0.0, 0.1, 1.0)
"""Seconds to wait after the 1st, 2nd and 3rd consecutive failed store call; then frequent_interval."""

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
GO_ZERO_TIME = datetime(1, 1, 1, tzinfo=UTC)
"""``lastUpdated`` of a lockfile upstream's leader resigned (Go's zero ``time.Time``): take over now."""
_EPSILON = 1e-6  # float slack when comparing accumulated monotonic times


#: Reads and conditional deletes a release tries before leaving the lock to go stale.
RELEASE_ATTEMPTS = 3


@dataclass(frozen=True)
class LeaderInfo:
    """The content of a lockfile: who leads, where to reach it, and the ETag it was read/written with."""

    leader_id: str
    address: str
    last_updated: datetime
    extra: dict[str, str]
    etag: str

    @property
    def resigned(self) -> bool:
        """Whether the leader gave the lock up: upstream writes ``lastUpdated`` as Go's zero time."""
        return self.last_updated == GO_ZERO_TIME


def takeover_wait(frequent: float, timeout: float) -> float:
    """Seconds a follower waits, from first seeing a lockfile version, before taking that version over.

    ``max(T - F, 0.6 T, min(1.5 F, T))`` for ``leader_timeout`` T and ``frequent_interval`` F:

    * more than F (the config requires T > F): a leader renewing once per F - upstream's s3lect leader
      writes once per F tick, ours at least that often - is never taken over while it keeps renewing,
      even if a renewal lands up to ``min(F / 2, T - F)`` late. The follower reads again exactly when
      the wait ends, and its takeover is a conditional write on the version it saw, so a renewal that
      landed before that write wins. (T - F is the lateness upstream's own followers allow: they take
      over once ``lastUpdated`` is T old.) With F = 10 s and T = 15 s that is 15 s, not 9 s;
    * more than T / 2: one of our leaders stops acting T / 2 after its last write started, which is
      before anyone first saw that write, so it has stopped before a follower takes over;
    * at most T, and ``T - F`` with F up to 0.4 T: 10 s with the defaults 5 s / 15 s, so failover
      stays as fast as before.
    """
    return max(timeout - frequent, 0.6 * timeout, min(1.5 * frequent, timeout))


def format_timestamp(when: datetime) -> str:
    """RFC 3339 UTC with microseconds (``2026-01-01T00:00:05.000000Z``); Go's time.Parse accepts it."""
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_timestamp(text: str) -> datetime:
    """Parse an RFC 3339 timestamp (any fraction length, ``Z`` or offset) to aware UTC; ValueError if not."""
    parsed = datetime.fromisoformat(text.strip())
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.astimezone(UTC)


def encode_lockfile(leader_id: str, address: str, last_updated: datetime, extra: Mapping[str, str]) -> bytes:
    """The lockfile bytes: upstream's three fields first, then ``extra`` (which must not reuse them)."""
    clash = sorted(set(extra) & set(LOCK_FIELDS))
    if clash:
        raise InvalidArgument(f"lockfile extra keys {clash} clash with the fields {list(LOCK_FIELDS)}")
    doc: dict[str, str] = {
        "leaderID": leader_id,
        "leaderAddr": address,
        "lastUpdated": format_timestamp(last_updated),
    }
    doc.update(extra)
    return json.dumps(doc, separators=(",", ":")).encode("utf-8")


def parse_lockfile(data: bytes, etag: str) -> LeaderInfo:
    """Parse lockfile bytes; raise ValueError if they are not a JSON object with a non-empty leaderID.

    Tolerant of everything else: a missing ``leaderAddr`` reads as ``""``, a missing or unparsable
    ``lastUpdated`` as the Unix epoch, and non-string extra values are skipped.
    """
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"lockfile is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ValueError(f"lockfile is JSON {type(doc).__name__}, expected an object")
    leader_id = doc.get("leaderID")
    if not isinstance(leader_id, str) or not leader_id:
        raise ValueError("lockfile has no leaderID")
    address = doc.get("leaderAddr")
    last_updated = _EPOCH
    raw_time = doc.get("lastUpdated")
    if isinstance(raw_time, str):
        try:
            last_updated = parse_timestamp(raw_time)
        except ValueError:
            log.debug("lockfile lastUpdated %r is not RFC 3339; ignoring it", raw_time)
    extra = {k: v for k, v in doc.items() if k not in LOCK_FIELDS and isinstance(v, str)}
    return LeaderInfo(
        leader_id=leader_id,
        address=address if isinstance(address, str) else "",
        last_updated=last_updated,
        extra=extra,
        etag=etag,
    )


class Elector:
    """Competes for one lockfile; see the module docstring. Drive it with ``run()`` (or ``step()`` in tests).

    An Elector is single-use: after ``run()`` is cancelled it never leads again.
    """

    def __init__(
        self,
        store: ObjectStore,
        key: str,
        *,
        elector_id: str,
        address: str,
        extra: Mapping[str, str] | None = None,
        config: LeaderElectionConfig,
        clock: Clock,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        grace: float | None = None,
        on_change: Callable[[bool], None] | None = None,
        name: str = "shard",
    ) -> None:
        if not elector_id:
            raise InvalidArgument(f"{name} election: elector_id must not be empty (use the server ID)")
        if not key:
            raise InvalidArgument(f"{name} election: lockfile key must not be empty")
        extra_map = dict(extra or {})
        clash = sorted(set(extra_map) & set(LOCK_FIELDS))
        if clash:
            raise InvalidArgument(
                f"{name} election: extra lockfile keys {clash} clash with upstream's fields "
                f"{list(LOCK_FIELDS)}; rename them"
            )
        if grace is not None and (grace < 0 or not math.isfinite(grace)):
            raise InvalidArgument(f"{name} election: grace must be a finite number of seconds >= 0")
        self._store = store
        self._key = key
        self._id = elector_id
        self._address = address
        self._extra = extra_map
        self._enabled = config.enabled
        self._clock = clock
        self._sleep = sleep
        self._on_change = on_change
        self._name = name

        self._frequent = config.frequent_interval.total_seconds()
        self._infrequent = config.infrequent_interval.total_seconds()
        self._timeout = config.leader_timeout.total_seconds()
        self._valid_for = self._timeout / 2
        self._takeover_after = takeover_wait(self._frequent, self._timeout)
        self._follow_every = self._frequent / 2
        self._renew_every = min(self._frequent, self._valid_for * 2 / 3)
        self._grace = min(1.0, self._frequent / 2) if grace is None else grace

        self._lock = asyncio.Lock()
        # Leadership (enabled mode).
        self._holding = False  # our last conditional write won and nothing has failed since
        self._etag: str | None = None  # ETag of our lock while holding
        self._write_started = -math.inf  # monotonic start of our last successful write
        self._grace_until = math.inf
        self._term = 0
        self._notified = False  # what on_change was last told
        # What we know about the lockfile.
        self._leader: LeaderInfo | None = None
        self._seen_etag: str | None = None
        self._seen_since = 0.0
        self._corrupt_logged: str | None = None
        # Our own writes, to recognise them after an ambiguous failure.
        self._own_etag: str | None = None
        self._attempted: bytes | None = None
        # Failures and resignation.
        self._failures = 0
        self._hold_off_until = -math.inf
        self._stopped = False
        self._announced = False
        self._relead_pending = False
        self._foreign_own_id = 0  # times we found our ID in content we did not write

        if not self._enabled:
            self._term = 1
            self._leader = LeaderInfo(self._id, self._address, clock.now(), dict(self._extra), "")

    # -- public API ------------------------------------------------------------------------------

    @property
    def term(self) -> int:
        """Increments on every acquisition; leader-only work tagged with an older term is stale."""
        return self._term

    def leader(self) -> LeaderInfo | None:
        """The lockfile content as last read or written (who leads, at what address), or None."""
        return self._leader

    def is_leader(self) -> bool:
        """Fenced leadership: won, past the grace gap, no failed renewal, and the lease still valid.

        It turns True only together with ``on_change(True)`` (at the step that ends the grace gap), and
        False as soon as any condition fails, even between steps (``on_change(False)`` follows at the
        next step).
        """
        if not self._enabled:
            return not self._stopped and not self._relead_pending
        return self._notified and self._leading_now()

    def _leading_now(self) -> bool:
        if not self._holding:
            return False
        now = self._clock.monotonic()
        return self._grace_until <= now < self._write_started + self._valid_for

    async def run(self) -> None:
        """Step and sleep until cancelled; on cancellation (or any crash) stop acting and release our lock."""
        try:
            while True:
                delay = await self.step()
                await self._sleep(delay)
        except BaseException:
            await self._shutdown()
            raise

    async def step(self) -> float:
        """Run one iteration of the election; return the seconds to wait before the next one."""
        async with self._lock:
            if not self._enabled:
                return self._step_disabled()
            if self._stopped:
                return self._frequent
            now = self._clock.monotonic()
            if self._holding and now >= self._write_started + self._valid_for:
                self._lose("lease validity ran out before a renewal succeeded", warn=True)
            if self._holding:
                return await self._lead(now)
            return await self._follow()

    async def resign(self) -> None:
        """Stop acting now, delete our lock (conditionally) and let another server take over.

        We do not try to acquire again for ``leader_timeout``.
        """
        self._hold_off_until = self._clock.monotonic() + self._timeout
        if not self._enabled:
            self._relead_pending = True
            log.info("%s election disabled: resigned", self._name, extra=self._log_fields())
            self._notify()
            return
        self._lose("resigned")
        self._notify()
        async with self._lock:
            await self._release()

    # -- disabled mode ---------------------------------------------------------------------------

    def _step_disabled(self) -> float:
        if not self._announced:
            self._announced = True
            log.info(
                "%s leader election is disabled: this server always leads and never writes the lockfile",
                self._name,
                extra=self._log_fields(),
            )
        now = self._clock.monotonic()
        if self._relead_pending and not self._stopped and now >= self._hold_off_until:
            self._relead_pending = False
            self._term += 1
        self._notify()
        if self._relead_pending and now < self._hold_off_until:
            return min(self._infrequent, self._hold_off_until - now)
        return self._infrequent

    # -- leader side -----------------------------------------------------------------------------

    async def _lead(self, now: float) -> float:
        self._notify()
        due = self._write_started + self._renew_every
        if now + _EPSILON < due:
            return self._leader_wait(now)
        return await self._renew()

    def _leader_wait(self, now: float) -> float:
        wait = self._write_started + self._renew_every - now
        if now < self._grace_until:
            wait = min(wait, self._grace_until - now)
        return max(wait, 0.0)

    async def _renew(self) -> float:
        data, written_at = self._encode()
        started = self._clock.monotonic()
        valid_until = self._write_started + self._valid_for
        etag = self._etag
        self._attempted = data
        try:
            new_etag = await self._call(
                lambda: self._store.put_if_match(self._key, data, etag),
                limit=valid_until - started,
            )
        except PreconditionFailed:
            self._failures = 0
            self._lose("another server replaced the lockfile", warn=True)
            return await self._observe_after_lost_write()
        except _StoreError as exc:
            self._lose(f"renewal failed ({_describe(exc)})", warn=True)
            return self._failed("renew the lockfile", exc)
        self._failures = 0
        if not self._holding:  # resigned or stopped while the write was in flight
            return self._frequent
        now = self._clock.monotonic()
        self._own_etag = new_etag
        self._leader = LeaderInfo(self._id, self._address, written_at, dict(self._extra), new_etag)
        self._seen_etag, self._seen_since = new_etag, now
        if now >= valid_until:
            # The write landed, but only after the lease had lapsed: callers saw is_leader() False
            # in between, so this counts as a new acquisition (new term, grace gap).
            self._lose("renewal completed only after the lease had lapsed", warn=True)
            self._win(started, new_etag, written_at, reason="late renewal", stretched=False)
            return self._leader_wait(self._clock.monotonic())
        self._etag = new_etag
        self._write_started = started
        self._notify()
        return self._leader_wait(now)

    # -- follower side ---------------------------------------------------------------------------

    async def _follow(self) -> float:
        try:
            seen = await self._observe()
        except _StoreError as exc:
            return self._failed("read the lockfile", exc)
        now = self._clock.monotonic()
        if now < self._hold_off_until:
            self._failures = 0
            return min(self._frequent, self._hold_off_until - now)
        if seen is None:
            return await self._acquire(None, reason="no lockfile", stretched=False)
        data, etag, info = seen
        if info is None:
            return await self._acquire(etag, reason="corrupt lockfile", stretched=True)
        if info.leader_id == self._id:
            ours = etag == self._own_etag or data == self._attempted
            if ours:
                return await self._acquire(etag, reason="resuming our own lock", stretched=False)
            self._foreign_own_id += 1
            if self._foreign_own_id > 1:
                log.warning(
                    "%s election: the lockfile again carries our ID %r with content this process did not "
                    "write; is another running server configured with the same ID?",
                    self._name,
                    self._id,
                    extra=self._log_fields(etag=etag),
                )
            if info.resigned:  # an earlier run (upstream's server) stopped acting before it wrote this
                reason = "resuming a lock with our ID that an earlier run resigned"
                return await self._acquire(etag, reason=reason, stretched=False)
            reason = "resuming a lock with our ID from an earlier run"
            return await self._acquire(etag, reason=reason, stretched=True)
        if info.resigned:
            reason = f"{info.leader_id!r} resigned the lock (lastUpdated is the zero time)"
            return await self._acquire(etag, reason=reason, stretched=False)
        age = now - self._seen_since
        if age + _EPSILON >= self._takeover_after:
            reason = (
                f"lock of {info.leader_id!r} unchanged for {age:.1f}s (taking over after "
                f"{self._takeover_after:g}s; leader_timeout {self._timeout:g}s)"
            )
            return await self._acquire(etag, reason=reason, stretched=False)
        self._failures = 0  # (a failed write is only forgotten once we settle for waiting)
        return max(min(self._follow_every, self._seen_since + self._takeover_after - now), 0.0)

    async def _observe(self) -> tuple[bytes, str, LeaderInfo | None] | None:
        """Read the lockfile and record what we saw; None if it does not exist. Store errors propagate."""
        try:
            data, etag = await self._call(lambda: self._store.get(self._key))
        except ObjectNotFound:
            self._leader = None
            self._seen_etag = None
            return None
        now = self._clock.monotonic()
        if etag != self._seen_etag:
            self._seen_etag, self._seen_since = etag, now
        try:
            info: LeaderInfo | None = parse_lockfile(data, etag)
        except ValueError as exc:
            info = None
            if self._corrupt_logged != etag:
                self._corrupt_logged = etag
                log.warning(
                    "%s election: lockfile %s is corrupt (%s); it will be taken over",
                    self._name,
                    self._key,
                    exc,
                    extra=self._log_fields(etag=etag),
                )
        self._leader = info
        return data, etag, info

    async def _observe_after_lost_write(self) -> float:
        try:
            await self._observe()
        except _StoreError as exc:
            return self._failed("read the lockfile", exc)
        return self._frequent

    async def _acquire(self, etag: str | None, *, reason: str, stretched: bool) -> float:
        data, written_at = self._encode()
        started = self._clock.monotonic()
        self._attempted = data
        try:
            new_etag = await self._call(lambda: self._store.put_if_match(self._key, data, etag))
        except PreconditionFailed:
            self._failures = 0
            log.info(
                "%s election: another server wrote the lockfile first (%s)",
                self._name,
                reason,
                extra=self._log_fields(),
            )
            return await self._observe_after_lost_write()
        except _StoreError as exc:
            return self._failed("write the lockfile", exc)
        self._failures = 0
        self._own_etag = new_etag
        if self._stopped or self._clock.monotonic() < self._hold_off_until:
            # resign()/shutdown ran while the write was in flight; they release it after this step.
            return self._frequent
        self._win(started, new_etag, written_at, reason=reason, stretched=stretched)
        return self._leader_wait(self._clock.monotonic())

    # -- transitions -----------------------------------------------------------------------------

    def _win(self, started: float, etag: str, written_at: datetime, *, reason: str, stretched: bool) -> None:
        now = self._clock.monotonic()
        grace = max(self._grace, self._valid_for) if stretched else self._grace
        self._holding = True
        self._term += 1
        self._etag = etag
        self._own_etag = etag
        self._write_started = started
        self._grace_until = now + grace
        self._leader = LeaderInfo(self._id, self._address, written_at, dict(self._extra), etag)
        self._seen_etag, self._seen_since = etag, now
        log.info(
            "%s election: won the lock (%s); acting as leader after a %.3gs grace gap",
            self._name,
            reason,
            grace,
            extra=self._log_fields(etag=etag),
        )
        self._notify()

    def _lose(self, reason: str, *, warn: bool = False) -> None:
        if not self._holding:
            return
        self._holding = False
        self._etag = None
        log.log(
            logging.WARNING if warn else logging.INFO,
            "%s election: stopped leading (%s)",
            self._name,
            reason,
            extra=self._log_fields(),
        )
        self._notify()

    def _notify(self) -> None:
        leading = self._leading_now() if self._enabled else self.is_leader()
        if leading == self._notified:
            return
        self._notified = leading
        log.info(
            "%s election: %s",
            self._name,
            "now leading" if leading else "no longer leading",
            extra=self._log_fields(leading=leading),
        )
        if self._on_change is not None:
            try:
                self._on_change(leading)
            except Exception:
                log.exception("%s election: on_change(%s) callback failed", self._name, leading)

    def _failed(self, what: str, exc: _StoreError) -> float:
        self._failures += 1
        index = self._failures - 1
        delay = RETRY_DELAYS[index] if index < len(RETRY_DELAYS) else self._frequent
        # Unavailable/timeouts are expected now and then; anything else (access denied, a missing
        # bucket) needs a person, so it is logged as an error, but we keep retrying either way.
        log.log(
            logging.WARNING if exc.transient else logging.ERROR,
            "%s election: could not %s %s (%s); retrying in %.3gs",
            self._name,
            what,
            self._key,
            _describe(exc),
            delay,
            extra=self._log_fields(failures=self._failures),
        )
        return delay

    # -- shutdown and release --------------------------------------------------------------------

    async def _shutdown(self) -> None:
        self._stopped = True
        self._hold_off_until = math.inf
        self._lose("shutting down")
        self._notify()
        if self._enabled:
            async with self._lock:
                await self._release()

    async def _release(self) -> None:
        """Delete the lockfile if it holds content this process wrote (conditional delete).

        A renewal that was in flight when we stopped may land between our read and our delete: the
        delete then fails its precondition on content that is still ours, so we read again (a few
        times) rather than leave a fresh lock that others must wait out for a whole leader timeout.
        """
        for _attempt in range(RELEASE_ATTEMPTS):
            try:
                data, etag = await self._call(lambda: self._store.get(self._key))
            except ObjectNotFound:
                return
            except _StoreError as exc:
                self._release_failed("read", exc)
                return
            if etag != self._own_etag and data != self._attempted:
                return  # not ours (someone took over, or an earlier run's lock): leave it alone
            try:
                await self._call(functools.partial(self._store.delete, self._key, if_match=etag))
            except ObjectNotFound:
                return
            except PreconditionFailed:
                continue  # changed under us: our own late renewal, or someone else's lock (read again)
            except _StoreError as exc:
                self._release_failed("delete", exc)
                return
            self._leader = None
            self._seen_etag = None
            log.info("%s election: released the lock", self._name, extra=self._log_fields(etag=etag))
            return

    def _release_failed(self, step: str, exc: _StoreError) -> None:
        log.warning(
            "%s election: could not %s %s to release it (%s); others take over after %gs",
            self._name,
            step,
            self._key,
            _describe(exc),
            self._timeout,
            extra=self._log_fields(),
        )

    # -- helpers ---------------------------------------------------------------------------------

    def _encode(self) -> tuple[bytes, datetime]:
        now = self._clock.now()
        return encode_lockfile(self._id, self._address, now, self._extra), now

    async def _call(self, fn: Callable[[], T], *, limit: float | None = None) -> T:
        """Run one store call in a worker thread, bounded by ``limit`` seconds (default: valid_for).

        ObjectNotFound and PreconditionFailed pass through (they are answers); every other failure,
        including a timeout, becomes _StoreError (the election must fence itself whatever went wrong).
        """
        seconds = self._valid_for if limit is None else max(limit, 0.0)
        try:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for loses a cancellation that arrives
            # as the store call completes, and a cancelled elector would then run on for ever.
            async with asyncio.timeout(seconds):
                return await asyncio.to_thread(fn)
        except (ObjectNotFound, PreconditionFailed):
            raise
        except TimeoutError as exc:
            raise _StoreError(f"no answer within {seconds:.3g}s", transient=True) from exc
        except Exception as exc:
            transient = isinstance(exc, Unavailable | OSError)
            raise _StoreError(_describe(exc), transient=transient) from exc

    def _log_fields(self, **more: Any) -> dict[str, Any]:
        fields: dict[str, Any] = {
            "election": self._name,
            "elector_id": self._id,
            "lock_key": self._key,
            "term": self._term,
        }
        fields.update(more)
        return fields


class _StoreError(Exception):
    """A store call failed in a way that is not an answer (not ObjectNotFound/PreconditionFailed)."""

    def __init__(self, message: str, *, transient: bool) -> None:
        super().__init__(message)
        self.transient = transient


def _describe(exc: BaseException) -> str:
    if isinstance(exc, _StoreError):
        return str(exc)
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class ElectorLeadership:
    """An Elector as the server's ``Leadership``: who leads, and the leader's operator address.

    The address is the lockfile's ``operatorAddr`` when the leader recorded one (clients of the
    Operator API are sent there), else its election address.
    """

    def __init__(self, elector: Elector) -> None:
        self._elector = elector

    def is_leader(self) -> bool:
        return self._elector.is_leader()

    def leader_address(self) -> str:
        info = self._elector.leader()
        if info is None:
            return ""
        return info.extra.get("operatorAddr") or info.address
