"""Small decisions of the agent: which registration failures are permanent, when to renew, which key
names are acceptable, whether a stored certificate can be reused, and what /healthz answers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import pytest
from cryptography.hazmat.primitives.asymmetric import ed25519

from nstance.agent.identity import certificate_problem, ensure_identity_key
from nstance.agent.keys import KeyStore, validate_key_name
from nstance.agent.register import Outcome, classify_registration_error
from nstance.agent.renewal import renewal_due, warning_due
from nstance.core.clock import ManualClock
from nstance.core.errors import FailedPrecondition, InvalidArgument
from nstance.pki.ca import create_ca
from nstance.pki.certs import issue_client_certificate
from nstance.pki.keys import load_private_key_pem, load_public_key_pem, public_key_to_pem

NOW = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("code", "details", "outcome"),
    [
        (grpc.StatusCode.UNAUTHENTICATED, "bad signature", Outcome.PERMANENT),
        (grpc.StatusCode.PERMISSION_DENIED, "", Outcome.PERMANENT),
        (grpc.StatusCode.INVALID_ARGUMENT, "key type", Outcome.PERMANENT),
        (grpc.StatusCode.ALREADY_EXISTS, "nonce used", Outcome.PERMANENT),
        (grpc.StatusCode.FAILED_PRECONDITION, "nonce expired", Outcome.PERMANENT),
        (grpc.StatusCode.FAILED_PRECONDITION, "this server is not the leader of shard s1", Outcome.TRANSIENT),
        (grpc.StatusCode.UNAVAILABLE, "connection refused", Outcome.TRANSIENT),
        (grpc.StatusCode.DEADLINE_EXCEEDED, "", Outcome.TRANSIENT),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, "", Outcome.TRANSIENT),
        (grpc.StatusCode.INTERNAL, "", Outcome.TRANSIENT),
    ],
)
def test_registration_failures_are_sorted(code: grpc.StatusCode, details: str, outcome: Outcome) -> None:
    assert classify_registration_error(code, details) is outcome


def test_renewal_starts_at_two_thirds_and_warns_at_ninety_percent(tmp_path: Path) -> None:
    ca = create_ca(clock=ManualClock(NOW - timedelta(days=1)))
    key = ensure_identity_key(tmp_path / "identity.key")
    issued = issue_client_certificate(
        ca,
        key.public_key(),
        client_id="i",
        tenant="t",
        role="agent",
        ttl=timedelta(hours=300),
        clock=ManualClock(NOW),
    )
    start = issued.not_before  # backdated a few minutes by the CA
    life = issued.not_after - start
    assert renewal_due(issued.certificate) == start + life * 2 / 3
    assert warning_due(issued.certificate) == start + life * 0.9


def test_stored_certificate_reuse_rules(tmp_path: Path) -> None:
    ca = create_ca(clock=ManualClock(NOW - timedelta(days=1)))
    other_ca = create_ca(clock=ManualClock(NOW - timedelta(days=1)))
    key_path = tmp_path / "identity.key"
    key = ensure_identity_key(key_path)
    assert (key_path.stat().st_mode & 0o777) == 0o600
    assert load_private_key_pem(key_path.read_bytes()).public_key() == key.public_key()
    assert ensure_identity_key(key_path).private_numbers() == key.private_numbers()  # reused, not replaced

    def cert(**changes: object) -> bytes:
        args: dict[str, object] = {
            "client_id": "web-1",
            "tenant": "t",
            "role": "agent",
            "ttl": timedelta(days=1),
        }
        args |= changes
        issuer = args.pop("ca", ca)
        public = args.pop("key", key.public_key())
        return issue_client_certificate(issuer, public, clock=ManualClock(NOW), **args).cert_pem  # type: ignore[arg-type]

    def problem(pem: bytes, at: datetime = NOW) -> str | None:
        return certificate_problem(pem, ca_pem=ca.cert_pem, key=key, instance_id="web-1", now=at)

    assert problem(cert()) is None
    assert "not this instance" in (problem(cert(client_id="web-2")) or "")
    assert "role" in (problem(cert(role="operator")) or "")
    assert "not issued by" in (problem(cert(ca=other_ca)) or "")
    other_key = ensure_identity_key(tmp_path / "other.key")
    assert "does not match" in (problem(cert(key=other_key.public_key())) or "")
    assert "expires" in (problem(cert(), NOW + timedelta(days=1) - timedelta(seconds=30)) or "")
    assert "expired" in (problem(cert(), NOW + timedelta(days=2)) or "")


@pytest.mark.parametrize("name", ["../x", "a/b", "", ".hidden", "a\x00", "a\\b", "..", "a..b"])
def test_key_names_must_be_bare(name: str) -> None:
    with pytest.raises(InvalidArgument):
        validate_key_name(name)


def test_key_store_creates_reuses_and_lists_keys(tmp_path: Path) -> None:
    store = KeyStore(tmp_path / "keys")
    assert store.ensure(["kubelet.server", "etcd.peer.pub", "../evil"]) == ["kubelet.server", "etcd.peer"]
    first = (tmp_path / "keys" / "kubelet.server.key").read_bytes()
    assert store.ensure(["kubelet.server"]) == ["kubelet.server"]
    assert (tmp_path / "keys" / "kubelet.server.key").read_bytes() == first
    assert not (tmp_path / "evil.key").exists()
    listed = store.public_keys()
    assert [k.name for k in listed] == ["etcd.peer", "kubelet.server"]
    pub = load_public_key_pem(listed[1].public_key_pem, ("ecdsa-p256",))
    assert pub == load_private_key_pem(first).public_key()


def test_the_identity_key_is_kept_as_a_pair_as_upstreams_agent_keeps_it(tmp_path: Path) -> None:
    # Upstream's agent (internal/identity) stores identity.key and identity.pub and refuses a
    # directory with one of them: a Go agent started on this directory after a rollback must find both.
    key_path = tmp_path / "identity.key"
    public_path = tmp_path / "identity.pub"
    key = ensure_identity_key(key_path, key_type="ed25519")
    assert public_path.read_bytes() == public_key_to_pem(key)
    assert (public_path.stat().st_mode & 0o777) == 0o600
    public_path.unlink()  # a directory written by an earlier version of this agent: the pair is completed
    assert public_key_to_pem(ensure_identity_key(key_path)) == public_key_to_pem(key)
    assert public_path.read_bytes() == public_key_to_pem(key)
    key_path.unlink()  # a public key alone: refused, never replaced by a new pair
    with pytest.raises(FailedPrecondition, match="incomplete identity keypair"):
        ensure_identity_key(key_path)
    assert not key_path.exists()
    assert public_path.read_bytes() == public_key_to_pem(key)


def test_key_pairs_made_on_request_take_the_type_they_are_told(tmp_path: Path) -> None:
    store = KeyStore(tmp_path / "keys", key_type="ed25519")  # under an Ed25519 CA (a Go server's cluster)
    assert store.ensure(["tls"]) == ["tls"]
    made = load_private_key_pem((tmp_path / "keys" / "tls.key").read_bytes())
    assert isinstance(made, ed25519.Ed25519PrivateKey)
    assert load_public_key_pem(store.public_keys()[0].public_key_pem, ("ed25519",)) is not None
