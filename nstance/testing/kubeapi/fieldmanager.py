"""Field ownership (``metadata.managedFields``) and server-side apply, as the emulator does them.

A field set is a set of paths; each path is a tuple of the elements the real server writes in
``fieldsV1``: ``f:<name>`` for a map key, ``k:{"key":value}`` for an item of a list of type ``map`` (keyed
by its ``x-kubernetes-list-map-keys``, keys sorted) and ``v:<json>`` for an item of a list of type ``set``.
Every other list is atomic: the list is one field. Built-in kinds have no schema here, so all their lists
are atomic (the real server merges e.g. a pod's containers by name); ``metadata`` has the real shape
(finalizers a set, ownerReferences keyed by uid).

``apply`` merges an applied configuration into the live object for one field manager, reporting a
conflict for every field another manager owns whose value would change (unless forced, which takes the
field over). ``record_update`` gives an ordinary update's changed fields to its manager. Pure functions on
JSON values: no I/O.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

JSON = dict[str, Any]
Path = tuple[str, ...]

APPLY = "Apply"
UPDATE = "Update"
_MISSING = object()
# Fields the server owns: never part of a field set (the real server's reset fields).
_SERVER_META = frozenset(
    {
        "name",
        "namespace",
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "managedFields",
        "selfLink",
    }
)
METADATA_SCHEMA: JSON = {
    "type": "object",
    "properties": {
        "finalizers": {"type": "array", "x-kubernetes-list-type": "set"},
        "ownerReferences": {
            "type": "array",
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["uid"],
        },
    },
}


@dataclass(frozen=True)
class Conflict:
    """A field ``manager`` owns that an apply would change."""

    manager: str
    operation: str
    api_version: str
    path: Path

    def describe(self) -> str:
        """``conflict with "m"`` (Apply) or ``conflict with "m" using v1`` (Update), like the real server."""
        using = f" using {self.api_version}" if self.operation == UPDATE else ""
        return f'conflict with "{self.manager}"{using}'


class ApplyConflict(Exception):
    def __init__(self, conflicts: list[Conflict]) -> None:
        super().__init__(f"{len(conflicts)} conflicts")
        self.conflicts = conflicts


def object_schema(schema: JSON | None) -> JSON:
    """The kind's schema with the real ``metadata`` shape."""
    properties = dict((schema or {}).get("properties") or {})
    properties["metadata"] = METADATA_SCHEMA
    return {**(schema or {}), "type": "object", "properties": properties}


def _child(schema: JSON | None, key: str) -> JSON | None:
    if not isinstance(schema, dict):
        return None
    found = (schema.get("properties") or {}).get(key)
    if isinstance(found, dict):
        return found
    extra = schema.get("additionalProperties")
    return extra if isinstance(extra, dict) else None


def _items(schema: JSON | None) -> JSON | None:
    items = schema.get("items") if isinstance(schema, dict) else None
    return items if isinstance(items, dict) else None


def _list_type(schema: JSON | None) -> tuple[str, list[str]]:
    if not isinstance(schema, dict):
        return "atomic", []
    kind = str(schema.get("x-kubernetes-list-type") or "atomic")
    keys = [str(k) for k in schema.get("x-kubernetes-list-map-keys") or []]
    if kind == "map" and not keys:
        return "atomic", []
    return kind, keys


def _key_element(item: JSON, keys: list[str]) -> str:
    chosen = {k: item[k] for k in sorted(keys) if k in item}
    return "k:" + json.dumps(chosen, separators=(",", ":"))


def _value_element(value: Any) -> str:
    return "v:" + json.dumps(value, separators=(",", ":"))


def _matches(item: Any, keys: JSON) -> bool:
    return isinstance(item, dict) and all(item.get(k) == v for k, v in keys.items())


# ----------------------------------------------------------------------------------------- field sets


def fields_of(obj: JSON, schema: JSON) -> set[Path]:
    """The field set of an object (``schema`` from ``object_schema``), without server-owned fields."""
    out: set[Path] = set()
    for key, value in obj.items():
        if key in ("apiVersion", "kind"):
            continue
        if key == "metadata" and isinstance(value, dict):
            meta = {k: v for k, v in value.items() if k not in _SERVER_META}
            if meta:
                _walk(meta, METADATA_SCHEMA, ("f:metadata",), out)
            continue
        _walk(value, _child(schema, key), ("f:" + key,), out)
    return out


def _walk(value: Any, schema: JSON | None, prefix: Path, out: set[Path]) -> None:
    atomic_map = isinstance(schema, dict) and schema.get("x-kubernetes-map-type") == "atomic"
    if isinstance(value, dict) and value and not atomic_map:
        for key, child in value.items():
            _walk(child, _child(schema, key), (*prefix, "f:" + key), out)
        return
    if isinstance(value, list):
        kind, keys = _list_type(schema)
        if kind == "map":
            for item in value:
                if isinstance(item, dict):
                    path = (*prefix, _key_element(item, keys))
                    out.add(path)
                    for key, child in item.items():
                        _walk(child, _child(_items(schema), key), (*path, "f:" + key), out)
            return
        if kind == "set":
            out.update((*prefix, _value_element(item)) for item in value)
            return
    out.add(prefix)


