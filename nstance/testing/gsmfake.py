"""A local Google Cloud Secret Manager v1 gRPC server for tests (the calls the secrets store makes).

Speaks the real ``google.cloud.secretmanager.v1.SecretManagerService`` protocol, with the message
types shipped in ``google-cloud-secret-manager``, so the unmodified client library talks to it over a
plain gRPC channel (``SECRET_MANAGER_EMULATOR_HOST=<endpoint>``). Served, in memory, for any
project: ``CreateSecret`` (``ALREADY_EXISTS`` for a taken id, ``INVALID_ARGUMENT`` for an id outside
``[A-Za-z0-9_-]{1,255}``), ``GetSecret``, ``DeleteSecret``, ``AddSecretVersion`` (versions numbered
from 1), ``AccessSecretVersion`` (a number or ``latest``, the newest version; ``NOT_FOUND`` when
there is none) and ``ListSecrets`` (the ``name:<text>`` filter, one page). Calls are answered one at
a time under a lock, so racing creates behave as against the service. ``fail_next(code)`` makes the
next call fail with that status, for error-path tests. Not for production use.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.cloud.secretmanager_v1.types import resources, service
from google.protobuf import empty_pb2

SERVICE = "google.cloud.secretmanager.v1.SecretManagerService"
_ID = re.compile(r"[A-Za-z0-9_-]{1,255}")
_SECRET = re.compile(r"projects/([^/]+)/secrets/([^/]+)")
_VERSION = re.compile(r"projects/([^/]+)/secrets/([^/]+)/versions/([^/]+)")


@dataclass
class _Secret:
    versions: list[bytes] = field(default_factory=list)


class _Abort(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


class GsmFake:
    """In-memory Secret Manager; thread-safe. ``start()`` listens on 127.0.0.1 with an ephemeral port."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._secrets: dict[tuple[str, str], _Secret] = {}
        self._fail_next: grpc.StatusCode | None = None
        self._server: grpc.Server | None = None
        self.endpoint = ""
        self.calls: list[str] = []

    # ------------------------------------------------------------------------------ control

    def start(self) -> GsmFake:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        handlers = {
            "CreateSecret": (self._create, service.CreateSecretRequest, resources.Secret),
            "GetSecret": (self._get, service.GetSecretRequest, resources.Secret),
            "DeleteSecret": (self._delete, service.DeleteSecretRequest, None),
            "AddSecretVersion": (self._add_version, service.AddSecretVersionRequest, resources.SecretVersion),
            "AccessSecretVersion": (
                self._access,
                service.AccessSecretVersionRequest,
                service.AccessSecretVersionResponse,
            ),
            "ListSecrets": (self._list, service.ListSecretsRequest, service.ListSecretsResponse),
        }
        server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    SERVICE,
                    {name: self._handler(name, *spec) for name, spec in handlers.items()},
                ),
            )
        )
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        self._server = server
        self.endpoint = f"127.0.0.1:{port}"
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None)
            self._server = None

    def __enter__(self) -> GsmFake:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def fail_next(self, code: grpc.StatusCode) -> None:
        """Make the next call fail with ``code``."""
        with self._lock:
            self._fail_next = code

    def put(self, project: str, secret_id: str, *versions: bytes) -> None:
        """Seed a secret with versions (none: a secret left without a value)."""
        with self._lock:
            self._secrets.setdefault((project, secret_id), _Secret()).versions.extend(versions)

    def versions(self, project: str, secret_id: str) -> list[bytes]:
        with self._lock:
            found = self._secrets.get((project, secret_id))
            return list(found.versions) if found else []

    # ------------------------------------------------------------------------------ plumbing

    def _handler(self, name: str, fn: Callable[[Any], Any], request_type: Any, response_type: Any) -> Any:
        def call(request: Any, context: grpc.ServicerContext) -> Any:
            with self._lock:
                self.calls.append(name)
                code, self._fail_next = self._fail_next, None
                try:
                    if code is not None:
                        raise _Abort(code, f"injected {code.name}")
                    return fn(request)
                except _Abort as exc:
                    context.abort(exc.code, str(exc))

        serialize = (
            response_type.serialize if response_type is not None else empty_pb2.Empty.SerializeToString
        )
        return grpc.unary_unary_rpc_method_handler(
            call, request_deserializer=request_type.deserialize, response_serializer=serialize
        )

    def _secret(self, name: str) -> tuple[tuple[str, str], _Secret]:
        match = _SECRET.fullmatch(name)
        if match is None:
            raise _Abort(grpc.StatusCode.INVALID_ARGUMENT, f"bad secret name {name!r}")
        key = (match.group(1), match.group(2))
        found = self._secrets.get(key)
        if found is None:
            raise _Abort(grpc.StatusCode.NOT_FOUND, f"Secret [{name}] not found or has no versions.")
        return key, found

    # ------------------------------------------------------------------------------ methods

    def _create(self, request: Any) -> Any:
        project = request.parent.removeprefix("projects/")
        if "/" in project or not project:
            raise _Abort(grpc.StatusCode.INVALID_ARGUMENT, f"bad parent {request.parent!r}")
        if not _ID.fullmatch(request.secret_id):
            raise _Abort(grpc.StatusCode.INVALID_ARGUMENT, f"bad secret id {request.secret_id!r}")
        key = (project, request.secret_id)
        if key in self._secrets:
            raise _Abort(grpc.StatusCode.ALREADY_EXISTS, f"Secret [{request.secret_id}] already exists.")
        self._secrets[key] = _Secret()
        return resources.Secret(name=f"projects/{project}/secrets/{request.secret_id}")

    def _get(self, request: Any) -> Any:
        self._secret(request.name)
        return resources.Secret(name=request.name)

    def _delete(self, request: Any) -> Any:
        key, _found = self._secret(request.name)
        del self._secrets[key]
        return empty_pb2.Empty()

    def _add_version(self, request: Any) -> Any:
        _key, found = self._secret(request.parent)
        found.versions.append(bytes(request.payload.data))
        return resources.SecretVersion(
            name=f"{request.parent}/versions/{len(found.versions)}",
            state=resources.SecretVersion.State.ENABLED,
        )

    def _access(self, request: Any) -> Any:
        match = _VERSION.fullmatch(request.name)
        if match is None:
            raise _Abort(grpc.StatusCode.INVALID_ARGUMENT, f"bad version name {request.name!r}")
        _key, found = self._secret(f"projects/{match.group(1)}/secrets/{match.group(2)}")
        wanted = match.group(3)
        number = len(found.versions) if wanted == "latest" else int(wanted) if wanted.isdigit() else 0
        if not 1 <= number <= len(found.versions):
            raise _Abort(grpc.StatusCode.NOT_FOUND, f"Secret Version [{request.name}] not found.")
        return service.AccessSecretVersionResponse(
            name=request.name.replace("/versions/latest", f"/versions/{number}"),
            payload=resources.SecretPayload(data=found.versions[number - 1]),
        )

    def _list(self, request: Any) -> Any:
        project = request.parent.removeprefix("projects/")
        text = request.filter.removeprefix("name:") if request.filter.startswith("name:") else ""
        names = sorted(
            f"projects/{p}/secrets/{sid}" for (p, sid) in self._secrets if p == project and text in sid
        )
        return service.ListSecretsResponse(secrets=[resources.Secret(name=n) for n in names])
