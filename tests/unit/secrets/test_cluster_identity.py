"""Cluster identity bootstrap: one CA however many initialisers race, crash recovery, clear refusals."""

from __future__ import annotations

import threading

import pytest

from nstance.core.errors import FailedPrecondition
from nstance.objectstore.memory import MemoryObjectStore
from nstance.pki.certs import issue_client_certificate
from nstance.pki.keys import generate_private_key
from nstance.pki.nonce import operator_nonce_claims, sign_nonce, verify_nonce
from nstance.secrets.cluster_identity import (
    CA_CERT_OBJECT,
    CA_KEY_SECRET,
    NONCE_KEY_SECRET,
    ensure_cluster_identity,
    identity_state,
    load_cluster_identity,
)
from nstance.secrets.objectstorage import ObjectStorageSecretStore

KEY = bytes(range(32))


def _stores() -> tuple[MemoryObjectStore, ObjectStorageSecretStore]:
    cluster = MemoryObjectStore()
    return cluster, ObjectStorageSecretStore(cluster, "secret/", keys=[KEY])


def test_first_run_creates_everything_and_second_run_changes_nothing() -> None:
    cluster, secrets = _stores()
    assert identity_state(cluster, secrets).empty
    first = ensure_cluster_identity(cluster, secrets, cluster_id="demo")
    assert first.created_ca
    assert first.created_nonce_key
    assert not first.repaired_ca_cert
    assert identity_state(cluster, secrets).complete
    assert sorted(cluster.list()) == ["ca.crt", "secret/ca.key", "secret/registration-nonce.key"]
    etags = {key: cluster.head(key).etag for key in cluster.list()}

    second = ensure_cluster_identity(cluster, secrets, cluster_id="demo")
    assert not second.changed
    assert second.identity.ca_fingerprint == first.identity.ca_fingerprint
    assert {key: cluster.head(key).etag for key in cluster.list()} == etags


def test_new_ca_is_ed25519_by_default_as_upstream_and_ecdsa_on_request() -> None:
    cluster, secrets = _stores()
    assert ensure_cluster_identity(cluster, secrets, cluster_id="demo").identity.ca.key_type == "ed25519"
    key_pem = secrets.get("ca.key")
    assert key_pem.startswith(b"-----BEGIN PRIVATE KEY-----")  # PKCS#8, what upstream's Go server parses
    cluster2, secrets2 = _stores()
    p256 = ensure_cluster_identity(cluster2, secrets2, cluster_id="demo", key_type="ecdsa-p256")
    assert p256.identity.ca.key_type == "ecdsa-p256"


def test_loaded_identity_signs_usable_nonces_and_certificates() -> None:
    cluster, secrets = _stores()
    ensure_cluster_identity(cluster, secrets, cluster_id="demo")
    identity = load_cluster_identity(cluster, secrets)
    token = sign_nonce(identity.nonce_key, operator_nonce_claims(cluster_id="demo", tenant="default"))
    claims = verify_nonce(token, identity.nonce_key.public_key(), expected_kind="operator", cluster_id="demo")
    assert claims.tenant == "default"
    cert = issue_client_certificate(
        identity.ca,
        generate_private_key("ecdsa-p256").public_key(),
        client_id="opr-1",
        tenant="default",
        role="operator",
    )
    assert cert.certificate.issuer == identity.ca.certificate.subject


def test_racing_initialisers_agree_on_one_ca() -> None:
    cluster, secrets = _stores()
    fingerprints: list[str] = []
    barrier = threading.Barrier(8)

    def run() -> None:
        barrier.wait()
        fingerprints.append(
            ensure_cluster_identity(cluster, secrets, cluster_id="demo").identity.ca_fingerprint
        )

    threads = [threading.Thread(target=run) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(fingerprints) == 8
    assert len(set(fingerprints)) == 1
    assert load_cluster_identity(cluster, secrets).ca_fingerprint == fingerprints[0]


def test_crash_between_key_and_certificate_is_repaired_with_the_same_key() -> None:
    cluster, secrets = _stores()
    first = ensure_cluster_identity(cluster, secrets, cluster_id="demo")
    cluster.delete(CA_CERT_OBJECT)  # as if the process died after writing ca.key
    repaired = ensure_cluster_identity(cluster, secrets, cluster_id="demo")
    assert repaired.repaired_ca_cert
    assert not repaired.created_ca
    assert repaired.identity.ca.key_pem == first.identity.ca.key_pem


def test_certificate_without_key_is_refused_and_nothing_is_written() -> None:
    cluster, secrets = _stores()
    ensure_cluster_identity(cluster, secrets, cluster_id="demo")
    secrets.delete(CA_KEY_SECRET)
    before = sorted(cluster.list())
    with pytest.raises(FailedPrecondition, match="inconsistent CA state"):
        ensure_cluster_identity(cluster, secrets, cluster_id="demo")
    assert sorted(cluster.list()) == before
    with pytest.raises(FailedPrecondition, match="inconsistent CA state"):
        load_cluster_identity(cluster, secrets)


def test_missing_identity_names_what_is_missing() -> None:
    cluster, secrets = _stores()
    with pytest.raises(FailedPrecondition, match=r"not initialised.*cluster init") as info:
        load_cluster_identity(cluster, secrets)
    assert CA_CERT_OBJECT in str(info.value)
    assert NONCE_KEY_SECRET in str(info.value)


def test_a_key_that_is_not_the_certificates_is_reported() -> None:
    cluster, secrets = _stores()
    ensure_cluster_identity(cluster, secrets, cluster_id="demo")
    other_cluster, other_secrets = _stores()
    ensure_cluster_identity(other_cluster, other_secrets, cluster_id="demo")
    secrets.set(CA_KEY_SECRET, other_secrets.get(CA_KEY_SECRET))
    with pytest.raises(FailedPrecondition, match="does not match"):
        load_cluster_identity(cluster, secrets)
