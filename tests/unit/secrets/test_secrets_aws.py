"""AWS Secrets Manager store: what it does in AWS (moto, in-process) and how AWS errors surface."""

from __future__ import annotations

from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError

from nstance.core.errors import (
    FailedPrecondition,
    InvalidArgument,
    PermissionDenied,
    ResourceExhausted,
    Unavailable,
)
from nstance.secrets.aws import AwsSecretsManagerStore
from nstance.secrets.base import SecretNotFound


@pytest.fixture
def client(mocked_aws: None) -> Any:
    return boto3.client("secretsmanager", region_name="us-east-1")


def test_secrets_are_stored_binary_under_the_prefix(client: Any) -> None:
    store = AwsSecretsManagerStore("nstance/prod/", client=client)
    store.set("ca.key", b"\x00\x01key")
    described = client.describe_secret(SecretId="nstance/prod/ca.key")
    assert described["Name"] == "nstance/prod/ca.key"
    value = client.get_secret_value(SecretId="nstance/prod/ca.key")
    assert value["SecretBinary"] == b"\x00\x01key"
    assert "SecretString" not in value
    assert store.get("ca.key") == b"\x00\x01key"


def test_update_writes_a_new_version(client: Any) -> None:
    store = AwsSecretsManagerStore("p/", client=client)
    store.set("k", b"v1")
    store.set("k", b"v2")
    assert store.get("k") == b"v2"
    versions = client.list_secret_version_ids(SecretId="p/k")["Versions"]
    assert len(versions) == 2


def test_secret_string_created_by_hand_is_read(client: Any) -> None:
    client.create_secret(Name="p/manual", SecretString="hello")
    assert AwsSecretsManagerStore("p/", client=client).get("manual") == b"hello"


def test_not_found_and_force_delete(client: Any) -> None:
    store = AwsSecretsManagerStore("p/", client=client)
    with pytest.raises(SecretNotFound, match=r"secret 'ca\.key' not found"):
        store.get("ca.key")
    store.set("ca.key", b"x")
    store.delete("ca.key")
    assert not store.exists("ca.key")
    with pytest.raises(SecretNotFound):
        store.get("ca.key")
    store.delete("ca.key")  # already gone: fine


def test_set_if_absent(client: Any) -> None:
    store = AwsSecretsManagerStore("p/", client=client)
    assert store.set_if_absent("ca.key", b"first")
    assert not store.set_if_absent("ca.key", b"second")
    assert store.get("ca.key") == b"first"


def test_region_constructor_builds_its_own_client(client: Any) -> None:
    store = AwsSecretsManagerStore("p/", region="us-east-1")
    store.set("x", b"1")
    assert client.get_secret_value(SecretId="p/x")["SecretBinary"] == b"1"


class _FailingClient:
    """Raises the given error from every call, as botocore would."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def __getattr__(self, name: str) -> Any:
        def call(**_: Any) -> Any:
            raise self.error

        return call


def _client_error(code: str, message: str = "boom") -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": message}}, "Operation")


@pytest.mark.parametrize(
    ("error", "expected", "text"),
    [
        (_client_error("AccessDeniedException", "not allowed"), PermissionDenied, "AccessDeniedException"),
        (_client_error("ThrottlingException"), Unavailable, "ThrottlingException"),
        (_client_error("InternalServiceError"), Unavailable, "InternalServiceError"),
        (_client_error("LimitExceededException"), ResourceExhausted, "LimitExceededException"),
        (_client_error("DecryptionFailure", "kms"), FailedPrecondition, "DecryptionFailure: kms"),
        (EndpointConnectionError(endpoint_url="https://x"), Unavailable, "could not"),
        (NoCredentialsError(), FailedPrecondition, "no AWS credentials"),
    ],
)
def test_aws_errors_become_core_errors(error: Exception, expected: type[Exception], text: str) -> None:
    store = AwsSecretsManagerStore("p/", client=_FailingClient(error))
    for call in (
        lambda: store.get("k"),
        lambda: store.set("k", b"v"),
        lambda: store.set_if_absent("k", b"v"),
        lambda: store.delete("k"),
        lambda: store.exists("k"),
    ):
        with pytest.raises(expected, match=text):
            call()


def test_secret_marked_for_deletion() -> None:
    error = _client_error("InvalidRequestException", "it was marked for deletion")
    store = AwsSecretsManagerStore("p/", client=_FailingClient(error))
    with pytest.raises(SecretNotFound, match="marked for deletion"):
        store.get("k")
    with pytest.raises(Unavailable, match="still being deleted"):
        store.set_if_absent("k", b"v")
    with pytest.raises(Unavailable, match="still being deleted"):
        store.set("k", b"v")


def test_a_missing_region_is_a_clear_error_not_a_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/dev/null")
    with pytest.raises(InvalidArgument, match="AWS Secrets Manager needs a region: set AWS_REGION"):
        AwsSecretsManagerStore(prefix="c1/")
    monkeypatch.setenv("AWS_REGION", "eu-west-1")  # the variable botocore itself ignores here
    assert AwsSecretsManagerStore(prefix="c1/")._client.meta.region_name == "eu-west-1"