def _value_at(obj: Any, path: Path) -> Any:
    current = obj
    for element in path:
        kind, _, rest = element.partition(":")
        if kind == "f":
            if not isinstance(current, dict) or rest not in current:
                return _MISSING
            current = current[rest]
        elif kind == "k":
            keys = json.loads(rest)
            found = [item for item in current if _matches(item, keys)] if isinstance(current, list) else []
            if not found:
                return _MISSING
            current = found[0]
        else:
            value = json.loads(rest)
            return value if isinstance(current, list) and value in current else _MISSING
    return current


def _differs(left: Any, right: Any, path: Path) -> bool:
    """Whether the field at ``path`` differs; for a list item only whether it is there."""
    a, b = _value_at(left, path), _value_at(right, path)
    if path and path[-1][:2] in ("k:", "v:"):
        return (a is _MISSING) != (b is _MISSING)
    return bool(a is _MISSING or b is _MISSING or a != b)


def readable(path: Path) -> str:
    """``.spec.ports[name="a"].port``, as field paths appear in conflict messages."""
    parts: list[str] = []
    for element in path:
        kind, _, rest = element.partition(":")
        if kind == "f":
            parts.append("." + rest)
        elif kind == "k":
            keys = json.loads(rest)
            parts.append("[" + ",".join(f"{k}={json.dumps(v)}" for k, v in keys.items()) + "]")
        else:
            parts.append(f"[={rest}]")
    return "".join(parts)


# ----------------------------------------------------------------------------------------- fieldsV1


def encode(paths: Iterable[Path]) -> JSON:
    """A field set as ``fieldsV1`` (nested ``f:``/``k:``/``v:`` keys; ``.`` marks a member with children)."""
    root: JSON = {}
    members = sorted(set(paths))
    for path in members:
        node = root
        for element in path:
            node = node.setdefault(element, {})
    for path in members:
        node = root
        for element in path:
            node = node[element]
        if node and "." not in node:
            node["."] = {}
    return root


def decode(tree: Any, prefix: Path = ()) -> set[Path]:
    out: set[Path] = set()
    if not isinstance(tree, dict):
        return out
    for key, child in tree.items():
        if key == ".":
            out.add(prefix)
        elif isinstance(child, dict) and child:
            out |= decode(child, (*prefix, key))
        else:
            out.add((*prefix, key))
    return out


def _entry_key(entry: JSON) -> tuple[str, str, str]:
    return (str(entry.get("manager", "")), str(entry.get("operation", "")), str(entry.get("subresource", "")))


def _entry(manager: str, operation: str, api_version: str, now: str, sub: str, paths: set[Path]) -> JSON:
    entry: JSON = {
        "manager": manager,
        "operation": operation,
        "apiVersion": api_version,
        "time": now,
        "fieldsType": "FieldsV1",
        "fieldsV1": encode(paths),
    }
    if sub:
        entry["subresource"] = sub
    return entry


def _owned(managed: Any) -> list[tuple[JSON, set[Path]]]:
    entries = managed if isinstance(managed, list) else []
    return [(e, decode(e.get("fieldsV1"))) for e in entries if isinstance(e, dict) and e.get("manager")]


def _rebuild(owned: list[tuple[JSON, set[Path]]], changed: set[tuple[str, str, str]]) -> list[JSON]:
    """Entries with their new sets; an entry whose set became empty is dropped."""
    out: list[JSON] = []
    for entry, paths in owned:
        if not paths:
            continue
        if _entry_key(entry) in changed:
            entry = {**entry, "fieldsV1": encode(paths)}
        out.append(entry)
    return out


# ----------------------------------------------------------------------------------------- update


def record_update(
    old: JSON | None,
    new: JSON,
    *,
    manager: str,
    schema: JSON,
    api_version: str,
    now: str,
    subresource: str = "",
) -> list[JSON]:
    """``new``'s managedFields after an update (or create) by ``manager``: it owns what it changed."""
    owned = _owned((old or {}).get("metadata", {}).get("managedFields"))
    new_set = fields_of(new, schema)
    old_set = fields_of(old, schema) if old is not None else set()
    changed = {
        p for p in new_set if p not in old_set or (p[-1][:2] not in ("k:", "v:") and _differs(old, new, p))
    }
    removed = old_set - new_set
    key = (manager, UPDATE, subresource)
    touched: set[tuple[str, str, str]] = set()
    mine: set[Path] | None = None
    for entry, paths in owned:
        before = set(paths)
        paths -= removed
        if _entry_key(entry) == key:
            paths |= changed
            mine = paths
        else:
            paths -= changed
        if paths != before:
            touched.add(_entry_key(entry))
    result = _rebuild(owned, touched)
    if mine is None and changed:
        result.append(_entry(manager, UPDATE, api_version, now, subresource, changed))
    elif mine is not None and key in touched:
        result = [{**e, "time": now} if _entry_key(e) == key else e for e in result]
    return result


