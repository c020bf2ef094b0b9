"""SecretStore on AWS Secrets Manager (boto3).

Each secret ``name`` is the Secrets Manager secret ``prefix + name``, stored as ``SecretBinary``
(secrets created by hand as ``SecretString`` are read too, as UTF-8). Calls:

* get -> ``GetSecretValue``; set -> ``PutSecretValue``, or ``CreateSecret`` when the secret does not
  exist yet (a concurrent creator is handled by writing a new version); set_if_absent ->
  ``CreateSecret`` only (``ResourceExistsException`` -> False); delete -> ``DeleteSecret`` with
  ``ForceDeleteWithoutRecovery`` (a missing secret is fine); exists -> ``DescribeSecret``.

Errors become core errors: ``ResourceNotFoundException`` (and a secret already marked for deletion,
on reads) -> SecretNotFound; access denied -> PermissionDenied; throttling, 5xx and connection failures
-> Unavailable; a name still scheduled for deletion on create -> Unavailable (retry shortly); anything
else -> FailedPrecondition naming the AWS error code. botocore's own retry policy handles transient
errors before they reach us.

Encryption at rest is Secrets Manager's (KMS); this module adds none. It needs boto3 and must only be
imported when this provider is chosen (the factory imports it lazily). It never logs secret values.
"""

from __future__ import annotations

import os
from typing import Any, NoReturn

import boto3
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError, NoRegionError

from nstance.core.errors import (
    FailedPrecondition,
    InvalidArgument,
    PermissionDenied,
    ResourceExhausted,
    Unavailable,
)
from nstance.secrets.base import SecretNotFound, validate_secret_name

_NOT_FOUND = "ResourceNotFoundException"
_EXISTS = "ResourceExistsException"
DENIED_CODES = {
    "AccessDeniedException",
    "AccessDenied",
    "UnrecognizedClientException",
    "ExpiredTokenException",
}
TRANSIENT_CODES = {
    "ThrottlingException",
    "Throttling",
    "TooManyRequestsException",
    "InternalServiceError",
    "InternalFailure",
    "ServiceUnavailable",
    "RequestTimeout",
}


