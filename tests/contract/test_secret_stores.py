"""Behaviour every SecretStore shares: memory, encrypted object storage, AWS Secrets Manager and
Parameter Store (moto), Google Secret Manager (the real client library against ``GsmFake`` over gRPC)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable

import boto3
import pytest

from nstance.core.errors import FailedPrecondition, InvalidArgument, NotFound
from nstance.objectstore.memory import MemoryObjectStore
from nstance.secrets.aws import AwsSecretsManagerStore
from nstance.secrets.base import SecretNotFound, SecretStore, validate_secret_name
from nstance.secrets.googlesm import GoogleSecretManagerStore, secret_manager_client
from nstance.secrets.memory import MemorySecretStore
from nstance.secrets.objectstorage import ObjectStorageSecretStore
from nstance.secrets.parameterstore import AwsParameterStoreSecretStore
from nstance.testing.gsmfake import GsmFake

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


_GSM: list[GsmFake] = []  # the session's fake, set by the store_kind fixture when a test needs it


def _google() -> SecretStore:
    project = f"p-{uuid.uuid4().hex[:12]}"  # a project of its own per store: tests never share secrets
    return GoogleSecretManagerStore(project, "nstance-test-", client=secret_manager_client(_GSM[0].endpoint))


FACTORIES: dict[str, Callable[[], SecretStore]] = {
    "memory": _memory,
    "object-storage": _object_storage,
    "aws-secrets-manager": _aws,
    "aws-parameter-store": _parameter_store,
    "google-secret-manager": _google,
}
#: Stores that hold only text (as upstream's Parameter Store does).
TEXT_ONLY = frozenset({"aws-parameter-store"})


@pytest.fixture(params=sorted(FACTORIES))
def store_kind(request: pytest.FixtureRequest) -> str:
    if request.param.startswith("aws-"):
        request.getfixturevalue("mocked_aws")
    if request.param == "google-secret-manager" and not _GSM:
        _GSM.append(request.getfixturevalue("gsm_fake"))
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


@pytest.mark.parametrize("store_kind", ["memory", "object-storage", "google-secret-manager"], indirect=True)
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


# ------------------------------------------------------------------------- Google Secret Manager only


@pytest.fixture
def gsm(gsm_fake: GsmFake) -> GsmFake:
    if not _GSM:
        _GSM.append(gsm_fake)
    return gsm_fake


def test_google_secret_ids_are_upstreams(gsm: GsmFake) -> None:
    """``ca.key`` under ``nstance-`` is ``nstance-ca-key``: the secret upstream's Go server reads."""
    project = f"p-{uuid.uuid4().hex[:12]}"
    store = GoogleSecretManagerStore(project, client=secret_manager_client(gsm.endpoint))
    store.set("ca.key", b"one")
    store.set("ca.key", b"two")
    assert gsm.versions(project, "nstance-ca-key") == [b"one", b"two"]  # a write is a new version
    gsm.put(project, "nstance-registration-nonce-key", b"written by Go")
    assert store.get("registration-nonce.key") == b"written by Go"


def test_a_google_secret_without_a_version_is_an_error_not_absent(
    gsm: GsmFake, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = f"p-{uuid.uuid4().hex[:12]}"
    store = GoogleSecretManagerStore(project, client=secret_manager_client(gsm.endpoint))
    gsm.put(project, "nstance-ca-key")  # created, then its creator stopped before adding the value
    with pytest.raises(FailedPrecondition, match="nstance-ca-key exists but has no version"):
        store.get("ca.key")
    monkeypatch.setattr("nstance.secrets.googlesm._FIRST_VERSION_WAITS", (0.01,))
    with pytest.raises(FailedPrecondition, match="exists but has no version"):
        store.set_if_absent("ca.key", b"new")
    assert gsm.versions(project, "nstance-ca-key") == []  # nothing written over a half-made secret
    store.set("ca.key", b"repaired")
    assert store.get("ca.key") == b"repaired"


def test_google_errors_become_clear_core_errors(gsm: GsmFake) -> None:
    import grpc

    from nstance.core.errors import PermissionDenied

    store = GoogleSecretManagerStore(f"p-{uuid.uuid4().hex[:12]}", client=secret_manager_client(gsm.endpoint))
    gsm.fail_next(grpc.StatusCode.PERMISSION_DENIED)
    with pytest.raises(PermissionDenied, match="Google Secret Manager could not look up secret 'ca"):
        store.exists("ca.key")
    with pytest.raises(InvalidArgument, match="needs a project_id"):
        GoogleSecretManagerStore("", client=object())
    with pytest.raises(InvalidArgument, match="Secret Manager holds at most 65536"):
        store.set("big", b"x" * 65537)


def test_an_encryption_key_held_in_google_secret_manager(
    gsm: GsmFake, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The key source upstream reads with ``{provider: google-secret-manager, source, project_id}``."""
    from nstance.secrets.keys import generate_encryption_key, load_encryption_key

    project = f"p-{uuid.uuid4().hex[:12]}"
    raw = generate_encryption_key()
    gsm.put(project, "fleet-encryption-key", raw.encode())
    monkeypatch.setenv("SECRET_MANAGER_EMULATOR_HOST", gsm.endpoint)
    assert (
        load_encryption_key("google-secret-manager", "fleet-encryption-key", project_id=project)
        == raw.encode()
    )
    with pytest.raises(SecretNotFound):
        load_encryption_key("google-secret-manager", "missing-key", project_id=project)
