"""Whether a written object is of the type its path serves, answered as kube-apiserver answers.

kube-apiserver decodes a request body into the type of the resource it was sent to, so a body whose
``kind`` or ``apiVersion`` names another type is refused and nothing is stored (measured on a real
v1.34 server, ``tests/contract/test_kubeapi_contract.py``):

- a built-in resource takes a body without ``kind`` or ``apiVersion`` (the path says them); another
  kind, or a version the group does not serve, is a 400 "cannot be handled as a ConfigMap";
- a custom resource needs both: without ``kind`` a 400 "Object 'Kind' is missing", another
  ``apiVersion`` (or none) a 400 "the API version in the data ... does not match", another kind a
  422 Invalid on the field ``kind``;
- a merge or JSON patch that changes ``kind`` or ``apiVersion`` is a 422: on a custom resource on the
  field it changed, on a built-in on the field ``patch``. A strategic merge patch (built-ins only) and
  a write to the ``status`` subresource do not change the type: their ``kind`` is ignored.

Pure: each function raises the APIError the server answers with, or returns.
"""

from __future__ import annotations

import json
from typing import Any

from nstance.testing.kubeapi import errors
from nstance.testing.kubeapi.resources import ResourceType

JSON = dict[str, Any]
SCHEME = '"pkg/runtime/scheme.go:110"'
"""How kube-apiserver names its type registry in a decoding error."""


def check_written(rtype: ResourceType, body: JSON) -> None:
    """A create's or an update's body (POST, PUT): raises unless it can be of ``rtype``."""
    if rtype.custom:
        _check_custom(rtype, body)
        return
    problem = _builtin_problem(rtype, body)
    if problem is not None:
        kind, version, detail = problem
        raise errors.bad_request(
            f'{kind} in version "{version}" cannot be handled as a {rtype.kind}: {detail}'
        )


def check_patched(rtype: ResourceType, name: str, patched: JSON) -> None:
    """The object a merge or JSON patch of the object itself made: raises if the patch changed its type."""
    if rtype.custom:
        kind, api_version = patched.get("kind"), patched.get("apiVersion")
        if not kind or not api_version:
            raise _patch_invalid(patched, f"Object 'Kind' is missing in '{_compact(patched)}'")
        if api_version != rtype.api_version:
            raise errors.invalid_object(
                _group_of(str(api_version)),
                rtype.kind,
                name,
                [errors.invalid("apiVersion", api_version, f"must be {rtype.api_version}")],
            )
        if kind != rtype.kind:
            raise errors.invalid_object(
                rtype.group, str(kind), name, [errors.invalid("kind", kind, f"must be {rtype.kind}")]
            )
        return
    problem = _builtin_problem(rtype, patched)
    if problem is not None:
        raise _patch_invalid(patched, problem[2])


def _check_custom(rtype: ResourceType, body: JSON) -> None:
    kind, api_version = body.get("kind"), body.get("apiVersion")
    if not kind:
        raise errors.bad_request(
            f"the object provided is unrecognized (must be of type {rtype.kind}): "
            f"Object 'Kind' is missing in '{_compact(body)}'"
        )
    if api_version != rtype.api_version:
        raise errors.bad_request(
            f"the API version in the data ({api_version or ''}) does not match the expected API version "
            f"({rtype.api_version})"
        )
    if kind != rtype.kind:
        name = str((body.get("metadata") or {}).get("name") or "")
        raise errors.invalid_object(
            rtype.group, str(kind), name, [errors.invalid("kind", kind, f"must be {rtype.kind}")]
        )


def _builtin_problem(rtype: ResourceType, body: JSON) -> tuple[str, str, str] | None:
    """``(kind, version, why)`` when ``body`` names a type other than built-in ``rtype`` (what it leaves
    out is the path's)."""
    kind = str(body.get("kind") or rtype.kind)
    api_version = str(body.get("apiVersion") or rtype.api_version)
    version = api_version.rpartition("/")[2]
    if api_version != rtype.api_version:
        return (
            kind,
            version,
            f'no kind "{kind}" is registered for version "{api_version}" in scheme {SCHEME}',
        )
    if kind != rtype.kind:
        internal = rtype.group.partition(".")[0] or "core"
        why = f"converting ({version}.{kind}) to ({internal}.{rtype.kind}): unknown conversion"
        return kind, version, why
    return None


def _patch_invalid(patched: JSON, detail: str) -> errors.APIError:
    text = _compact(patched)
    return errors.invalid_object(
        "",
        "",
        "",
        [errors.FieldError("patch", "FieldValueInvalid", f"Invalid value: {errors.go_repr(text)}: {detail}")],
    )


def _group_of(api_version: str) -> str:
    group, _, _ = api_version.rpartition("/")
    return group


def _compact(obj: JSON) -> str:
    return json.dumps(obj, separators=(",", ":"), sort_keys=True)
