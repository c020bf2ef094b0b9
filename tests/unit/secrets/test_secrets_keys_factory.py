"""Encryption-key loading (env and file, every accepted format and error) and the store factory."""

from __future__ import annotations

import base64
from pathlib import Path

import boto3
import pytest

from nstance.core.errors import FailedPrecondition, InvalidArgument, NotFound
from nstance.objectstore.memory import MemoryObjectStore
from nstance.secrets import keys
from nstance.secrets.aws import AwsSecretsManagerStore
from nstance.secrets.factory import open_secret_store
from nstance.secrets.memory import MemorySecretStore
from nstance.secrets.objectstorage import ObjectStorageSecretStore
from nstance.secrets.parameterstore import AwsParameterStoreSecretStore

KEY = bytes(range(32))
ENV = "NSTANCE_ENCRYPTION_KEY"


@pytest.mark.parametrize(
    "text",
    [
        base64.b64encode(KEY).decode(),
        base64.b64encode(KEY).decode().rstrip("="),
        base64.urlsafe_b64encode(KEY).decode(),
        KEY.hex(),
        KEY.hex().upper(),
        f"  {base64.b64encode(KEY).decode()}\n",
    ],
)
def test_env_key_formats(text: str) -> None:
    assert keys.load_encryption_key("env", ENV, {ENV: text}) == KEY


def test_env_32_character_value_is_used_as_is_like_upstream() -> None:
    value = "0123456789abcdef0123456789ABCDEF"
    assert keys.load_encryption_key("env", ENV, {ENV: value}) == value.encode()


def test_env_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_KEY", KEY.hex())
    assert keys.load_encryption_key("env", "MY_KEY") == KEY


@pytest.mark.parametrize(
    "content",
    [
        KEY,  # 32 raw bytes
        b"\n" * 32,  # 32 raw bytes that happen to be whitespace are still a key
        base64.b64encode(KEY) + b"\n",
        KEY.hex().encode() + b"\r\n",
        b"0123456789abcdef0123456789ABCDEF\n",  # upstream: 32 characters, trailing newline trimmed
    ],
)
def test_file_key_formats(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "key"
    path.write_bytes(content)
    loaded = keys.load_encryption_key("file", str(path))
    assert len(loaded) == 32
    if content in (KEY, b"\n" * 32):
        assert loaded == content


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({}, "environment variable NSTANCE_ENCRYPTION_KEY is not set or empty"),
        ({ENV: ""}, "environment variable NSTANCE_ENCRYPTION_KEY is not set or empty"),
        (
            {ENV: base64.b64encode(b"k" * 16).decode()},
            "from environment variable NSTANCE_ENCRYPTION_KEY decodes \\(base64\\) to 16 bytes, not 32",
        ),
        ({ENV: "short"}, "not in a recognised format \\(5 characters\\)"),
        ({ENV: "!" * 40}, "not in a recognised format"),
        ({ENV: "   "}, "is empty"),
    ],
)
def test_env_errors_name_the_variable_and_the_formats(environ: dict[str, str], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message) as err:
        keys.load_encryption_key("env", ENV, environ)
    assert "base64" in str(err.value)
    assert "64 hex characters" in str(err.value)


def test_error_never_echoes_the_value() -> None:
    secret_ish = "c2VjcmV0LXZhbHVlLXRoYXQtaXMtd3Jvbmc"
    with pytest.raises(InvalidArgument) as err:
        keys.load_encryption_key("env", ENV, {ENV: secret_ish})
    assert secret_ish not in str(err.value)


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "absent.key"
    with pytest.raises(InvalidArgument, match=f"cannot read encryption key file {path}: No such file"):
        keys.load_encryption_key("file", str(path))


def test_file_of_the_wrong_size(tmp_path: Path) -> None:
    path = tmp_path / "k"
    path.write_bytes(b"\x00" * 31)
    with pytest.raises(InvalidArgument, match=f"from file {path} is not in a recognised format"):
        keys.load_encryption_key("file", str(path))


def test_google_key_provider_needs_a_project() -> None:
    with pytest.raises(InvalidArgument, match="'google-secret-manager' needs a project_id"):
        keys.load_encryption_key("google-secret-manager", "x", {})


def test_key_from_aws_secrets_manager_as_the_terraform_module_stores_it(mocked_aws: None) -> None:
    client = boto3.client("secretsmanager", region_name="us-east-1")
    raw = keys.generate_encryption_key()
    arn = client.create_secret(Name="nstance-prod-encryption-key", SecretString=raw)["ARN"]
    assert keys.load_encryption_key("aws-secrets-manager", arn) == raw.encode()
    assert keys.load_encryption_key("aws-secrets-manager", "nstance-prod-encryption-key") == raw.encode()
    client.create_secret(Name="binary", SecretBinary=KEY)
    assert keys.load_encryption_key("aws-secrets-manager", "binary") == KEY
    client.create_secret(Name="short", SecretString="too short")
    with pytest.raises(
        InvalidArgument, match="AWS Secrets Manager secret short is not in a recognised format"
    ):
        keys.load_encryption_key("aws-secrets-manager", "short")
    with pytest.raises(NotFound, match="secret 'missing' not found"):
        keys.load_encryption_key("aws-secrets-manager", "missing")


