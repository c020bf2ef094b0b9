"""Condition names and reasons of an NstanceMachine, each marked transient or terminal.

Must not: hold behaviour.
"""

from __future__ import annotations

import enum
from typing import Final

INSTANCE_CREATED: Final = "InstanceCreated"
"""Condition: the shard accepted CreateInstance for status.instanceID (never create again after)."""

READY_STATUSES: Final = frozenset({"running", "registered", "healthy"})
"""Instance status words (GetInstanceStatus) that mean the VM is up."""


class MachineReason(enum.StrEnum):
    INVALID = "Invalid"
    """Terminal until the spec changes."""
    SHARD_NOT_CONFIGURED = "ShardNotConfigured"
    """Transient: the chosen or requested shard is not in the operator config."""
    SHARD_UNREACHABLE = "ShardUnreachable"
    """Transient: retried after unreachable_retry."""
    REACHABLE = "Reachable"
    CREATING = "Creating"
    """Transient: instance ID chosen, CreateInstance not confirmed yet."""
    CREATED = "Created"
    PENDING = "InstancePending"
    """Transient: the instance exists but is not running yet."""
    INSTANCE_READY = "InstanceReady"
    INSTANCE_GONE = "InstanceNotFound"
    """Terminal: the shard no longer knows the instance (it is not created again)."""
    CREATE_REFUSED = "CreateRefused"
    """Terminal until the spec or the shard config changes; retried after error_retry."""
    PROVIDER_ERROR = "ProviderError"
    """Transient: retried after error_retry."""
