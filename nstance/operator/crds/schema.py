"""Turn a pydantic model into a Kubernetes *structural* OpenAPI v3 schema for a CRD.

Responsible for: taking pydantic's JSON schema of a model (by alias, validation mode) and rewriting it
into the subset the Kubernetes API server accepts for CustomResourceDefinitions: every ``$ref`` inlined
(no ``$defs``), optional fields expressed by leaving them out of ``required`` (never ``anyOf`` with
``null``), no ``title``/``default``, bounds implied by ``format: int32``/``int64`` not repeated, and
descriptions kept. It refuses any construct it does not know rather than emit a schema the server
would reject or interpret differently.

Must not: import kopf, kubernetes_asyncio, grpc or nstance.rpc, or know about particular kinds (that is
``manifests.py``).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

JSONSchema = dict[str, Any]

_FORMAT_BOUNDS = {
    "int32": (-(2**31), 2**31 - 1),
    "int64": (-(2**63), 2**63 - 1),
}

# Keys copied through unchanged (after their values are converted where they hold schemas).
_PLAIN_KEYS = frozenset(
    {
        "type",
        "format",
        "description",
        "required",
        "enum",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "minItems",
        "maxItems",
        "minLength",
        "maxLength",
        "minProperties",
        "maxProperties",
        "pattern",
        "uniqueItems",
        "x-kubernetes-list-type",
        "x-kubernetes-list-map-keys",
        "x-kubernetes-map-type",
        "x-kubernetes-preserve-unknown-fields",
        "x-kubernetes-int-or-string",
        "x-kubernetes-embedded-resource",
    }
)
# Keys dropped: presentation only, or defaults we do not want the API server to apply.
_DROPPED_KEYS = frozenset({"title", "default", "examples"})

_KNOWN_TYPES = frozenset({"object", "array", "string", "integer", "number", "boolean"})


class SchemaError(ValueError):
    """A model uses a construct that has no faithful structural-schema form."""


def structural_schema(model: type[BaseModel]) -> JSONSchema:
    """The structural OpenAPI v3 schema of ``model`` (camelCase property names)."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    definitions: dict[str, JSONSchema] = raw.get("$defs", {})
    return _convert(raw, definitions, path=model.__name__, resolving=())


def _resolve(ref: str, definitions: dict[str, JSONSchema], path: str) -> tuple[str, JSONSchema]:
    prefix = "#/$defs/"
    if not ref.startswith(prefix):
        raise SchemaError(f"{path}: unsupported $ref {ref!r} (only local #/$defs/ references)")
    name = ref[len(prefix) :]
    if name not in definitions:
        raise SchemaError(f"{path}: $ref {ref!r} names no definition")
    return name, definitions[name]


def _strip_null(node: JSONSchema, path: str) -> JSONSchema:
    """Rewrite ``anyOf: [X, {type: null}]`` (pydantic's Optional) into X; refuse any other anyOf."""
    options = node["anyOf"]
    non_null = [option for option in options if option != {"type": "null"}]
    if len(non_null) != 1 or len(options) != 2:
        raise SchemaError(
            f"{path}: anyOf {options!r} is not a structural schema; use one type (Optional[X] is fine)"
        )
    merged = {key: value for key, value in node.items() if key != "anyOf"}
    inner = dict(non_null[0])
    # Outer keys (the field's description) win over the inner type's own.
    inner.update(merged)
    return inner


def _convert(
    node: JSONSchema, definitions: dict[str, JSONSchema], path: str, resolving: tuple[str, ...]
) -> JSONSchema:
    if "anyOf" in node:
        node = _strip_null(node, path)
    if "allOf" in node:
        parts = node["allOf"]
        if len(parts) != 1:
            raise SchemaError(f"{path}: allOf with {len(parts)} parts is not supported")
        node = {**parts[0], **{k: v for k, v in node.items() if k != "allOf"}}
    if "$ref" in node:
        name, target = _resolve(node["$ref"], definitions, path)
        if name in resolving:
            raise SchemaError(f"{path}: recursive model {name!r} cannot be inlined into a CRD schema")
        overrides = {k: v for k, v in node.items() if k != "$ref"}
        return _convert({**target, **overrides}, definitions, path, (*resolving, name))
    if "const" in node:
        node = {**{k: v for k, v in node.items() if k != "const"}, "enum": [node["const"]]}

    out: JSONSchema = {}
    for key, value in node.items():
        if key in _DROPPED_KEYS or key == "$defs":
            continue
        if key == "properties":
            out[key] = {
                name: _convert(child, definitions, f"{path}.{name}", resolving)
                for name, child in value.items()
            }
        elif key == "items":
            if not isinstance(value, dict):
                raise SchemaError(f"{path}: tuple-style items are not supported")
            out[key] = _convert(value, definitions, f"{path}[]", resolving)
        elif key == "additionalProperties":
            if value is True:
                out["x-kubernetes-preserve-unknown-fields"] = True
            elif value is False:
                continue  # the API server prunes unknown fields already
            else:
                out[key] = _convert(value, definitions, f"{path}.*", resolving)
        elif key in _PLAIN_KEYS:
            out[key] = value
        else:
            raise SchemaError(f"{path}: JSON-schema key {key!r} has no structural-schema equivalent")

    if "enum" in out and "type" not in out:
        out["type"] = _enum_type(out["enum"], path)
    kind = out.get("type")
    if kind not in _KNOWN_TYPES:
        raise SchemaError(f"{path}: every node needs one type of {sorted(_KNOWN_TYPES)}, got {kind!r}")
    bounds = _FORMAT_BOUNDS.get(out.get("format", ""))
    if bounds is not None:
        if out.get("minimum") == bounds[0]:
            del out["minimum"]
        if out.get("maximum") == bounds[1]:
            del out["maximum"]
    if kind == "object" and "properties" not in out and "additionalProperties" not in out:
        # A free-form object must say so, or the API server prunes everything inside it.
        out["x-kubernetes-preserve-unknown-fields"] = True
    if "required" in out:
        out["required"] = sorted(out["required"])
    # Stable output: keys sorted, properties kept in the model's declaration order.
    return {key: out[key] for key in sorted(out)}


def _enum_type(values: list[Any], path: str) -> str:
    types = {type(value) for value in values}
    if types == {str}:
        return "string"
    if types == {int}:
        return "integer"
    if types == {bool}:
        return "boolean"
    raise SchemaError(f"{path}: enum values {values!r} must all be strings, integers or booleans")


def schema_problems(schema: JSONSchema, path: str = "") -> list[str]:
    """Reasons ``schema`` is not structural (empty when it is): refs, combinators, nodes without a type."""
    problems: list[str] = []
    for key in ("$ref", "$defs", "anyOf", "oneOf", "allOf", "not", "nullable"):
        if key in schema:
            problems.append(f"{path or '<root>'}: has {key}")
    if schema.get("type") not in _KNOWN_TYPES and not schema.get("x-kubernetes-int-or-string"):
        problems.append(f"{path or '<root>'}: has no type")
    for name, child in schema.get("properties", {}).items():
        problems.extend(schema_problems(child, f"{path}.{name}"))
    if isinstance(schema.get("items"), dict):
        problems.extend(schema_problems(schema["items"], f"{path}[]"))
    if isinstance(schema.get("additionalProperties"), dict):
        problems.extend(schema_problems(schema["additionalProperties"], f"{path}.*"))
    return problems
