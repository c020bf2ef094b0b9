"""Registration nonce JWTs: the happy paths, upstream's wire form, and every attack refused."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import hmac
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from nstance.core.clock import ManualClock
from nstance.core.errors import InvalidArgument, Unauthenticated
from nstance.pki import nonce
from nstance.testing import jwtforge
from nstance.testing.jwtforge import b64json, craft
from nstance.testing.jwtforge import b64url as b64

START = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
KEY = ed25519.Ed25519PrivateKey.generate()
PUB = KEY.public_key()
_DROP = object()  # marks a claim to leave out of a crafted payload


def ed_sign(header: dict[str, Any], payload: dict[str, Any], key: ed25519.Ed25519PrivateKey = KEY) -> str:
    return jwtforge.ed_sign(header, payload, key)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(START)


def agent_claims(clock: ManualClock, **overrides: Any) -> nonce.NonceClaims:
    claims = nonce.agent_nonce_claims(
        instance_id="knc06bgm7733st2576nx5jht4ecjw",
        cluster_id="prod",
        shard="us-east-1a",
        group="workers",
        tenant="acme",
        config_hash="abc123",
        clock=clock,
    )
    return dataclasses.replace(claims, **overrides)


def agent_payload(clock: ManualClock, **overrides: Any) -> dict[str, Any]:
    payload = agent_claims(clock).to_payload()
    payload.update(overrides)
    return {k: v for k, v in payload.items() if v is not _DROP}


def verify_agent(token: str | bytes, clock: ManualClock, **kwargs: Any) -> nonce.NonceClaims:
    args: dict[str, Any] = {
        "expected_kind": "agent",
        "cluster_id": "prod",
        "shard": "us-east-1a",
        "clock": clock,
    }
    args.update(kwargs)
    return nonce.verify_nonce(token, PUB, **args)


# --- happy paths ---------------------------------------------------------------------------------


def test_agent_nonce_round_trip(clock: ManualClock) -> None:
    claims = agent_claims(clock, on_demand=True)
    token = nonce.sign_nonce(KEY, claims)
    assert verify_agent(token, clock) == claims
    header = json.loads(base64.urlsafe_b64decode(token.split(".")[0] + "=="))
    assert header == {"alg": "EdDSA", "typ": "JWT"}


def test_payload_has_upstream_claims_and_order(clock: ManualClock) -> None:
    token = nonce.sign_nonce(KEY, agent_claims(clock))
    payload = json.loads(base64.urlsafe_b64decode(token.split(".")[1] + "=="))
    assert list(payload) == [
        "iss", "sub", "exp", "nbf", "iat", "kind", "config_hash", "cluster_id", "shard", "group",
        "on_demand", "tenant",
    ]  # fmt: skip
    assert payload["iss"] == "nstance-server"
    assert payload["exp"] - payload["iat"] == 300  # agent nonces live 5 minutes
    assert payload["nbf"] == payload["iat"] == int(START.timestamp())


def test_operator_nonce_round_trip(clock: ManualClock) -> None:
    claims = nonce.operator_nonce_claims(cluster_id="prod", tenant="acme", clock=clock)
    assert claims.exp - claims.iat == timedelta(hours=3)
    token = nonce.sign_nonce(KEY, claims)
    got = nonce.verify_nonce(token, PUB, expected_kind="operator", cluster_id="prod", clock=clock)
    assert got.sub == "prod"
    assert got.shard == ""


@pytest.mark.parametrize("kid", [None, "", "k1", "clé/2026"])
@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"on_demand": True, "config_hash": ""},
        {"tenant": "écurie", "group": "wörkers\u2028", "shard": ""},
        {"sub": "x" * 300, "config_hash": "sha256:" + "f" * 64},
    ],
)
def test_signed_bytes_are_pyjwt_encode_bytes(
    clock: ManualClock, kid: str | None, overrides: dict[str, Any]
) -> None:
    # The signer writes the compact form itself; PyJWT's encoder is the reference for every byte
    # (Ed25519 is deterministic, so equal input gives an equal signature).
    claims = agent_claims(clock, **overrides)
    expected = jwt.encode(claims.to_payload(), KEY, algorithm="EdDSA", headers={"kid": kid} if kid else None)
    assert nonce.sign_nonce(KEY, claims, kid=kid) == expected
    if kid:
        verify_agent(expected, clock, kid=kid, shard=claims.shard or None)


def test_token_shaped_like_golang_jwt_output_verifies(clock: ManualClock) -> None:
    # golang-jwt writes {"alg":"EdDSA","typ":"JWT"}; a token without typ and with float times is fine too.
    payload = agent_payload(clock)
    payload["exp"] = float(payload["exp"])
    token = ed_sign({"alg": "EdDSA"}, payload)
    assert verify_agent(token, clock).exp == START + timedelta(minutes=5)
    assert verify_agent(token.encode(), clock).sub == "knc06bgm7733st2576nx5jht4ecjw"


def test_leeway_absorbs_small_clock_skew(clock: ManualClock) -> None:
    token = nonce.sign_nonce(KEY, agent_claims(clock))
    clock.advance(timedelta(minutes=5, seconds=59))
    verify_agent(token, clock)  # 59 s past exp, leeway 60 s
    clock.advance(1)
    with pytest.raises(Unauthenticated, match=r"^registration nonce expired at 2026-03-01T12:05:00\+00:00$"):
        verify_agent(token, clock)
    verify_agent(token, clock, leeway=timedelta(minutes=10))


def test_kid_pinning(clock: ManualClock) -> None:
    token = nonce.sign_nonce(KEY, agent_claims(clock), kid="k1")
    verify_agent(token, clock, kid="k1")
    verify_agent(token, clock)  # no pin: kid ignored
    with pytest.raises(Unauthenticated, match="signed with key id 'k1', expected 'k2'"):
        verify_agent(token, clock, kid="k2")
    unkeyed = nonce.sign_nonce(KEY, agent_claims(clock))
    with pytest.raises(Unauthenticated, match="signed with key id None, expected 'k1'"):
        verify_agent(unkeyed, clock, kid="k1")


# --- algorithm attacks ---------------------------------------------------------------------------


@pytest.mark.parametrize("alg", ["none", "None", "NONE", "nOnE"])
def test_alg_none_is_refused(clock: ManualClock, alg: str) -> None:
    token = craft({"alg": alg, "typ": "JWT"}, agent_payload(clock))
    with pytest.raises(Unauthenticated, match=f"uses algorithm '{alg}'; only EdDSA is accepted"):
        verify_agent(token, clock)


def test_alg_none_with_a_copied_signature_is_refused(clock: ManualClock) -> None:
    good = nonce.sign_nonce(KEY, agent_claims(clock))
    _, payload, sig = good.split(".")
    with pytest.raises(Unauthenticated, match="uses algorithm 'none'"):
        verify_agent(f"{b64json({'alg': 'none'})}.{payload}.{sig}", clock)


def test_missing_alg_is_refused(clock: ManualClock) -> None:
    with pytest.raises(Unauthenticated, match="uses algorithm None"):
        verify_agent(craft({"typ": "JWT"}, agent_payload(clock), b"x"), clock)


@pytest.mark.parametrize(
    "secret",
    [
        PUB.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo),
        PUB.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw),
        PUB.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo),
    ],
)
@pytest.mark.parametrize("alg", ["HS256", "HS384", "HS512"])
def test_hmac_signed_with_the_public_key_is_refused(clock: ManualClock, secret: bytes, alg: str) -> None:
    digest = {"HS256": hashlib.sha256, "HS384": hashlib.sha384, "HS512": hashlib.sha512}[alg]
    signing_input = f"{b64json({'alg': alg, 'typ': 'JWT'})}.{b64json(agent_payload(clock))}"
    token = f"{signing_input}.{b64(hmac.new(secret, signing_input.encode(), digest).digest())}"
    with pytest.raises(Unauthenticated, match=f"uses algorithm '{alg}'; only EdDSA is accepted"):
        verify_agent(token, clock)


def test_hmac_signature_under_an_eddsa_header_is_refused(clock: ManualClock) -> None:
    secret = PUB.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    signing_input = f"{b64json({'alg': 'EdDSA', 'typ': 'JWT'})}.{b64json(agent_payload(clock))}"
    token = f"{signing_input}.{b64(hmac.new(secret, signing_input.encode(), hashlib.sha256).digest())}"
    with pytest.raises(Unauthenticated, match="signature is invalid"):
        verify_agent(token, clock)


def test_rs256_with_another_key_is_refused(clock: ManualClock) -> None:
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    token = jwt.encode(agent_payload(clock), other, algorithm="RS256")
    with pytest.raises(Unauthenticated, match="uses algorithm 'RS256'; only EdDSA is accepted"):
        verify_agent(token, clock)


@pytest.mark.parametrize(("alg", "curve"), [("ES256", ec.SECP256R1()), ("ES384", ec.SECP384R1())])
def test_ecdsa_with_another_key_is_refused(clock: ManualClock, alg: str, curve: ec.EllipticCurve) -> None:
    token = jwt.encode(agent_payload(clock), ec.generate_private_key(curve), algorithm=alg)
    with pytest.raises(Unauthenticated, match=f"uses algorithm '{alg}'"):
        verify_agent(token, clock)


def test_another_ed25519_key_is_refused(clock: ManualClock) -> None:
    token = nonce.sign_nonce(ed25519.Ed25519PrivateKey.generate(), agent_claims(clock))
    with pytest.raises(Unauthenticated, match=r"signature is invalid \(wrong key or altered token\)"):
        verify_agent(token, clock)


def test_embedded_attacker_key_headers_are_refused(clock: ManualClock) -> None:
    attacker = ed25519.Ed25519PrivateKey.generate()
    raw = attacker.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    for name, value in [
        ("jwk", {"kty": "OKP", "crv": "Ed25519", "x": b64(raw)}),
        ("jku", "https://evil.example/keys"),
        ("x5u", "https://evil.example/cert"),
        ("x5c", ["MIIB"]),
        ("crit", ["exp"]),
        ("b64", False),
    ]:
        token = ed_sign({"alg": "EdDSA", name: value}, agent_payload(clock), attacker)
        with pytest.raises(Unauthenticated, match=f"header carries '{name}'"):
            verify_agent(token, clock)


def test_wrong_typ_is_refused(clock: ManualClock) -> None:
    token = ed_sign({"alg": "EdDSA", "typ": "at+jwt"}, agent_payload(clock))
    with pytest.raises(Unauthenticated, match="has type 'at\\+jwt'"):
        verify_agent(token, clock)


# --- tampering -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "change", [{"tenant": "evil"}, {"shard": "us-east-1b"}, {"exp": 4102444800}, {"kind": "operator"}]
)
def test_tampered_payload_with_the_original_signature_is_refused(
    clock: ManualClock, change: dict[str, Any]
) -> None:
    header, _, sig = nonce.sign_nonce(KEY, agent_claims(clock)).split(".")
    forged = f"{header}.{b64json(agent_payload(clock, **change))}.{sig}"
    with pytest.raises(Unauthenticated, match="signature is invalid"):
        verify_agent(forged, clock)


def test_tampered_header_or_signature_is_refused(clock: ManualClock) -> None:
    header, payload, sig = nonce.sign_nonce(KEY, agent_claims(clock)).split(".")
    with pytest.raises(Unauthenticated, match="signature is invalid"):
        verify_agent(f"{b64json({'alg': 'EdDSA', 'typ': 'JWT', 'kid': 'x'})}.{payload}.{sig}", clock)
    flipped = bytearray(base64.urlsafe_b64decode(sig + "=="))
    flipped[0] ^= 1
    with pytest.raises(Unauthenticated, match="signature is invalid"):
        verify_agent(f"{header}.{payload}.{b64(bytes(flipped))}", clock)
    with pytest.raises(Unauthenticated, match="signature is invalid"):
        verify_agent(f"{header}.{payload}.", clock)


# --- time ----------------------------------------------------------------------------------------


def test_expired_nonce(clock: ManualClock) -> None:
    token = nonce.sign_nonce(KEY, agent_claims(clock))
    clock.advance(timedelta(hours=1))
    with pytest.raises(Unauthenticated, match=r"registration nonce expired at 2026-03-01T12:05:00\+00:00"):
        verify_agent(token, clock)


def test_not_yet_valid_nonce(clock: ManualClock) -> None:
    future = START + timedelta(hours=1)
    claims = agent_claims(clock, nbf=future, iat=START, exp=future + timedelta(minutes=5))
    with pytest.raises(Unauthenticated, match=r"not valid before 2026-03-01T13:00:00\+00:00"):
        verify_agent(nonce.sign_nonce(KEY, claims), clock)


def test_nonce_issued_in_the_future(clock: ManualClock) -> None:
    future = START + timedelta(hours=1)
    claims = agent_claims(clock, iat=future, nbf=START, exp=future + timedelta(minutes=5))
    with pytest.raises(Unauthenticated, match="was issued in the future"):
        verify_agent(nonce.sign_nonce(KEY, claims), clock)


# --- claims --------------------------------------------------------------------------------------


def test_wrong_kind(clock: ManualClock) -> None:
    token = nonce.sign_nonce(KEY, nonce.operator_nonce_claims(cluster_id="prod", tenant="acme", clock=clock))
    with pytest.raises(
        Unauthenticated, match=r"^registration nonce is for kind 'operator', expected 'agent'$"
    ):
        verify_agent(token, clock)
    agent_token = nonce.sign_nonce(KEY, agent_claims(clock))
    with pytest.raises(Unauthenticated, match="is for kind 'agent', expected 'operator'"):
        nonce.verify_nonce(agent_token, PUB, expected_kind="operator", cluster_id="prod", clock=clock)


def test_wrong_cluster(clock: ManualClock) -> None:
    token = nonce.sign_nonce(KEY, agent_claims(clock))
    expected = r"^registration nonce was signed for cluster 'prod', this cluster is 'staging'$"
    with pytest.raises(Unauthenticated, match=expected):
        verify_agent(token, clock, cluster_id="staging")


def test_wrong_shard(clock: ManualClock) -> None:
    token = nonce.sign_nonce(KEY, agent_claims(clock))
    with pytest.raises(Unauthenticated, match="signed for shard 'us-east-1a', this shard is 'us-east-1b'"):
        verify_agent(token, clock, shard="us-east-1b")


def test_operator_subject_must_be_the_cluster(clock: ManualClock) -> None:
    claims = nonce.operator_nonce_claims(cluster_id="prod", tenant="acme", clock=clock)
    token = nonce.sign_nonce(KEY, dataclasses.replace(claims, sub="someone"))
    with pytest.raises(
        Unauthenticated, match="operator registration nonce subject 'someone' is not the cluster"
    ):
        nonce.verify_nonce(token, PUB, expected_kind="operator", cluster_id="prod", clock=clock)


def test_wrong_issuer(clock: ManualClock) -> None:
    token = ed_sign({"alg": "EdDSA"}, agent_payload(clock, iss="someone-else"))
    with pytest.raises(Unauthenticated, match="issuer is 'someone-else', expected 'nstance-server'"):
        verify_agent(token, clock)


@pytest.mark.parametrize("claim", ["iss", "sub", "exp", "nbf", "iat", "kind", "cluster_id", "tenant"])
def test_missing_required_claim(clock: ManualClock, claim: str) -> None:
    token = ed_sign({"alg": "EdDSA", "typ": "JWT"}, agent_payload(clock, **{claim: _DROP}))
    with pytest.raises(Unauthenticated, match=f"missing required claim\\(s\\): {claim}$"):
        verify_agent(token, clock)


def test_several_missing_claims_are_listed(clock: ManualClock) -> None:
    token = ed_sign({"alg": "EdDSA"}, {"sub": "x"})
    with pytest.raises(
        Unauthenticated, match="missing required claim\\(s\\): iss, exp, nbf, iat, kind, cluster_id"
    ):
        verify_agent(token, clock)


def test_optional_claims_may_be_absent(clock: ManualClock) -> None:
    payload = agent_payload(clock, config_hash=_DROP, group=_DROP, on_demand=_DROP)
    claims = verify_agent(ed_sign({"alg": "EdDSA"}, payload), clock)
    assert (claims.config_hash, claims.group, claims.on_demand) == ("", "", False)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"tenant": ""}, "claim 'tenant' is empty"),
        ({"sub": ""}, "claim 'sub' is empty"),
        ({"cluster_id": 5}, "claim 'cluster_id' must be a string"),
        ({"exp": "tomorrow"}, "claim 'exp' must be a number of seconds"),
        ({"nbf": True}, "claim 'nbf' must be a number of seconds"),
        ({"exp": 1e300}, "claim 'exp' is not a valid time"),
        ({"on_demand": "yes"}, "claim 'on_demand' must be a boolean"),
        ({"shard": None}, "claim 'shard' must be a string"),
    ],
)
def test_badly_typed_claims(clock: ManualClock, change: dict[str, Any], message: str) -> None:
    token = ed_sign({"alg": "EdDSA"}, agent_payload(clock, **change))
    with pytest.raises(Unauthenticated, match=message):
        verify_agent(token, clock)


# --- malformed tokens ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("token", "message"),
    [
        ("", "not a well-formed JWT"),
        ("garbage", "expected 3 dot-separated segments, got 1"),
        ("a.b", "expected 3 dot-separated segments, got 2"),
        ("a.b.c.d", "expected 3 dot-separated segments, got 4"),
        ("a.b.c.d.e", "got 5"),
        (".payload.sig", "empty header or payload"),
        ("eyJ!.eyJ.sig", "segments must be unpadded base64url"),
        ("eyJhbGciOiJFZERTQSJ9==.eyJ.sig", "segments must be unpadded base64url"),
        ("a.b.c", "header is not base64url-encoded JSON"),
        (b64(b"{not json") + ".e30.", "header is not base64url-encoded JSON"),
        (b64json([1, 2]) + ".e30.", "header is not a JSON object"),
        (b64(b'{"alg":"EdDSA","alg":"none"}') + ".e30.", "header is not base64url-encoded JSON"),
        ("x" * 9000, "too long"),
    ],
)
def test_malformed_tokens(clock: ManualClock, token: str, message: str) -> None:
    with pytest.raises(Unauthenticated, match=message):
        verify_agent(token, clock)


def test_signed_but_non_json_payload(clock: ManualClock) -> None:
    header = b64json({"alg": "EdDSA"})
    for body in [b"not json", b"[1,2]", b'{"a":1,"a":2}', b"\xff\xfe"]:
        signing_input = f"{header}.{b64(body)}"
        token = f"{signing_input}.{b64(KEY.sign(signing_input.encode()))}"
        with pytest.raises(Unauthenticated, match="not a well-formed JWT"):
            verify_agent(token, clock)


def test_non_ascii_bytes_token(clock: ManualClock) -> None:
    with pytest.raises(Unauthenticated, match="not a well-formed JWT"):
        verify_agent("é".encode("latin-1"), clock)


# --- programming errors --------------------------------------------------------------------------


def test_signing_refuses_bad_keys_and_claims(clock: ManualClock) -> None:
    with pytest.raises(InvalidArgument, match="signing key is ecdsa-p256; accepted key types: Ed25519"):
        nonce.sign_nonce(ec.generate_private_key(ec.SECP256R1()), agent_claims(clock))  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="unknown nonce kind 'admin'"):
        nonce.sign_nonce(KEY, agent_claims(clock, kind="admin"))
    with pytest.raises(InvalidArgument, match="'tenant' must not be empty"):
        nonce.sign_nonce(KEY, agent_claims(clock, tenant=""))
    with pytest.raises(InvalidArgument, match="must expire after"):
        nonce.sign_nonce(KEY, agent_claims(clock, exp=START))


def test_verifying_with_a_non_ed25519_key_is_a_configuration_error(clock: ManualClock) -> None:
    token = nonce.sign_nonce(KEY, agent_claims(clock))
    with pytest.raises(InvalidArgument, match="verification key is ecdsa-p256"):
        nonce.verify_nonce(
            token,
            ec.generate_private_key(ec.SECP256R1()).public_key(),  # type: ignore[arg-type]
            expected_kind="agent",
            cluster_id="prod",
            clock=clock,
        )
    with pytest.raises(InvalidArgument, match="unknown nonce kind"):
        nonce.verify_nonce(token, PUB, expected_kind="admin", cluster_id="prod", clock=clock)
