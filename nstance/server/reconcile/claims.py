"""Who claims a VM the provider lists, and what the provider sync may do with it: a pure decision.

A VM is deleted as an orphan only when all of these hold: its own tags say it is ours (this cluster,
this shard, an instance id), no record - readable or not - claims it, and a record or cache row
*disclaims* it (its create failed or was given up, or its instance was deleted). A VM that is ours by
its tags but that no record mentions at all (the record was lost, or the whole ``instance/`` prefix
was deleted) is **adopted**: a record is rebuilt from its tags (tenant, group, on-demand) instead of
deleting and recreating it. A VM some unreadable record may describe (its key names the instance, or
its bytes contain the VM's ids) is **claimed**: left alone and reported until a person repairs or
removes that record. No I/O here; ``recovery.sync_provider`` carries the verdicts out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from nstance.core.errors import InvalidArgument
from nstance.core.ids import validate_identifier, validate_puid
from nstance.providers.base import ProviderInstance
from nstance.server.state.records import RecordProblem


class Verdict(StrEnum):
    """What the provider sync does with one listed VM that no active cache row explains."""

    FOREIGN = "foreign"  # its tags do not say it is ours: never touched
    CLAIMED = "claimed"  # an unreadable record may describe it: kept and reported
    ADOPT = "adopt"  # ours, no record at all: a record is rebuilt from its tags
    ORPHAN = "orphan"  # ours, and its record or row says it should not exist: deleted (braked)
    UNADOPTABLE = "unadoptable"  # ours, no record, but its tags lack tenant or group: kept and reported


@dataclass(frozen=True, slots=True)
class Decision:
    verdict: Verdict
    why: str


def is_ours(vm: ProviderInstance, cluster_id: str, shard: str) -> bool:
    """Whether the VM's own tags name this cluster and shard and carry a well-formed instance id."""
    if not vm.instance_id or vm.cluster_id != cluster_id or vm.shard != shard:
        return False
    try:
        validate_puid(vm.instance_id)
    except InvalidArgument:
        return False
    return True


def unreadable_claim(vm: ProviderInstance, unreadable: Sequence[RecordProblem]) -> RecordProblem | None:
    """The first unreadable record that may describe ``vm`` (by the id in its key or its bytes)."""
    needles = [s.encode() for s in (vm.instance_id, vm.provider_id) if s]
    for problem in unreadable:
        if problem.instance_id and problem.instance_id == vm.instance_id:
            return problem
        if any(needle in problem.raw for needle in needles):
            return problem
    return None


def _adoptable(vm: ProviderInstance) -> str | None:
    """None when the tags give what a record needs; else what is missing."""
    for name, value in (("tenant", vm.tenant), ("group", vm.group)):
        if not value:
            return f"its tags name no {name}"
        try:
            validate_identifier(value, name)
        except InvalidArgument as exc:
            return f"its {name} tag is not valid ({exc})"
    return None


def decide(
    vm: ProviderInstance,
    *,
    cluster_id: str,
    shard: str,
    disclaimed: bool,
    unreadable: Sequence[RecordProblem],
) -> Decision:
    """The verdict for a listed VM that no active (non-failed) cache row explains.

    ``disclaimed``: a record or cache row for its instance id exists and says it should not run (its
    create failed, it was retired or deleted).
    """
    if not is_ours(vm, cluster_id, shard):
        return Decision(Verdict.FOREIGN, "its tags do not name this cluster and shard with an instance id")
    claim = unreadable_claim(vm, unreadable)
    if claim is not None:
        return Decision(
            Verdict.CLAIMED,
            f"the unreadable record {claim.key} may describe it; repair or remove that record",
        )
    if disclaimed:
        return Decision(Verdict.ORPHAN, "its instance's record says it was deleted or never created")
    missing = _adoptable(vm)
    if missing is not None:
        return Decision(Verdict.UNADOPTABLE, f"no record claims it and {missing}, so it cannot be adopted")
    return Decision(Verdict.ADOPT, "no record claims it; adopting it from its tags")
