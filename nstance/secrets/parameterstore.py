"""SecretStore on AWS Systems Manager Parameter Store (boto3), as upstream's v2 default on AWS.

Each secret ``name`` is the parameter ``prefix + name`` (upstream's default prefix ``/nstance/``),
a standard-tier ``SecureString`` encrypted by the account's default KMS key. Calls:

* get -> ``GetParameter`` with decryption (a parameter that is not a ``SecureString`` is refused);
* set -> ``PutParameter`` with ``Overwrite``; set_if_absent -> ``PutParameter`` without it
  (``ParameterAlreadyExists`` -> False, so the first writer wins);
* delete -> ``DeleteParameter`` (a missing parameter is fine); exists -> ``GetParameter``.

Parameter values are text: a secret must be UTF-8 and at most 4 KiB (the standard tier), as in
upstream; anything else is refused with InvalidArgument before AWS is called. AWS errors become core
errors as in ``nstance.secrets.aws`` (not found -> SecretNotFound, access denied -> PermissionDenied,
throttling and 5xx -> Unavailable). Imported only when this provider is chosen; never logs values.
"""

from __future__ import annotations

import os
from typing import Any, NoReturn

import boto3
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError, NoRegionError

from nstance.core.errors import FailedPrecondition, InvalidArgument, PermissionDenied, Unavailable
from nstance.secrets.aws import DENIED_CODES, TRANSIENT_CODES, error_code, error_message
from nstance.secrets.base import SecretNotFound, validate_secret_name

DEFAULT_PREFIX = "/nstance/"
MAX_VALUE_BYTES = 4 * 1024
_NOT_FOUND = "ParameterNotFound"
_EXISTS = "ParameterAlreadyExists"


def ssm_client(region: str | None = None, endpoint_url: str | None = None) -> Any:
    """A boto3 SSM client; InvalidArgument naming what to set when no region is configured."""
    try:
        return boto3.client(
            "ssm", region_name=region or os.environ.get("AWS_REGION") or None, endpoint_url=endpoint_url
        )
    except NoRegionError as exc:
        raise InvalidArgument(
            "AWS Parameter Store needs a region: set AWS_REGION or AWS_DEFAULT_REGION (or a region in the "
            "AWS profile)"
        ) from exc


def read_secure_string(client: Any, parameter: str, what: str) -> str:
    """The decrypted value of SecureString ``parameter``; SecretNotFound when it does not exist."""
    try:
        resp = client.get_parameter(Name=parameter, WithDecryption=True)
    except (ClientError, BotoCoreError) as exc:
        fail(exc, what, "read")
    found = resp.get("Parameter") or {}
    if found.get("Type") != "SecureString":
        raise FailedPrecondition(
            f"AWS Parameter Store parameter {parameter!r} is {found.get('Type') or 'empty'}, "
            "expected SecureString"
        )
    return str(found.get("Value") or "")


def fail(exc: Exception, what: str, action: str) -> NoReturn:
    """Raise the core error for a botocore failure of ``action`` on ``what``."""
    where = f"AWS Parameter Store could not {action} {what}"
    if isinstance(exc, NoCredentialsError):
        raise FailedPrecondition(f"{where}: no AWS credentials found") from exc
    if isinstance(exc, BotoCoreError):
        raise Unavailable(f"{where}: {exc}") from exc
    assert isinstance(exc, ClientError)
    code, msg = error_code(exc), error_message(exc)
    if code == _NOT_FOUND:
        raise SecretNotFound(f"{what} not found") from exc
    if code in DENIED_CODES:
        raise PermissionDenied(f"{where}: {code}: {msg}") from exc
    if code in TRANSIENT_CODES:
        raise Unavailable(f"{where}: {code}: {msg}") from exc
    raise FailedPrecondition(f"{where}: {code}: {msg}") from exc


class AwsParameterStoreSecretStore:
    """Secrets as SecureString parameters under a name prefix."""

    def __init__(
        self,
        prefix: str = DEFAULT_PREFIX,
        client: Any = None,
        region: str | None = None,
        *,
        endpoint_url: str | None = None,
    ) -> None:
        self._prefix = prefix
        self._client: Any = client if client is not None else ssm_client(region, endpoint_url)

    @property
    def prefix(self) -> str:
        return self._prefix

    def _name(self, name: str) -> str:
        return self._prefix + validate_secret_name(name)

    @staticmethod
    def _value(name: str, data: bytes) -> str:
        try:
            text = bytes(data).decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidArgument(
                f"secret {name!r} is not UTF-8 text; AWS Parameter Store holds only text values"
            ) from None
        if len(data) > MAX_VALUE_BYTES:
            raise InvalidArgument(
                f"secret {name!r} is {len(data)} bytes; a standard-tier parameter holds at most "
                f"{MAX_VALUE_BYTES}"
            )
        return text

    def get(self, name: str) -> bytes:
        return read_secure_string(self._client, self._name(name), f"secret {name!r}").encode("utf-8")

    def _put(self, name: str, data: bytes, *, overwrite: bool) -> None:
        self._client.put_parameter(
            Name=self._name(name),
            Value=self._value(name, data),
            Type="SecureString",
            Tier="Standard",
            Overwrite=overwrite,
        )

    def set(self, name: str, data: bytes) -> None:
        self._name(name)
        try:
            self._put(name, data, overwrite=True)
        except (ClientError, BotoCoreError) as exc:
            fail(exc, f"secret {name!r}", "write")

    def set_if_absent(self, name: str, data: bytes) -> bool:
        self._name(name)
        try:
            self._put(name, data, overwrite=False)
        except ClientError as exc:
            if error_code(exc) == _EXISTS:
                return False
            fail(exc, f"secret {name!r}", "create")
        except BotoCoreError as exc:
            fail(exc, f"secret {name!r}", "create")
        return True

    def delete(self, name: str) -> None:
        try:
            self._client.delete_parameter(Name=self._name(name))
        except ClientError as exc:
            if error_code(exc) == _NOT_FOUND:
                return
            fail(exc, f"secret {name!r}", "delete")
        except BotoCoreError as exc:
            fail(exc, f"secret {name!r}", "delete")

    def exists(self, name: str) -> bool:
        try:
            self._client.get_parameter(Name=self._name(name), WithDecryption=False)
        except ClientError as exc:
            if error_code(exc) == _NOT_FOUND:
                return False
            fail(exc, f"secret {name!r}", "look up")
        except BotoCoreError as exc:
            fail(exc, f"secret {name!r}", "look up")
        return True
