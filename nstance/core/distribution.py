"""Replica distribution: how many instances of a pool each shard runs.

Responsible for one pure decision: split a pool's desired replica count over the shards listed in
``NstanceMachinePool.spec.shards``. Every shard gets ``total // n``; the remainder goes one each to the
first shards *in the order the user listed them* (the spec wins over upstream's sorted order, so a user
can say which zone takes the odd instance). The result is deterministic and ignores shard health and
capacity on purpose: moving replicas away from a zone that is down is a separate, explicit decision.

Must not: do I/O, look at Kubernetes objects or shard connections, or reorder the shards.
"""

from __future__ import annotations

from collections.abc import Sequence


def distribute_replicas(total: int, shards: Sequence[str]) -> dict[str, int]:
    """Per-shard sizes summing to ``total``; the first ``total % len(shards)`` shards get one more.

    The returned dict keeps the order of ``shards``. Raises ValueError for a negative total, an empty
    shard list, or a shard listed twice (each message names the problem so it can go straight into a
    status condition).
    """
    if total < 0:
        raise ValueError(f"replicas must not be negative (got {total})")
    if not shards:
        raise ValueError("at least one shard is required to place replicas")
    seen: set[str] = set()
    duplicates: list[str] = []
    for shard in shards:
        if shard in seen and shard not in duplicates:
            duplicates.append(shard)
        seen.add(shard)
    if duplicates:
        listed = ", ".join(repr(s) for s in duplicates)
        raise ValueError(f"shards must be listed once each; listed more than once: {listed}")
    base, remainder = divmod(total, len(shards))
    return {shard: base + (1 if index < remainder else 0) for index, shard in enumerate(shards)}
