"""``InstanceOps``: the steps that change instances, one object for the reconcile loops to hold.

A thin facade over the modules that do each job, so callers (the reconciler, GC, recovery, restore
and the shard's Operator API) hold one object:

* ``create`` - intent, launch, adopt, the record follow-ups (crash-safe ordering in its docstring);
* ``retire`` - delete, drain and the drain timeout, retiring rows that never got a VM;
* ``members`` - the cache's rows as the planner's members and clients' status words;
* ``safety`` - the mass-deletion brake, safety holds and error reports.

It also keeps what recovery learns about records for this shard's reconcile (``unreadable``,
``rejoined``). Nothing here decides anything (``nstance.core.plan`` does).
"""

from __future__ import annotations

from datetime import datetime

from nstance.core.backoff import Backoff
from nstance.db.rows import InstanceRow, SyncRow
from nstance.server.reconcile import members
from nstance.server.reconcile.create import Creator
from nstance.server.reconcile.owedstatus import OwedStatuses
from nstance.server.reconcile.retire import Retirer
from nstance.server.reconcile.safety import Safety
from nstance.server.state import records
from nstance.server.state.context import ShardContext


class InstanceOps:
    """The steps that change instances. Every step is fenced by shard leadership."""

    def __init__(self, ctx: ShardContext, *, backoff: Backoff | None = None) -> None:
        self._ctx = ctx
        #: Final record statuses not written yet (``owedstatus``): GC writes them, a new term forgets them.
        self.owed = OwedStatuses(ctx)
        self.creator = Creator(ctx, self.owed, backoff=backoff)
        self.retirer = Retirer(ctx, self.owed)
        self.safety = Safety(ctx)
        #: Instance ids whose provider create is in flight (GC and re-list must not touch them).
        self.in_flight = self.creator.in_flight
        #: The shard's one database writer thread (batched cache writes; registration claims).
        self.db_writer = self.creator.db_writer
        self.followups = self.creator.followups
        self.lbs = self.retirer.lbs
        self.holds = self.safety.holds
        self.budget = self.safety.budget
        self.create = self.creator.create
        self.create_many = self.creator.create_many
        self.adopt = self.creator.adopt
        self.delete = self.retirer.delete
        self.delete_or_hold = self.retirer.delete_or_hold
        self.retire_unlaunched = self.retirer.retire_unlaunched
        self.drain = self.retirer.drain
        self.brake_limits = self.safety.brake_limits
        self.set_hold = self.safety.set_hold
        self.brake_silent = self.safety.brake_silent
        self.hold_left = self.safety.hold_left
        self.report_error = self.safety.report_error
        #: Unreadable objects under ``instance/`` at the last cache rebuild: each still claims its VM.
        self.unreadable: list[records.RecordProblem] = []
        #: Instance id -> when (leader clock) its cache row came back from a repaired record in this
        #: leadership. Until then the agent's streams were refused (no active row), so it could not
        #: report here: its silence is counted from this moment plus one window, not from the term.
        self.rejoined: dict[str, datetime] = {}

    async def read_unregistered_rows(self) -> list[InstanceRow]:
        """Live rows whose agent has not registered, oldest first, read in a worker thread."""
        return await members.read_unregistered_rows(self._ctx.db)

    async def read_sync_rows(self) -> dict[str, SyncRow]:
        """Every instance row by id, the provider sync's columns, read in a worker thread."""
        return await members.read_sync_rows(self._ctx.db)

    async def read_provider_ids(self) -> dict[str, str | None]:
        """Instance id -> provider id of every live row, read in a worker thread."""
        return await members.read_provider_ids(self._ctx.db)
