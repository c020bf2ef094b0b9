"""Pure decisions of a drain: which pods must leave a Node, when an event's deadline is, and how a
server reason reads as a Kubernetes condition reason.

Must not: do I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from nstance.rpc import operator_pb2

MIRROR_ANNOTATION: Final = "kubernetes.io/config.mirror"

_NOT_CAMEL: Final = re.compile(r"[^A-Za-z0-9]+")


def is_daemonset_pod(pod: Mapping[str, Any]) -> bool:
    """Whether a DaemonSet owns the pod (its controller recreates it on the Node anyway)."""
    owners = (pod.get("metadata") or {}).get("ownerReferences") or []
    return any(owner.get("kind") == "DaemonSet" for owner in owners)


def is_mirror_pod(pod: Mapping[str, Any]) -> bool:
    """Whether the pod is the API mirror of a static pod (the kubelet owns it; it cannot be evicted)."""
    return MIRROR_ANNOTATION in ((pod.get("metadata") or {}).get("annotations") or {})


def is_terminating(pod: Mapping[str, Any]) -> bool:
    return bool((pod.get("metadata") or {}).get("deletionTimestamp"))


def pods_to_drain(pods: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The pods that must leave the Node before it counts as drained (terminating ones included)."""
    return [pod for pod in pods if not is_daemonset_pod(pod) and not is_mirror_pod(pod)]


def pod_ref(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"


def condition_reason(text: str, default: str) -> str:
    """A server reason such as ``scale-down`` as a Kubernetes condition reason (``ScaleDown``)."""
    words = [word for word in _NOT_CAMEL.split(text) if word]
    camel = "".join(word[:1].upper() + word[1:] for word in words)
    if not camel or not camel[0].isalpha():
        return default
    return camel


def event_deadline(event: operator_pb2.InstanceEvent, now: datetime, fallback: float) -> datetime:
    """When the server deletes the instance regardless: ``delete_at``, else ``now + fallback``."""
    if event.HasField("delete_at") and (event.delete_at.seconds or event.delete_at.nanos):
        moment: datetime = event.delete_at.ToDatetime(tzinfo=UTC)
        return moment
    return now + timedelta(seconds=fallback)
