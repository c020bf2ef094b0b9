"""Resource types the emulator serves: the built-in kinds and those defined by CustomResourceDefinitions.

A ``ResourceType`` is one served group/version/plural with its kind, scope, short names, subresources,
selectable fields and (for custom resources) OpenAPI schema. The ``Registry`` maps request paths to types
and answers discovery questions. It is pure data: it must not store objects or do I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from nstance.testing.kubeapi import errors

JSON = dict[str, Any]

ALL_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")
COMMON_FIELDS = ("metadata.name", "metadata.namespace")


@dataclass(frozen=True)
class ResourceType:
    """One served resource (group, version, plural) and everything the server needs to know about it."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    singular: str = ""
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    subresources: frozenset[str] = frozenset()
    verbs: tuple[str, ...] = ALL_VERBS
    fields: tuple[str, ...] = COMMON_FIELDS
    schema: JSON | None = None
    custom: bool = False
    storage_version: str = ""
    # Core kinds accept updates without metadata.resourceVersion; custom resources refuse them.
    unconditional_update: bool = True
    cluster_wide_list: bool = True
    extra: JSON = field(default_factory=dict, compare=False, hash=False)

    @property
    def key(self) -> tuple[str, str]:
        """Storage key: objects are shared by every version of a group/resource."""
        return (self.group, self.plural)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    @property
    def has_status(self) -> bool:
        return "status" in self.subresources

    @property
    def singular_name(self) -> str:
        return self.singular or self.kind.lower()

    def describe(self) -> str:
        return f"{self.api_version} {self.plural}"


def _core(
    plural: str,
    kind: str,
    namespaced: bool,
    *,
    short: tuple[str, ...] = (),
    subs: Iterable[str] = (),
    fields: tuple[str, ...] = (),
    categories: tuple[str, ...] = (),
    group: str = "",
    version: str = "v1",
    unconditional_update: bool = True,
) -> ResourceType:
    return ResourceType(
        group=group,
        version=version,
        plural=plural,
        kind=kind,
        namespaced=namespaced,
        singular=kind.lower(),
        short_names=short,
        categories=categories,
        subresources=frozenset(subs),
        fields=COMMON_FIELDS + fields,
        storage_version=version,
        unconditional_update=unconditional_update,
    )


EVENT_FIELDS = (
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "source",
    "type",
)

BUILTINS: tuple[ResourceType, ...] = (
    _core(
        "namespaces", "Namespace", False, short=("ns",), subs=("status", "finalize"), fields=("status.phase",)
    ),
    _core(
        "pods",
        "Pod",
        True,
        short=("po",),
        subs=("status", "eviction"),
        categories=("all",),
        fields=(
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ),
    ),
    _core("nodes", "Node", False, short=("no",), subs=("status",), fields=("spec.unschedulable",)),
    _core("events", "Event", True, short=("ev",), fields=EVENT_FIELDS),
    _core("configmaps", "ConfigMap", True, short=("cm",)),
    _core("secrets", "Secret", True, fields=("type",)),
    _core("serviceaccounts", "ServiceAccount", True, short=("sa",), subs=("token",)),
    _core("services", "Service", True, short=("svc",), subs=("status",), categories=("all",)),
    # A Lease is an election's lock: kube-apiserver takes its updates only at a known resourceVersion.
    _core("leases", "Lease", True, group="coordination.k8s.io", unconditional_update=False),
    _core("events", "Event", True, short=("ev",), group="events.k8s.io", fields=("regarding.name",)),
    _core(
        "customresourcedefinitions",
        "CustomResourceDefinition",
        False,
        short=("crd", "crds"),
        subs=("status",),
        categories=("api-extensions",),
        group="apiextensions.k8s.io",
    ),
    _core(
        "validatingwebhookconfigurations",
        "ValidatingWebhookConfiguration",
        False,
        categories=("api-extensions",),
        group="admissionregistration.k8s.io",
    ),
    _core(
        "mutatingwebhookconfigurations",
        "MutatingWebhookConfiguration",
        False,
        categories=("api-extensions",),
        group="admissionregistration.k8s.io",
    ),
    _core(
        "poddisruptionbudgets", "PodDisruptionBudget", True, short=("pdb",), subs=("status",), group="policy"
    ),
)

# Subresources that are not the object itself: (kind, group, version, verbs) in discovery.
SUBRESOURCE_DISCOVERY: dict[str, tuple[str, str, str, tuple[str, ...]]] = {
    "status": ("", "", "", ("get", "patch", "update")),
    "eviction": ("Eviction", "policy", "v1", ("create",)),
    "token": ("TokenRequest", "authentication.k8s.io", "v1", ("create",)),
    "finalize": ("", "", "", ("update",)),
    "scale": ("Scale", "autoscaling", "v1", ("get", "patch", "update")),
}

_VERSION_RE = re.compile(r"^v(\d+)(?:(alpha|beta)(\d+))?$")


def version_priority(version: str) -> tuple[int, int, int]:
    """Sort key (higher first wins) following Kubernetes' version ordering: GA > beta > alpha > others."""
    match = _VERSION_RE.match(version)
    if not match:
        return (0, 0, 0)
    major = int(match.group(1))
    stage = {"alpha": 1, "beta": 2, None: 3}[match.group(2)]
    minor = int(match.group(3) or 0)
    return (stage, major, minor)


