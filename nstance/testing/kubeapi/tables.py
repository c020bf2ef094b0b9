"""The ``meta.k8s.io/v1`` Table rendering of objects, which ``kubectl get`` asks for.

A request whose Accept header names ``as=Table`` gets a Table instead of the object or list: the columns
are ``Name`` followed by a custom resource version's ``additionalPrinterColumns`` (each cell is its
JSONPath evaluated on the object; ``date`` columns become an age like ``5m``), or ``Name`` and ``Age``
where none are declared, and for the built-in kinds. Rows carry the object as ``PartialObjectMetadata``
(``includeObject=Metadata``, the default), whole (``Object``) or not at all (``None``). In a watch only
the first event's Table has the column definitions, as on a real server. Pure functions: no I/O.
"""

from __future__ import annotations

import datetime
import json
import re
from typing import Any

from nstance.testing.kubeapi import errors
from nstance.testing.kubeapi.resources import ResourceType

JSON = dict[str, Any]

NAME_COLUMN: JSON = {
    "name": "Name",
    "type": "string",
    "format": "name",
    "description": "Name must be unique within a namespace. Is required when creating resources, although "
    "some resources may allow a client to request the generation of an appropriate name automatically. Name "
    "is primarily intended for creation idempotence and configuration definition. Cannot be updated. More "
    "info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names",
    "priority": 0,
}
AGE_COLUMN: JSON = {
    "name": "Age",
    "type": "date",
    "format": "",
    "description": "CreationTimestamp is a timestamp representing the server time when this object was "
    "created.",
    "priority": 0,
    "jsonPath": ".metadata.creationTimestamp",
}

_SEGMENT = re.compile(
    r"""\.([A-Za-z0-9_-]+)|\[(\d+)\]|\[\?\(@\.([A-Za-z0-9_.-]+)\s*==\s*["']([^"']*)["']\)\]"""
)


def wants_table(accept: str) -> bool:
    """Whether the Accept header asks for a Table (kubectl's ``as=Table;v=v1;g=meta.k8s.io``)."""
    return any("as=Table" in part for part in accept.split(","))


def columns(rtype: ResourceType) -> list[JSON]:
    """The column definitions for ``rtype`` (each with its JSONPath under ``jsonPath``)."""
    declared = rtype.extra.get("printerColumns") or []
    if not declared:
        return [NAME_COLUMN, AGE_COLUMN]
    out = [NAME_COLUMN]
    for column in declared:
        out.append(
            {
                "name": column["name"],
                "type": column.get("type", "string"),
                "format": column.get("format", ""),
                "description": column.get("description", ""),
                "priority": int(column.get("priority", 0)),
                "jsonPath": column["jsonPath"],
            }
        )
    return out


def evaluate(path: str, obj: Any) -> list[Any]:
    """The values a simple JSONPath (``.a.b``, ``[0]``, ``[?(@.type=="Ready")]``) selects in ``obj``."""
    results = [obj]
    position = 0
    text = path.strip()
    if text.startswith("{") and text.endswith("}"):
        text = text[1:-1]
    while position < len(text):
        match = _SEGMENT.match(text, position)
        if match is None:
            raise errors.bad_request(f"unsupported JSONPath {path!r} in the emulator")
        position = match.end()
        key, index, filter_key, filter_value = match.groups()
        selected: list[Any] = []
        for value in results:
            if key is not None and isinstance(value, dict) and key in value:
                selected.append(value[key])
            elif index is not None and isinstance(value, list) and int(index) < len(value):
                selected.append(value[int(index)])
            elif filter_key is not None and isinstance(value, list):
                for item in value:
                    found = evaluate("." + filter_key, item)
                    if found and str(found[0]) == filter_value:
                        selected.append(item)
        results = selected
    return results


def age(timestamp: str, now: datetime.datetime) -> str:
    """Kubernetes' short human duration (``45s``, ``5m``, ``3h``, ``2d``) since ``timestamp``."""
    try:
        then = datetime.datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    except ValueError:
        return "<invalid>"
    seconds = int((now - then).total_seconds())
    if seconds < 0:
        return "<invalid>"
    if seconds < 120:
        return f"{seconds}s"
    minutes = seconds // 60
    if minutes < 10:
        return f"{minutes}m{seconds % 60}s" if seconds % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    days = hours // 24
    if days < 8:
        return f"{days}d{hours % 24}h" if hours % 24 else f"{days}d"
    return f"{days}d" if days < 365 * 2 else f"{days // 365}y"


def cell(column: JSON, obj: JSON, now: datetime.datetime) -> Any:
    """One cell: the column's JSONPath result, typed as the column says (None when nothing matches)."""
    if column is NAME_COLUMN:
        return obj["metadata"]["name"]
    values = evaluate(column["jsonPath"], obj)
    if not values:
        return None
    value = values[0] if len(values) == 1 else values
    kind = column["type"]
    if kind == "date":
        return age(str(value), now) if isinstance(value, str) else None
    if kind == "integer" and isinstance(value, int) and not isinstance(value, bool):
        return value
    if kind == "number" and isinstance(value, int | float) and not isinstance(value, bool):
        return value
    if kind == "boolean" and isinstance(value, bool):
        return value
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"))


def row(rtype: ResourceType, obj: JSON, include: str, now: datetime.datetime) -> JSON:
    out: JSON = {"cells": [cell(column, obj, now) for column in columns(rtype)]}
    if include == "Object":
        out["object"] = obj
    elif include != "None":
        out["object"] = {
            "kind": "PartialObjectMetadata",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": obj["metadata"],
        }
    return out


def include_object(query: Any) -> str:
    value = query.get("includeObject", "Metadata") or "Metadata"
    if value not in ("None", "Metadata", "Object"):
        raise errors.bad_request(
            f'includeObject: Unsupported value: "{value}": supported values: "Metadata", "None", "Object"'
        )
    return str(value)


def table(
    rtype: ResourceType,
    objects: list[JSON],
    *,
    include: str,
    metadata: JSON | None = None,
    with_columns: bool = True,
    now: datetime.datetime | None = None,
) -> JSON:
    """A Table of ``objects``; ``metadata`` carries the list's resourceVersion and continue token."""
    moment = now or datetime.datetime.now(datetime.UTC)
    definitions = (
        [{k: v for k, v in c.items() if k != "jsonPath"} for c in columns(rtype)] if with_columns else []
    )
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": dict(metadata or {}),
        "columnDefinitions": definitions,
        "rows": [row(rtype, obj, include, moment) for obj in objects],
    }
