"""Wire names of the on-demand pod flow and the pure helpers that read a pod.

Both annotation spellings are accepted: the documented ``on-demand.nstance.dev/group`` /
``on-demand.nstance.dev/instance-type`` and the ones upstream's code reads,
``nstance.dev/on-demand-group`` / ``nstance.dev/on-demand-instance-type`` (documented names first).
Must not: do I/O.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any, Final

from nstance.operator.crds.names import ONDEMAND_POD_FINALIZER

GROUP_ANNOTATIONS: Final = ("on-demand.nstance.dev/group", "nstance.dev/on-demand-group")
INSTANCE_TYPE_ANNOTATIONS: Final = (
    "on-demand.nstance.dev/instance-type",
    "nstance.dev/on-demand-instance-type",
)
SCHEDULING_GATE: Final = "nstance.dev/on-demand"
"""A pod carrying this scheduling gate waits for its own VM and is pinned to it."""
HOSTNAME_LABEL: Final = "kubernetes.io/hostname"
NAME_PREFIX: Final = "on-demand-"
NAME_MAX: Final = 253


def _first(annotations: Mapping[str, Any], keys: tuple[str, ...]) -> str:
    for key in keys:
        value = annotations.get(key)
        if value:
            return str(value)
    return ""


def pod_annotations(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    metadata = pod.get("metadata") or {}
    annotations = metadata.get("annotations") or {}
    return annotations if isinstance(annotations, Mapping) else {}


def on_demand_group(pod: Mapping[str, Any]) -> str:
    """The group a pod asks for ("" when it is not an on-demand pod)."""
    return _first(pod_annotations(pod), GROUP_ANNOTATIONS)


def on_demand_instance_type(pod: Mapping[str, Any]) -> str:
    return _first(pod_annotations(pod), INSTANCE_TYPE_ANNOTATIONS)


def is_on_demand_pod(pod: Mapping[str, Any]) -> bool:
    """Whether the pod is ours to handle: it asks for a group or still carries our finalizer."""
    finalizers = (pod.get("metadata") or {}).get("finalizers") or []
    return bool(on_demand_group(pod)) or ONDEMAND_POD_FINALIZER in finalizers


def machine_name(pod_name: str) -> str:
    """``on-demand-{pod}``, shortened with a hash when it would exceed a Kubernetes name's 253 chars."""
    name = f"{NAME_PREFIX}{pod_name}"
    if len(name) <= NAME_MAX:
        return name
    digest = hashlib.sha256(pod_name.encode()).hexdigest()[:10]
    return f"{name[: NAME_MAX - 11]}-{digest}"


def has_gate(pod: Mapping[str, Any]) -> bool:
    gates = (pod.get("spec") or {}).get("schedulingGates") or []
    return any(isinstance(g, Mapping) and g.get("name") == SCHEDULING_GATE for g in gates)
