"""Behaviour every SecretStore shares: memory, encrypted object storage, AWS Secrets Manager (moto)."""

from __future__ import annotations

import threading
from collections.abc import Callable

import boto3
import pytest

from nstance.core.errors import FailedPrecondition, InvalidArgument, NotFound
from nstance.objectstore.memory import MemoryObjectStore
from nstance.secrets.aws import AwsSecretsManagerStore
from nstance.secrets.base import SecretNotFound, SecretStore, validate_secret_name
from nstance.secrets.memory import MemorySecretStore
from nstance.secrets.objectstorage import ObjectStorageSecretStore
from nstance.secrets.parameterstore import AwsParameterStoreSecretStore

KEY = bytes(range(32))


def _memory() -> SecretStore:
    return MemorySecretStore()


def _object_storage() -> SecretStore:
    return ObjectStorageSecretStore(MemoryObjectStore(), keys=[KEY])


def _aws() -> SecretStore:
    return AwsSecretsManagerStore(
        "nstance/test/", client=boto3.client("secretsmanager", region_name="us-east-1")
    )


def _parameter_store() -> SecretStore:
    return AwsParameterStoreSecretStore("/nstance/test/", client=boto3.client("ssm", region_name="us-east-1"))


FACTORIES: dict[str, Callable[[], SecretStore]] = {
    "memory": _memory,
    "object-storage": _object_storage,
    "aws-secrets-manager": _aws,
    "aws-parameter-store": _parameter_store,
}
#: Stores that hold only text (as upstream's Parameter Store does).
TEXT_ONLY = frozenset({"aws-parameter-store"})


@pytest.fixture(params=sorted(FACTORIES))
def store_kind(request: pytest.FixtureRequest) -> str:
    if request.param.startswith("aws-"):
        request.getfixturevalue("mocked_aws")
    return str(request.param)


@pytest.fixture
def store(store_kind: str) -> SecretStore:
    return FACTORIES[store_kind]()


def test_round_trip(store: SecretStore) -> None:
    store.set("ca.key", b"-----BEGIN PRIVATE KEY-----\n...")
    assert store.get("ca.key") == b"-----BEGIN PRIVATE KEY-----\n..."
    assert store.exists("ca.key")


def test_binary_values_survive(store: SecretStore, store_kind: str) -> None:
    data = bytes(range(256)) * 4
    if store_kind in TEXT_ONLY:
        with pytest.raises(InvalidArgument, match="is not UTF-8 text"):
            store.set("blob", data)
        return
    store.set("blob", data)
    assert store.get("blob") == data


def test_parameter_store_values_are_standard_tier_secure_strings(mocked_aws: None) -> None:
    store = _parameter_store()
    with pytest.raises(InvalidArgument, match="a standard-tier parameter holds at most 4096"):
        store.set("big", b"x" * 4097)
    client = boto3.client("ssm", region_name="us-east-1")
    client.put_parameter(Name="/nstance/test/plain", Value="v", Type="String")
    with pytest.raises(FailedPrecondition, match="is String, expected SecureString"):
        store.get("plain")


def test_overwrite(store: SecretStore) -> None:
    store.set("registration-nonce.key", b"one")
    store.set("registration-nonce.key", b"two")
    assert store.get("registration-nonce.key") == b"two"


def test_missing_secret(store: SecretStore) -> None:
    with pytest.raises(SecretNotFound, match="secret 'nope' not found") as err:
        store.get("nope")
    assert isinstance(err.value, NotFound)
    assert not store.exists("nope")


def test_delete_is_idempotent(store: SecretStore) -> None:
    store.set("gone", b"x")
    store.delete("gone")
    assert not store.exists("gone")
    with pytest.raises(SecretNotFound):
        store.get("gone")
    store.delete("gone")
    store.delete("never-existed")


def test_set_if_absent_creates_once(store: SecretStore) -> None:
    assert store.set_if_absent("ca.key", b"first") is True
    assert store.set_if_absent("ca.key", b"second") is False
    assert store.get("ca.key") == b"first"


def test_set_after_delete(store: SecretStore) -> None:
    store.set("k", b"1")
    store.delete("k")
    store.set("k", b"2")
    assert store.get("k") == b"2"


@pytest.mark.parametrize("name", ["", "a/b", "..", "a..b", ".", "has space", "ünï", "x" * 256])
def test_invalid_names_are_refused_everywhere(store: SecretStore, name: str) -> None:
    for call in (store.get, store.exists, store.delete):
        with pytest.raises(InvalidArgument):
            call(name)
    with pytest.raises(InvalidArgument):
        store.set(name, b"x")
    with pytest.raises(InvalidArgument):
        store.set_if_absent(name, b"x")


@pytest.mark.parametrize("store_kind", ["memory", "object-storage"])
def test_set_if_absent_is_atomic_under_contention(store_kind: str) -> None:
    store = FACTORIES[store_kind]()
    results: list[bool] = []
    lock = threading.Lock()
    barrier = threading.Barrier(16)

    def worker(i: int) -> None:
        barrier.wait()
        created = store.set_if_absent("ca.key", f"writer-{i}".encode())
        with lock:
            results.append(created)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results.count(True) == 1
    assert store.get("ca.key").startswith(b"writer-")


@pytest.mark.parametrize("name", ["ca.key", "registration-nonce.key", "A_b+c=d@e-f", "x" * 255])
def test_valid_names(name: str) -> None:
    assert validate_secret_name(name) == name


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("", "must not be empty"),
        ("a/b", "must not contain '/'"),
        ("../etc", "must not contain '/'"),
        ("..", "must not be '.' or contain '..'"),
        ("a b", "may only contain letters, digits"),
        ("x" * 256, "at most 255 characters"),
    ],
)
def test_name_errors_say_which_rule(name: str, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        validate_secret_name(name)
