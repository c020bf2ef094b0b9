"""A small typed, blocking wrapper around proxmoxer for the Proxmox VE REST API.

Responsible for: connecting with an API token (or a password, for tests), issuing one GET/POST/PUT/DELETE
or file upload, and turning every failure into one ``PveError`` that says what kind of failure it was
(``throttled``, ``unavailable``, ``not_found``, ``invalid``, ``denied``, ``locked``) plus PVE's own message.

It must not retry, sleep, decide anything about instances, or raise provider errors itself: the provider
runs these calls in worker threads, retries with backoff and words the user-facing error. It is the only
module of the package that imports proxmoxer or requests.
"""

from __future__ import annotations

import io
import urllib.parse
from dataclasses import dataclass
from typing import Any, Literal

import proxmoxer  # type: ignore[import-untyped]
import requests

FailureKind = Literal["throttled", "unavailable", "not_found", "invalid", "denied", "locked", "conflict"]

#: HTTP statuses PVE (or the AnyEvent layer of pveproxy) uses for "could not reach the node/worker".
_UNREACHABLE = frozenset({502, 504, 595, 596, 597, 598, 599})


class PveError(Exception):
    """One failed API call, classified; ``message`` is PVE's wording (with per-field errors, if any)."""

    def __init__(self, kind: FailureKind, status: int, message: str, method: str, path: str) -> None:
        super().__init__(
            f"{method} {path}: HTTP {status}: {message}" if status else f"{method} {path}: {message}"
        )
        self.kind: FailureKind = kind
        self.status = status
        self.message = message
        self.method = method
        self.path = path


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where the API is and how to log in. ``verify`` is True, False or a CA bundle path."""

    api_url: str
    token_id: str = ""  # user@realm!tokenname
    token_secret: str = ""
    user: str = ""  # password login (tests, labs); API tokens are the supported way
    password: str = ""
    verify: bool | str = True
    timeout: float = 30.0


class PveClient:
    """Blocking PVE API calls; safe to share between worker threads (one requests session)."""

    def __init__(self, endpoint: Endpoint) -> None:
        parsed = urllib.parse.urlsplit(endpoint.api_url)
        if parsed.scheme != "https" or not parsed.hostname:
            raise ValueError(f"not an https URL with a host: {endpoint.api_url!r}")
        prefix = parsed.path.rstrip("/")
        if prefix.endswith("/api2/json"):
            prefix = prefix[: -len("/api2/json")]
        host = parsed.hostname if ":" not in parsed.hostname else f"[{parsed.hostname}]"
        kwargs: dict[str, Any] = {
            "host": host,
            "port": parsed.port or 8006,
            "verify_ssl": endpoint.verify,
            "timeout": endpoint.timeout,
            "path_prefix": prefix.strip("/") or None,
        }
        if endpoint.token_id:
            user, sep, token_name = endpoint.token_id.partition("!")
            if not sep or not user or not token_name:
                raise ValueError(f"token id must look like user@realm!name (got {endpoint.token_id!r})")
            kwargs.update(user=user, token_name=token_name, token_value=endpoint.token_secret)
        elif endpoint.user:
            kwargs.update(user=endpoint.user, password=endpoint.password)
        else:
            raise ValueError("no credentials: give an API token id and secret")
        self._kwargs = kwargs
        self._api: Any = None  # built on first use: a password login talks to the server

    def _root(self, method: str, path: str) -> Any:
        if self._api is None:
            try:
                self._api = proxmoxer.ProxmoxAPI(backend="https", service="PVE", **self._kwargs)
            except proxmoxer.AuthenticationError as exc:
                raise PveError("denied", 401, f"login failed: {exc}", method, path) from exc
            except requests.RequestException as exc:
                raise PveError("unavailable", 0, f"cannot reach the API: {exc}", method, path) from exc
        return self._api

    def close(self) -> None:
        """Close the HTTP session's pooled connections (a later call opens new ones)."""
        api, self._api = self._api, None
        if api is not None:
            session = api._store.get("session")
            if session is not None:
                session.close()

    def get(self, path: str, **params: Any) -> Any:
        return self._call("GET", path, params)

    def post(self, path: str, **data: Any) -> Any:
        return self._call("POST", path, data)

    def put(self, path: str, **data: Any) -> Any:
        return self._call("PUT", path, data)

    def delete(self, path: str, **params: Any) -> Any:
        return self._call("DELETE", path, params)

    def upload(self, node: str, storage: str, filename: str, data: bytes, content: str = "iso") -> Any:
        """POST a file to ``/nodes/{node}/storage/{storage}/upload``; returns the task's UPID."""
        stream = io.BytesIO(data)
        stream.name = filename  # proxmoxer takes the multipart file name from here
        return self._call(
            "POST", f"nodes/{node}/storage/{storage}/upload", {"content": content, "filename": stream}
        )

    def _call(self, method: str, path: str, values: dict[str, Any]) -> Any:
        clean = path.strip("/")
        resource = self._root(method, clean)(clean)
        try:
            if method == "GET":
                return resource.get(**values)
            if method == "POST":
                return resource.post(**values)
            if method == "PUT":
                return resource.put(**values)
            return resource.delete(**values)
        except proxmoxer.ResourceException as exc:
            raise _classify(exc, method, clean) from exc
        except (requests.ConnectionError, requests.Timeout) as exc:
            raise PveError("unavailable", 0, f"connection failed: {exc}", method, clean) from exc
        except requests.RequestException as exc:
            raise PveError("unavailable", 0, f"request failed: {exc}", method, clean) from exc


def quote_segment(value: str) -> str:
    """One URL path segment (a volume id has ``:`` and ``/``)."""
    return urllib.parse.quote(value, safe="")


def _classify(exc: Any, method: str, path: str) -> PveError:
    status = int(getattr(exc, "status_code", 0) or 0)
    content = str(getattr(exc, "content", "") or "").strip()
    errors = getattr(exc, "errors", None)
    message = content
    if isinstance(errors, dict) and errors:
        message = f"{content} " + "; ".join(f"{k}: {str(v).strip()}" for k, v in sorted(errors.items()))
    lowered = message.lower()
    kind: FailureKind
    if status == 429:
        kind = "throttled"
    elif status == 503 and "lock" not in lowered:
        kind = "throttled"  # pveproxy refuses new connections when overloaded
    elif status in _UNREACHABLE:
        kind = "unavailable"
    elif status == 400:
        kind = "invalid"
    elif status in (401, 403):
        kind = "denied"
    elif "does not exist" in lowered or "no such vm" in lowered or status == 404:
        kind = "not_found"
    elif "already exists" in lowered:
        kind = "conflict"
    elif "lock" in lowered and ("timeout" in lowered or "locked" in lowered):
        kind = "locked"
    else:
        kind = "unavailable"
    return PveError(kind, status, message or f"HTTP {status}", method, path)
