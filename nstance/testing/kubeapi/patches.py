"""Patch algorithms: JSON merge patch (RFC 7386), JSON patch (RFC 6902) and a simplified strategic merge.

Strategic merge patch is treated as a merge patch after dropping the ``$``-directives
(``$setElementOrder/...``, ``$retainKeys``, ``$patch``): lists are replaced, not merged by key (the real
server merges containers by ``name`` and conditions by ``type``). Pure functions on JSON values; failures
raise ``PatchError`` with a message for the client. No I/O.
"""

from __future__ import annotations

import copy
from typing import Any


class PatchError(Exception):
    """A patch could not be applied; ``test_failed`` marks a failed RFC 6902 ``test`` operation."""

    def __init__(self, message: str, *, test_failed: bool = False, malformed: bool = False) -> None:
        super().__init__(message)
        self.test_failed = test_failed
        self.malformed = malformed


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, ``null`` deletes a key, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """Merge patch after removing strategic-merge directives (see the module docstring)."""
    return merge_patch(target, _strip_directives(patch))


def _strip_directives(value: Any) -> Any:
    if isinstance(value, dict):
        if value.get("$patch") == "delete":
            return None
        return {k: _strip_directives(v) for k, v in value.items() if not str(k).startswith("$")}
    if isinstance(value, list):
        return [
            _strip_directives(v) for v in value if not (isinstance(v, dict) and v.get("$patch") == "delete")
        ]
    return value


def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def _parse_pointer(pointer: Any) -> list[str]:
    if not isinstance(pointer, str):
        raise PatchError(f"json patch path must be a string, got {pointer!r}", malformed=True)
    if pointer == "":
        return []
    if not pointer.startswith("/"):
        raise PatchError(f"invalid JSON pointer {pointer!r}: must start with '/'", malformed=True)
    return [_unescape(part) for part in pointer[1:].split("/")]


def _index(container: list[Any], token: str, pointer: str, *, for_insert: bool) -> int:
    if token == "-" and for_insert:
        return len(container)
    if not token.isdigit() or (len(token) > 1 and token.startswith("0")):
        raise PatchError(f"invalid array index {token!r} in {pointer}")
    index = int(token)
    limit = len(container) if for_insert else len(container) - 1
    if index > limit:
        raise PatchError(f"array index {index} out of bounds in {pointer}")
    return index


def _parent(doc: Any, parts: list[str], pointer: str) -> Any:
    current = doc
    for part in parts[:-1]:
        if isinstance(current, dict):
            if part not in current:
                raise PatchError(f"doc is missing path: {pointer}: missing value")
            current = current[part]
        elif isinstance(current, list):
            current = current[_index(current, part, pointer, for_insert=False)]
        else:
            raise PatchError(f"doc is missing path: {pointer}: missing value")
    return current


def _get(doc: Any, pointer: str) -> Any:
    parts = _parse_pointer(pointer)
    if not parts:
        return doc
    parent = _parent(doc, parts, pointer)
    last = parts[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise PatchError(f"doc is missing path: {pointer}: missing value")
        return parent[last]
    if isinstance(parent, list):
        return parent[_index(parent, last, pointer, for_insert=False)]
    raise PatchError(f"doc is missing path: {pointer}: missing value")


def _add(doc: Any, pointer: str, value: Any) -> Any:
    parts = _parse_pointer(pointer)
    if not parts:
        return value
    parent = _parent(doc, parts, pointer)
    last = parts[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        parent.insert(_index(parent, last, pointer, for_insert=True), value)
    else:
        raise PatchError(f"doc is missing path: {pointer}: missing value")
    return doc


def _remove(doc: Any, pointer: str) -> tuple[Any, Any]:
    parts = _parse_pointer(pointer)
    if not parts:
        raise PatchError("cannot remove the whole document")
    parent = _parent(doc, parts, pointer)
    last = parts[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise PatchError(f"unable to remove nonexistent key: {last}: missing value")
        return doc, parent.pop(last)
    if isinstance(parent, list):
        return doc, parent.pop(_index(parent, last, pointer, for_insert=False))
    raise PatchError(f"doc is missing path: {pointer}: missing value")


def _json_equal(left: Any, right: Any) -> bool:
    if isinstance(left, bool) or isinstance(right, bool):
        return type(left) is type(right) and left == right
    if isinstance(left, dict) and isinstance(right, dict):
        return left.keys() == right.keys() and all(_json_equal(left[k], right[k]) for k in left)
    if isinstance(left, list) and isinstance(right, list):
        return len(left) == len(right) and all(_json_equal(a, b) for a, b in zip(left, right, strict=True))
    if isinstance(left, int | float) and isinstance(right, int | float):
        return left == right
    return type(left) is type(right) and bool(left == right)


def json_patch(document: Any, operations: Any) -> Any:
    """RFC 6902 on a deep copy of ``document``; all-or-nothing."""
    if not isinstance(operations, list):
        raise PatchError("json patch must be a list of operations", malformed=True)
    doc = copy.deepcopy(document)
    for op in operations:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise PatchError(
                f"invalid json patch operation {op!r}: 'op' and 'path' are required", malformed=True
            )
        kind = op["op"]
        path = op["path"]
        if kind in ("add", "replace", "test") and "value" not in op:
            raise PatchError(f"json patch {kind} operation on {path} has no 'value'", malformed=True)
        if kind == "add":
            doc = _add(doc, path, copy.deepcopy(op["value"]))
        elif kind == "remove":
            doc, _removed = _remove(doc, path)
        elif kind == "replace":
            _get(doc, path)  # must exist
            doc, _old = _remove(doc, path) if _parse_pointer(path) else (doc, None)
            doc = _add(doc, path, copy.deepcopy(op["value"]))
        elif kind in ("move", "copy"):
            source = op.get("from")
            if not isinstance(source, str):
                raise PatchError(f"json patch {kind} operation on {path} has no 'from'", malformed=True)
            if kind == "move":
                if path.startswith(source + "/"):
                    raise PatchError(f"cannot move {source} into its own child {path}")
                doc, value = _remove(doc, source)
            else:
                value = copy.deepcopy(_get(doc, source))
            doc = _add(doc, path, value)
        elif kind == "test":
            try:
                actual = _get(doc, path)
            except PatchError as exc:
                raise PatchError(f"testing value {path} failed: {exc}", test_failed=True) from None
            if not _json_equal(actual, op["value"]):
                raise PatchError(f"testing value {path} failed: test failed", test_failed=True)
        else:
            raise PatchError(f"unsupported json patch operation {kind!r}", malformed=True)
    return doc
