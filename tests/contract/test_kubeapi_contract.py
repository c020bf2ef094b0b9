"""Contract suite for the Kubernetes API semantics the operator relies on, run on two servers.

Every test runs against ``nstance.testing.kubeapi.KubeAPIServer`` (the emulator) and against a real
kube-apiserver: the session's ``nstance.testing.realkube`` control plane (built by scripts/build_kube.sh;
skipped where it is not built), or the cluster of ``KUBECONFIG`` when that is set. On a real server every
test works in a fresh namespace ``contract-<random>`` (deleted afterwards), the test CRD
``widgets.contract.nstance.dev`` is created if missing, and tests that need emulator-only hooks (eviction
429 hook, tiny watch history, fast bookmarks) are skipped with a reason. Requests go through
kubernetes_asyncio, or raw HTTP on its authenticated session where the client cannot express a request
(malformed bodies, exact status bodies, watch streams with parameters). Differences the suite found and
the emulator keeps are listed in docs/kubernetes-testing.md.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import ipaddress
import json
import os
import re
import ssl
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from kubernetes_asyncio import client, config, watch

from nstance.operator.controllers.ondemand.names import SCHEDULING_GATE
from nstance.operator.controllers.ondemand.pin_pod import pin_patch
from nstance.testing.kubeapi import KubeAPIServer
from nstance.testing.waiting import eventually

GROUP = "contract.nstance.dev"
CRD_NAME = f"widgets.{GROUP}"
WIDGETS = f"/apis/{GROUP}/v1"
MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
EXTERNAL_KUBECONFIG = os.environ.get("KUBECONFIG", "")
HISTORY_LIMIT = 60

WIDGET_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": CRD_NAME},
    "spec": {
        "group": GROUP,
        "scope": "Namespaced",
        "names": {
            "plural": "widgets",
            "singular": "widget",
            "kind": "Widget",
            "shortNames": ["wd"],
            "categories": ["nstance"],
        },
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "subresources": {
                    "status": {},
                    "scale": {
                        "specReplicasPath": ".spec.replicas",
                        "statusReplicasPath": ".status.replicas",
                        "labelSelectorPath": ".status.selector",
                    },
                },
                "additionalPrinterColumns": [
                    {"name": "Size", "type": "integer", "jsonPath": ".spec.size"},
                    {"name": "Shards", "type": "string", "jsonPath": ".spec.shards"},
                    {"name": "Ready", "type": "boolean", "jsonPath": ".status.ready"},
                    {"name": "Mode", "type": "string", "jsonPath": ".spec.mode", "priority": 1},
                    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                ],
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "required": ["shards"],
                                "properties": {
                                    "shards": {"type": "array", "minItems": 1, "items": {"type": "string"}},
                                    "size": {"type": "integer", "minimum": 0, "maximum": 100},
                                    "mode": {"type": "string", "enum": ["fast", "safe"]},
                                    "group": {"type": "string", "minLength": 1, "pattern": "^[a-z]+$"},
                                    "tier": {"type": "string", "default": "standard"},
                                    "vars": {"type": "object", "additionalProperties": {"type": "string"}},
                                    "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                                    "replicas": {"type": "integer", "minimum": 0},
                                    "ports": {
                                        "type": "array",
                                        "x-kubernetes-list-type": "map",
                                        "x-kubernetes-list-map-keys": ["name"],
                                        "items": {
                                            "type": "object",
                                            "required": ["name"],
                                            "properties": {
                                                "name": {"type": "string"},
                                                "port": {"type": "integer"},
                                            },
                                        },
                                    },
                                },
                            },
                            "status": {
                                "type": "object",
                                "properties": {
                                    "ready": {"type": "boolean"},
                                    "replicas": {"type": "integer"},
                                    "selector": {"type": "string"},
                                },
                            },
                        },
                    }
                },
            }
        ],
    },
}


def widget(name: str, **spec: Any) -> dict[str, Any]:
    spec.setdefault("shards", ["s1"])
    return {"apiVersion": f"{GROUP}/v1", "kind": "Widget", "metadata": {"name": name}, "spec": spec}


@dataclass
class Kube:
    """One test's view of the API: clients, its own namespace and (in emulator mode) the emulator."""

    api: client.ApiClient
    ns: str
    emulator: KubeAPIServer | None

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    @property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api)

    def require_local(self, why: str) -> None:
        """Skip on an external cluster (``KUBECONFIG``): the test needs the server on this machine."""
        if self.emulator is None and EXTERNAL_KUBECONFIG:
            pytest.skip(f"needs a local server: {why}")

    def require_emulator(self, why: str) -> KubeAPIServer:
        if self.emulator is None:
            pytest.skip(f"emulator-only: {why}")
        return self.emulator

    def widgets(self, name: str = "") -> str:
        return f"{WIDGETS}/namespaces/{self.ns}/widgets" + (f"/{name}" if name else "")

    async def _headers(self, content_type: str) -> dict[str, str]:
        headers = {"Content-Type": content_type, "Accept": "application/json"}
        await self.api.update_params_for_auth(headers, [], ["BearerToken"])
        return headers

    async def raw(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        data: bytes | None = None,
        query: dict[str, str] | None = None,
    ) -> tuple[int, Any]:
        """One HTTP request on the client's authenticated session; returns (status, decoded JSON body)."""
        payload = data if data is not None else (json.dumps(body).encode() if body is not None else None)
        session = self.api.rest_client.pool_manager
        async with session.request(
            method,
            self.api.configuration.host + path,
            params=query,
            headers=await self._headers(content_type),
            data=payload,
        ) as response:
            text = await response.read()
            if response.content_type != "application/json":
                return response.status, text.decode()  # e.g. "404 page not found" for unserved paths
            return response.status, (json.loads(text) if text else None)

    @contextlib.asynccontextmanager
    async def watch(self, path: str, **query: str) -> AsyncIterator[WatchStream]:
        params = {"watch": "true", **query}
        session = self.api.rest_client.pool_manager
        async with session.get(
            self.api.configuration.host + path, params=params, headers=await self._headers("application/json")
        ) as response:
            assert response.status == 200, await response.text()
            yield WatchStream(response)


class WatchStream:
    def __init__(self, response: Any) -> None:
        self._response = response

    async def next(self, within: float = 10.0) -> dict[str, Any] | None:
        """The next event, or None when the server ended the stream."""
        async with asyncio.timeout(within):
            line = await self._response.content.readline()
        return json.loads(line) if line else None

    async def until(
        self, predicate: Callable[[dict[str, Any]], bool], within: float = 20.0
    ) -> dict[str, Any]:
        """Skip events (and bookmarks) until one matches."""
        async with asyncio.timeout(within):
            while True:
                event = await self.next(within)
                assert event is not None, "the watch ended before the expected event"
                if predicate(event):
                    return event


def named(event_type: str, name: str) -> Callable[[dict[str, Any]], bool]:
    return lambda e: e["type"] == event_type and e["object"]["metadata"].get("name") == name


async def _ensure_crd(api: client.ApiClient) -> None:
    ext = client.ApiextensionsV1Api(api)
    try:
        await ext.create_custom_resource_definition(WIDGET_CRD)
    except client.ApiException as exc:
        if exc.status != 409:
            raise

    async def established() -> bool:
        crd = await ext.read_custom_resource_definition(CRD_NAME)
        conditions = {c.type: c.status for c in (crd.status.conditions or [])}
        return conditions.get("Established") == "True"

    # A real server needs a moment to establish a new CRD; the emulator does not.
    await eventually(established, within=10, every=0.1, what=f"CRD {CRD_NAME} to become Established")


async def _default_service_account(core: client.CoreV1Api, ns: str) -> None:
    """Wait for the controller manager to create the namespace's ``default`` ServiceAccount: until then
    a real server's ServiceAccount admission refuses pods."""

    async def created() -> bool:
        await core.read_namespaced_service_account("default", ns)
        return True

    await eventually(
        created, within=10, every=0.1, ignoring=client.ApiException, what=f"a default ServiceAccount in {ns}"
    )


@pytest.fixture(params=["emulator", "real"])
async def kube(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Kube]:
    ns = f"contract-{uuid.uuid4().hex[:8]}"
    async with contextlib.AsyncExitStack() as stack:
        emulator: KubeAPIServer | None = None
        api_config = client.Configuration()
        if request.param == "real":
            kubeconfig = EXTERNAL_KUBECONFIG or str(request.getfixturevalue("real_kube").kubeconfig)
            await config.load_kube_config(kubeconfig, client_configuration=api_config)
        else:
            emulator = await stack.enter_async_context(
                KubeAPIServer(bookmark_interval=0.2, history_limit=HISTORY_LIMIT)
            )
            path = emulator.write_kubeconfig(tmp_path / "kubeconfig")
            await config.load_kube_config(str(path), client_configuration=api_config)
        api = await stack.enter_async_context(client.ApiClient(api_config))
        await _ensure_crd(api)
        core = client.CoreV1Api(api)
        await core.create_namespace({"metadata": {"name": ns}})
        if emulator is None:
            await _default_service_account(core, ns)
        try:
            yield Kube(api, ns, emulator)
        finally:
            with contextlib.suppress(client.ApiException):
                await core.delete_namespace(ns)


# ---------------------------------------------------------------------------------------------- discovery


