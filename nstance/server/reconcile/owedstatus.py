"""Final record statuses a leader decided but could not write yet, written again by each GC cycle.

When an instance is retired (``deleted``) or its create has failed (``failed``), the cache row changes
at once and the record gets the status in a second step. If that write fails (storage unreachable, a
conflict), nothing else in this leadership looks at that record again: the row no longer asks for
anything, and the record goes on claiming a VM that is gone or was never made. ``OwedStatuses.write``
remembers such a write, and ``retry`` (each GC cycle) makes it until it lands. A new leadership
``forget``s them: its cache rebuild reads every record as it is, and the provider sync retires what they
still claim.

Writes are fenced (a deposed leader leaves records to the next one). A record that is gone needs
nothing. Must not decide which status an instance gets; it only delivers the ones its callers chose.
"""

from __future__ import annotations

import asyncio
import logging

from nstance.core.errors import NotFound, NstanceError, Unavailable
from nstance.server.state import records
from nstance.server.state.context import ShardContext
from nstance.server.state.fencing import NotLeader

log = logging.getLogger(__name__)


class OwedStatuses:
    """The record statuses of one leader still to be written (see the module docstring)."""

    def __init__(self, ctx: ShardContext) -> None:
        self._ctx = ctx
        #: Instance id -> (tenant, status) of each record still owed its status.
        self.owed: dict[str, tuple[str, str]] = {}

    async def write(self, tenant: str, instance_id: str, status: str, *, owe: bool = True) -> None:
        """Write ``status`` into the record now; when that fails it is logged, not raised, and with
        ``owe`` (a final status) remembered for ``retry``."""
        try:
            await self._write(tenant, instance_id, status)
        except NstanceError as exc:
            owed = owe and not isinstance(exc, (NotLeader, NotFound))
            log.warning(
                "instance %s: cannot set its record to %s: %s%s",
                instance_id,
                status,
                exc,
                " (written again later)" if owed else "",
            )
            if owed:
                self.owed[instance_id] = (tenant, status)
            elif owe and isinstance(exc, NotFound):
                self.owed.pop(instance_id, None)
        else:
            if owe:
                self.owed.pop(instance_id, None)

    async def commit(self, tenant: str, instance_id: str, status: str) -> None:
        """Write ``status`` now, raising what prevents it, for a decision that must be in the record
        before it is announced. A record that is gone is Unavailable: the GC cycle writes it back from
        the cache (or adopts the VM), and the decision can be recorded then."""
        try:
            await self._write(tenant, instance_id, status)
        except NotFound as exc:
            raise Unavailable(
                f"instance {instance_id}: its record is missing, so {status!r} cannot be recorded yet; "
                "retry once the record is back"
            ) from exc

    async def retry(self) -> list[str]:
        """Write every owed status once more (GC); the ids settled (written, or the record is gone).
        Raises NotLeader when leadership is lost."""
        settled: list[str] = []
        for instance_id, (tenant, status) in list(self.owed.items()):
            try:
                await self._write(tenant, instance_id, status)
            except NotLeader:
                raise
            except NotFound:
                pass  # no record claims anything any more
            except NstanceError as exc:
                log.info("instance %s: its record still cannot be set to %s: %s", instance_id, status, exc)
                continue
            if self.owed.get(instance_id) == (tenant, status):  # not owed something newer meanwhile
                del self.owed[instance_id]
            settled.append(instance_id)
        if settled:
            log.info("wrote the status owed to %d instance record(s)", len(settled))
        return settled

    def forget(self) -> None:
        """A new leadership: its cache rebuild reads the records as they are."""
        self.owed.clear()

    async def _write(self, tenant: str, instance_id: str, status: str) -> None:
        self._ctx.fence()
        await asyncio.to_thread(
            records.update_record,
            self._ctx.store,
            tenant,
            instance_id,
            status=status,
            last_updated=self._ctx.clock.now(),
        )
