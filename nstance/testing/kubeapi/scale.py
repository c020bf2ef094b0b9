"""The ``scale`` subresource of custom resources: the ``autoscaling/v1`` ``Scale`` view of an object.

A CRD version declaring ``subresources.scale`` names where the object keeps its desired replicas
(``specReplicasPath``), its observed replicas (``statusReplicasPath``) and optionally its label selector
as a string (``labelSelectorPath``). Reading the subresource builds a ``Scale`` from those fields; writing
it sets only the desired replicas. Paths are the simple dotted form CRDs allow (``.spec.replicas``).
Pure functions on JSON values: no I/O.
"""

from __future__ import annotations

import copy
from typing import Any

from nstance.testing.kubeapi import errors
from nstance.testing.kubeapi.resources import ResourceType

JSON = dict[str, Any]
API_VERSION = "autoscaling/v1"


def _paths(rtype: ResourceType) -> JSON:
    declared = rtype.extra.get("scale")
    return declared if isinstance(declared, dict) else {}


def _parts(path: Any) -> list[str]:
    return [part for part in str(path or "").split(".") if part]


def _get(obj: JSON, path: Any) -> Any:
    current: Any = obj
    for part in _parts(path):
        if not isinstance(current, dict) or part not in current:
            return None
        current = current[part]
    return current


def view(rtype: ResourceType, obj: JSON) -> JSON:
    """The object's ``Scale``."""
    paths = _paths(rtype)
    meta = obj["metadata"]
    scale_meta = {
        k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp") if k in meta
    }
    spec: JSON = {}
    desired = _get(obj, paths.get("specReplicasPath"))
    if isinstance(desired, int):
        spec["replicas"] = desired
    observed = _get(obj, paths.get("statusReplicasPath"))
    status: JSON = {"replicas": observed if isinstance(observed, int) else 0}
    selector = _get(obj, paths.get("labelSelectorPath")) if paths.get("labelSelectorPath") else None
    if isinstance(selector, str) and selector:
        status["selector"] = selector
    return {
        "kind": "Scale",
        "apiVersion": API_VERSION,
        "metadata": scale_meta,
        "spec": spec,
        "status": status,
    }


def replicas_of(scale: Any) -> int:
    """The desired replicas a written ``Scale`` asks for (422 when it is not a non-negative integer)."""
    spec = scale.get("spec") if isinstance(scale, dict) else None
    replicas = spec.get("replicas", 0) if isinstance(spec, dict) else 0
    if not isinstance(replicas, int) or isinstance(replicas, bool):
        raise errors.bad_request(f"Scale.spec.replicas must be an integer, got {replicas!r}")
    name = str(((scale or {}).get("metadata") or {}).get("name", ""))
    if replicas < 0:
        raise errors.invalid_object(
            "autoscaling",
            "Scale",
            name,
            [errors.invalid("spec.replicas", replicas, "must be greater than or equal to 0")],
        )
    return replicas


def with_replicas(rtype: ResourceType, obj: JSON, replicas: int) -> JSON:
    """A copy of the object with its desired replicas set."""
    new = copy.deepcopy(obj)
    parts = _parts(_paths(rtype).get("specReplicasPath"))
    if not parts:
        raise errors.internal(f"{rtype.kind} declares a scale subresource without specReplicasPath")
    current = new
    for part in parts[:-1]:
        nxt = current.get(part)
        if not isinstance(nxt, dict):
            nxt = current[part] = {}
        current = nxt
    current[parts[-1]] = replicas
    return new
