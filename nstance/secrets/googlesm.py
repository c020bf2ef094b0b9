"""SecretStore on Google Cloud Secret Manager (``google-cloud-secret-manager``), upstream v2's Google default.

Each secret ``name`` is the Secret Manager secret ``prefix + id`` in project ``project_id``, where the
id is the name with every character Secret Manager does not allow in an id (anything but letters,
digits, ``_`` and ``-``) written as ``-``: ``ca.key`` under the default prefix ``nstance-`` is the
secret ``nstance-ca-key``, the id upstream's Go server uses. The value is the secret's ``latest``
version. Calls:

* get -> ``AccessSecretVersion(.../versions/latest)``;
* set -> ``CreateSecret`` (automatic replication) when the secret is missing, then ``AddSecretVersion``;
* set_if_absent -> ``CreateSecret``; only the caller whose create succeeds adds the first version
  (``ALREADY_EXISTS`` -> False). A secret left without any version (its creator stopped between the
  two calls) is reported by ``get`` and ``set_if_absent`` as an error naming it, never taken as absent;
* delete -> ``DeleteSecret`` (a missing secret is fine); exists -> ``GetSecret``.

Errors become core errors: NOT_FOUND -> SecretNotFound, PERMISSION_DENIED/UNAUTHENTICATED ->
PermissionDenied, UNAVAILABLE/DEADLINE_EXCEEDED/RESOURCE_EXHAUSTED/INTERNAL -> Unavailable, others
-> FailedPrecondition. Credentials are Application Default Credentials; ``SECRET_MANAGER_EMULATOR_HOST``
(``host:port``) sends the calls in plain gRPC with anonymous credentials to a local emulator instead
(``nstance.testing.gsmfake`` is one). Imported only when this provider is chosen; never logs values.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from typing import Any, NoReturn

from google.api_core import exceptions as gexc
from google.auth.exceptions import DefaultCredentialsError

from nstance.core.errors import FailedPrecondition, InvalidArgument, PermissionDenied, Unavailable
from nstance.secrets.base import SecretNotFound, validate_secret_name

DEFAULT_PREFIX = "nstance-"
EMULATOR_ENV = "SECRET_MANAGER_EMULATOR_HOST"
MAX_ID_LEN = 255
MAX_VALUE_BYTES = 64 * 1024  # Secret Manager's payload limit
_FIRST_VERSION_WAITS = (0.05, 0.1, 0.2, 0.4, 0.8, 1.6)  # about 3 s for a racing creator's first version
_NOT_ID = re.compile(r"[^A-Za-z0-9_-]")
_TRANSIENT = (
    gexc.ServiceUnavailable,
    gexc.DeadlineExceeded,
    gexc.TooManyRequests,
    gexc.InternalServerError,
)
_DENIED = (gexc.PermissionDenied, gexc.Unauthenticated)


def secret_id(prefix: str, name: str) -> str:
    """The Secret Manager id of secret ``name`` under ``prefix`` (``ca.key`` -> ``<prefix>ca-key``)."""
    return _NOT_ID.sub("-", prefix + validate_secret_name(name))


def secret_manager_client(endpoint: str | None = None) -> Any:
    """A Secret Manager client for the emulator at ``endpoint`` (or ``SECRET_MANAGER_EMULATOR_HOST``)."""
    from google.cloud import secretmanager_v1

    target = endpoint or os.environ.get(EMULATOR_ENV) or None
    if target:
        import grpc
        from google.auth.credentials import AnonymousCredentials
        from google.cloud.secretmanager_v1.services.secret_manager_service.transports import (
            SecretManagerServiceGrpcTransport,
        )

        channel = grpc.insecure_channel(target)
        transport = SecretManagerServiceGrpcTransport(channel=channel, credentials=AnonymousCredentials())  # type: ignore[no-untyped-call]
        return secretmanager_v1.SecretManagerServiceClient(transport=transport)
    try:
        return secretmanager_v1.SecretManagerServiceClient()
    except DefaultCredentialsError as exc:
        raise FailedPrecondition(
            "Google Secret Manager needs credentials: set GOOGLE_APPLICATION_CREDENTIALS or run on a VM "
            f"with a service account ({exc})"
        ) from exc


def fail(exc: Exception, what: str, action: str) -> NoReturn:
    """Raise the core error for a failed Secret Manager call ``action`` on ``what``."""
    where = f"Google Secret Manager could not {action} {what}"
    if isinstance(exc, gexc.NotFound):
        raise SecretNotFound(f"{what} not found") from exc
    if isinstance(exc, _DENIED):
        raise PermissionDenied(f"{where}: {exc.message}") from exc
    if isinstance(exc, _TRANSIENT):
        raise Unavailable(f"{where}: {exc.message}") from exc
    if isinstance(exc, gexc.GoogleAPICallError):
        raise FailedPrecondition(f"{where}: {exc.message}") from exc
    if isinstance(exc, DefaultCredentialsError):
        raise FailedPrecondition(f"{where}: no Google credentials found") from exc
    raise Unavailable(f"{where}: {exc}") from exc


def access_latest(client: Any, project: str, sid: str, what: str) -> bytes:
    """The bytes of the latest version of secret ``sid``; SecretNotFound when it has none."""
    name = f"projects/{project}/secrets/{sid}/versions/latest"
    try:
        resp = client.access_secret_version(request={"name": name})
    except gexc.NotFound as exc:
        if _has_secret(client, project, sid, what):
            raise FailedPrecondition(
                f"Google Secret Manager secret {sid} exists but has no version (a create that stopped "
                "half-way?); set it again or delete it"
            ) from exc
        fail(exc, what, "read")
    except (gexc.GoogleAPIError, DefaultCredentialsError) as exc:
        fail(exc, what, "read")
    return bytes(resp.payload.data)


def _has_secret(client: Any, project: str, sid: str, what: str) -> bool:
    try:
        client.get_secret(request={"name": f"projects/{project}/secrets/{sid}"})
    except gexc.NotFound:
        return False
    except (gexc.GoogleAPIError, DefaultCredentialsError) as exc:
        fail(exc, what, "look up")
    return True


class GoogleSecretManagerStore:
    """Secrets as Secret Manager secrets under a name prefix in one project."""

    def __init__(
        self,
        project_id: str,
        prefix: str = DEFAULT_PREFIX,
        client: Any = None,
        *,
        endpoint: str | None = None,
    ) -> None:
        if not project_id:
            raise InvalidArgument("the google-secret-manager secrets provider needs a project_id")
        self._project = project_id
        self._prefix = prefix
        self._client: Any = client if client is not None else secret_manager_client(endpoint)

    @property
    def prefix(self) -> str:
        return self._prefix

    def _id(self, name: str) -> str:
        sid = secret_id(self._prefix, name)
        if len(sid) > MAX_ID_LEN:
            raise InvalidArgument(
                f"secret {name!r} makes the Secret Manager id {sid[:40]}... of {len(sid)} characters; "
                f"the limit is {MAX_ID_LEN}"
            )
        return sid

    @staticmethod
    def _payload(name: str, data: bytes) -> bytes:
        if len(data) > MAX_VALUE_BYTES:
            raise InvalidArgument(
                f"secret {name!r} is {len(data)} bytes; Secret Manager holds at most {MAX_VALUE_BYTES}"
            )
        return bytes(data)

    def get(self, name: str) -> bytes:
        return access_latest(self._client, self._project, self._id(name), f"secret {name!r}")

    def _create(self, sid: str) -> None:
        self._client.create_secret(
            request={
                "parent": f"projects/{self._project}",
                "secret_id": sid,
                "secret": {"replication": {"automatic": {}}},
            }
        )

    def _add_version(self, sid: str, data: bytes) -> None:
        self._client.add_secret_version(
            request={"parent": f"projects/{self._project}/secrets/{sid}", "payload": {"data": data}}
        )

    def set(self, name: str, data: bytes) -> None:
        sid, payload = self._id(name), self._payload(name, data)
        what = f"secret {name!r}"
        try:
            if not _has_secret(self._client, self._project, sid, what):
                # AlreadyExists: created by someone else since the look-up; adding a version is what we want
                with contextlib.suppress(gexc.AlreadyExists):
                    self._create(sid)
            self._add_version(sid, payload)
        except (gexc.GoogleAPIError, DefaultCredentialsError) as exc:
            fail(exc, what, "write")

    def set_if_absent(self, name: str, data: bytes) -> bool:
        sid, payload = self._id(name), self._payload(name, data)
        what = f"secret {name!r}"
        try:
            self._create(sid)
        except gexc.AlreadyExists:
            self._await_value(name)
            return False
        except (gexc.GoogleAPIError, DefaultCredentialsError) as exc:
            fail(exc, what, "create")
        try:
            self._add_version(sid, payload)
        except (gexc.GoogleAPIError, DefaultCredentialsError) as exc:
            fail(exc, what, "write")
        return True

    def _await_value(self, name: str) -> None:
        """Wait briefly for a secret another caller just created to get its first version.

        A secret that stays without a value is an error to report (FailedPrecondition), never "present".
        """
        for delay in _FIRST_VERSION_WAITS:
            try:
                self.get(name)
                return
            except FailedPrecondition:
                time.sleep(delay)
        self.get(name)

    def delete(self, name: str) -> None:
        try:
            self._client.delete_secret(request={"name": f"projects/{self._project}/secrets/{self._id(name)}"})
        except gexc.NotFound:
            return
        except (gexc.GoogleAPIError, DefaultCredentialsError) as exc:
            fail(exc, f"secret {name!r}", "delete")

    def exists(self, name: str) -> bool:
        return _has_secret(self._client, self._project, self._id(name), f"secret {name!r}")
