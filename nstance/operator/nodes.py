"""An in-memory index of Kubernetes Nodes by provider ID, kept current by a watch.

The drain coordinator and the NstanceMachine controller ask "which Node runs the machine with this
provider instance ID?" for every event; listing all Nodes each time (as upstream does) costs a full
LIST per question. ``NodeIndex`` is a ``WatchedIndex`` (list once, then watch from the list's version,
re-listing after a 410 Gone or a dropped stream, with backoff) keyed by ``spec.providerID``
(``nstance.core.providerid.node_keys``). ``find`` answers from memory. The index never writes to
Kubernetes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nstance.core.providerid import instance_key, node_keys
from nstance.operator.kube import NODES, Object
from nstance.operator.watchindex import ListWatch, WatchedIndex


def provider_keys(node: Mapping[str, Any]) -> set[str]:
    """The keys a Node is found under: its ``spec.providerID`` and that ID's trailing segment."""
    return node_keys(str((node.get("spec") or {}).get("providerID") or ""))


class NodeIndex(WatchedIndex):
    """Nodes by provider ID; ``run`` keeps it current, ``find`` looks one up, ``get`` by name."""

    def __init__(self, kube: ListWatch, *, backoff_base: float = 1.0, backoff_cap: float = 30.0) -> None:
        super().__init__(kube, NODES, provider_keys, backoff_base=backoff_base, backoff_cap=backoff_cap)

    def find(self, provider_instance_id: str) -> Object | None:
        """The Node whose ``spec.providerID`` names this machine (a server's provider instance ID)."""
        return super().find(instance_key(provider_instance_id))
