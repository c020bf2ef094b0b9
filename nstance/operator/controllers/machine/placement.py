"""Pure decisions of the NstanceMachine controller: which shard, which instance-ID kind.

* ``choose_shard``: the owner Machine's ``spec.failureDomain`` when set (it must be configured);
  otherwise the *reachable* configured shard with the fewest NstanceMachines, ties broken by config
  order (upstream picks "any" shard by map order, which piles machines onto one zone).
* ``instance_kind``: the 3-letter puid prefix to try; the kind of an earlier instance of the same
  group when one is known, else ``ins``. ``expected_kind`` reads the right kind out of the server's
  refusal when the guess was wrong (nothing is created on that refusal).

Must not: do I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from nstance.core.ids import kind_problem

DEFAULT_KIND: Final = "ins"

_KIND_REFUSAL = re.compile(
    r"has prefix '(?P<have>[a-z]{3})', but template \"[^\"]*\" "
    r"creates instances of kind \"(?P<want>[a-z]{3})\""
)


class NoShard(LookupError):
    """No shard can take the machine now; the message says why."""


def choose_shard(
    configured: Sequence[str],
    reachable: Iterable[str],
    counts: Mapping[str, int],
    failure_domain: str = "",
) -> str:
    """The shard for a new machine (see the module docstring); raises NoShard with the reason."""
    if failure_domain:
        if failure_domain not in configured:
            raise NoShard(
                f"the Machine's spec.failureDomain {failure_domain!r} is not a configured shard "
                f"(configured: {', '.join(configured) or 'none'})"
            )
        return failure_domain
    up = set(reachable)
    candidates = [shard for shard in configured if shard in up]
    if not candidates:
        raise NoShard(f"no configured shard is reachable (configured: {', '.join(configured) or 'none'})")
    return min(candidates, key=lambda shard: (counts.get(shard, 0), candidates.index(shard)))


def instance_kind(machines: Iterable[Mapping[str, Any]], group: str) -> str:
    """The kind prefix of an earlier instance of ``group`` (from NstanceMachine status), else ``ins``."""
    for machine in machines:
        spec = machine.get("spec") or {}
        status = machine.get("status") or {}
        instance_id = str(status.get("instanceID") or "")
        if spec.get("group") == group and len(instance_id) > 3 and kind_problem(instance_id[:3]) is None:
            return instance_id[:3]
    return DEFAULT_KIND


def expected_kind(details: str) -> str | None:
    """The kind the server asked for in a prefix refusal, or None when it is another error."""
    match = _KIND_REFUSAL.search(details)
    return match.group("want") if match else None


def shard_counts(machines: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """NstanceMachines per shard (from status.shard)."""
    counts: dict[str, int] = {}
    for machine in machines:
        shard = str((machine.get("status") or {}).get("shard") or "")
        if shard:
            counts[shard] = counts.get(shard, 0) + 1
    return counts
