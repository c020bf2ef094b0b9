"""In-process fan-out of group, instance and error events to any number of watchers.

The Go server kept one stream per tenant per watch type, so a second watcher silently replaced the
first. Here every subscriber gets its own bounded queue, filtered by tenant. A subscriber that falls
more than ``queue_size`` events behind is disconnected (its iterator ends with ``SubscriberTooSlow``)
instead of making the server buffer without bound or silently skip events: the watcher reconnects and
receives a fresh snapshot, which carries the current state, so nothing a reconnecting operator needs
is lost. Snapshots are the caller's business (the servicer sends them before live events).

Events are plain dataclasses; ``convert`` turns them into protobuf messages. No I/O, no gRPC here.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Generic, TypeVar

from nstance.core.errors import Unavailable


@dataclass(frozen=True, slots=True)
class GroupEventData:
    """A group was created/changed (``upsert``) or removed (``delete``)."""

    kind: str  # "upsert" | "delete"
    tenant: str
    group: str


@dataclass(frozen=True, slots=True)
class InstanceEventData:
    """An instance is to be drained (``pending_deletion``), is being deleted, or is gone."""

    instance_id: str
    tenant: str
    group: str
    provider_id: str
    status: str  # "pending_deletion" | "deleting" | "deleted"
    reason: str = ""
    unhealthy_at: datetime | None = None
    delete_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class ErrorEventData:
    """Something went wrong that an operator should see (provider error, bad config for a group)."""

    tenant: str
    group: str
    instance_id: str
    error: str
    timestamp: datetime


class SubscriberTooSlow(Unavailable):
    """The watcher fell too far behind and was disconnected; reconnect for a fresh snapshot."""


E = TypeVar("E", GroupEventData, InstanceEventData, ErrorEventData)


@dataclass(frozen=True, slots=True)
class _End:
    """Queue marker: the subscription ends (``overflow`` says whether because the reader was slow)."""

    overflow: bool


@dataclass(eq=False)
class _Subscriber(Generic[E]):
    tenant: str | None
    queue: asyncio.Queue[E | _End]
    ended: bool = False


@dataclass
class EventHub(Generic[E]):
    """Fan-out for one event type. Publish from the event loop's thread."""

    queue_size: int = 1024
    _subscribers: set[_Subscriber[E]] = field(default_factory=set)

    def publish(self, event: E) -> None:
        """Deliver ``event`` to every subscriber of its tenant (or of all tenants)."""
        for sub in list(self._subscribers):
            if sub.tenant is not None and sub.tenant != event.tenant:
                continue
            if sub.ended:
                continue
            if sub.queue.qsize() >= self.queue_size:
                self._end(sub, overflow=True)
            else:
                sub.queue.put_nowait(event)

    @contextlib.asynccontextmanager
    async def subscribe(self, tenant: str | None) -> AsyncIterator[AsyncIterator[E]]:
        """Subscribe for the duration of the ``async with``; iterate the yielded iterator for events.

        Subscribing before the caller reads its snapshot means no event between snapshot and live
        stream can be missed (a duplicate is possible and harmless: events are idempotent).
        """
        sub: _Subscriber[E] = _Subscriber(tenant=tenant, queue=asyncio.Queue(self.queue_size + 1))
        self._subscribers.add(sub)
        try:
            yield self._iterate(sub)
        finally:
            self._subscribers.discard(sub)

    @staticmethod
    def _end(sub: _Subscriber[E], *, overflow: bool) -> None:
        # The queue has one slot beyond queue_size, kept free for this marker.
        sub.ended = True
        sub.queue.put_nowait(_End(overflow))

    async def _iterate(self, sub: _Subscriber[E]) -> AsyncIterator[E]:
        while True:
            event = await sub.queue.get()
            if isinstance(event, _End):
                if not event.overflow:
                    return
                raise SubscriberTooSlow(
                    f"watch stream fell more than {self.queue_size} events behind and was closed; "
                    "reconnect to receive a fresh snapshot"
                )
            yield event

    def close_all(self) -> None:
        """End every subscription (server shutdown): each iterator stops at its next read."""
        for sub in list(self._subscribers):
            if not sub.ended:
                self._end(sub, overflow=False)


@dataclass
class Events:
    """The three hubs a server has."""

    groups: EventHub[GroupEventData] = field(default_factory=EventHub)
    instances: EventHub[InstanceEventData] = field(default_factory=EventHub)
    errors: EventHub[ErrorEventData] = field(default_factory=EventHub)

    def close_all(self) -> None:
        """End every watch stream."""
        self.groups.close_all()
        self.instances.close_all()
        self.errors.close_all()
