"""Condition reasons of an NstanceShardGroup, each marked transient or terminal. Must not: hold behaviour."""

from __future__ import annotations

import enum


class ShardGroupReason(enum.StrEnum):
    SYNC_SUCCEEDED = "SyncSucceeded"
    """Ready: the shard accepted the group's current spec."""
    REACHABLE = "Reachable"
    """ShardReachable: the shard answered."""
    VALID = "Valid"
    """ConfigValid: the shard accepted the config."""
    SHARD_UNREACHABLE = "ShardUnreachable"
    """Transient: the shard did not answer (retried after unreachable_retry)."""
    SHARD_NOT_CONFIGURED = "ShardNotConfigured"
    """Terminal until the operator config lists the shard again."""
    CONFIG_INVALID = "ConfigInvalid"
    """Terminal until the spec (or the shard's config) changes; retried after error_retry."""
    PROVIDER_ERROR = "ProviderError"
    """Transient: the shard failed for another reason (retried after error_retry)."""
