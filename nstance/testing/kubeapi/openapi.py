"""OpenAPI v3 documents (``/openapi/v3`` and one per group/version), as ``kubectl`` reads them.

kubectl looks in them for three things: a PATCH operation per kind whose path declares the
``fieldValidation`` query parameter (then it leaves validation to the server, ``fieldValidation=Strict``),
the schema of each kind under ``components.schemas`` tagged with ``x-kubernetes-group-version-kind``
(``kubectl explain``), and ``ObjectMeta``. Custom resources get their CRD version's ``openAPIV3Schema``
with ``metadata`` pointing at ``ObjectMeta``; the built-in kinds get an open object schema (the emulator
does not carry their full schemas: ``kubectl explain pod.spec`` shows no fields). Pure functions: no I/O.
"""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

from nstance.testing.kubeapi.resources import Registry, ResourceType

JSON = dict[str, Any]

OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
_STRING: JSON = {"type": "string"}
_STRING_MAP: JSON = {"type": "object", "additionalProperties": {"type": "string", "default": ""}}
OBJECT_META_SCHEMA: JSON = {
    "description": "ObjectMeta is metadata that all persisted resources must have, which includes all "
    "objects users must create.",
    "type": "object",
    "properties": {
        "annotations": {**_STRING_MAP, "description": "Annotations is an unstructured key value map."},
        "creationTimestamp": {**_STRING, "format": "date-time"},
        "deletionGracePeriodSeconds": {"type": "integer", "format": "int64"},
        "deletionTimestamp": {**_STRING, "format": "date-time"},
        "finalizers": {"type": "array", "items": {"type": "string", "default": ""}},
        "generateName": _STRING,
        "generation": {"type": "integer", "format": "int64"},
        "labels": {**_STRING_MAP, "description": "Map of string keys and values for organizing objects."},
        "managedFields": {
            "type": "array",
            "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
        },
        "name": {**_STRING, "description": "Name must be unique within a namespace."},
        "namespace": {
            **_STRING,
            "description": "Namespace defines the space within which each name must be unique.",
        },
        "ownerReferences": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["apiVersion", "kind", "name", "uid"],
                "properties": {
                    "apiVersion": _STRING,
                    "blockOwnerDeletion": {"type": "boolean"},
                    "controller": {"type": "boolean"},
                    "kind": _STRING,
                    "name": _STRING,
                    "uid": _STRING,
                },
            },
        },
        "resourceVersion": _STRING,
        "selfLink": _STRING,
        "uid": _STRING,
    },
}
_WRITE_PARAMETERS = (
    {"name": "dryRun", "in": "query", "schema": {"type": "string", "uniqueItems": True}},
    {"name": "fieldManager", "in": "query", "schema": {"type": "string", "uniqueItems": True}},
    {"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": True}},
    {"name": "pretty", "in": "query", "schema": {"type": "string", "uniqueItems": True}},
)


def group_version_path(group: str, version: str) -> str:
    """``api/v1`` or ``apis/{group}/{version}``: the key in ``/openapi/v3`` and the document's path."""
    return f"apis/{group}/{version}" if group else f"api/{version}"


def schema_name(rtype: ResourceType) -> str:
    """``io.k8s.api.core.v1.Pod`` for built-in kinds, the group reversed for others (``dev.nstance.v1.X``)."""
    if not rtype.custom:
        group = rtype.group.split(".")[0] if rtype.group else "core"
        return f"io.k8s.api.{group}.{rtype.version}.{rtype.kind}"
    reversed_group = ".".join(reversed(rtype.group.split(".")))
    return f"{reversed_group}.{rtype.version}.{rtype.kind}"


def _gvk(rtype: ResourceType) -> JSON:
    return {"group": rtype.group, "kind": rtype.kind, "version": rtype.version}


def kind_schema(rtype: ResourceType) -> JSON:
    meta_ref = {"allOf": [{"$ref": f"#/components/schemas/{OBJECT_META}"}], "default": {}}
    if rtype.custom and rtype.schema:
        schema = copy.deepcopy(rtype.schema)
        properties = schema.setdefault("properties", {})
        properties.setdefault("apiVersion", _STRING)
        properties.setdefault("kind", _STRING)
        properties["metadata"] = {**meta_ref, "description": "Standard object's metadata."}
    else:
        schema = {
            "type": "object",
            "description": f"{rtype.kind} (the Kubernetes API emulator does not describe its fields).",
            "properties": {"apiVersion": _STRING, "kind": _STRING, "metadata": meta_ref},
            "x-kubernetes-preserve-unknown-fields": True,
        }
    schema["x-kubernetes-group-version-kind"] = [_gvk(rtype)]
    return schema


def _operation(rtype: ResourceType, action: str, ref: str, *, writes: bool = False) -> JSON:
    op: JSON = {
        "operationId": f"{action}{rtype.kind}",
        "responses": {
            "200": {"description": "OK", "content": {"application/json": {"schema": {"$ref": ref}}}}
        },
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": _gvk(rtype),
    }
    if writes:  # kubectl looks for fieldValidation among the PATCH operation's own parameters
        op["parameters"] = list(_WRITE_PARAMETERS)
        media = "application/merge-patch+json" if action == "patch" else "application/json"
        op["requestBody"] = {"content": {media: {"schema": {"$ref": ref}}}}
    return op


def _paths(rtype: ResourceType) -> JSON:
    base = "/" + group_version_path(rtype.group, rtype.version)
    if rtype.namespaced:
        base += "/namespaces/{namespace}"
    ref = f"#/components/schemas/{schema_name(rtype)}"
    collection = f"{base}/{rtype.plural}"
    return {
        collection: {
            "get": _operation(rtype, "list", ref),
            "post": _operation(rtype, "post", ref, writes=True),
        },
        f"{collection}/{{name}}": {
            "get": _operation(rtype, "get", ref),
            "put": _operation(rtype, "put", ref, writes=True),
            "patch": _operation(rtype, "patch", ref, writes=True),
            "delete": _operation(rtype, "delete", ref),
        },
    }


def document(registry: Registry, group: str, version: str) -> JSON | None:
    """The OpenAPI v3 document of one group/version, or None when it is not served."""
    types = registry.for_group_version(group, version)
    if not types:
        return None
    schemas: JSON = {OBJECT_META: OBJECT_META_SCHEMA}
    paths: JSON = {}
    for rtype in sorted(types, key=lambda t: t.plural):
        schemas[schema_name(rtype)] = kind_schema(rtype)
        paths.update(_paths(rtype))
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.34.0"},
        "paths": paths,
        "components": {"schemas": schemas},
    }


def _hash(doc: JSON) -> str:
    return hashlib.sha512(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:128].upper()


def index(registry: Registry) -> JSON:
    """``/openapi/v3``: each served group/version with the URL (and content hash) of its document."""
    paths: JSON = {}
    for group, versions in sorted(registry.group_versions().items()):
        for version in versions:
            doc = document(registry, group, version)
            if doc is not None:
                key = group_version_path(group, version)
                paths[key] = {"serverRelativeURL": f"/openapi/v3/{key}?hash={_hash(doc)}"}
    return {"paths": paths}
