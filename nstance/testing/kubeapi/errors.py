"""API errors of the Kubernetes API emulator and the ``Status`` bodies the real API server sends for them.

Each constructor builds the exact reason, code, message and details a kube-apiserver returns for the same
situation, so clients (kopf, kubernetes_asyncio, kubectl) map them to the same exceptions. This module is
pure: it must not do I/O or know about HTTP frameworks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

JSON = dict[str, Any]


def group_resource(group: str, plural: str) -> str:
    """``widgets.example.com`` (or ``pods`` for the core group), as the real server prints resources."""
    return f"{plural}.{group}" if group else plural


def group_kind(group: str, kind: str) -> str:
    """``Widget.example.com`` (or ``Pod`` for the core group), as the real server prints kinds."""
    return f"{kind}.{group}" if group else kind


@dataclass(frozen=True)
class FieldError:
    """One ``details.causes[]`` entry (reason like ``FieldValueRequired``, field like ``spec.size``)."""

    field: str
    reason: str
    message: str

    def text(self) -> str:
        return f"{self.field}: {self.message}" if self.field else self.message


def required(path: str) -> FieldError:
    return FieldError(path, "FieldValueRequired", "Required value")


def invalid(path: str, value: Any, detail: str) -> FieldError:
    return FieldError(path, "FieldValueInvalid", f"Invalid value: {go_repr(value)}: {detail}")


def type_invalid(path: str, actual: str, detail: str) -> FieldError:
    return FieldError(path, "FieldValueTypeInvalid", f"Invalid value: {go_repr(actual)}: {detail}")


def not_supported(path: str, value: Any, allowed: list[Any]) -> FieldError:
    listed = ", ".join(go_repr(item) for item in allowed)
    return FieldError(
        path, "FieldValueNotSupported", f"Unsupported value: {go_repr(value)}: supported values: {listed}"
    )


def forbidden(path: str, detail: str) -> FieldError:
    return FieldError(path, "FieldValueForbidden", f"Forbidden: {detail}")


def go_repr(value: Any) -> str:
    """Render a value the way apimachinery's field errors do (strings quoted, numbers bare)."""
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if value is True:
        return "true"
    if value is False:
        return "false"
    if value is None:
        return "null"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, list):
        return f"[]interface {{}}{{{', '.join(go_repr(item) for item in value)}}}"
    return "map[string]interface {}{...}"


@dataclass
class APIError(Exception):
    """An error answered with a ``Status`` object; ``code`` is the HTTP status."""

    code: int
    reason: str
    message: str
    details: JSON = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        return f"{self.code} {self.reason}: {self.message}"

    def status(self) -> JSON:
        body: JSON = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details:
            body["details"] = self.details
        return body


def _details(group: str, kind: str, name: str) -> JSON:
    details: JSON = {}
    if name:
        details["name"] = name
    if group:
        details["group"] = group
    if kind:
        details["kind"] = kind
    return details


def not_found(group: str, plural: str, name: str) -> APIError:
    return APIError(
        404, "NotFound", f'{group_resource(group, plural)} "{name}" not found', _details(group, plural, name)
    )


def already_exists(group: str, plural: str, name: str) -> APIError:
    return APIError(
        409,
        "AlreadyExists",
        f'{group_resource(group, plural)} "{name}" already exists',
        _details(group, plural, name),
    )


def conflict(group: str, plural: str, name: str, detail: str | None = None) -> APIError:
    detail = detail or (
        "the object has been modified; please apply your changes to the latest version and try again"
    )
    return APIError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {group_resource(group, plural)} "{name}": {detail}',
        _details(group, plural, name),
    )


def invalid_object(group: str, kind: str, name: str, errors: list[FieldError]) -> APIError:
    texts = [error.text() for error in errors]
    summary = texts[0] if len(texts) == 1 else "[" + ", ".join(texts) + "]"
    details = _details(group, kind, name)
    details["causes"] = [{"reason": e.reason, "message": e.message, "field": e.field} for e in errors]
    return APIError(422, "Invalid", f'{group_kind(group, kind)} "{name}" is invalid: {summary}', details)


def bad_request(message: str) -> APIError:
    return APIError(400, "BadRequest", message)


def unprocessable(message: str) -> APIError:
    """A 422 that is not about a named object (for example a failed JSON-patch ``test`` operation)."""
    return APIError(422, "Invalid", message)


def forbidden_request(message: str, group: str = "", plural: str = "", name: str = "") -> APIError:
    return APIError(403, "Forbidden", message, _details(group, plural, name))


def method_not_allowed(
    message: str = "the server does not allow this method on the requested resource",
) -> APIError:
    return APIError(405, "MethodNotAllowed", message)


def unsupported_media_type(content_type: str, accepted: list[str]) -> APIError:
    return APIError(
        415,
        "UnsupportedMediaType",
        f"the body of the request was in an unknown format ({content_type}) - accepted media types include: "
        + ", ".join(accepted),
    )


def gone(message: str) -> APIError:
    return APIError(410, "Expired", message)


def too_many_requests(message: str, causes: list[JSON] | None = None, retry_after: int = 0) -> APIError:
    details: JSON = {"causes": causes} if causes else {}
    if retry_after:
        details["retryAfterSeconds"] = retry_after
    headers = {"Retry-After": str(retry_after)} if retry_after else {}
    return APIError(429, "TooManyRequests", message, details, headers)


def internal(message: str) -> APIError:
    return APIError(500, "InternalError", f"Internal error occurred: {message}")