async def test_discovery_lists_core_and_custom_resources(kube: Kube) -> None:
    status, version = await kube.raw("GET", "/version")
    assert status == 200
    assert version["major"] == "1"
    assert version["gitVersion"].startswith("v1.")

    _status, api = await kube.raw("GET", "/api")
    assert api["kind"] == "APIVersions"
    assert "v1" in api["versions"]

    _status, core = await kube.raw("GET", "/api/v1")
    by_name = {r["name"]: r for r in core["resources"]}
    assert by_name["pods"]["namespaced"] is True
    assert by_name["pods"]["kind"] == "Pod"
    assert "po" in by_name["pods"]["shortNames"]
    assert by_name["namespaces"]["namespaced"] is False
    assert by_name["pods/eviction"]["kind"] == "Eviction"
    assert by_name["pods/eviction"]["group"] == "policy"
    assert "pods/status" in by_name
    assert "nodes/status" in by_name
    for name in ("events", "configmaps", "secrets", "serviceaccounts", "services", "nodes"):
        assert {"get", "list", "watch", "create"} <= set(by_name[name]["verbs"]), name

    _status, groups = await kube.raw("GET", "/apis")
    names = {g["name"] for g in groups["groups"]}
    assert {
        GROUP,
        "apiextensions.k8s.io",
        "coordination.k8s.io",
        "events.k8s.io",
        "admissionregistration.k8s.io",
        "policy",
    } <= names

    _status, group = await kube.raw("GET", f"/apis/{GROUP}")
    assert group["preferredVersion"]["groupVersion"] == f"{GROUP}/v1"

    _status, resources = await kube.raw("GET", WIDGETS)
    assert resources["groupVersion"] == f"{GROUP}/v1"
    by_name = {r["name"]: r for r in resources["resources"]}
    widgets = by_name["widgets"]
    assert widgets["kind"] == "Widget"
    assert widgets["singularName"] == "widget"
    assert widgets["namespaced"]
    assert widgets["shortNames"] == ["wd"]
    assert widgets["categories"] == ["nstance"]
    assert {"create", "delete", "get", "list", "patch", "update", "watch"} <= set(widgets["verbs"])
    assert "widgets/status" in by_name


async def test_crd_created_through_the_api_is_established_and_served(kube: Kube) -> None:
    suffix = uuid.uuid4().hex[:6]
    plural = f"gizmos{suffix}"
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Cluster",
            "names": {"plural": plural, "kind": f"Gizmo{suffix}"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                    },
                }
            ],
        },
    }
    ext = client.ApiextensionsV1Api(kube.api)
    await ext.create_custom_resource_definition(crd)
    try:

        async def established() -> tuple[Any, dict[str, str]] | None:
            stored = await ext.read_custom_resource_definition(f"{plural}.{GROUP}")
            conditions = {c.type: c.status for c in stored.status.conditions or []}
            return (stored, conditions) if conditions.get("Established") == "True" else None

        stored, conditions = await eventually(
            established, within=10, every=0.1, what=f"CRD {plural}.{GROUP} to become Established"
        )
        assert conditions["NamesAccepted"] == "True"
        assert stored.status.accepted_names.plural == plural
        assert stored.status.accepted_names.singular == f"gizmo{suffix}"
        _status, resources = await kube.raw("GET", WIDGETS)
        assert plural in {r["name"] for r in resources["resources"]}
        created = await kube.custom.create_cluster_custom_object(
            GROUP,
            "v1",
            plural,
            {"apiVersion": f"{GROUP}/v1", "kind": f"Gizmo{suffix}", "metadata": {"name": "g"}},
        )
        assert created["metadata"]["name"] == "g"
        assert "namespace" not in created["metadata"]
    finally:
        await ext.delete_custom_resource_definition(f"{plural}.{GROUP}")

    # Deleting the CRD removes its objects and, once they are gone, the resource itself.
    async def resource_gone() -> bool:
        _status, resources = await kube.raw("GET", WIDGETS)
        return plural not in {r["name"] for r in resources["resources"]}

    await eventually(resource_gone, within=10, every=0.1, what=f"{plural} gone from discovery")
    status, _body = await kube.raw("GET", f"{WIDGETS}/{plural}/g")
    assert status == 404


# ---------------------------------------------------------------------------------------------- objects


async def test_create_fills_server_metadata_and_answers_201(kube: Kube) -> None:
    status, created = await kube.raw("POST", kube.widgets(), widget("w1", size=3))
    assert status == 201
    meta = created["metadata"]
    assert uuid.UUID(meta["uid"])
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", meta["creationTimestamp"])
    assert meta["generation"] == 1
    assert meta["namespace"] == kube.ns
    assert int(meta["resourceVersion"]) > 0
    # Ownership is recorded for ordinary writes too, named after the User-Agent's product token.
    assert [m["operation"] for m in meta["managedFields"]] == ["Update"]
    assert meta["managedFields"][0]["manager"] == "Python"
    assert created["spec"]["tier"] == "standard"  # schema default applied

    status, second = await kube.raw("POST", kube.widgets(), widget("w2"))
    assert int(second["metadata"]["resourceVersion"]) > int(meta["resourceVersion"])

    body = widget("")
    body["metadata"] = {"generateName": "auto-"}
    status, generated = await kube.raw("POST", kube.widgets(), body)
    assert status == 201
    status, dry = await kube.raw("POST", kube.widgets(), widget("dry"), query={"dryRun": "All"})
    assert status == 201
    assert dry["metadata"]["name"] == "dry"
    status, _missing = await kube.raw("GET", kube.widgets("dry"))
    assert status == 404
    assert re.fullmatch(r"auto-[a-z0-9]{5}", generated["metadata"]["name"])


async def test_duplicate_create_is_409_already_exists_status(kube: Kube) -> None:
    await kube.raw("POST", kube.widgets(), widget("dup"))
    status, body = await kube.raw("POST", kube.widgets(), widget("dup"))
    assert status == 409
    assert body["kind"] == "Status"
    assert body["apiVersion"] == "v1"
    assert body["status"] == "Failure"
    assert body["reason"] == "AlreadyExists"
    assert body["code"] == 409
    assert body["message"] == f'widgets.{GROUP} "dup" already exists'
    assert body["details"] == {"name": "dup", "group": GROUP, "kind": "widgets"}

    await kube.core.create_namespaced_config_map(kube.ns, {"metadata": {"name": "cm"}})
    with pytest.raises(client.ApiException) as exc:
        await kube.core.create_namespaced_config_map(kube.ns, {"metadata": {"name": "cm"}})
    assert exc.value.status == 409
    assert json.loads(exc.value.body)["message"] == 'configmaps "cm" already exists'


async def test_missing_object_and_missing_namespace_are_404(kube: Kube) -> None:
    status, body = await kube.raw("GET", kube.widgets("nope"))
    assert status == 404
    assert body["reason"] == "NotFound"
    assert body["message"] == f'widgets.{GROUP} "nope" not found'
    assert body["details"] == {"name": "nope", "group": GROUP, "kind": "widgets"}

    status, body = await kube.raw("POST", f"{WIDGETS}/namespaces/no-such-ns-{kube.ns}/widgets", widget("x"))
    assert status == 404
    assert body["message"] == f'namespaces "no-such-ns-{kube.ns}" not found'


async def test_stale_resource_version_conflicts_on_put_and_patch(kube: Kube) -> None:
    _status, created = await kube.raw("POST", kube.widgets(), widget("occ", size=1))
    stale = created["metadata"]["resourceVersion"]
    updated = dict(created, spec={"shards": ["s1"], "size": 2})
    status, fresh = await kube.raw("PUT", kube.widgets("occ"), updated)
    assert status == 200
    assert fresh["spec"]["size"] == 2

    again = dict(created, spec={"shards": ["s1"], "size": 3})
    status, body = await kube.raw("PUT", kube.widgets("occ"), again)
    assert status == 409
    assert body["reason"] == "Conflict"
    assert body["message"] == (
        f'Operation cannot be fulfilled on widgets.{GROUP} "occ": the object has been modified; '
        "please apply your changes to the latest version and try again"
    )
    patch = {"metadata": {"resourceVersion": stale}, "spec": {"size": 4}}
    status, body = await kube.raw("PATCH", kube.widgets("occ"), patch, content_type=MERGE)
    assert status == 409
    assert body["reason"] == "Conflict"

    # Custom resources refuse an update without any resourceVersion.
    unconditional = {k: v for k, v in fresh.items() if k != "metadata"} | {"metadata": {"name": "occ"}}
    status, body = await kube.raw("PUT", kube.widgets("occ"), unconditional)
    assert status == 422
    assert "metadata.resourceVersion" in body["message"]

    # Leases are ordinary objects: two candidates racing on one resourceVersion, one wins.
    coordination = client.CoordinationV1Api(kube.api)
    lease = await coordination.create_namespaced_lease(
        kube.ns, {"metadata": {"name": "leader"}, "spec": {"holderIdentity": "a"}}
    )
    lease_path = f"/apis/coordination.k8s.io/v1/namespaces/{kube.ns}/leases/leader"
    body_a = {
        "metadata": {"name": "leader", "resourceVersion": lease.metadata.resource_version},
        "spec": {"holderIdentity": "a2"},
    }
    body_b = {
        "metadata": {"name": "leader", "resourceVersion": lease.metadata.resource_version},
        "spec": {"holderIdentity": "b"},
    }
    first, _ = await kube.raw("PUT", lease_path, body_a)
    second, _ = await kube.raw("PUT", lease_path, body_b)
    assert (first, second) == (200, 409)
    assert (await coordination.read_namespaced_lease("leader", kube.ns)).spec.holder_identity == "a2"


async def test_generation_counts_spec_changes_only(kube: Kube) -> None:
    _status, created = await kube.raw("POST", kube.widgets(), widget("gen", size=1))
    assert created["metadata"]["generation"] == 1
    _status, labelled = await kube.raw(
        "PATCH", kube.widgets("gen"), {"metadata": {"labels": {"a": "b"}}}, content_type=MERGE
    )
    assert labelled["metadata"]["generation"] == 1
    _status, status_only = await kube.raw(
        "PATCH", kube.widgets("gen") + "/status", {"status": {"ready": True}}, content_type=MERGE
    )
    assert status_only["metadata"]["generation"] == 1
    assert status_only["status"] == {"ready": True}
    _status, resized = await kube.raw("PATCH", kube.widgets("gen"), {"spec": {"size": 2}}, content_type=MERGE)
    assert resized["metadata"]["generation"] == 2
    # A patch that changes nothing keeps the resourceVersion.
    _status, same = await kube.raw("PATCH", kube.widgets("gen"), {"spec": {"size": 2}}, content_type=MERGE)
    assert same["metadata"]["resourceVersion"] == resized["metadata"]["resourceVersion"]


