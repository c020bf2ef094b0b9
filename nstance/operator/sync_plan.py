"""Pure decisions of the sync manager: aggregate shard groups, choose pools to import, shape status.

Responsible for:

* ``aggregate``: groups with the same key on several shards become one ``AggregatedGroup``: the sum
  of their desired sizes (the initial MachinePool replicas), the shards in config order, the union of
  their provider IDs (sorted), ``is_static`` if any shard says so, and template / instance type /
  subnet pool / vars taken from the first shard in config order that sets them (vars merged, earlier
  shards winning); every disagreement between shards is listed in ``conflicts`` so it can be logged.
* ``pools_to_create`` and ``name_problem``: which groups have no NstanceMachinePool yet and whether a
  group key can name Kubernetes objects.
* ``capi_machine_pool`` / ``nstance_machine_pool``: the bodies created for an imported group.
* ``shard_group_status_patch``: the ``/status`` merge patch that brings an NstanceShardGroup in line
  with what its shard reports, or None when nothing would change (so unchanged objects are not written).

Must not: talk to Kubernetes or shards, read clocks, or import grpc / nstance.rpc. Callers pass ``now``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from nstance.core.ids import identifier_problem
from nstance.operator.conditions import find_condition, set_condition, timestamp
from nstance.operator.crds import names
from nstance.operator.crds.models import NstanceMachinePool

CLUSTER_NAME_LABEL: Final = "cluster.x-k8s.io/cluster-name"
"""The Cluster API label naming the owning Cluster."""

REASON_CONNECTED: Final = "StreamConnected"
REASON_STREAM_LOST: Final = "StreamLost"

_DNS1123_LABEL: Final = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_LABEL_MAX: Final = 63


@dataclass(frozen=True)
class GroupState:
    """What one shard reports about one group (a ``GroupStatus`` without the wire types)."""

    key: str
    size: int = 0
    """Desired size on this shard."""
    actual_size: int = 0
    """Running managed instances."""
    provider_ids: tuple[str, ...] = ()
    is_static: bool = False
    template: str = ""
    instance_type: str = ""
    subnet_pool: str = ""
    vars: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class AggregatedGroup:
    """One group key across every shard that has it."""

    key: str
    shards: tuple[str, ...]
    replicas: int
    """Sum of the desired sizes: the MachinePool's replicas when it is imported."""
    provider_ids: tuple[str, ...]
    is_static: bool
    template: str
    instance_type: str
    subnet_pool: str
    vars: Mapping[str, str]
    conflicts: tuple[str, ...] = ()
    """Human-readable disagreements between shards (the first shard's value was kept)."""


def aggregate(
    cache: Mapping[str, Mapping[str, GroupState]], shard_order: Sequence[str]
) -> list[AggregatedGroup]:
    """Aggregate the groups of the shards in ``shard_order`` (config order); sorted by group key.

    Shards not in ``shard_order`` are ignored (they are no longer configured).
    """
    by_key: dict[str, list[tuple[str, GroupState]]] = {}
    for shard in shard_order:
        for key, state in (cache.get(shard) or {}).items():
            by_key.setdefault(key, []).append((shard, state))
    return [_aggregate_one(key, members) for key, members in sorted(by_key.items())]


def _aggregate_one(key: str, members: Sequence[tuple[str, GroupState]]) -> AggregatedGroup:
    conflicts: list[str] = []

    def first(attribute: str) -> str:
        chosen, chosen_shard = "", ""
        for shard, state in members:
            value = str(getattr(state, attribute))
            if not value:
                continue
            if not chosen:
                chosen, chosen_shard = value, shard
            elif value != chosen:
                conflicts.append(
                    f"{attribute} is {chosen!r} on shard {chosen_shard} but {value!r} on shard {shard}"
                )
        return chosen

    merged: dict[str, str] = {}
    origin: dict[str, str] = {}
    for shard, state in members:
        for name, value in state.vars.items():
            if name not in merged:
                merged[name], origin[name] = value, shard
            elif merged[name] != value:
                conflicts.append(
                    f"var {name} is {merged[name]!r} on shard {origin[name]} but {value!r} on shard {shard}"
                )
    provider_ids: set[str] = set()
    for _, state in members:
        provider_ids.update(state.provider_ids)
    return AggregatedGroup(
        key=key,
        shards=tuple(shard for shard, _ in members),
        replicas=sum(max(0, state.size) for _, state in members),
        provider_ids=tuple(sorted(provider_ids)),
        is_static=any(state.is_static for _, state in members),
        template=first("template"),
        instance_type=first("instance_type"),
        subnet_pool=first("subnet_pool"),
        vars=merged,
        conflicts=tuple(conflicts),
    )


def name_problem(key: str) -> str | None:
    """Why a group key cannot name its NstanceMachinePool and MachinePool, or None when it can."""
    if len(key) > _DNS1123_LABEL_MAX or not _DNS1123_LABEL.match(key):
        return (
            f"group key {key!r} is not a valid Kubernetes name (DNS-1123 label: lowercase letters, digits "
            f"and '-', starting and ending with a letter or digit, at most {_DNS1123_LABEL_MAX} characters)"
        )
    problem = identifier_problem(key)
    if problem is not None:
        return f"group key {key!r} is not a valid NstanceMachinePool spec.group: {problem}"
    return None


