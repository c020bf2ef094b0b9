"""Discovery documents (``/version``, ``/api``, ``/apis``, ``/apis/{group}``, APIResourceLists).

Builds the same shapes a kube-apiserver 1.34 returns, from the ``Registry`` of served resource types, so
kopf's resource scanning, kubernetes_asyncio and ``kubectl`` find the resources and their subresources.
Pure functions: no I/O and no object storage.
"""

from __future__ import annotations

from typing import Any

from nstance.testing.kubeapi.resources import SUBRESOURCE_DISCOVERY, Registry, ResourceType

JSON = dict[str, Any]

VERSION_INFO: JSON = {
    "major": "1",
    "minor": "34",
    "emulationMajor": "1",
    "emulationMinor": "34",
    "minCompatibilityMajor": "1",
    "minCompatibilityMinor": "33",
    "gitVersion": "v1.34.0-nstance-emulator",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2026-01-01T00:00:00Z",
    "goVersion": "go1.24.6",
    "compiler": "gc",
    "platform": "linux/amd64",
}


def version() -> JSON:
    return dict(VERSION_INFO)


def core_versions(server_address: str) -> JSON:
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    }


def _group_doc(name: str, versions: list[str]) -> JSON:
    entries = [{"groupVersion": f"{name}/{v}", "version": v} for v in versions]
    return {"name": name, "versions": entries, "preferredVersion": entries[0]}


def group_list(registry: Registry) -> JSON:
    groups = [
        _group_doc(name, versions) for name, versions in sorted(registry.group_versions().items()) if name
    ]
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def group(registry: Registry, name: str) -> JSON | None:
    versions = registry.group_versions().get(name)
    if not name or not versions:
        return None
    return {"kind": "APIGroup", "apiVersion": "v1", **_group_doc(name, versions)}


def _resource_entry(rtype: ResourceType) -> JSON:
    entry: JSON = {
        "name": rtype.plural,
        "singularName": rtype.singular_name,
        "namespaced": rtype.namespaced,
        "kind": rtype.kind,
        "verbs": list(rtype.verbs),
    }
    if rtype.short_names:
        entry["shortNames"] = list(rtype.short_names)
    if rtype.categories:
        entry["categories"] = list(rtype.categories)
    return entry


def _subresource_entry(rtype: ResourceType, sub: str) -> JSON:
    kind, sub_group, sub_version, verbs = SUBRESOURCE_DISCOVERY.get(sub, ("", "", "", ("get",)))
    entry: JSON = {
        "name": f"{rtype.plural}/{sub}",
        "singularName": "",
        "namespaced": rtype.namespaced,
        "kind": kind or rtype.kind,
        "verbs": list(verbs),
    }
    if sub_group:
        entry["group"] = sub_group
        entry["version"] = sub_version
    return entry


def resource_list(registry: Registry, group_name: str, version_name: str) -> JSON | None:
    types = registry.for_group_version(group_name, version_name)
    if not types:
        return None
    resources: list[JSON] = []
    for rtype in sorted(types, key=lambda t: t.plural):
        resources.append(_resource_entry(rtype))
        resources.extend(_subresource_entry(rtype, sub) for sub in sorted(rtype.subresources))
    group_version = f"{group_name}/{version_name}" if group_name else version_name
    body: JSON = {"kind": "APIResourceList", "groupVersion": group_version, "resources": resources}
    if group_name:
        body["apiVersion"] = "v1"
    return body