async def test_status_subresource_separates_spec_and_status(kube: Kube) -> None:
    _status, created = await kube.raw("POST", kube.widgets(), dict(widget("st"), status={"ready": True}))
    assert "status" not in created  # status is dropped on create when it is a subresource

    _status, main = await kube.raw(
        "PATCH", kube.widgets("st"), {"spec": {"size": 5}, "status": {"ready": True}}, content_type=MERGE
    )
    assert main["spec"]["size"] == 5
    assert "status" not in main

    _status, sub = await kube.raw(
        "PATCH",
        kube.widgets("st") + "/status",
        {"spec": {"size": 9}, "status": {"replicas": 2}},
        content_type=MERGE,
    )
    assert sub["spec"]["size"] == 5
    assert sub["status"] == {"replicas": 2}

    put_body = dict(sub, spec={"shards": ["s1"], "size": 6}, status={"replicas": 7})
    _status, put_main = await kube.raw("PUT", kube.widgets("st"), put_body)
    assert put_main["spec"]["size"] == 6
    assert put_main["status"] == {"replicas": 2}

    put_status = dict(put_main, spec={"shards": ["zzz"]}, status={"replicas": 8})
    _status, put_sub = await kube.raw("PUT", kube.widgets("st") + "/status", put_status)
    assert put_sub["spec"]["shards"] == ["s1"]
    assert put_sub["status"] == {"replicas": 8}

    read = await kube.custom.get_namespaced_custom_object_status(GROUP, "v1", kube.ns, "widgets", "st")
    assert read["status"] == {"replicas": 8}


# ---------------------------------------------------------------------------------------------- patches


async def test_merge_json_and_strategic_patches(kube: Kube) -> None:
    await kube.raw("POST", kube.widgets(), widget("p", size=1, vars={"a": "1", "b": "2"}))
    _status, merged = await kube.raw(
        "PATCH", kube.widgets("p"), {"spec": {"vars": {"a": None, "c": "3"}}}, content_type=MERGE
    )
    assert merged["spec"]["vars"] == {"b": "2", "c": "3"}

    ops = [
        {"op": "add", "path": "/spec/shards/-", "value": "s2"},
        {"op": "replace", "path": "/spec/size", "value": 7},
        {"op": "remove", "path": "/spec/vars/b"},
        {"op": "copy", "from": "/spec/vars/c", "path": "/spec/vars/d"},
        {"op": "move", "from": "/spec/vars/c", "path": "/spec/vars/e"},
        {"op": "test", "path": "/spec/size", "value": 7},
    ]
    _status, patched = await kube.raw("PATCH", kube.widgets("p"), ops, content_type=JSON_PATCH)
    assert patched["spec"]["shards"] == ["s1", "s2"]
    assert patched["spec"]["size"] == 7
    assert patched["spec"]["vars"] == {"d": "3", "e": "3"}

    failing = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "1"},
        {"op": "remove", "path": "/spec/size"},
    ]
    status, body = await kube.raw("PATCH", kube.widgets("p"), failing, content_type=JSON_PATCH)
    assert status == 422
    assert body["kind"] == "Status"
    assert body["message"]
    _status, unchanged = await kube.raw("GET", kube.widgets("p"))
    assert unchanged["spec"]["size"] == 7

    status, body = await kube.raw("PATCH", kube.widgets("p"), {"spec": {"size": 1}}, content_type=STRATEGIC)
    assert status == 415
    assert body["reason"] == "UnsupportedMediaType"

    await kube.core.create_namespaced_config_map(kube.ns, {"metadata": {"name": "smp"}, "data": {"a": "1"}})
    cm = await kube.core.patch_namespaced_config_map("smp", kube.ns, {"data": {"b": "2"}})  # strategic merge
    assert cm.data == {"a": "1", "b": "2"}


# ----------------------------------------------------------------------------------------- server-side apply

APPLY = "application/apply-patch+yaml"


def owners(obj: dict[str, Any]) -> dict[tuple[str, str, str], dict[str, Any]]:
    """managedFields by (manager, operation, subresource) -> fieldsV1."""
    return {
        (m["manager"], m["operation"], m.get("subresource", "")): m["fieldsV1"]
        for m in obj["metadata"].get("managedFields", [])
    }


async def test_server_side_apply_creates_merges_and_reports_conflicts(kube: Kube) -> None:
    path = kube.widgets("ssa")
    first = widget("ssa", size=1, ports=[{"name": "a", "port": 1}])
    status, created = await kube.raw(
        "PATCH", path, first, content_type=APPLY, query={"fieldManager": "alpha"}
    )
    assert status == 201, created
    assert created["spec"]["size"] == 1
    assert owners(created)[("alpha", "Apply", "")] == {
        "f:spec": {
            "f:ports": {'k:{"name":"a"}': {".": {}, "f:name": {}, "f:port": {}}},
            "f:shards": {},
            "f:size": {},
        }
    }

    status, body = await kube.raw("PATCH", path, first, content_type=APPLY)
    assert status == 422, body
    assert "fieldManager: Required value" in body["message"]

    # Another manager changing alpha's field is a conflict naming the field and the owner.
    second = {**widget("ssa", size=2), "spec": {"size": 2, "ports": [{"name": "b", "port": 2}]}}
    status, body = await kube.raw("PATCH", path, second, content_type=APPLY, query={"fieldManager": "beta"})
    assert status == 409, body
    assert body["reason"] == "Conflict"
    assert body["message"] == 'Apply failed with 1 conflict: conflict with "alpha": .spec.size'
    assert body["details"]["causes"] == [
        {"reason": "FieldManagerConflict", "message": 'conflict with "alpha"', "field": ".spec.size"}
    ]

    # The same value is no conflict: both own it.
    same = {**second, "spec": {"size": 1}}
    status, shared = await kube.raw("PATCH", path, same, content_type=APPLY, query={"fieldManager": "beta"})
    assert status == 200, shared
    assert "f:size" in owners(shared)[("beta", "Apply", "")]["f:spec"]
    assert "f:size" in owners(shared)[("alpha", "Apply", "")]["f:spec"]

    # force takes the field over; map lists merge by key.
    query = {"fieldManager": "beta", "force": "true"}
    status, forced = await kube.raw("PATCH", path, second, content_type=APPLY, query=query)
    assert status == 200, forced
    assert forced["spec"]["size"] == 2
    assert forced["spec"]["ports"] == [{"name": "a", "port": 1}, {"name": "b", "port": 2}]
    assert "f:size" not in owners(forced)[("alpha", "Apply", "")]["f:spec"]

    # A field its applier drops is removed unless someone else owns it.
    status, dropped = await kube.raw(
        "PATCH", path, widget("ssa"), content_type=APPLY, query={"fieldManager": "alpha"}
    )
    assert status == 200, dropped["message"]
    assert dropped["spec"]["ports"] == [{"name": "b", "port": 2}]
    assert dropped["spec"]["size"] == 2

    # An ordinary update gives its manager the fields it changed; applying over them conflicts "using".
    status, updated = await kube.raw(
        "PATCH", path, {"spec": {"size": 3}}, content_type=MERGE, query={"fieldManager": "gamma"}
    )
    assert status == 200, updated
    assert owners(updated)[("gamma", "Update", "")] == {"f:spec": {"f:size": {}}}
    assert "f:size" not in owners(updated)[("beta", "Apply", "")]["f:spec"]
    status, body = await kube.raw(
        "PATCH", path, widget("ssa", size=4), content_type=APPLY, query={"fieldManager": "alpha"}
    )
    assert status == 409, body
    assert body["message"] == (
        f'Apply failed with 1 conflict: conflict with "gamma" using {GROUP}/v1: .spec.size'
    )

    # A keyed list its last item's owner drops goes away altogether.
    status, emptied = await kube.raw(
        "PATCH", path, widget("ssa"), content_type=APPLY, query={"fieldManager": "beta"}
    )
    assert status == 200, emptied
    assert "ports" not in emptied["spec"]
    assert ("beta", "Apply", "") in owners(emptied)

    # force on a non-apply patch is refused.
    status, body = await kube.raw(
        "PATCH", path, {"spec": {"size": 3}}, content_type=MERGE, query={"fieldManager": "g", "force": "true"}
    )
    assert status == 422, body


async def test_server_side_apply_to_the_status_subresource(kube: Kube) -> None:
    await kube.raw("POST", kube.widgets(), widget("ssa-status"))
    applied = {**widget("ssa-status"), "status": {"replicas": 3}}
    status, body = await kube.raw(
        "PATCH",
        kube.widgets("ssa-status") + "/status",
        applied,
        content_type=APPLY,
        query={"fieldManager": "ctl"},
    )
    assert status == 200, body
    assert body["status"] == {"replicas": 3}
    assert owners(body)[("ctl", "Apply", "status")] == {"f:status": {"f:replicas": {}}}

    # Status in an apply to the main resource is ignored, like in an update.
    status, main = await kube.raw(
        "PATCH",
        kube.widgets("ssa-status"),
        {**applied, "status": {"replicas": 9}},
        content_type=APPLY,
        query={"fieldManager": "other"},
    )
    assert status == 200, main
    assert main["status"] == {"replicas": 3}
    assert "f:status" not in owners(main)[("other", "Apply", "")]

    status, body = await kube.raw(
        "PATCH",
        kube.widgets("nothing") + "/status",
        applied,
        content_type=APPLY,
        query={"fieldManager": "ctl"},
    )
    assert status == 404, body


# ---------------------------------------------------------------------------------------------- scale


async def test_scale_subresource_reads_and_writes_the_replicas(kube: Kube) -> None:
    _status, resources = await kube.raw("GET", WIDGETS)
    entry = {r["name"]: r for r in resources["resources"]}["widgets/scale"]
    assert (entry["kind"], entry["group"], entry["version"]) == ("Scale", "autoscaling", "v1")
    assert sorted(entry["verbs"]) == ["get", "patch", "update"]

    await kube.raw("POST", kube.widgets(), widget("sc", replicas=2))
    await kube.raw(
        "PATCH",
        kube.widgets("sc") + "/status",
        {"status": {"replicas": 1, "selector": "app=sc"}},
        content_type=MERGE,
    )
    status, scale = await kube.raw("GET", kube.widgets("sc") + "/scale")
    assert status == 200, scale
    assert (scale["apiVersion"], scale["kind"]) == ("autoscaling/v1", "Scale")
    assert scale["metadata"]["name"] == "sc"
    assert scale["spec"] == {"replicas": 2}
    assert scale["status"] == {"replicas": 1, "selector": "app=sc"}

    status, scaled = await kube.raw(
        "PATCH",
        kube.widgets("sc") + "/scale",
        {"spec": {"replicas": 5}},
        content_type=MERGE,
        query={"fieldManager": "scaler"},
    )
    assert status == 200, scaled
    assert scaled["kind"] == "Scale"
    assert scaled["spec"] == {"replicas": 5}
    _status, obj = await kube.raw("GET", kube.widgets("sc"))
    assert obj["spec"]["replicas"] == 5
    assert obj["metadata"]["generation"] == 2
    assert owners(obj)[("scaler", "Update", "scale")] == {"f:spec": {"f:replicas": {}}}

    stale = {**scale, "spec": {"replicas": 1}}
    status, body = await kube.raw("PUT", kube.widgets("sc") + "/scale", stale)
    assert status == 409, body
    status, put = await kube.raw("PUT", kube.widgets("sc") + "/scale", {**scaled, "spec": {"replicas": 1}})
    assert status == 200, put
    assert put["spec"] == {"replicas": 1}
    assert put["metadata"]["resourceVersion"] != scaled["metadata"]["resourceVersion"]

    status, body = await kube.raw("GET", kube.widgets("missing") + "/scale")
    assert status == 404, body


