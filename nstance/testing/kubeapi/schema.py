"""CRD structural-schema handling for custom resources: defaulting, pruning and validation.

Given a CRD version's ``openAPIV3Schema`` this applies ``default`` values, drops fields the schema does not
know (unless ``x-kubernetes-preserve-unknown-fields``), drops ``null`` values of non-``nullable`` fields, and
checks ``required``, ``type``, ``enum``, ``minimum``/``maximum`` (with ``exclusive*``),
``minItems``/``maxItems``, ``minLength``/``maxLength``, ``pattern``, ``x-kubernetes-int-or-string``,
``additionalProperties`` and ``x-kubernetes-embedded-resource``. Errors use the real server's field paths
and wording. It does not evaluate CEL (``x-kubernetes-validations``) or ``format``. Pure: no I/O.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from nstance.testing.kubeapi import errors

JSON = dict[str, Any]
_METADATA_KEYS = ("apiVersion", "kind", "metadata")


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _type_ok(value: Any, expected: str) -> bool:
    if expected == "object":
        return isinstance(value, dict)
    if expected == "array":
        return isinstance(value, list)
    if expected == "string":
        return isinstance(value, str)
    if expected == "boolean":
        return isinstance(value, bool)
    if expected == "integer":
        return (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, float) and value.is_integer()
        )
    if expected == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    return True


def apply_schema(obj: JSON, schema: JSON | None) -> tuple[JSON, list[errors.FieldError]]:
    """Return the defaulted + pruned object and the validation errors (empty when valid)."""
    if not schema:
        return obj, []
    result = copy.deepcopy(obj)
    problems: list[errors.FieldError] = []
    properties = schema.get("properties") or {}
    preserve = bool(schema.get("x-kubernetes-preserve-unknown-fields"))
    for key in list(result):
        if key in _METADATA_KEYS:
            continue
        if key in properties:
            value = _walk(result[key], properties[key], key, problems)
            if value is _DROP:
                del result[key]
            else:
                result[key] = value
        elif not preserve:
            del result[key]
    for key, sub in properties.items():
        if key in _METADATA_KEYS or key in result:
            continue
        if isinstance(sub, dict) and "default" in sub:
            result[key] = _walk(copy.deepcopy(sub["default"]), sub, key, problems)
    for key in schema.get("required") or []:
        if key not in result:
            problems.append(errors.required(key))
    return result, problems


class _Drop:
    """Marker: the value must be removed from its parent (a pruned ``null``)."""


_DROP: Any = _Drop()


def _child(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _walk(value: Any, schema: Any, path: str, problems: list[errors.FieldError]) -> Any:
    if not isinstance(schema, dict):
        return value
    if value is None:
        return None if schema.get("nullable") else _DROP
    if schema.get("x-kubernetes-int-or-string"):
        if not (isinstance(value, str) or _type_ok(value, "integer")):
            problems.append(
                errors.type_invalid(
                    path,
                    _type_name(value),
                    f"{path} in body must be of type integer-or-string: {_type_name(value)!r}",
                )
            )
            return value
        return value
    expected = schema.get("type")
    if isinstance(expected, str) and not _type_ok(value, expected):
        problems.append(
            errors.type_invalid(
                path, _type_name(value), f'{path} in body must be of type {expected}: "{_type_name(value)}"'
            )
        )
        return value
    if isinstance(value, dict):
        value = _walk_object(value, schema, path, problems)
    elif isinstance(value, list):
        value = _walk_array(value, schema, path, problems)
    _check_scalar(value, schema, path, problems)
    return value


def _walk_object(value: JSON, schema: JSON, path: str, problems: list[errors.FieldError]) -> JSON:
    properties = schema.get("properties") or {}
    additional = schema.get("additionalProperties")
    preserve = bool(schema.get("x-kubernetes-preserve-unknown-fields"))
    embedded = bool(schema.get("x-kubernetes-embedded-resource"))
    result: JSON = {}
    for key, item in value.items():
        if key in properties:
            walked = _walk(item, properties[key], _child(path, key), problems)
        elif isinstance(additional, dict):
            walked = _walk(item, additional, f"{path}[{key}]", problems)
        elif additional is True or preserve or (embedded and key in _METADATA_KEYS):
            walked = item
        else:
            continue  # pruned: unknown field
        if walked is not _DROP:
            result[key] = walked
    for key, sub in properties.items():
        if key not in result and isinstance(sub, dict) and "default" in sub:
            result[key] = _walk(copy.deepcopy(sub["default"]), sub, _child(path, key), problems)
    for key in schema.get("required") or []:
        if key not in result:
            problems.append(errors.required(_child(path, key)))
    min_props = schema.get("minProperties")
    if isinstance(min_props, int) and len(result) < min_props:
        problems.append(
            errors.invalid(path, len(result), f"{path} in body should have at least {min_props} properties")
        )
    return result


def _walk_array(value: list[Any], schema: JSON, path: str, problems: list[errors.FieldError]) -> list[Any]:
    items = schema.get("items")
    result = []
    for index, item in enumerate(value):
        walked = _walk(item, items, f"{path}[{index}]", problems) if isinstance(items, dict) else item
        result.append(None if walked is _DROP else walked)
    min_items = schema.get("minItems")
    max_items = schema.get("maxItems")
    if isinstance(min_items, int) and len(result) < min_items:
        problems.append(
            errors.invalid(path, len(result), f"{path} in body should have at least {min_items} items")
        )
    if isinstance(max_items, int) and len(result) > max_items:
        problems.append(
            errors.FieldError(
                path, "FieldValueTooMany", f"Too many: {len(result)}: must have at most {max_items} items"
            )
        )
    if schema.get("x-kubernetes-list-type") == "set" and len({repr(v) for v in result}) != len(result):
        problems.append(errors.FieldError(path, "FieldValueDuplicate", "Duplicate value"))
    return result


def _check_scalar(value: Any, schema: JSON, path: str, problems: list[errors.FieldError]) -> None:
    enum = schema.get("enum")
    if isinstance(enum, list) and value not in enum:
        problems.append(errors.not_supported(path, value, enum))
    if isinstance(value, int | float) and not isinstance(value, bool):
        minimum = schema.get("minimum")
        maximum = schema.get("maximum")
        if isinstance(minimum, int | float):
            if schema.get("exclusiveMinimum") and value <= minimum:
                problems.append(
                    errors.invalid(path, value, f"{path} in body should be greater than {minimum}")
                )
            elif value < minimum:
                problems.append(
                    errors.invalid(
                        path, value, f"{path} in body should be greater than or equal to {minimum}"
                    )
                )
        if isinstance(maximum, int | float):
            if schema.get("exclusiveMaximum") and value >= maximum:
                problems.append(errors.invalid(path, value, f"{path} in body should be less than {maximum}"))
            elif value > maximum:
                problems.append(
                    errors.invalid(path, value, f"{path} in body should be less than or equal to {maximum}")
                )
    if isinstance(value, str):
        min_length = schema.get("minLength")
        max_length = schema.get("maxLength")
        pattern = schema.get("pattern")
        if isinstance(min_length, int) and len(value) < min_length:
            problems.append(
                errors.invalid(path, value, f"{path} in body should be at least {min_length} chars long")
            )
        if isinstance(max_length, int) and len(value) > max_length:
            problems.append(
                errors.FieldError(
                    path, "FieldValueTooLong", f"Too long: may not be more than {max_length} bytes"
                )
            )
        if isinstance(pattern, str):
            try:
                matched = re.search(pattern, value) is not None
            except re.error:
                matched = True  # a pattern Python cannot compile is not checked
            if not matched:
                problems.append(errors.invalid(path, value, f"{path} in body should match '{pattern}'"))


def unknown_fields(obj: Any, schema: JSON | None) -> list[str]:
    """Paths (``spec.extra``, ``spec.items[0].x``) of the fields in ``obj`` that pruning would drop.

    What a real server reports for ``fieldValidation=Strict`` (an error) or ``Warn`` (warnings).
    """
    if not schema or not isinstance(obj, dict):
        return []
    found: list[str] = []
    top = {k: v for k, v in obj.items() if k not in _METADATA_KEYS}
    _unknown(top, schema, "", found)
    return found


def _unknown(value: Any, schema: Any, path: str, found: list[str]) -> None:
    if not isinstance(schema, dict) or value is None:
        return
    if isinstance(value, list):
        items = schema.get("items")
        for index, item in enumerate(value):
            _unknown(item, items, f"{path}[{index}]", found)
        return
    if not isinstance(value, dict) or schema.get("x-kubernetes-preserve-unknown-fields"):
        return
    properties = schema.get("properties") or {}
    additional = schema.get("additionalProperties")
    embedded = bool(schema.get("x-kubernetes-embedded-resource"))
    for key, item in value.items():
        if key in properties:
            _unknown(item, properties[key], _child(path, key), found)
        elif isinstance(additional, dict):
            _unknown(item, additional, f"{path}[{key}]", found)
        elif not (additional is True or (embedded and key in _METADATA_KEYS)):
            found.append(_child(path, key))