def error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def error_message(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Message", ""))


def _marked_for_deletion(exc: ClientError) -> bool:
    return error_code(exc) == "InvalidRequestException" and "deletion" in error_message(exc).lower()


def secrets_manager_failure(exc: Exception, what: str, action: str) -> NoReturn:
    """Raise the core error for a botocore failure of ``action`` on ``what`` (``secret 'x'``)."""
    where = f"AWS Secrets Manager could not {action} {what}"
    if isinstance(exc, NoCredentialsError):
        raise FailedPrecondition(f"{where}: no AWS credentials found") from exc
    if isinstance(exc, BotoCoreError):
        raise Unavailable(f"{where}: {exc}") from exc
    if not isinstance(exc, ClientError):  # pragma: no cover - callers pass only botocore errors
        raise exc
    code, msg = error_code(exc), error_message(exc)
    if code == _NOT_FOUND:
        raise SecretNotFound(f"{what} not found") from exc
    if code in DENIED_CODES:
        raise PermissionDenied(f"{where}: {code}: {msg}") from exc
    if code in TRANSIENT_CODES:
        raise Unavailable(f"{where}: {code}: {msg}") from exc
    if code == "LimitExceededException":
        raise ResourceExhausted(f"{where}: {code}: {msg}") from exc
    raise FailedPrecondition(f"{where}: {code}: {msg}") from exc


def secrets_manager_client(region: str | None = None, endpoint_url: str | None = None) -> Any:
    """A boto3 Secrets Manager client; InvalidArgument naming what to set when no region is configured."""
    try:
        return boto3.client(
            "secretsmanager",
            region_name=region or os.environ.get("AWS_REGION") or None,
            endpoint_url=endpoint_url,
        )
    except NoRegionError as exc:
        raise InvalidArgument(
            "AWS Secrets Manager needs a region: set AWS_REGION or AWS_DEFAULT_REGION (or a region "
            "in the AWS profile)"
        ) from exc


class AwsSecretsManagerStore:
    """Secrets in AWS Secrets Manager under a name prefix."""

    def __init__(
        self,
        prefix: str = "",
        client: Any = None,
        region: str | None = None,
        *,
        endpoint_url: str | None = None,
        description: str = "Nstance secret",
    ) -> None:
        self._prefix = prefix
        self._description = description
        self._client: Any = client if client is not None else secrets_manager_client(region, endpoint_url)

    @property
    def prefix(self) -> str:
        return self._prefix

    def _id(self, name: str) -> str:
        return self._prefix + validate_secret_name(name)

    def _fail(self, exc: Exception, name: str, action: str) -> NoReturn:
        secrets_manager_failure(exc, f"secret {name!r}", action)

    def get(self, name: str) -> bytes:
        secret_id = self._id(name)
        try:
            resp = self._client.get_secret_value(SecretId=secret_id)
        except ClientError as exc:
            if _marked_for_deletion(exc):
                raise SecretNotFound(f"secret {name!r} not found (marked for deletion)") from exc
            self._fail(exc, name, "read")
        except BotoCoreError as exc:
            self._fail(exc, name, "read")
        if resp.get("SecretBinary") is not None:
            return bytes(resp["SecretBinary"])
        if resp.get("SecretString") is not None:
            return str(resp["SecretString"]).encode("utf-8")
        raise FailedPrecondition(f"AWS Secrets Manager secret {name!r} holds no value")

    def _create(self, name: str, data: bytes) -> None:
        self._client.create_secret(
            Name=self._id(name), SecretBinary=bytes(data), Description=f"{self._description}: {name}"
        )

    def set(self, name: str, data: bytes) -> None:
        secret_id = self._id(name)
        try:
            try:
                self._client.put_secret_value(SecretId=secret_id, SecretBinary=bytes(data))
                return
            except ClientError as exc:
                if error_code(exc) != _NOT_FOUND:
                    raise
            try:
                self._create(name, data)
            except ClientError as exc:
                if error_code(exc) != _EXISTS:
                    raise
                # Someone created it between our two calls: write our value as the newest version.
                self._client.put_secret_value(SecretId=secret_id, SecretBinary=bytes(data))
        except ClientError as exc:
            if _marked_for_deletion(exc):
                raise Unavailable(
                    f"secret {name!r} is still being deleted in AWS Secrets Manager; retry shortly"
                ) from exc
            self._fail(exc, name, "write")
        except BotoCoreError as exc:
            self._fail(exc, name, "write")

    def set_if_absent(self, name: str, data: bytes) -> bool:
        try:
            self._create(name, data)
        except ClientError as exc:
            if error_code(exc) == _EXISTS:
                return False
            if _marked_for_deletion(exc):
                raise Unavailable(
                    f"secret {name!r} is still being deleted in AWS Secrets Manager; retry shortly"
                ) from exc
            self._fail(exc, name, "create")
        except BotoCoreError as exc:
            self._fail(exc, name, "create")
        return True

    def delete(self, name: str) -> None:
        secret_id = self._id(name)
        try:
            self._client.delete_secret(SecretId=secret_id, ForceDeleteWithoutRecovery=True)
        except ClientError as exc:
            if error_code(exc) == _NOT_FOUND:
                return
            self._fail(exc, name, "delete")
        except BotoCoreError as exc:
            self._fail(exc, name, "delete")

    def exists(self, name: str) -> bool:
        secret_id = self._id(name)
        try:
            resp = self._client.describe_secret(SecretId=secret_id)
        except ClientError as exc:
            if error_code(exc) == _NOT_FOUND:
                return False
            self._fail(exc, name, "look up")
        except BotoCoreError as exc:
            self._fail(exc, name, "look up")
        return resp.get("DeletedDate") is None