def test_key_from_aws_parameter_store(mocked_aws: None) -> None:
    client = boto3.client("ssm", region_name="us-east-1")
    raw = keys.generate_encryption_key()
    client.put_parameter(Name="/nstance/prod/key", Value=raw, Type="SecureString")
    assert keys.load_encryption_key("aws-parameter-store", "/nstance/prod/key") == raw.encode()
    client.put_parameter(Name="/plain", Value=raw, Type="String")
    with pytest.raises(FailedPrecondition, match="is String, expected SecureString"):
        keys.load_encryption_key("aws-parameter-store", "/plain")
    with pytest.raises(NotFound, match="parameter '/nope' not found"):
        keys.load_encryption_key("aws-parameter-store", "/nope")


def test_unknown_key_provider_and_empty_source() -> None:
    with pytest.raises(InvalidArgument, match="unknown encryption key provider 'vault'"):
        keys.load_encryption_key("vault", "x", {})
    with pytest.raises(InvalidArgument, match="needs a source \\(an environment variable name\\)"):
        keys.load_encryption_key("env", "", {})


def test_generated_keys_are_32_characters_used_byte_for_byte_as_upstream_does() -> None:
    one, two = keys.generate_encryption_key(), keys.generate_encryption_key()
    assert one != two
    assert len(one) == 32
    assert one.isalnum()
    assert one.isascii()
    # upstream reads env and file keys as raw bytes and needs exactly 32 of them
    assert keys.load_encryption_key("env", ENV, {ENV: one}) == one.encode()


def test_load_several_keys_keeps_the_order(tmp_path: Path) -> None:
    path = tmp_path / "old.key"
    path.write_bytes(b"\x07" * 32)
    loaded = keys.load_encryption_keys([("env", ENV, ""), ("file", str(path), "")], {ENV: KEY.hex()})
    assert loaded == [KEY, b"\x07" * 32]


# --- factory ---------------------------------------------------------------------------------------


def test_factory_memory() -> None:
    assert isinstance(open_secret_store("memory"), MemorySecretStore)


def test_factory_object_storage() -> None:
    bucket = MemoryObjectStore()
    store = open_secret_store("object-storage", object_store=bucket, keys=[KEY])
    assert isinstance(store, ObjectStorageSecretStore)
    assert store.prefix == "secret/"
    store.set("ca.key", b"x")
    assert bucket.list() == ["secret/ca.key"]
    custom = open_secret_store("object-storage", object_store=bucket, keys=[KEY], prefix="s")
    assert isinstance(custom, ObjectStorageSecretStore)
    assert custom.prefix == "s/"


def test_factory_object_storage_needs_a_store_and_a_key() -> None:
    with pytest.raises(InvalidArgument, match="needs an object store"):
        open_secret_store("object-storage", keys=[KEY])
    with pytest.raises(InvalidArgument, match="unencrypted"):
        open_secret_store("object-storage", object_store=MemoryObjectStore())


def test_factory_aws(mocked_aws: None) -> None:
    store = open_secret_store("aws-secrets-manager", prefix="nstance/", aws_region="us-east-1")
    assert isinstance(store, AwsSecretsManagerStore)
    store.set("ca.key", b"v")
    client = boto3.client("secretsmanager", region_name="us-east-1")
    assert client.get_secret_value(SecretId="nstance/ca.key")["SecretBinary"] == b"v"


def test_factory_parameter_store_with_upstreams_default_prefix(mocked_aws: None) -> None:
    store = open_secret_store("aws-parameter-store", aws_region="us-east-1")
    assert isinstance(store, AwsParameterStoreSecretStore)
    store.set("ca.key", b"pem")
    client = boto3.client("ssm", region_name="us-east-1")
    parameter = client.get_parameter(Name="/nstance/ca.key", WithDecryption=True)["Parameter"]
    assert (parameter["Type"], parameter["Value"]) == ("SecureString", "pem")
    assert open_secret_store("aws-secrets-manager", aws_region="us-east-1").prefix == "nstance/"  # type: ignore[attr-defined]


def test_factory_needs_a_project_for_google_secret_manager() -> None:
    with pytest.raises(InvalidArgument, match="google-secret-manager secrets provider needs a project_id"):
        open_secret_store("google-secret-manager")


def test_factory_refuses_unknown_providers() -> None:
    with pytest.raises(
        InvalidArgument,
        match="unknown secrets provider 'vault'; use one of: object-storage, aws-parameter-store, "
        "aws-secrets-manager, google-secret-manager, memory",
    ):
        open_secret_store("vault")
