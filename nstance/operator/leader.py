"""Lease-based election of the one operator replica that acts (``coordination.k8s.io/v1`` Lease).

The Lease ``spec`` carries ``holderIdentity`` (pod or host name plus a random suffix),
``leaseDurationSeconds``, ``acquireTime``, ``renewTime`` and ``leaseTransitions``, the fields
client-go's resource lock writes, so ``kubectl get lease`` reads the same way. Every write is a PUT
guarded by the ``resourceVersion`` last read: of two replicas racing for one Lease exactly one wins.

* A standby reads the Lease every ``renew_interval``. It takes over only when the Lease is free
  (no holder, e.g. released by a leader that stopped) or when it has watched the same Lease record
  stay unchanged for ``lease_duration`` by its *own* monotonic clock — it never compares its wall clock
  with another host's ``renewTime``.
* The leader renews every ``renew_interval``. It is fenced: ``is_leader()`` is true only until
  ``renew_deadline`` after the start of its last successful renewal, and the moment that passes (or a
  renewal finds another holder) leadership is lost at once, even while an API call is still hanging.
  ``renew_deadline < lease_duration``, so a leader that cannot renew stops acting before any standby
  may take over.
* ``release`` (on shutdown) first ends ``run`` (so no renewal or acquisition in flight can race it and
  the elector never competes again), then clears the holder so a standby takes over at its next poll.

Stopping is bounded: every Lease call runs under a deadline, and the loops end on cancellation even
when a call swallowed the cancel. (Python 3.11's ``asyncio.wait_for`` returns the result instead of
raising when the cancel arrives as the call completes, which left an elector renewing for ever after
its runtime stopped; ``asyncio.timeout`` is used instead, and each loop turn checks for a pending
cancel of its task.)

``wait_leading`` / ``wait_not_leading`` and ``on_change`` callbacks tell the runtime; ``following``
says whether a standby is reading the Lease successfully (its readiness).

Must not: start or stop controllers (the runtime does), retry forever inside a single call, or wait
without a deadline while stopping.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any, Final

from nstance.core.clock import Clock, SystemClock
from nstance.operator.kube import LEASES, Kube, KubeError, Object

log = logging.getLogger(__name__)

MICROTIME: Final = "%Y-%m-%dT%H:%M:%S.%fZ"


def microtime(moment: datetime) -> str:
    """Kubernetes MicroTime (RFC 3339 with microseconds, UTC)."""
    return moment.strftime(MICROTIME)


def _raise_if_cancelling() -> None:
    """Raise CancelledError when the current task has been asked to cancel but the request was lost
    (a call that swallowed it returned normally): a loop that runs "until cancelled" must still end."""
    task = asyncio.current_task()
    if task is not None and task.cancelling() > 0:
        raise asyncio.CancelledError


class LeaseElector:
    """Acquire, renew and release one Lease; report gained/lost leadership."""

    def __init__(
        self,
        kube: Kube,
        namespace: str,
        name: str,
        identity: str,
        *,
        lease_duration: float = 15.0,
        renew_interval: float = 5.0,
        renew_deadline: float = 10.0,
        clock: Clock | None = None,
    ) -> None:
        if not 0 < renew_interval < renew_deadline < lease_duration:
            raise ValueError("0 < renew_interval < renew_deadline < lease_duration is required")
        self.kube = kube
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_duration = lease_duration
        self.renew_interval = renew_interval
        self.renew_deadline = renew_deadline
        self.clock: Clock = clock or SystemClock()
        self.holder = ""
        self.last_error = ""
        self.on_change: list[Callable[[bool], None]] = []
        self.term = 0
        """Counts the times this replica became leader; a session belongs to one term."""
        self._leading = False
        self._last_renew = 0.0
        self._last_read: float | None = None
        self._observed: tuple[str, str] | None = None
        self._observed_at = 0.0
        self._lease: Object | None = None
        self._changed = asyncio.Event()
        self._released = False
        self._acquiring = False
        self._runner: asyncio.Task[Any] | None = None

    # --- state ----------------------------------------------------------------------------------------

    def is_leader(self) -> bool:
        """True while this replica holds the Lease and its last renewal is within the deadline."""
        return self._leading and self.clock.monotonic() - self._last_renew < self.renew_deadline

    @property
    def following(self) -> bool:
        """Whether the Lease was read successfully lately (a standby's readiness)."""
        if self._last_read is None:
            return False
        return self.clock.monotonic() - self._last_read < max(self.lease_duration, 3 * self.renew_interval)

    async def wait_leading(self) -> None:
        while not self._leading:
            await self._wait()

    async def wait_not_leading(self, term: int | None = None) -> None:
        """Until leadership is lost; with ``term``, also when that term has ended (even if a new one
        has begun meanwhile)."""
        while self._leading and (term is None or self.term == term):
            await self._wait()

    async def _wait(self) -> None:
        event = self._changed
        await event.wait()

    def _set_leading(self, leading: bool, why: str) -> None:
        if leading == self._leading:
            return
        self._leading = leading
        if leading:
            self.term += 1
            log.info("acquired Lease %s/%s as %s", self.namespace, self.name, self.identity)
        else:
            log.warning("lost Lease %s/%s: %s", self.namespace, self.name, why)
        event, self._changed = self._changed, asyncio.Event()
        event.set()
        for callback in list(self.on_change):
            try:
                callback(leading)
            except Exception:  # a listener's bug must not break the election
                log.exception("leadership callback failed")

    # --- Lease I/O ------------------------------------------------------------------------------------

    def _spec(self, previous: dict[str, Any] | None, *, now: datetime) -> dict[str, Any]:
        previous = previous or {}
        holder = str(previous.get("holderIdentity") or "")
        transitions = int(previous.get("leaseTransitions") or 0)
        ours = holder == self.identity
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, round(self.lease_duration)),
            "acquireTime": previous.get("acquireTime") if ours else microtime(now),
            "renewTime": microtime(now),
            "leaseTransitions": transitions if ours or not previous else transitions + 1,
        }

    def _observe(self, lease: Object) -> dict[str, Any]:
        self._last_read = self.clock.monotonic()
        self._lease = lease
        spec = dict(lease.get("spec") or {})
        meta = lease.get("metadata") or {}
        key = (str(spec.get("holderIdentity") or ""), str(meta.get("resourceVersion") or ""))
        if key != self._observed:
            self._observed = key
            self._observed_at = self.clock.monotonic()
        self.holder = key[0]
        return spec

    async def _try_acquire(self) -> bool:
        started = self.clock.monotonic()
        lease = await self.kube.get(LEASES, self.name, self.namespace)
        now = self.clock.now()
        if lease is None:
            self._last_read = self.clock.monotonic()
            body: Object = {
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": {**self._spec(None, now=now), "leaseTransitions": 0},
            }
            try:
                created = await self.kube.create(LEASES, body, self.namespace)
            except KubeError as exc:
                if exc.status == 409:
                    return False
                raise
            self._observe(created)
            self._last_renew = started
            return True
        spec = self._observe(lease)
        holder = str(spec.get("holderIdentity") or "")
        if holder and holder != self.identity:
            duration = float(spec.get("leaseDurationSeconds") or self.lease_duration)
            if self.clock.monotonic() - self._observed_at < duration:
                return False
            log.info("Lease %s/%s held by %s expired; taking over", self.namespace, self.name, holder)
        return await self._write(lease, spec, started, now)

    async def _write(self, lease: Object, spec: dict[str, Any], started: float, now: datetime) -> bool:
        meta = lease.get("metadata") or {}
        body: Object = {
            "metadata": {
                "name": self.name,
                "namespace": self.namespace,
                "resourceVersion": meta.get("resourceVersion"),
            },
            "spec": self._spec(spec, now=now),
        }
        try:
            written = await self.kube.replace(LEASES, self.name, body, self.namespace)
        except KubeError as exc:
            if exc.status == 409:
                self._lease = None
                return False
            raise
        self._observe(written)
        self._last_renew = started
        return True

    async def _renew(self) -> bool:
        """One renewal; False when it did not happen (the caller retries until the deadline)."""
        started = self.clock.monotonic()
        lease = self._lease
        if lease is None:
            lease = await self.kube.get(LEASES, self.name, self.namespace)
            if lease is None:
                self._set_leading(False, "the Lease was deleted")
                return False
        spec = self._observe(lease)
        if spec.get("holderIdentity") != self.identity:
            self._set_leading(False, f"the Lease is now held by {spec.get('holderIdentity') or 'nobody'}")
            return False
        return await self._write(lease, spec, started, self.clock.now())

    # --- loops ----------------------------------------------------------------------------------------

    async def _lead(self) -> None:
        while self._leading:
            _raise_if_cancelling()
            remaining = self._last_renew + self.renew_deadline - self.clock.monotonic()
            if remaining <= 0:
                self._set_leading(
                    False, f"could not renew within {self.renew_deadline:g}s ({self.last_error})"
                )
                return
            try:
                # asyncio.timeout, not wait_for: on 3.11 wait_for loses a cancel that arrives as the
                # renewal completes, and the elector would then renew for ever after its runtime stopped.
                async with asyncio.timeout(remaining):
                    ok = await self._renew()
            except TimeoutError:
                self.last_error = "the renewal did not finish before the deadline"
                continue
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - any API/transport failure: retry until the deadline
                self.last_error = str(exc)
                log.warning("renewing Lease %s/%s failed: %s", self.namespace, self.name, exc)
                ok = False
            if ok:
                self.last_error = ""
            if not self._leading:
                return
            wait = self.renew_interval if ok else self.renew_interval / 2
            deadline_in = self._last_renew + self.renew_deadline - self.clock.monotonic()
            await asyncio.sleep(max(0.0, min(wait, deadline_in)))

    async def run(self) -> None:
        """Compete for the Lease until cancelled (or ``release``); never raises for API trouble."""
        self._runner = asyncio.current_task()
        try:
            await self._compete()
        finally:
            self._runner = None

    async def _compete(self) -> None:
        while True:
            _raise_if_cancelling()
            if self._released:
                # Released on shutdown: never take the Lease again; wait to be cancelled.
                await asyncio.Event().wait()
            self._acquiring = True
            try:
                # Bounded like a renewal: a hanging API call must not keep a standby from polling.
                async with asyncio.timeout(self.renew_deadline):
                    acquired = await self._try_acquire()
                self.last_error = ""
            except TimeoutError:
                acquired = False
                self.last_error = f"reading the Lease took longer than {self.renew_deadline:g}s"
                log.warning("reading Lease %s/%s timed out", self.namespace, self.name)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - any API/transport failure: poll again later
                acquired = False
                self.last_error = str(exc)
                log.warning("reading Lease %s/%s failed: %s", self.namespace, self.name, exc)
            finally:
                self._acquiring = False
            _raise_if_cancelling()
            if acquired:
                self._set_leading(True, "")
                await self._lead()
                continue
            await asyncio.sleep(self.renew_interval)

    async def release(self) -> None:
        """Give the Lease up (clear the holder) if this replica holds it; never raises (except for a
        cancel of the caller) and takes at most about ``2 * renew_deadline``.

        ``run`` is ended first, so no renewal or acquisition in flight can overwrite the release or take
        the Lease again; the elector does not compete any more afterwards.
        """
        might_hold = self._leading or self._acquiring
        self._released = True
        self._set_leading(False, "released")
        await self._stop_runner()
        if not might_hold:
            return
        try:
            async with asyncio.timeout(self.renew_deadline):
                await self._clear_holder()
        except TimeoutError:
            log.warning(
                "could not release Lease %s/%s within %gs; it expires in %gs anyway",
                self.namespace,
                self.name,
                self.renew_deadline,
                self.lease_duration,
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - best effort; the Lease expires anyway
            log.warning("could not release Lease %s/%s: %s", self.namespace, self.name, exc)

    async def _stop_runner(self) -> None:
        """Cancel the task running ``run`` and wait (at most ``renew_deadline``) until it has ended."""
        runner = self._runner
        if runner is None or runner.done() or runner is asyncio.current_task():
            return
        runner.cancel()
        await asyncio.wait([runner], timeout=self.renew_deadline)
        if not runner.done():
            log.error(
                "the election loop of Lease %s/%s did not stop within %gs of being cancelled",
                self.namespace,
                self.name,
                self.renew_deadline,
            )

    async def _clear_holder(self) -> None:
        for _ in range(3):  # a conflicting write (a renewal that was in flight) is re-read and retried
            lease = await self.kube.get(LEASES, self.name, self.namespace)
            if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            spec = dict(lease.get("spec") or {})
            spec.update(
                {"holderIdentity": "", "leaseDurationSeconds": 1, "renewTime": microtime(self.clock.now())}
            )
            body = {"metadata": {**lease["metadata"]}, "spec": spec}
            try:
                await self.kube.replace(LEASES, self.name, body, self.namespace)
            except KubeError as exc:
                if exc.status == 409:
                    continue
                raise
            log.info("released Lease %s/%s", self.namespace, self.name)
            return
        raise KubeError(409, "Conflict", "the Lease kept changing while it was being released")