# ---------------------------------------------------------------------------------------------- lists


async def test_list_with_label_and_field_selectors_and_pagination(kube: Kube) -> None:
    labels = {"a": {"env": "prod", "tier": "web"}, "b": {"env": "dev", "tier": "web"}, "c": {"env": "prod"}}
    for name, label_set in labels.items():
        body = widget(name)
        body["metadata"]["labels"] = label_set
        await kube.raw("POST", kube.widgets(), body)

    async def names(**query: str) -> list[str]:
        status, body = await kube.raw("GET", kube.widgets(), query=query)
        assert status == 200, body
        assert body["kind"] == "WidgetList"
        assert int(body["metadata"]["resourceVersion"]) > 0
        return [item["metadata"]["name"] for item in body["items"]]

    assert await names() == ["a", "b", "c"]
    assert await names(labelSelector="env=prod") == ["a", "c"]
    assert await names(labelSelector="env==prod,tier=web") == ["a"]
    assert await names(labelSelector="env!=prod") == ["b"]
    assert await names(labelSelector="env in (dev,qa)") == ["b"]
    assert await names(labelSelector="env notin (dev)") == ["a", "c"]
    assert await names(labelSelector="tier") == ["a", "b"]
    assert await names(labelSelector="!tier") == ["c"]
    assert await names(fieldSelector="metadata.name=b") == ["b"]
    assert await names(fieldSelector="metadata.name!=b") == ["a", "c"]
    assert await names(fieldSelector=f"metadata.namespace={kube.ns}") == ["a", "b", "c"]

    status, page = await kube.raw("GET", kube.widgets(), query={"limit": "2"})
    assert [i["metadata"]["name"] for i in page["items"]] == ["a", "b"]
    assert page["metadata"]["continue"]
    status, rest = await kube.raw(
        "GET", kube.widgets(), query={"limit": "2", "continue": page["metadata"]["continue"]}
    )
    assert [i["metadata"]["name"] for i in rest["items"]] == ["c"]
    assert not rest["metadata"].get("continue")

    status, body = await kube.raw("GET", kube.widgets(), query={"fieldSelector": "spec.size=1"})
    assert status == 400
    assert body["reason"] == "BadRequest"

    for pod, node in (("p1", "n1"), ("p2", "n2")):
        await kube.core.create_namespaced_pod(
            kube.ns,
            {
                "metadata": {"name": pod},
                "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]},
            },
        )
    pods = await kube.core.list_namespaced_pod(kube.ns, field_selector="spec.nodeName=n2")
    assert [p.metadata.name for p in pods.items] == ["p2"]
    everywhere = await kube.core.list_pod_for_all_namespaces(field_selector="spec.nodeName=n1")
    assert [p.metadata.name for p in everywhere.items if p.metadata.namespace == kube.ns] == ["p1"]


# ---------------------------------------------------------------------------------------------- watch


async def test_watch_streams_initial_and_live_events(kube: Kube) -> None:
    await kube.raw("POST", kube.widgets(), widget("old"))
    async with kube.watch(kube.widgets()) as stream:
        first = await stream.until(lambda e: e["type"] != "BOOKMARK")
        assert first["type"] == "ADDED"
        assert first["object"]["metadata"]["name"] == "old"
        assert first["object"]["kind"] == "Widget"
        assert first["object"]["apiVersion"] == f"{GROUP}/v1"
        await kube.raw("POST", kube.widgets(), widget("new"))
        await stream.until(named("ADDED", "new"))
        await kube.raw("PATCH", kube.widgets("new"), {"spec": {"size": 2}}, content_type=MERGE)
        modified = await stream.until(named("MODIFIED", "new"))
        assert modified["object"]["spec"]["size"] == 2
        await kube.raw("DELETE", kube.widgets("new"))
        await stream.until(named("DELETED", "new"))


async def test_kubernetes_asyncio_watch_helper_streams_events(kube: Kube) -> None:
    _status, listed = await kube.raw("GET", kube.widgets())
    watcher = watch.Watch()
    seen: list[tuple[str, str]] = []
    async with asyncio.timeout(20):
        stream = watcher.stream(
            kube.custom.list_namespaced_custom_object,
            GROUP,
            "v1",
            kube.ns,
            "widgets",
            resource_version=listed["metadata"]["resourceVersion"],
            allow_watch_bookmarks=True,
            timeout_seconds=30,
        )
        await kube.raw("POST", kube.widgets(), widget("via-client"))
        await kube.raw("DELETE", kube.widgets("via-client"))
        async for event in stream:
            if event["type"] == "BOOKMARK":
                continue
            seen.append((event["type"], event["object"]["metadata"]["name"]))
            if event["type"] == "DELETED":
                watcher.stop()
    assert seen == [("ADDED", "via-client"), ("DELETED", "via-client")]
    pods = await kube.core.list_namespaced_pod(kube.ns)
    async with asyncio.timeout(20):
        core_watcher = watch.Watch()
        core_stream = core_watcher.stream(
            kube.core.list_namespaced_pod, kube.ns, resource_version=pods.metadata.resource_version
        )
        await _pod(kube, "watched")
        async for event in core_stream:
            assert event["type"] == "ADDED"
            assert event["object"].metadata.name == "watched"  # typed V1Pod for core resources
            core_watcher.stop()


async def test_watch_resumes_from_resource_version_and_filters(kube: Kube) -> None:
    _status, created = await kube.raw("POST", kube.widgets(), widget("r1"))
    since = created["metadata"]["resourceVersion"]
    await kube.raw("PATCH", kube.widgets("r1"), {"metadata": {"labels": {"keep": "yes"}}}, content_type=MERGE)
    await kube.raw("POST", kube.widgets(), widget("r2"))
    async with kube.watch(kube.widgets(), resourceVersion=since, labelSelector="keep=yes") as stream:
        # r1 entered the selection after `since`: seen as ADDED; r2 never matches.
        entered = await stream.until(lambda e: e["type"] != "BOOKMARK")
        assert entered["type"] == "ADDED"
        assert entered["object"]["metadata"]["name"] == "r1"
        await kube.raw(
            "PATCH", kube.widgets("r1"), {"metadata": {"labels": {"keep": "no"}}}, content_type=MERGE
        )
        left = await stream.until(lambda e: e["type"] != "BOOKMARK")
        assert left["type"] == "DELETED"
        assert left["object"]["metadata"]["name"] == "r1"

    # A cluster-wide watch of a namespaced resource sees this namespace's objects.
    async with kube.watch(f"{WIDGETS}/widgets", resourceVersion=since) as stream:
        await stream.until(named("ADDED", "r2"))


async def test_watch_timeout_ends_the_stream(kube: Kube) -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    async with kube.watch(kube.widgets(), timeoutSeconds="1") as stream:
        while (event := await stream.next(within=10)) is not None:
            assert event["type"] in ("ADDED", "BOOKMARK")
    assert loop.time() - started < 8


async def test_watch_from_an_expired_resource_version_gets_410(kube: Kube) -> None:
    if kube.emulator is not None:
        await kube.core.create_namespaced_config_map(kube.ns, {"metadata": {"name": "churn"}})
        for index in range(HISTORY_LIMIT + 5):
            await kube.core.patch_namespaced_config_map("churn", kube.ns, {"data": {"i": str(index)}})
    async with kube.watch(kube.widgets(), resourceVersion="1") as stream:
        event = await stream.until(lambda e: e["type"] != "BOOKMARK")
        assert event["type"] == "ERROR"
        assert event["object"]["code"] == 410
        assert event["object"]["reason"] in ("Expired", "Gone")


