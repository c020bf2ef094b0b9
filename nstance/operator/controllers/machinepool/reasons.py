"""Ready-condition reasons of an NstanceMachinePool (upstream's names), each marked transient or terminal.

Must not: hold behaviour.
"""

from __future__ import annotations

import enum


class PoolReason(enum.StrEnum):
    RECONCILING = "Reconciling"
    """Transient: shard groups are being created or are not Ready yet."""
    RECONCILED = "Reconciled"
    """Every shard group is Ready."""
    INVALID = "Invalid"
    """Terminal until the spec or the operator config changes: bad spec or unconfigured shards."""
    DUPLICATE_GROUP = "DuplicateGroup"
    """Terminal while an older pool manages the same group."""
    DELETING = "Deleting"
    """Transient: the group is being removed from its shards."""