def pools_to_create(groups: Sequence[AggregatedGroup], existing: set[str]) -> list[AggregatedGroup]:
    """The groups no NstanceMachinePool has as ``spec.group`` (``existing``), in key order."""
    return [group for group in groups if group.key not in existing]


def existing_pool_groups(pools: Sequence[Mapping[str, Any]]) -> set[str]:
    """The ``spec.group`` of every NstanceMachinePool (objects without one are ignored)."""
    found: set[str] = set()
    for pool in pools:
        group = (pool.get("spec") or {}).get("group")
        if isinstance(group, str) and group:
            found.add(group)
    return found


def _metadata(group: AggregatedGroup, namespace: str, cluster_name: str) -> dict[str, Any]:
    return {
        "name": group.key,
        "namespace": namespace,
        "labels": {CLUSTER_NAME_LABEL: cluster_name},
        "annotations": {names.MANAGED_BY_ANNOTATION: names.MANAGED_BY_VALUE},
    }


def capi_machine_pool(group: AggregatedGroup, *, namespace: str, cluster_name: str) -> dict[str, Any]:
    """The Cluster API MachinePool created for an imported group (replicas = the sum of sizes)."""
    return {
        "apiVersion": names.CAPI_API_VERSION,
        "kind": names.CAPI_KIND_MACHINE_POOL,
        "metadata": _metadata(group, namespace, cluster_name),
        "spec": {
            "clusterName": cluster_name,
            "replicas": group.replicas,
            "template": {
                "spec": {
                    "clusterName": cluster_name,
                    "bootstrap": {"dataSecretName": ""},
                    "infrastructureRef": {
                        "apiGroup": names.GROUP,
                        "kind": names.KIND_MACHINE_POOL,
                        "name": group.key,
                    },
                }
            },
        },
    }


def nstance_machine_pool(group: AggregatedGroup, *, namespace: str, cluster_name: str) -> dict[str, Any]:
    """The NstanceMachinePool created for an imported group.

    Template and subnet pool are set only for dynamic groups (a static group's come from the server
    config and the webhook forbids setting them). Raises ``InvalidResource`` (naming the field) when
    the server reported something the CRD schema would refuse.
    """
    spec: dict[str, Any] = {"group": group.key, "shards": list(group.shards)}
    if not group.is_static:
        if group.template:
            spec["template"] = group.template
        if group.subnet_pool:
            spec["subnetPool"] = group.subnet_pool
    if group.instance_type:
        spec["instanceType"] = group.instance_type
    if group.vars:
        spec["vars"] = dict(group.vars)
    if group.provider_ids:
        spec["providerIDList"] = list(group.provider_ids)
    body = {
        "apiVersion": names.API_VERSION,
        "kind": names.KIND_MACHINE_POOL,
        "metadata": _metadata(group, namespace, cluster_name),
        "spec": spec,
    }
    NstanceMachinePool.from_k8s(body)
    return body


@dataclass(frozen=True)
class ShardObservation:
    """What the sync manager knows about one group on one shard right now."""

    reachable: bool
    """Whether the shard's group stream is connected and its last full list succeeded."""
    state: GroupState | None = None
    """The group as the shard reports it; None when the shard (reachable) does not have it."""
    error: str = ""
    """Why the shard is not reachable."""


def shard_group_status_patch(
    obj: Mapping[str, Any], observed: ShardObservation, *, shard: str, now: datetime
) -> dict[str, Any] | None:
    """The merge patch for ``obj``'s ``/status`` (None when already current).

    Reachable: ``replicas`` (actual size), sorted ``providerIDs``, ``isStatic`` (when the shard has
    the group) and ShardReachable=True. Not reachable: only ShardReachable=False (reason StreamLost),
    the counts are left as last seen. A condition already holding the wanted status is left alone
    (its reason may come from another controller). The patch carries ``metadata.resourceVersion``,
    so a concurrent writer of the conditions makes it fail with 409 instead of being overwritten.
    """
    status = obj.get("status") or {}
    conditions = status.get("conditions") or []
    changes: dict[str, Any] = {}
    if observed.reachable:
        state = observed.state
        replicas = state.actual_size if state is not None else 0
        provider_ids = sorted(state.provider_ids) if state is not None else []
        if status.get("replicas") != replicas:
            changes["replicas"] = replicas
        if list(status.get("providerIDs") or []) != provider_ids:
            changes["providerIDs"] = provider_ids
        if state is not None and bool(status.get("isStatic")) != state.is_static:
            changes["isStatic"] = state.is_static
        wanted, reason, message = True, REASON_CONNECTED, f"watching shard {shard}"
    else:
        wanted, reason = False, REASON_STREAM_LOST
        message = f"lost the group stream of shard {shard}: {observed.error}"
    current = find_condition(conditions, names.SHARD_REACHABLE)
    if current is None or current.get("status") != ("True" if wanted else "False"):
        changes["conditions"] = set_condition(
            conditions, names.SHARD_REACHABLE, wanted, reason=reason, message=message, now=now
        )
    if not changes:
        return None
    if observed.reachable:
        changes["lastSyncTime"] = timestamp(now)
    patch: dict[str, Any] = {"status": changes}
    version = (obj.get("metadata") or {}).get("resourceVersion")
    if version:
        patch["metadata"] = {"resourceVersion": version}
    return patch
