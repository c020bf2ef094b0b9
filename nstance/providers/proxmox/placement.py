"""Choose the node a new VM goes to: online nodes ranked by free memory and free CPU (TOPSIS).

Each candidate is scored on two benefit criteria, free memory (weight 0.6) and free CPU cores (weight 0.4),
by the TOPSIS method: columns are vector-normalised and weighted, and a node's score is its closeness to
the ideal node (most of both) relative to the anti-ideal (least of both). Offline nodes, nodes without
usage figures, nodes outside an allow-list and nodes without room for the VM's memory are skipped.
Memory this process has promised to VMs still starting (``reserved``) counts as used.

Pure functions over ``/cluster/resources`` node entries; no I/O and no randomness (ties go to the name
that sorts first, so placement is repeatable).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

MEMORY_WEIGHT = 0.6
CPU_WEIGHT = 0.4


@dataclass(frozen=True, slots=True)
class NodeLoad:
    """One node's capacity and use, as ``/cluster/resources?type=node`` reports it."""

    name: str
    online: bool
    mem: int = 0  # bytes used
    maxmem: int = 0  # bytes
    cpu: float = 0.0  # fraction of all cores busy, 0..1
    maxcpu: int = 0  # cores

    def free_memory(self, reserved: int = 0) -> int:
        return max(0, self.maxmem - self.mem - reserved)

    def free_cpu(self) -> float:
        return max(0.0, self.maxcpu * (1.0 - min(max(self.cpu, 0.0), 1.0)))


def node_loads(resources: Iterable[Mapping[str, Any]]) -> list[NodeLoad]:
    """The node entries of a ``/cluster/resources`` answer (other types are ignored)."""
    out: list[NodeLoad] = []
    for item in resources:
        if item.get("type") != "node" or not isinstance(item.get("node"), str):
            continue
        out.append(
            NodeLoad(
                name=item["node"],
                online=item.get("status") == "online",
                mem=_int(item.get("mem")),
                maxmem=_int(item.get("maxmem")),
                cpu=_float(item.get("cpu")),
                maxcpu=_int(item.get("maxcpu")),
            )
        )
    return out


def rank_nodes(
    nodes: Iterable[NodeLoad],
    *,
    need_memory: int = 0,
    allowed: Iterable[str] | None = None,
    reserved: Mapping[str, int] | None = None,
) -> list[str]:
    """Names of the nodes that can take a VM needing ``need_memory`` bytes, best first."""
    allow = set(allowed) if allowed is not None else None
    held = reserved or {}
    candidates = [
        n
        for n in nodes
        if n.online
        and n.maxmem > 0
        and n.maxcpu > 0
        and (allow is None or n.name in allow)
        and n.free_memory(held.get(n.name, 0)) >= need_memory
    ]
    if not candidates:
        return []
    rows = [(float(n.free_memory(held.get(n.name, 0))), n.free_cpu()) for n in candidates]
    scores = topsis(rows, (MEMORY_WEIGHT, CPU_WEIGHT))
    order = sorted(range(len(candidates)), key=lambda i: (-scores[i], candidates[i].name))
    return [candidates[i].name for i in order]


def topsis(rows: Sequence[Sequence[float]], weights: Sequence[float]) -> list[float]:
    """TOPSIS closeness (0..1, higher is better) of each row; every criterion is a benefit."""
    if not rows:
        return []
    width = len(weights)
    norms = [math.sqrt(sum(row[j] ** 2 for row in rows)) for j in range(width)]
    weighted = [[(row[j] / norms[j] if norms[j] else 0.0) * weights[j] for j in range(width)] for row in rows]
    best = [max(r[j] for r in weighted) for j in range(width)]
    worst = [min(r[j] for r in weighted) for j in range(width)]
    out: list[float] = []
    for r in weighted:
        to_best = math.sqrt(sum((r[j] - best[j]) ** 2 for j in range(width)))
        to_worst = math.sqrt(sum((r[j] - worst[j]) ** 2 for j in range(width)))
        out.append(1.0 if to_best + to_worst == 0 else to_worst / (to_best + to_worst))
    return out


def _int(value: object) -> int:
    if isinstance(value, bool):
        return 0
    if isinstance(value, int | float):
        return int(value)
    if isinstance(value, str):
        try:
            return int(float(value))
        except ValueError:
            return 0
    return 0


def _float(value: object) -> float:
    if isinstance(value, bool):
        return 0.0
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return 0.0
    return 0.0