# ----------------------------------------------------------------------------------------- apply


def apply(
    live: JSON | None,
    applied: JSON,
    *,
    manager: str,
    schema: JSON,
    force: bool,
    api_version: str,
    now: str,
    subresource: str = "",
    scope: Path | None = None,
) -> tuple[JSON, list[JSON]]:
    """(merged object, its managedFields) for ``manager`` applying ``applied`` to ``live`` (None: create).

    ``scope`` limits the applied field set to one top-level field (``("f:status",)`` for the status
    subresource); fields outside it are neither owned nor merged. Raises ``ApplyConflict``.
    """
    applied_set = fields_of(applied, schema)
    if scope is not None:
        applied_set = {p for p in applied_set if p[: len(scope)] == scope}
    owned = _owned((live or {}).get("metadata", {}).get("managedFields"))
    key = (manager, APPLY, subresource)
    conflicts: list[Conflict] = []
    for entry, paths in owned:
        if _entry_key(entry) == key:
            continue
        for path in sorted(paths & applied_set):
            if live is not None and _differs(live, applied, path):
                conflicts.append(
                    Conflict(
                        str(entry["manager"]),
                        str(entry.get("operation", "")),
                        str(entry.get("apiVersion", "")),
                        path,
                    )
                )
    if conflicts and not force:
        raise ApplyConflict(conflicts)
    taken = {c.path for c in conflicts}
    touched: set[tuple[str, str, str]] = set()
    previous: set[Path] = set()
    others: set[Path] = set()
    mine = False
    for entry, paths in owned:
        if _entry_key(entry) == key:
            previous = set(paths)
            paths.clear()
            paths |= applied_set
            mine = True
            continue
        if paths & taken:
            paths -= taken
            touched.add(_entry_key(entry))
        others |= paths
    merged = copy.deepcopy(live) if live is not None else {}
    kept = applied_set | others
    for path in sorted(previous - kept, key=len):  # a list item goes before its fields
        if not any(p[: len(path)] == path for p in kept):
            _remove(merged, path)
            _prune(merged, path[:-1])
    merged = _merge(merged, _scoped(applied, scope), schema)
    if previous != applied_set:
        touched.add(key)
    result = _rebuild(owned, touched)
    if not mine:
        result.append(_entry(manager, APPLY, api_version, now, subresource, applied_set))
    elif key in touched:
        result = [{**e, "time": now} if _entry_key(e) == key else e for e in result]
    return merged, result


def _scoped(applied: JSON, scope: Path | None) -> JSON:
    if scope is None:
        return applied
    top = scope[0][2:]
    keep = {k: v for k, v in applied.items() if k in ("apiVersion", "kind", top)}
    if isinstance(applied.get("metadata"), dict):
        keep["metadata"] = {k: v for k, v in applied["metadata"].items() if k in ("name", "namespace")}
    return keep


def _remove(obj: Any, path: Path) -> None:
    parent = _value_at(obj, path[:-1])
    kind, _, rest = path[-1].partition(":")
    if kind == "f" and isinstance(parent, dict):
        parent.pop(rest, None)
    elif kind == "k" and isinstance(parent, list):
        keys = json.loads(rest)
        parent[:] = [item for item in parent if not _matches(item, keys)]
    elif kind == "v" and isinstance(parent, list):
        value = json.loads(rest)
        parent[:] = [item for item in parent if item != value]


def _prune(obj: Any, path: Path) -> None:
    """Drop the containers along ``path`` that a removal left empty (like the real server's removal)."""
    while len(path) > 1 and _value_at(obj, path) in ({}, []):
        _remove(obj, path)
        path = path[:-1]


def _merge(live: Any, applied: Any, schema: JSON | None) -> Any:
    atomic_map = isinstance(schema, dict) and schema.get("x-kubernetes-map-type") == "atomic"
    if isinstance(applied, dict) and isinstance(live, dict) and not atomic_map:
        out = dict(live)
        for key, value in applied.items():
            out[key] = _merge(live.get(key), value, _child(schema, key))
        return out
    if isinstance(applied, list) and isinstance(live, list):
        kind, keys = _list_type(schema)
        if kind == "map":
            merged = list(live)
            for item in applied:
                if not isinstance(item, dict):
                    continue
                wanted = {k: item[k] for k in keys if k in item}
                index = next((i for i, cur in enumerate(merged) if _matches(cur, wanted)), None)
                if index is None:
                    merged.append(copy.deepcopy(item))
                else:
                    merged[index] = _merge(merged[index], item, _items(schema))
            return merged
        if kind == "set":
            return list(live) + [copy.deepcopy(v) for v in applied if v not in live]
    return copy.deepcopy(applied)