class Registry:
    """Served resource types by (group, version, plural); CRD types come and go with their CRDs."""

    def __init__(self) -> None:
        self._types: dict[tuple[str, str, str], ResourceType] = {}
        self._crd_types: dict[str, list[ResourceType]] = {}
        for builtin in BUILTINS:
            self._types[(builtin.group, builtin.version, builtin.plural)] = builtin

    def lookup(self, group: str, version: str, plural: str) -> ResourceType | None:
        return self._types.get((group, version, plural))

    def require(self, group: str, version: str, plural: str) -> ResourceType:
        found = self.lookup(group, version, plural)
        if found is None:
            raise errors.APIError(
                404, "NotFound", "the server could not find the requested resource", {"group": group}
            )
        return found

    def has_group_version(self, group: str, version: str) -> bool:
        return any(g == group and v == version for (g, v, _p) in self._types)

    def types(self) -> list[ResourceType]:
        return list(self._types.values())

    def group_versions(self) -> dict[str, list[str]]:
        """Group name -> served versions, preferred (highest priority) first."""
        found: dict[str, set[str]] = {}
        for group, version, _plural in self._types:
            found.setdefault(group, set()).add(version)
        return {g: sorted(vs, key=version_priority, reverse=True) for g, vs in found.items()}

    def for_group_version(self, group: str, version: str) -> list[ResourceType]:
        return [t for (g, v, _p), t in self._types.items() if g == group and v == version]

    def versions_of(self, key: tuple[str, str]) -> list[ResourceType]:
        return [t for t in self._types.values() if t.key == key]

    def register_crd(self, crd: JSON) -> list[ResourceType]:
        """Serve every ``served`` version of a (validated) CRD; replaces what an earlier version served."""
        name = crd["metadata"]["name"]
        self.unregister_crd(name)
        new_types = crd_resource_types(crd)
        for rtype in new_types:
            self._types[(rtype.group, rtype.version, rtype.plural)] = rtype
        self._crd_types[name] = new_types
        return new_types

    def unregister_crd(self, name: str) -> list[ResourceType]:
        removed = self._crd_types.pop(name, [])
        for rtype in removed:
            self._types.pop((rtype.group, rtype.version, rtype.plural), None)
        return removed

    def crd_name_for(self, key: tuple[str, str]) -> str | None:
        for name, types in self._crd_types.items():
            if any(t.key == key for t in types):
                return name
        return None


def crd_resource_types(crd: JSON) -> list[ResourceType]:
    """The resource types a CRD serves (one per served version)."""
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    versions = spec.get("versions") or []
    storage = next((v["name"] for v in versions if v.get("storage")), versions[0]["name"] if versions else "")
    result: list[ResourceType] = []
    for version in versions:
        if not version.get("served", True):
            continue
        subresources = set((version.get("subresources") or {}).keys())
        schema = (version.get("schema") or {}).get("openAPIV3Schema")
        selectable = tuple(
            str(item.get("jsonPath", "")).lstrip(".") for item in version.get("selectableFields") or []
        )
        result.append(
            ResourceType(
                group=spec["group"],
                version=version["name"],
                plural=names["plural"],
                kind=names["kind"],
                namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                singular=names.get("singular") or names["kind"].lower(),
                short_names=tuple(names.get("shortNames") or ()),
                categories=tuple(names.get("categories") or ()),
                subresources=frozenset(subresources),
                fields=COMMON_FIELDS + selectable,
                schema=schema if isinstance(schema, dict) else None,
                custom=True,
                storage_version=storage,
                unconditional_update=False,
                extra={
                    "printerColumns": list(version.get("additionalPrinterColumns") or []),
                    "scale": (version.get("subresources") or {}).get("scale") or {},
                },
            )
        )
    return result


def validate_crd(crd: JSON) -> list[errors.FieldError]:
    """The structural checks the real server makes before accepting a CRD (the ones that matter here)."""
    problems: list[errors.FieldError] = []
    spec = crd.get("spec")
    if not isinstance(spec, dict):
        return [errors.required("spec")]
    group = spec.get("group")
    names = spec.get("names")
    if not isinstance(group, str) or not group:
        problems.append(errors.required("spec.group"))
    if not isinstance(names, dict):
        problems.append(errors.required("spec.names"))
        names = {}
    for key in ("plural", "kind"):
        if not isinstance(names.get(key), str) or not names.get(key):
            problems.append(errors.required(f"spec.names.{key}"))
    if spec.get("scope") not in ("Namespaced", "Cluster"):
        problems.append(errors.not_supported("spec.scope", spec.get("scope"), ["Cluster", "Namespaced"]))
    versions = spec.get("versions")
    if not isinstance(versions, list) or not versions:
        problems.append(errors.required("spec.versions"))
    else:
        storage = [v for v in versions if isinstance(v, dict) and v.get("storage")]
        if len(storage) != 1:
            problems.append(
                errors.invalid(
                    "spec.versions", len(storage), "must have exactly one version marked as storage version"
                )
            )
        for index, version in enumerate(versions):
            if not isinstance(version, dict) or not isinstance(version.get("name"), str):
                problems.append(errors.required(f"spec.versions[{index}].name"))
    name = (crd.get("metadata") or {}).get("name")
    if isinstance(group, str) and isinstance(names.get("plural"), str):
        expected = f"{names['plural']}.{group}"
        if name != expected:
            problems.append(errors.invalid("metadata.name", name, 'must be spec.names.plural+"."+spec.group'))
    return problems