async def test_watch_bookmarks_carry_the_resource_version(kube: Kube) -> None:
    kube.require_emulator("real servers send bookmarks about once a minute")
    await kube.raw("POST", kube.widgets(), widget("b1"))
    async with kube.watch(kube.widgets(), allowWatchBookmarks="true", resourceVersion="0") as stream:
        bookmark = await stream.until(lambda e: e["type"] == "BOOKMARK", within=5)
        assert set(bookmark["object"]) == {"kind", "apiVersion", "metadata"}
        assert int(bookmark["object"]["metadata"]["resourceVersion"]) > 0
    async with kube.watch(
        kube.widgets(),
        allowWatchBookmarks="true",
        sendInitialEvents="true",
        resourceVersionMatch="NotOlderThan",
    ) as stream:
        await stream.until(named("ADDED", "b1"))
        end = await stream.until(lambda e: e["type"] == "BOOKMARK")
        assert end["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}


# ---------------------------------------------------------------------------------------------- deletion


async def test_finalizers_hold_deletion_until_removed(kube: Kube) -> None:
    body = widget("fin")
    body["metadata"]["finalizers"] = ["contract.nstance.dev/hold"]
    _status, created = await kube.raw("POST", kube.widgets(), body)
    async with kube.watch(kube.widgets(), resourceVersion=created["metadata"]["resourceVersion"]) as stream:
        status, deleting = await kube.raw("DELETE", kube.widgets("fin"))
        assert status in (200, 202)
        assert deleting["metadata"]["deletionTimestamp"]
        assert deleting["metadata"]["deletionGracePeriodSeconds"] == 0
        assert deleting["metadata"]["generation"] == 2
        marked = await stream.until(named("MODIFIED", "fin"))
        assert marked["object"]["metadata"]["deletionTimestamp"]

        status, body = await kube.raw(
            "PATCH",
            kube.widgets("fin"),
            {"metadata": {"finalizers": ["contract.nstance.dev/hold", "x.io/new"]}},
            content_type=MERGE,
        )
        assert status == 422
        assert "no new finalizers can be added if the object is being deleted" in body["message"]

        _status, still = await kube.raw("GET", kube.widgets("fin"))
        assert still["metadata"]["uid"] == created["metadata"]["uid"]
        await kube.raw("PATCH", kube.widgets("fin"), {"metadata": {"finalizers": None}}, content_type=MERGE)
        await stream.until(named("DELETED", "fin"))
    status, _body = await kube.raw("GET", kube.widgets("fin"))
    assert status == 404

    status, emptied = await kube.raw("DELETE", kube.widgets())  # deletecollection
    assert status == 200
    assert emptied["items"] == []
    _status, plain = await kube.raw("POST", kube.widgets(), widget("plain"))
    status, deleted = await kube.raw("DELETE", kube.widgets("plain"))
    assert status == 200
    # Deleted at once (no finalizers): a custom resource's delete answers with a Status naming it.
    assert deleted["kind"] == "Status"
    assert deleted["status"] == "Success"
    assert deleted["details"] == {
        "name": "plain",
        "group": GROUP,
        "kind": "widgets",
        "uid": plain["metadata"]["uid"],
    }


async def test_namespace_deletion_removes_its_objects(kube: Kube) -> None:
    other = f"{kube.ns}-x"
    await kube.core.create_namespace({"metadata": {"name": other}})
    await kube.core.create_namespaced_config_map(other, {"metadata": {"name": "inside"}})
    _status, listed = await kube.raw("GET", f"/api/v1/namespaces/{other}/configmaps")
    async with kube.watch(
        f"/api/v1/namespaces/{other}/configmaps", resourceVersion=listed["metadata"]["resourceVersion"]
    ) as stream:
        deleted = await kube.core.delete_namespace(other)
        assert deleted is not None
        await stream.until(named("DELETED", "inside"), within=60)
    ns = None
    with contextlib.suppress(client.ApiException):
        ns = await kube.core.read_namespace(other)
    assert ns is None or ns.status.phase == "Terminating"


async def test_owner_deletion_collects_dependents(kube: Kube) -> None:
    _status, owner = await kube.raw("POST", kube.widgets(), widget("owner"))
    ref = {
        "apiVersion": f"{GROUP}/v1",
        "kind": "Widget",
        "name": "owner",
        "uid": owner["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
    for name in ("child", "orphan-child"):
        await kube.core.create_namespaced_config_map(
            kube.ns, {"metadata": {"name": name, "ownerReferences": [ref]}}
        )
    _status, listed = await kube.raw("GET", f"/api/v1/namespaces/{kube.ns}/configmaps")
    async with kube.watch(
        f"/api/v1/namespaces/{kube.ns}/configmaps", resourceVersion=listed["metadata"]["resourceVersion"]
    ) as stream:
        await kube.raw("DELETE", kube.widgets("owner"), {"propagationPolicy": "Background"})
        # The collector deletes dependents in no set order: wait for both, in either order.
        pending = {"child", "orphan-child"}

        def collected(event: dict[str, Any]) -> bool:
            if event["type"] == "DELETED":
                pending.discard(event["object"]["metadata"].get("name"))
            return not pending

        await stream.until(collected, within=60)

    # Orphan: the dependent stays and loses its owner reference.
    _status, owner2 = await kube.raw("POST", kube.widgets(), widget("owner2"))
    ref2 = dict(ref, name="owner2", uid=owner2["metadata"]["uid"])
    await kube.core.create_namespaced_config_map(
        kube.ns, {"metadata": {"name": "kept", "ownerReferences": [ref2]}}
    )
    await kube.raw("DELETE", kube.widgets("owner2"), query={"propagationPolicy": "Orphan"})

    async def orphaned() -> bool:
        kept = await kube.core.read_namespaced_config_map("kept", kube.ns)
        return not kept.metadata.owner_references

    # The real collector can take many seconds on a loaded machine.
    await eventually(orphaned, within=60, every=0.1, what="the kept ConfigMap to lose its owner reference")


async def test_foreground_deletion_waits_for_dependents(kube: Kube) -> None:
    _status, owner = await kube.raw("POST", kube.widgets(), widget("fg"))
    ref = {
        "apiVersion": f"{GROUP}/v1",
        "kind": "Widget",
        "name": "fg",
        "uid": owner["metadata"]["uid"],
        "blockOwnerDeletion": True,  # only blocking dependents hold a foreground deletion on a real server
    }
    await kube.core.create_namespaced_config_map(
        kube.ns,
        {"metadata": {"name": "held", "ownerReferences": [ref], "finalizers": ["contract.nstance.dev/x"]}},
    )
    status, deleting = await kube.raw("DELETE", kube.widgets("fg"), {"propagationPolicy": "Foreground"})
    assert status in (200, 202)
    assert "foregroundDeletion" in deleting["metadata"]["finalizers"]
    _status, listed = await kube.raw("GET", kube.widgets())
    async with kube.watch(kube.widgets(), resourceVersion=listed["metadata"]["resourceVersion"]) as stream:

        async def deleting() -> bool:
            held = await kube.core.read_namespaced_config_map("held", kube.ns)
            return bool(held.metadata.deletion_timestamp)

        await eventually(deleting, within=60, every=0.1, what="the held ConfigMap marked for deletion")
        _status, still = await kube.raw("GET", kube.widgets("fg"))
        assert still["metadata"]["deletionTimestamp"]
        await kube.core.patch_namespaced_config_map("held", kube.ns, {"metadata": {"finalizers": None}})
        await stream.until(named("DELETED", "fg"), within=60)


# ---------------------------------------------------------------------------------------------- schema


async def test_schema_validation_errors_match_the_real_server(kube: Kube) -> None:
    body = widget("bad")
    del body["spec"]["shards"]
    status, error = await kube.raw("POST", kube.widgets(), body)
    assert status == 422
    assert error["reason"] == "Invalid"
    assert error["message"] == f'Widget.{GROUP} "bad" is invalid: spec.shards: Required value'
    assert error["details"]["name"] == "bad"
    assert error["details"]["kind"] == "Widget"
    assert error["details"]["group"] == GROUP
    assert error["details"]["causes"] == [
        {"reason": "FieldValueRequired", "message": "Required value", "field": "spec.shards"}
    ]

    status, error = await kube.raw("POST", kube.widgets(), widget("bad", size="big"))
    assert status == 422
    cause = error["details"]["causes"][0]
    assert cause["field"] == "spec.size"
    assert cause["reason"] == "FieldValueTypeInvalid"
    assert 'spec.size in body must be of type integer: "string"' in cause["message"]

    cases = {
        "spec.size": widget("bad", size=101),
        "spec.mode": widget("bad", mode="slow"),
        "spec.shards": widget("bad", shards=[]),
        "spec.group": widget("bad", group="UPPER"),
    }
    for field, case in cases.items():
        status, error = await kube.raw("POST", kube.widgets(), case)
        assert status == 422, field
        assert [c["field"] for c in error["details"]["causes"]] == [field], error
    _status, error = await kube.raw("POST", kube.widgets(), widget("bad", mode="slow"))
    assert error["details"]["causes"][0]["reason"] == "FieldValueNotSupported"
    assert 'Unsupported value: "slow": supported values: "fast", "safe"' in error["message"]


async def test_unknown_fields_are_pruned_unless_preserved(kube: Kube) -> None:
    body = widget("prune", extra={"anything": {"goes": 1}})
    body["spec"]["unknown"] = 1
    body["topLevel"] = True
    status, created = await kube.raw("POST", kube.widgets(), body)
    assert status == 201
    assert "unknown" not in created["spec"]
    assert "topLevel" not in created
    assert created["spec"]["extra"] == {"anything": {"goes": 1}}


# ---------------------------------------------------------------------------------------------- pods


async def _pod(kube: Kube, name: str, labels: dict[str, str] | None = None, ready: bool = False) -> None:
    await kube.core.create_namespaced_pod(
        kube.ns,
        {
            "metadata": {"name": name, "labels": labels or {}},
            "spec": {"containers": [{"name": "c", "image": "i"}]},
        },
    )
    if ready:
        await kube.core.patch_namespaced_pod_status(
            name,
            kube.ns,
            {"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}},
        )


def _eviction(name: str, ns: str) -> dict[str, Any]:
    return {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": ns}}


async def test_eviction_deletes_the_pod(kube: Kube) -> None:
    await _pod(kube, "evictee")
    await kube.core.create_namespaced_pod_eviction("evictee", kube.ns, _eviction("evictee", kube.ns))

    async def deleted() -> bool:
        pods = await kube.core.list_namespaced_pod(kube.ns, field_selector="metadata.name=evictee")
        return not pods.items or bool(pods.items[0].metadata.deletion_timestamp)

    await eventually(deleted, within=10, every=0.1, what="the evicted pod deleted")


# ---------------------------------------------------------------------------- service-account tokens


def _token_path(ns: str, account: str) -> str:
    return f"/api/v1/namespaces/{ns}/serviceaccounts/{account}/token"


def _token_request(seconds: int | None = None, **meta: str) -> dict[str, Any]:
    spec = {} if seconds is None else {"expirationSeconds": seconds}
    body: dict[str, Any] = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
    if meta:
        body["metadata"] = meta
    return body


async def test_token_request_answers_a_token_of_the_service_account(kube: Kube) -> None:
    account = await kube.core.create_namespaced_service_account(kube.ns, {"metadata": {"name": "robot"}})
    before = datetime.datetime.now(datetime.UTC)
    status, answer = await kube.raw("POST", _token_path(kube.ns, "robot"), _token_request(3600))
    assert status == 201, answer
    assert (answer["apiVersion"], answer["kind"]) == ("authentication.k8s.io/v1", "TokenRequest")
    meta = answer["metadata"]
    assert (meta["name"], meta["namespace"], meta["uid"]) == ("robot", kube.ns, account.metadata.uid)
    assert meta["creationTimestamp"]
    assert answer["spec"]["expirationSeconds"] == 3600
    assert answer["spec"]["audiences"]  # the server's own audiences when none are asked for
    assert len(answer["status"]["token"].split(".")) == 3  # a JWT
    expiry = datetime.datetime.fromisoformat(answer["status"]["expirationTimestamp"])
    after = datetime.datetime.now(datetime.UTC)
    hour = datetime.timedelta(hours=1)
    assert (
        before + hour - datetime.timedelta(seconds=2)
        <= expiry
        <= after + hour + datetime.timedelta(seconds=2)
    )

    # expirationSeconds defaults to an hour; the body's name may be given when it is the URL's.
    status, answer = await kube.raw("POST", _token_path(kube.ns, "robot"), _token_request(name="robot"))
    assert status == 201, answer
    assert answer["spec"]["expirationSeconds"] == 3600


async def test_token_request_refusals(kube: Kube) -> None:
    status, body = await kube.raw("POST", _token_path(kube.ns, "nobody"), _token_request(3600))
    assert (status, body["reason"]) == (404, "NotFound")
    assert body["message"] == 'serviceaccounts "nobody" not found'

    await kube.core.create_namespaced_service_account(kube.ns, {"metadata": {"name": "robot"}})
    status, body = await kube.raw("POST", _token_path(kube.ns, "robot"), _token_request(60))
    assert (status, body["reason"]) == (422, "Invalid")
    assert body["message"] == (
        'TokenRequest.authentication.k8s.io "" is invalid: spec.expirationSeconds: Invalid value: 60: '
        "may not specify a duration less than 10 minutes"
    )
    assert body["details"]["kind"] == "TokenRequest"
    assert body["details"]["group"] == "authentication.k8s.io"
    assert body["details"]["causes"][0]["field"] == "spec.expirationSeconds"

    status, body = await kube.raw("POST", _token_path(kube.ns, "robot"), _token_request(name="other"))
    assert (status, body["reason"]) == (422, "Invalid")
    assert body["message"] == (
        'TokenRequest.authentication.k8s.io "robot" is invalid: metadata.name: Invalid value: "other": '
        "must match the service account name if specified"
    )


async def test_discovery_lists_the_token_subresource(kube: Kube) -> None:
    _status, core = await kube.raw("GET", "/api/v1")
    by_name = {r["name"]: r for r in core["resources"]}
    token = by_name["serviceaccounts/token"]
    assert (token["kind"], token["group"], token["version"]) == (
        "TokenRequest",
        "authentication.k8s.io",
        "v1",
    )
    assert token["verbs"] == ["create"]
    assert token["namespaced"] is True


async def test_eviction_hook_answers_429(kube: Kube) -> None:
    emulator = kube.require_emulator("the 429 eviction hook is an emulator test hook")
    await _pod(kube, "guarded")
    emulator.fail_evictions(2)
    path = f"/api/v1/namespaces/{kube.ns}/pods/guarded/eviction"
    for _ in range(2):
        status, body = await kube.raw("POST", path, _eviction("guarded", kube.ns))
        assert status == 429
        assert body["reason"] == "TooManyRequests"
        assert body["message"] == "Cannot evict pod as it would violate the pod's disruption budget."
    status, _body = await kube.raw("POST", path, _eviction("guarded", kube.ns))
    assert status == 201
    assert (await kube.core.list_namespaced_pod(kube.ns)).items == []

    await _pod(kube, "special", {"app": "db"})
    emulator.block_evictions(lambda pod: pod["metadata"].get("labels", {}).get("app") == "db")
    status, _body = await kube.raw("POST", f"/api/v1/namespaces/{kube.ns}/pods/special/eviction")
    assert status == 429
    emulator.block_evictions(None)
    status, _body = await kube.raw("POST", f"/api/v1/namespaces/{kube.ns}/pods/special/eviction")
    assert status == 201


async def test_pod_disruption_budget_blocks_evictions(kube: Kube) -> None:
    kube.require_emulator("pods never become Ready on a real cluster without a node running them")
    for name in ("db-0", "db-1"):
        await _pod(kube, name, {"app": "db"}, ready=True)
    policy = client.PolicyV1Api(kube.api)
    await policy.create_namespaced_pod_disruption_budget(
        kube.ns,
        {"metadata": {"name": "db"}, "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "db"}}}},
    )
    await kube.core.create_namespaced_pod_eviction("db-0", kube.ns, _eviction("db-0", kube.ns))
    with pytest.raises(client.ApiException) as refused:
        await kube.core.create_namespaced_pod_eviction("db-1", kube.ns, _eviction("db-1", kube.ns))
    assert refused.value.status == 429
    cause = json.loads(refused.value.body)["details"]["causes"][0]
    assert cause == {
        "reason": "DisruptionBudget",
        "message": "The disruption budget db needs 1 healthy pods and has 1 currently",
    }


# ---------------------------------------------------------------------------------------------- events


async def test_core_and_events_k8s_io_events_are_stored(kube: Kube) -> None:
    involved = {"kind": "Widget", "name": "w", "namespace": kube.ns, "apiVersion": f"{GROUP}/v1"}
    await kube.core.create_namespaced_event(
        kube.ns,
        {
            "metadata": {"generateName": "w."},
            "involvedObject": involved,
            "reason": "Tested",
            "message": "hi",
            "type": "Normal",
        },
    )
    events = await kube.core.list_namespaced_event(kube.ns, field_selector="involvedObject.name=w")
    assert [e.reason for e in events.items] == ["Tested"]
    events_api = client.EventsV1Api(kube.api)
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    await events_api.create_namespaced_event(
        kube.ns,
        {
            "metadata": {"name": "e2"},
            "eventTime": now,
            "reason": "Tested2",
            "action": "Test",
            "reportingController": "contract",
            "reportingInstance": "contract-1",
            "regarding": involved,
            "type": "Normal",
        },
    )
    # Listed raw: the typed client refuses the core-created event, whose events.k8s.io view has no eventTime.
    _status, listed = await kube.raw("GET", f"/apis/events.k8s.io/v1/namespaces/{kube.ns}/events")
    by_reason = {e["reason"]: e for e in listed["items"]}
    assert by_reason["Tested2"]["eventTime"].startswith(now[:19])
    if kube.emulator is None:  # the emulator keeps the two APIs apart (docs/kubernetes-testing.md)
        assert by_reason["Tested"].get("eventTime") is None
        assert by_reason["Tested"]["regarding"]["name"] == "w"


# ---------------------------------------------------------------------------------------------- robustness


async def test_bad_requests_get_status_answers(kube: Kube) -> None:
    status, body = await kube.raw("POST", kube.widgets(), data=b"{not json")
    assert status == 400
    assert body["kind"] == "Status"
    assert body["code"] == 400
    # A path where no resource is served gets a plain-text 404, not a Status.
    status, body = await kube.raw("GET", f"{WIDGETS}/namespaces/{kube.ns}/nothings")
    assert (status, body) == (404, "404 page not found\n")
    status, body = await kube.raw("GET", "/apis/no.such.group/v1")
    assert (status, body) == (404, "404 page not found\n")
    await kube.raw("POST", kube.widgets(), widget("m"))
    status, body = await kube.raw("POST", kube.widgets("m"), widget("m"))  # a create at the object's path
    assert status == 409
    assert body["reason"] == "AlreadyExists"
    status, body = await kube.raw("PUT", kube.widgets("m"), ["not", "an", "object"])
    assert status in (400, 422)
    assert body["kind"] == "Status"
    status, body = await kube.raw("GET", kube.widgets(), query={"labelSelector": "a in b"})
    assert status == 400


async def test_a_body_must_be_of_the_kind_its_path_serves(kube: Kube) -> None:
    """A write whose ``kind`` or ``apiVersion`` names another type is refused, nothing is stored;
    a built-in object may leave both out (the path says them), a custom resource may not."""
    configmaps = f"/api/v1/namespaces/{kube.ns}/configmaps"

    async def refused(method: str, path: str, body: Any, code: int, *words: str, **kw: Any) -> None:
        status, answer = await kube.raw(method, path, body, **kw)
        assert status == code, (method, path, body, answer)
        assert answer["kind"] == "Status"
        assert answer["reason"] == ("BadRequest" if code == 400 else "Invalid")
        for word in words:
            assert word in answer["message"], answer["message"]

    # Built-in: another kind or an unknown version is a 400 naming the type the path serves.
    await refused(
        "POST", configmaps, {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "a"}}, 400,
        "cannot be handled as a ConfigMap",
    )  # fmt: skip
    await refused(
        "POST", configmaps, {"apiVersion": "apps/v1", "kind": "ConfigMap", "metadata": {"name": "b"}}, 400,
        "cannot be handled as a ConfigMap",
    )  # fmt: skip
    for name, typed in (("c", {}), ("d", {"kind": "ConfigMap"}), ("e", {"apiVersion": "v1"})):
        status, created = await kube.raw("POST", configmaps, {**typed, "metadata": {"name": name}})
        assert status == 201, created
        assert (created["apiVersion"], created["kind"]) == ("v1", "ConfigMap")
    await refused(
        "PUT", f"{configmaps}/c", {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "c"}}, 400,
        "cannot be handled as a ConfigMap",
    )  # fmt: skip
    status, _ = await kube.raw("PUT", f"{configmaps}/c", {"metadata": {"name": "c"}, "data": {"k": "v"}})
    assert status == 200
    await refused("PATCH", f"{configmaps}/c", {"kind": "Secret"}, 422, content_type=MERGE)
    await refused(
        "PATCH", f"{configmaps}/c", [{"op": "replace", "path": "/kind", "value": "Secret"}], 422,
        content_type=JSON_PATCH,
    )  # fmt: skip
    # A strategic merge patch does not change the type: its kind is ignored.
    status, patched = await kube.raw("PATCH", f"{configmaps}/c", {"kind": "Secret"}, content_type=STRATEGIC)
    assert (status, patched["kind"]) == (200, "ConfigMap")

    # Custom resources: another kind is 422 Invalid on "kind"; another version or none is a 400.
    await refused(
        "POST", kube.widgets(), {**widget("f"), "kind": "Gadget"}, 422, 'kind: Invalid value: "Gadget"',
        "must be Widget",
    )  # fmt: skip
    await refused(
        "POST", kube.widgets(), {**widget("g"), "apiVersion": "v1"}, 400,
        "does not match the expected API version",
    )  # fmt: skip
    for missing in ("kind", "apiVersion"):
        body = {k: v for k, v in widget("h").items() if k != missing}
        status, answer = await kube.raw("POST", kube.widgets(), body)
        assert status == 400, answer
        assert answer["reason"] == "BadRequest"
    status, _ = await kube.raw("POST", kube.widgets(), widget("w"))
    assert status == 201
    await refused("PATCH", kube.widgets("w"), {"kind": "Gadget"}, 422, "must be Widget", content_type=MERGE)
    await refused(
        "PATCH", kube.widgets("w"), {"apiVersion": "v1"}, 422, f"must be {GROUP}/v1", content_type=MERGE
    )
    unstamped = {k: v for k, v in widget("w").items() if k not in ("kind", "apiVersion")}
    await refused("PUT", kube.widgets("w"), unstamped, 400)
    # Nor does a write to the status subresource.
    status, patched = await kube.raw(
        "PATCH",
        kube.widgets("w") + "/status",
        {"kind": "Gadget", "status": {"ready": True}},
        content_type=MERGE,
    )
    assert (status, patched["kind"], patched["status"]) == (200, "Widget", {"ready": True})

    # Nothing refused was stored.
    _, listed = await kube.raw("GET", configmaps)
    assert {"a", "b"}.isdisjoint(item["metadata"]["name"] for item in listed["items"])
    _, listed = await kube.raw("GET", kube.widgets())
    assert [item["metadata"]["name"] for item in listed["items"]] == ["w"]
    _, stored = await kube.raw("GET", f"{configmaps}/c")
    assert (stored["kind"], stored["data"]) == ("ConfigMap", {"k": "v"})


async def test_metadata_and_builtin_validation_match_the_real_server(kube: Kube) -> None:
    """Label keys and values, annotation keys and finalizers must be valid names; an Event lives in the
    namespace of the object it is about (``default`` for a cluster-scoped one); a Lease has a positive
    duration and is updated only at a known resourceVersion."""

    async def invalid(method: str, path: str, body: Any, *words: str, **kw: Any) -> None:
        status, answer = await kube.raw(method, path, body, **kw)
        assert (status, answer.get("reason")) == (422, "Invalid"), (method, path, body, answer)
        for word in words:
            assert word in answer["message"], answer["message"]

    def labelled(name: str, **meta: Any) -> dict[str, Any]:
        body = widget(name)
        body["metadata"].update(meta)
        return body

    status, _ = await kube.raw(
        "POST", kube.widgets(), labelled("ok", labels={"nstance.dev/group": "a-b", "empty": ""})
    )
    assert status == 201
    await invalid(
        "POST", kube.widgets(), labelled("v", labels={"x": "a b"}), "metadata.labels", "a valid label"
    )
    await invalid("POST", kube.widgets(), labelled("l", labels={"x": "a" * 64}), "no more than 63")
    await invalid("POST", kube.widgets(), labelled("k", labels={"-x": "a"}), "name part must consist")
    await invalid("POST", kube.widgets(), labelled("p", labels={"Example.com/x": "a"}), "prefix part")
    await invalid("POST", kube.widgets(), labelled("a", annotations={"a b": "c"}), "metadata.annotations")
    await invalid(
        "PATCH", kube.widgets("ok"), {"metadata": {"finalizers": ["bad finalizer"]}}, "metadata.finalizers",
        content_type=MERGE,
    )  # fmt: skip
    _, listed = await kube.raw("GET", kube.widgets())
    assert [item["metadata"]["name"] for item in listed["items"]] == ["ok"]

    events = f"/api/v1/namespaces/{kube.ns}/events"

    def event(name: str, about: dict[str, Any]) -> dict[str, Any]:
        return {
            "metadata": {"name": name},
            "involvedObject": about,
            "reason": "R",
            "message": "m",
            "type": "Normal",
        }

    status, _ = await kube.raw(
        "POST", events, event("same", {"kind": "Widget", "name": "ok", "namespace": kube.ns})
    )
    assert status == 201
    await invalid(
        "POST", events, event("other", {"kind": "Widget", "name": "ok", "namespace": "elsewhere"}),
        "involvedObject.namespace", "does not match event.namespace",
    )  # fmt: skip
    node = f"node-{kube.ns}"
    await invalid(
        "POST", events, event("node", {"kind": "Node", "name": node}), "does not match event.namespace"
    )
    # About a cluster-scoped object: in "default", naming no namespace; kubectl describe finds it so.
    default_events = "/api/v1/namespaces/default/events"
    status, _ = await kube.raw("POST", default_events, event(node, {"kind": "Node", "name": node}))
    assert status == 201
    try:
        selector = f"involvedObject.kind=Node,involvedObject.name={node},involvedObject.namespace="
        _, found = await kube.raw("GET", default_events, query={"fieldSelector": selector})
        assert [e["metadata"]["name"] for e in found["items"]] == [node]
    finally:
        await kube.raw("DELETE", f"{default_events}/{node}")
    await invalid(
        "POST", f"/apis/events.k8s.io/v1/namespaces/{kube.ns}/events",
        {
            "metadata": {"name": "new"}, "regarding": {"kind": "Widget", "name": "ok", "namespace": kube.ns},
            "reason": "R", "note": "m", "type": "Normal", "action": "A",
            "reportingController": "nstance.dev/test", "reportingInstance": "i",
        },
        "eventTime: Required value",
    )  # fmt: skip

    leases = f"/apis/coordination.k8s.io/v1/namespaces/{kube.ns}/leases"
    await invalid(
        "POST", leases, {"metadata": {"name": "zero"}, "spec": {"leaseDurationSeconds": 0}},
        "spec.leaseDurationSeconds", "must be greater than 0",
    )  # fmt: skip
    status, lease = await kube.raw(
        "POST", leases, {"metadata": {"name": "l"}, "spec": {"holderIdentity": "a"}}
    )
    assert status == 201
    await invalid(
        "PUT", f"{leases}/l", {"metadata": {"name": "l"}, "spec": {"holderIdentity": "b"}},
        "metadata.resourceVersion", "must be specified for an update",
    )  # fmt: skip
    lease["spec"]["holderIdentity"] = "b"
    status, lease = await kube.raw("PUT", f"{leases}/l", lease)
    assert (status, lease["spec"]["holderIdentity"]) == (200, "b")


async def test_a_pod_spec_changes_only_where_kubernetes_allows_and_the_operator_pins_a_gated_pod(
    kube: Kube,
) -> None:
    """A pod's spec is fixed but for images and a few fields; a pod still held by a scheduling gate may
    gain nodeSelector entries and lose gates. The operator's own pin patch must pass on both servers."""
    pods = f"/api/v1/namespaces/{kube.ns}/pods"

    def pod(name: str, **spec: Any) -> dict[str, Any]:
        return {"metadata": {"name": name}, "spec": {"containers": [{"name": "c", "image": "a"}], **spec}}

    async def patched(name: str, body: Any, content_type: str = STRATEGIC) -> tuple[int, Any]:
        return await kube.raw("PATCH", f"{pods}/{name}", body, content_type=content_type)

    gates = [{"name": SCHEDULING_GATE}, {"name": "example.com/other"}]
    status, gated = await kube.raw(
        "POST", pods, pod("gated", nodeSelector={"disk": "ssd"}, schedulingGates=gates)
    )
    assert status == 201, gated
    status, answer = await patched("gated", {"spec": {"nodeSelector": {"disk": "hdd"}}})
    assert status == 422, answer  # an existing entry may not change, even while gated
    status, answer = await patched(
        "gated", {"spec": {"schedulingGates": [*gates, {"name": "example.com/new"}]}}
    )
    assert status == 422, answer  # gates are only ever removed
    status, pinned = await patched("gated", pin_patch(gated, "node-7"), JSON_PATCH)
    assert status == 200, pinned
    assert pinned["spec"]["nodeSelector"] == {"disk": "ssd", "kubernetes.io/hostname": "node-7"}
    assert pinned["spec"]["schedulingGates"] == [{"name": "example.com/other"}]
    status, ungated = await patched("gated", [{"op": "remove", "path": "/spec/schedulingGates"}], JSON_PATCH)
    assert status == 200, ungated
    assert "schedulingGates" not in ungated["spec"]
    status, answer = await patched("gated", {"spec": {"nodeSelector": {"zone": "b"}}})
    assert (status, answer["reason"]) == (422, "Invalid"), answer  # no gate left: scheduled as it is

    status, _ = await kube.raw("POST", pods, pod("plain"))
    assert status == 201
    status, answer = await patched("plain", {"spec": {"restartPolicy": "Never"}})
    assert (status, answer["reason"]) == (422, "Invalid"), answer
    assert "pod updates may not change fields" in answer["message"]
    status, answer = await patched("plain", {"spec": {"containers": [{"name": "c", "image": "b"}]}})
    assert (status, answer["spec"]["containers"][0]["image"]) == (200, "b")
    status, answer = await patched("plain", {"spec": {"tolerations": [{"key": "k", "operator": "Exists"}]}})
    assert status == 200, answer  # tolerations may be added


# ---------------------------------------------------------------------------------------------- webhooks


def _self_signed(directory: Path) -> tuple[Path, Path, bytes]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    pem = cert.public_bytes(serialization.Encoding.PEM)
    cert_path, key_path = directory / "hook.crt", directory / "hook.key"
    cert_path.write_bytes(pem)
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_path, key_path, pem


@contextlib.asynccontextmanager
async def webhook_server(tmp_path: Path, reviews: list[dict[str, Any]]) -> AsyncIterator[tuple[str, str]]:
    """An HTTPS admission webhook on 127.0.0.1 that denies widgets with spec.size > 10 (422)."""
    cert, key, pem = _self_signed(tmp_path)

    async def review(request: web.Request) -> web.Response:
        body = await request.json()
        reviews.append(body)
        obj = body["request"]["object"] or {}
        allowed = (obj.get("spec") or {}).get("size", 0) <= 10
        answer: dict[str, Any] = {"uid": body["request"]["uid"], "allowed": allowed}
        if not allowed:
            answer["status"] = {"code": 422, "message": "size must be at most 10"}
        return web.json_response(
            {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": answer}
        )

    app = web.Application()
    app.router.add_post("/validate", review)
    runner = web.AppRunner(app)
    await runner.setup()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"https://127.0.0.1:{port}/validate", base64.b64encode(pem).decode()
    finally:
        await runner.cleanup()


def _webhook_config(name: str, url: str, ca: str, **extra: Any) -> dict[str, Any]:
    hook = {
        "name": f"{name}.contract.nstance.dev",
        "clientConfig": {"url": url, "caBundle": ca},
        "rules": [
            {
                "apiGroups": [GROUP],
                "apiVersions": ["v1"],
                "resources": ["widgets"],
                "operations": ["CREATE", "UPDATE"],
                "scope": "Namespaced",
            }
        ],
        "sideEffects": "None",
        "admissionReviewVersions": ["v1"],
        "timeoutSeconds": 5,
        "failurePolicy": "Fail",
        **extra,
    }
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [hook],
    }


@contextlib.asynccontextmanager
async def webhook_configuration(
    kube: Kube, name: str, url: str, ca: str, **extra: Any
) -> AsyncIterator[None]:
    """Register a validating webhook limited to the test's namespace; remove it afterwards."""
    admission = client.AdmissionregistrationV1Api(kube.api)
    namespace_selector = {"matchLabels": {"kubernetes.io/metadata.name": kube.ns}}
    await admission.create_validating_webhook_configuration(
        _webhook_config(name, url, ca, namespaceSelector=namespace_selector, **extra)
    )
    try:
        yield
    finally:
        await admission.delete_validating_webhook_configuration(name)


async def until_webhooks_answer(kube: Kube, status: int, body: dict[str, Any]) -> None:
    """Dry-run creates of ``body`` until the API server answers ``status``.

    A real API server applies a webhook configuration once its informer has seen the write, a moment
    after the write returned (longer on a loaded machine), so a test first waits for the change to
    show. Dry runs call the webhooks (``sideEffects: None``) and store nothing.
    """

    async def answered() -> bool:
        got, _body = await kube.raw("POST", kube.widgets(), body, query={"dryRun": "All"})
        return got == status

    await eventually(answered, within=30, every=0.1, what=f"a dry-run create to be answered {status}")


async def test_webhook_names_need_three_dot_separated_parts(kube: Kube) -> None:
    config = _webhook_config("names", "https://127.0.0.1:1/validate", "")
    config["webhooks"][0]["name"] = "names.nstance"
    config["webhooks"][0]["clientConfig"].pop("caBundle")
    status, body = await kube.raw(
        "POST", "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations", config
    )
    assert status == 422, body
    assert body["reason"] == "Invalid"
    assert (
        'webhooks[0].name: Invalid value: "names.nstance": should be a domain with at least three '
        in (body["message"])
    )


async def test_validating_webhook_denies_and_allows(kube: Kube, tmp_path: Path) -> None:
    kube.require_local("the webhook listens on the test machine's loopback")
    reviews: list[dict[str, Any]] = []
    async with webhook_server(tmp_path, reviews) as (url, ca), webhook_configuration(kube, "size", url, ca):
        await until_webhooks_answer(kube, 422, widget("huge", size=50))
        status, body = await kube.raw("POST", kube.widgets(), widget("huge", size=50))
        assert status == 422
        assert body["message"] == (
            'admission webhook "size.contract.nstance.dev" denied the request: size must be at most 10'
        )
        status, _body = await kube.raw("POST", kube.widgets(), widget("fine", size=5))
        assert status == 201
        request = reviews[-1]["request"]
        assert request["operation"] == "CREATE"
        assert request["name"] == "fine"
        assert request["namespace"] == kube.ns
        assert request["kind"] == {"group": GROUP, "version": "v1", "kind": "Widget"}
        assert request["resource"] == {"group": GROUP, "version": "v1", "resource": "widgets"}
        assert request["userInfo"]["username"]
        assert request["oldObject"] is None

        status, _body = await kube.raw(
            "PATCH", kube.widgets("fine"), {"spec": {"size": 11}}, content_type=MERGE
        )
        assert status == 422
        assert reviews[-1]["request"]["oldObject"]["spec"]["size"] == 5
        # Status updates do not match rules on "widgets" (only "widgets/status" would).
        status, _body = await kube.raw(
            "PATCH", kube.widgets("fine") + "/status", {"status": {"replicas": 1}}, content_type=MERGE
        )
        assert status == 200
    # The webhook's server is gone now: failurePolicy Fail refuses, Ignore lets writes through.
    async with webhook_configuration(kube, "size", url, ca):
        await until_webhooks_answer(kube, 500, widget("unreachable"))  # not between the delete and the create
        status, body = await kube.raw("POST", kube.widgets(), widget("unreachable"))
        assert status == 500
        assert 'failed calling webhook "size.contract.nstance.dev"' in body["message"]
        await kube.raw(
            "PATCH",
            "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/size",
            [{"op": "replace", "path": "/webhooks/0/failurePolicy", "value": "Ignore"}],
            content_type=JSON_PATCH,
        )
        await until_webhooks_answer(kube, 201, widget("unreachable"))
        status, _body = await kube.raw("POST", kube.widgets(), widget("unreachable"))
        assert status == 201


async def test_webhook_object_selector_limits_calls(kube: Kube, tmp_path: Path) -> None:
    kube.require_local("the webhook listens on the test machine's loopback")
    reviews: list[dict[str, Any]] = []
    selector = {"matchExpressions": [{"key": "checked", "operator": "In", "values": ["yes"]}]}
    async with (
        webhook_server(tmp_path, reviews) as (url, ca),
        webhook_configuration(kube, "selective", url, ca, objectSelector=selector),
    ):
        body = widget("checked", size=50)
        body["metadata"]["labels"] = {"checked": "yes"}
        await until_webhooks_answer(kube, 422, body)
        reviews.clear()  # the dry runs' reviews
        status, _body = await kube.raw("POST", kube.widgets(), widget("unchecked", size=50))
        assert status == 201
        assert reviews == []
        status, _body = await kube.raw("POST", kube.widgets(), body)
        assert status == 422
        assert len(reviews) == 1


# ---------------------------------------------------------------------------------------------- tables

TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"


async def test_table_format_uses_the_printer_columns(kube: Kube) -> None:
    await kube.custom.create_namespaced_custom_object(
        GROUP, "v1", kube.ns, "widgets", widget("tabled", size=3, mode="fast", shards=["a", "b"])
    )
    session = kube.api.rest_client.pool_manager
    headers = {**await kube._headers("application/json"), "Accept": TABLE}
    async with session.get(kube.api.configuration.host + kube.widgets(), headers=headers) as response:
        assert response.status == 200
        table = await response.json()
    assert table["kind"] == "Table"
    assert table["apiVersion"] == "meta.k8s.io/v1"
    assert [(c["name"], c["type"], c["priority"]) for c in table["columnDefinitions"]] == [
        ("Name", "string", 0),
        ("Size", "integer", 0),
        ("Shards", "string", 0),
        ("Ready", "boolean", 0),
        ("Mode", "string", 1),
        ("Age", "date", 0),
    ]
    (row,) = table["rows"]
    name, size, shards, ready, mode, age = row["cells"]
    assert (name, size, shards, ready, mode) == ("tabled", 3, '["a","b"]', None, "fast")
    assert re.fullmatch(r"\d+s", age), age
    assert row["object"]["kind"] == "PartialObjectMetadata"
    assert row["object"]["metadata"]["name"] == "tabled"

    async with session.get(
        kube.api.configuration.host + kube.widgets("tabled"),
        headers=headers,
        params={"includeObject": "Object"},
    ) as response:
        one = await response.json()
    assert one["rows"][0]["object"]["spec"]["size"] == 3


async def test_table_watch_sends_columns_once(kube: Kube) -> None:
    session = kube.api.rest_client.pool_manager
    headers = {**await kube._headers("application/json"), "Accept": TABLE}
    await kube.custom.create_namespaced_custom_object(GROUP, "v1", kube.ns, "widgets", widget("w1"))
    async with session.get(
        kube.api.configuration.host + kube.widgets(), headers=headers, params={"watch": "true"}
    ) as response:
        stream = WatchStream(response)
        first = await stream.until(lambda e: e["type"] == "ADDED")
        assert first["object"]["kind"] == "Table"
        assert [c["name"] for c in first["object"]["columnDefinitions"]][:2] == ["Name", "Size"]
        await kube.custom.create_namespaced_custom_object(GROUP, "v1", kube.ns, "widgets", widget("w2"))
        second = await stream.until(lambda e: e["type"] == "ADDED")
        assert second["object"]["rows"][0]["cells"][0] == "w2"
        assert not second["object"].get("columnDefinitions")


# ---------------------------------------------------------------------------------------------- runners


def test_in_thread_runner_serves_sync_callers(tmp_path: Path) -> None:
    crd_file = tmp_path / "crd.json"
    crd_file.write_text(json.dumps(WIDGET_CRD))
    with KubeAPIServer.in_thread(crds=[crd_file]) as server:
        kubeconfig = json.loads(server.write_kubeconfig(tmp_path / "kc").read_text())
        assert kubeconfig["clusters"][0]["cluster"]["server"] == server.url
        assert kubeconfig["current-context"] == "emulator"
        assert kubeconfig["contexts"][0]["context"]["namespace"] == "default"
        with urllib.request.urlopen(f"{server.url}{WIDGETS}") as response:
            names = {r["name"] for r in json.load(response)["resources"]}
        assert "widgets" in names
        server.load_crd_files([crd_file])  # applying again is an update, not an error


def test_cli_prints_url_and_stops_on_sigterm(tmp_path: Path) -> None:
    crd_file = tmp_path / "crd.json"
    crd_file.write_text(json.dumps(WIDGET_CRD))
    kubeconfig = tmp_path / "out" / "kubeconfig"
    command = [
        sys.executable,
        "-m",
        "nstance.testing.kubeapi",
        "--port",
        "0",
        "--crds",
        str(crd_file),
        "--kubeconfig",
        str(kubeconfig),
    ]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as process:
        try:
            assert process.stdout is not None
            line = json.loads(process.stdout.readline())
            assert line["url"].startswith("http://127.0.0.1:")
            assert json.loads(kubeconfig.read_text())["clusters"][0]["cluster"]["server"] == line["url"]
            with urllib.request.urlopen(f"{line['url']}/apis/{GROUP}/v1") as response:
                assert response.status == 200
        finally:
            process.terminate()
            assert process.wait(timeout=10) == 0
