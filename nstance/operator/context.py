"""What every operator component is handed: identity of the cluster, the Kubernetes API, the shards.

``ShardAccess`` is the contract between the shard connections (``shards.py``) and their users (the
controllers, the sync manager, the drain coordinator): which shards are configured, a gRPC stub for
each, whether a shard answered lately, and a way to wait until the configured set changes (shards
are added or removed through the ConfigMap without a restart). ``OperatorContext`` bundles it with
``Kube``, the Node index and the settings that stay fixed for the life of the process.

This module holds no behaviour beyond naming; it must not open connections or talk to Kubernetes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final, Protocol

from nstance.core.clock import Clock, SystemClock
from nstance.operator.kube import Kube
from nstance.operator.nodes import NodeIndex
from nstance.rpc import operator_pb2_grpc

RPC_TIMEOUT: Final = 10.0
"""Seconds a unary Operator API call may take before the shard counts as unreachable."""


class ShardNotConfigured(LookupError):
    """The shard is not in the operator config (any more)."""


class ShardAccess(Protocol):
    """The operator's connections to its shard servers."""

    def configured(self) -> Sequence[str]:
        """Configured shard ids, in config order."""
        ...

    def stub(self, shard: str) -> operator_pb2_grpc.OperatorServiceStub:
        """An Operator API stub (grpc.aio, mTLS) for ``shard``; raises ``ShardNotConfigured``."""
        ...

    def reachable(self, shard: str) -> bool:
        """Whether the shard's last call or stream succeeded (False for unknown shards)."""
        ...

    def report(self, shard: str, ok: bool, error: str = "") -> None:
        """Tell the connection manager how a call went, so ``reachable`` stays current."""
        ...

    async def wait_changed(self) -> None:
        """Return when the configured set of shards (or their addresses) changes."""
        ...


@dataclass(frozen=True)
class Timings:
    """Intervals of the operator's loops, in seconds (tests shorten them; production keeps these)."""

    resync: float = 30.0
    """ListGroups on every shard (sync manager safety net) and refresh of machine status."""
    unreachable_retry: float = 10.0
    """Requeue of an object whose shard is not reachable."""
    error_retry: float = 30.0
    """Requeue after a shard refused a change (for example a provider error)."""
    backoff_base: float = 1.0
    backoff_cap: float = 30.0
    """Reconnect backoff of watch streams (exponential with jitter between these)."""
    drain_poll: float = 2.0
    """How often a drain checks whether its pods are gone and retries refused evictions."""
    drain_fallback: float = 300.0
    """Drain deadline when a drain event carries no ``delete_at``."""


@dataclass
class OperatorContext:
    """Everything a controller step needs; one per running operator."""

    namespace: str
    cluster_id: str
    tenant: str
    kube: Kube
    shards: ShardAccess
    nodes: NodeIndex
    clock: Clock = field(default_factory=SystemClock)
    timings: Timings = field(default_factory=Timings)

    @property
    def capi_cluster_name(self) -> str:
        """Name of the CAPI Cluster (and NstanceCluster) that owns every pool and machine."""
        return f"{self.cluster_id}--{self.tenant}"
