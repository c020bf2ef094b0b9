"""Validation kube-apiserver applies to every object's metadata and to a few built-in kinds.

Measured against a real v1.34 server (``test_metadata_and_builtin_validation_match_the_real_server``
in ``tests/contract/test_kubeapi_contract.py``) and mirrored here:

- **label keys, annotation keys and finalizers** are qualified names: an optional DNS-subdomain prefix
  and ``/``, then a name part of at most 63 alphanumerics, ``-``, ``_`` or ``.`` that starts and ends
  with an alphanumeric; **label values** are empty or such a name part;
- a core **Event** names the object it is about in ``involvedObject`` (``regarding`` in
  ``events.k8s.io``, the same stored object): an object's namespace must be the event's, and an event
  about a cluster-scoped object (no namespace) lives in ``default``; an ``events.k8s.io/v1`` Event
  also needs ``eventTime``;
- a **Pod**'s spec changes only in its images, ``activeDeadlineSeconds``, ``terminationGracePeriodSeconds``
  and added tolerations; its scheduling gates can only be removed, and while it has any (it is not
  scheduled yet) ``nodeSelector`` entries and ``affinity`` may be added: how an on-demand pod is pinned
  to its VM (``controllers/ondemand/pin_pod.py``);
- a **Lease**'s ``leaseDurationSeconds`` is positive, and a Lease is updated only at a known
  ``resourceVersion`` (as custom resources are: ``ResourceType.unconditional_update``).

Pure: each function returns the field errors it finds.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from nstance.testing.kubeapi import errors

_NAME_PART = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
"""A lowercase RFC 1123 subdomain (use ``fullmatch``): object names, and the prefix of a qualified name."""
NAME_PART_MAX = 63
PREFIX_MAX = 253

NAME_PART_RULE = (
    "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
    "alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is "
    "'([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
)
PREFIX_RULE = (
    "prefix part a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' "
    "or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for "
    "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
LABEL_VALUE_RULE = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and "
    "must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', "
    "regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
)
EVENTS = ("", "events")
EVENTS_K8S_IO = ("events.k8s.io", "events")
LEASES = ("coordination.k8s.io", "leases")
PODS = ("", "pods")
POD_UPDATE_RULE = (
    "pod updates may not change fields other than `spec.containers[*].image`,"
    "`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to "
    "existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was "
    "previously negative)"
)


def qualified_name_problems(value: str) -> list[str]:
    """Why ``value`` is not a qualified name (``[prefix/]name``), as kube-apiserver words it."""
    prefix, slash, name = value.rpartition("/")
    if slash and not prefix:
        return ["prefix part must be non-empty"]
    problems = []
    if not name:
        problems.append("name part must be non-empty")
    else:
        if len(name) > NAME_PART_MAX:
            problems.append(f"name part must be no more than {NAME_PART_MAX} bytes")
        if not _NAME_PART.fullmatch(name):
            problems.append(NAME_PART_RULE)
    if prefix:
        if len(prefix) > PREFIX_MAX:
            problems.append(f"prefix part must be no more than {PREFIX_MAX} bytes")
        if not SUBDOMAIN.fullmatch(prefix):
            problems.append(PREFIX_RULE)
    return problems


def label_value_problems(value: str) -> list[str]:
    """Why ``value`` is not a label value."""
    problems = []
    if len(value) > NAME_PART_MAX:
        problems.append(f"must be no more than {NAME_PART_MAX} bytes")
    if value and not _NAME_PART.fullmatch(value):
        problems.append(LABEL_VALUE_RULE)
    return problems


def metadata_problems(meta: Mapping[str, Any]) -> list[errors.FieldError]:
    """Label keys and values, annotation keys and finalizer names that are not valid (string-typed
    fields only: the caller reports values of the wrong type)."""
    found: list[errors.FieldError] = []
    labels = meta.get("labels")
    if isinstance(labels, Mapping):
        for key, value in labels.items():
            found.extend(_invalid("metadata.labels", key, qualified_name_problems(str(key))))
            if isinstance(value, str):
                found.extend(_invalid("metadata.labels", value, label_value_problems(value)))
    annotations = meta.get("annotations")
    if isinstance(annotations, Mapping):
        for key in annotations:
            found.extend(_invalid("metadata.annotations", key, qualified_name_problems(str(key))))
    finalizers = meta.get("finalizers")
    if isinstance(finalizers, list):
        for name in finalizers:
            if isinstance(name, str):
                found.extend(_invalid("metadata.finalizers", name, qualified_name_problems(name)))
    return found


def kind_problems(
    key: tuple[str, str], obj: Mapping[str, Any], old: Mapping[str, Any] | None
) -> list[errors.FieldError]:
    """What the built-in kind ``key`` (group, plural) requires of ``obj`` beyond its metadata; ``old``
    is the stored version an update replaces (None for a create)."""
    if key in (EVENTS, EVENTS_K8S_IO):
        return _event_problems(key, obj, creating=old is None)
    if key == PODS and old is not None:
        return pod_update_problems(old.get("spec") or {}, obj.get("spec") or {})
    if key == LEASES:
        duration = (obj.get("spec") or {}).get("leaseDurationSeconds")
        if isinstance(duration, int) and duration <= 0:
            return [errors.invalid("spec.leaseDurationSeconds", duration, "must be greater than 0")]
    return []


def _event_problems(
    key: tuple[str, str], obj: Mapping[str, Any], *, creating: bool
) -> list[errors.FieldError]:
    found: list[errors.FieldError] = []
    about = obj.get("regarding" if key == EVENTS_K8S_IO else "involvedObject") or {}
    about_namespace = str(about.get("namespace") or "") if isinstance(about, Mapping) else ""
    namespace = str((obj.get("metadata") or {}).get("namespace") or "")
    # An event about a cluster-scoped object (or about nothing) lives in "default".
    matches = about_namespace == namespace if about_namespace else namespace in ("", "default")
    if not matches:
        # Both API groups store the same object, and both word the error after the core field.
        found.append(
            errors.invalid("involvedObject.namespace", about_namespace, "does not match event.namespace")
        )
    if key == EVENTS_K8S_IO and creating and not obj.get("eventTime"):
        found.append(errors.required("eventTime"))
    return found


def pod_update_problems(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[errors.FieldError]:
    """What an update of a pod's spec from ``old`` to ``new`` changes that a pod may not change."""
    old_gates = [g.get("name") for g in old.get("schedulingGates") or [] if isinstance(g, Mapping)]
    new_gates = [g.get("name") for g in new.get("schedulingGates") or [] if isinstance(g, Mapping)]
    added = [gate for gate in new_gates if gate not in old_gates]
    if added:
        return [
            errors.forbidden(
                "spec.schedulingGates",
                f"only deletion is allowed, but found new scheduling gate '{added[0]}'",
            )
        ]
    gated = bool(old_gates)
    old_selector = old.get("nodeSelector") or {}
    new_selector = new.get("nodeSelector") or {}
    if (
        gated
        and isinstance(old_selector, Mapping)
        and isinstance(new_selector, Mapping)
        and any(new_selector.get(k) != v for k, v in old_selector.items())
    ):
        return [
            errors.invalid(
                "spec.nodeSelector",
                "",
                "only additions to spec.nodeSelector are allowed (no mutations or deletions)",
            )
        ]
    old_tolerations = list(old.get("tolerations") or [])
    new_tolerations = list(new.get("tolerations") or [])
    # What may change is taken from the new spec; whatever else differs is refused.
    mutable = {"activeDeadlineSeconds", "terminationGracePeriodSeconds", "schedulingGates"}
    if gated:
        mutable |= {"nodeSelector", "affinity"}
    if new_tolerations[: len(old_tolerations)] == old_tolerations:
        mutable.add("tolerations")
    before = {k: v for k, v in old.items() if k not in mutable}
    after = {k: v for k, v in new.items() if k not in mutable}
    for field in ("containers", "initContainers"):
        before[field] = _without_images(before.get(field))
        after[field] = _without_images(after.get(field))
    if before != after:
        return [errors.forbidden("spec", POD_UPDATE_RULE)]
    return []


def _without_images(containers: Any) -> Any:
    if not isinstance(containers, list):
        return containers
    return [{k: v for k, v in c.items() if k != "image"} if isinstance(c, Mapping) else c for c in containers]


def _invalid(path: str, value: str, problems: list[str]) -> list[errors.FieldError]:
    return [errors.invalid(path, value, problem) for problem in problems]
