"""Label and field selectors: parsing the query-string forms and matching objects against them.

Supports the label operators ``=``, ``==``, ``!=``, ``in``, ``notin``, existence (``key``) and
non-existence (``!key``); field selectors with ``=``, ``==`` and ``!=`` on the fields a resource type
declares; and ``metav1.LabelSelector`` objects (``matchLabels`` / ``matchExpressions``) as used by
webhooks and PodDisruptionBudgets. Pure functions: no I/O, no object storage.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from nstance.testing.kubeapi import errors

JSON = dict[str, Any]


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!exists"
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        if self.op == "exists":
            return present
        if self.op == "!exists":
            return not present
        if self.op in ("=", "in"):
            return present and labels[self.key] in self.values
        # "!=" and "notin" match objects without the label too, like the real server.
        return not present or labels[self.key] not in self.values


Selector = tuple[Requirement, ...]


def _split_top_level(text: str) -> list[str]:
    parts: list[str] = []
    depth = 0
    current = ""
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return [p.strip() for p in parts if p.strip()]


def parse_label_selector(text: str | None) -> Selector:
    """Parse ``a=b,c!=d,e in (x,y),!f``; raise a 400 APIError naming the bad requirement."""
    if not text:
        return ()
    requirements: list[Requirement] = []
    for part in _split_top_level(text):
        requirements.append(_parse_requirement(part))
    return tuple(requirements)


def _parse_requirement(part: str) -> Requirement:
    def fail(why: str) -> errors.APIError:
        return errors.bad_request(f"unable to parse requirement: {why}: {part!r}")

    lowered = part.replace("\t", " ")
    for word, op in ((" notin ", "notin"), (" in ", "in")):
        if word in lowered:
            key, _, rest = lowered.partition(word)
            rest = rest.strip()
            if not (rest.startswith("(") and rest.endswith(")")):
                raise fail("values must be in parentheses")
            values = frozenset(v.strip() for v in rest[1:-1].split(",") if v.strip())
            return Requirement(_check_key(key.strip(), fail), op, values)
    for token, op in (("!=", "!="), ("==", "="), ("=", "=")):
        if token in part:
            key, _, value = part.partition(token)
            value = value.strip()
            if any(c in value for c in "=!()"):
                raise fail("invalid value")
            return Requirement(_check_key(key.strip(), fail), op, frozenset({value}))
    if part.startswith("!"):
        return Requirement(_check_key(part[1:].strip(), fail), "!exists")
    return Requirement(_check_key(part, fail), "exists")


def _check_key(key: str, fail: Callable[[str], errors.APIError]) -> str:
    if not key or any(c in key for c in " =!(),"):
        raise fail("invalid label key")
    return key


def labels_of(obj: JSON) -> dict[str, str]:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return {str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {}


def matches_labels(selector: Selector, obj: JSON) -> bool:
    labels = labels_of(obj)
    return all(req.matches(labels) for req in selector)


@dataclass(frozen=True)
class FieldRequirement:
    path: str
    value: str
    negate: bool


FieldSelector = tuple[FieldRequirement, ...]


def parse_field_selector(text: str | None, allowed: tuple[str, ...], custom: bool = False) -> FieldSelector:
    """Parse ``metadata.name=x,spec.nodeName!=y``; only fields in ``allowed`` are accepted (400 otherwise)."""
    if not text:
        return ()
    result: list[FieldRequirement] = []
    for part in _split_top_level(text):
        for token, negate in (("!=", True), ("==", False), ("=", False)):
            if token in part:
                path, _, value = part.partition(token)
                path = path.strip()
                result_negate = negate
                break
        else:
            raise errors.bad_request(f"invalid selector: '{text}'; can't understand '{part}'")
        if path not in allowed:
            listed = '", "'.join(allowed)
            message = (
                f'"{path}" is not a known field selector: only "{listed}"'
                if custom
                else f"field label not supported: {path}"
            )
            raise errors.bad_request(message)
        result.append(FieldRequirement(path, value.strip(), result_negate))
    return tuple(result)


def field_value(obj: JSON, path: str) -> str:
    current: Any = obj
    for part in path.split("."):
        if not isinstance(current, dict):
            return ""
        current = current.get(part)
    if current is None:
        return ""
    if isinstance(current, bool):
        return "true" if current else "false"
    if isinstance(current, dict):
        # ``source`` on core events is an object; the real server selects on source.component.
        return str(current.get("component", ""))
    return str(current)


def matches_fields(selector: FieldSelector, obj: JSON) -> bool:
    for req in selector:
        equal = field_value(obj, req.path) == req.value
        if equal == req.negate:
            return False
    return True


def selector_from_object(selector: Any, where: str) -> Selector:
    """Turn a ``metav1.LabelSelector`` (``matchLabels``/``matchExpressions``) into requirements.

    ``None`` (absent) selects everything; a malformed selector raises a 400 naming ``where``.
    """
    if selector is None:
        return ()
    if not isinstance(selector, dict):
        raise errors.bad_request(f"{where}: a label selector must be an object")
    requirements: list[Requirement] = []
    for key, value in (selector.get("matchLabels") or {}).items():
        requirements.append(Requirement(str(key), "=", frozenset({str(value)})))
    ops = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!exists"}
    for expr in selector.get("matchExpressions") or []:
        if not isinstance(expr, dict) or expr.get("operator") not in ops or not expr.get("key"):
            raise errors.bad_request(f"{where}: invalid matchExpressions entry {expr!r}")
        values = frozenset(str(v) for v in expr.get("values") or [])
        requirements.append(Requirement(str(expr["key"]), ops[expr["operator"]], values))
    return tuple(requirements)
