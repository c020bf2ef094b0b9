"""Forged and broken registration nonces against the real RegistrationService (goal 9; RFC 8725, 7518).

Each token goes over a real TLS connection to the running server's registration port. Every one must
be refused with UNAUTHENTICATED, with a message that names the problem (``registration nonce ...``)
and holds no key material, and none may use up the genuine nonce: the agent registers with it
afterwards. A nonce the cluster really signed but never handed out gets NOT_FOUND (docs/registration.md,
step 5), and the nonces the server hands out live at most five minutes.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import grpc
import grpc.aio
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from nstance.core.ids import new_instance_id
from nstance.pki.keys import generate_private_key, public_key_to_pem
from nstance.pki.nonce import operator_nonce_claims
from nstance.rpc import registration_pb2
from nstance.server.identity.operatorreg import operator_nonce_key
from nstance.testing.jwtforge import (
    b64json,
    b64url,
    b64url_decode,
    craft,
    ed_sign,
    hmac_sign,
    replace_segment,
    sign_as,
    split,
)
from nstance.testing.securityshard import CALL_TIMEOUT, CLUSTER, TENANT_A, TENANT_B, SecurityShard

pytestmark = pytest.mark.timeout(60)

_DROP = object()
REQUIRED_CLAIMS = ("iss", "sub", "exp", "nbf", "iat", "kind", "cluster_id", "tenant")


def p256_pem() -> bytes:
    return public_key_to_pem(generate_private_key("ecdsa-p256"))


def forgeries(shard: SecurityShard, genuine: str) -> dict[str, str]:
    """Every way of bending ``genuine`` (an agent or operator nonce) that the server must refuse."""
    header, payload, signature = split(genuine)
    header_segment = genuine.split(".")[0]
    key = shard.identity.nonce_key
    public = key.public_key()
    public_pem = public.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    public_raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    attacker = ed25519.Ed25519PrivateKey.generate()
    attacker_raw = attacker.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    now = int(time.time())

    def resigned(**changes: Any) -> str:
        """The genuine claims with ``changes``, signed with the cluster's own key."""
        claims = {name: value for name, value in {**payload, **changes}.items() if value is not _DROP}
        return ed_sign(header, claims, key)

    flipped = bytearray(b64url_decode(signature))
    flipped[0] ^= 1
    tokens = {
        # RFC 7518 §3.6 / RFC 8725 §3.2: unsecured tokens.
        "alg none": craft({"alg": "none", "typ": "JWT"}, payload),
        "alg NoNe": craft({"alg": "NoNe", "typ": "JWT"}, payload),
        "alg none with the genuine signature": replace_segment(genuine, "header", b64json({"alg": "none"})),
        "no alg at all": replace_segment(genuine, "header", b64json({"typ": "JWT"})),
        # RFC 8725 §3.1: the verifier's public key used as an HMAC secret.
        "HS256 keyed with the public key (PEM)": hmac_sign(payload, public_pem),
        "HS256 keyed with the public key (raw)": hmac_sign(payload, public_raw),
        "HS512 keyed with the public key (PEM)": hmac_sign(payload, public_pem, "HS512"),
        # Wrong algorithm for the key, wrong key id, keys chosen by the token.
        "ES256 header with the attacker's P-256 key": sign_as(
            payload, ec.generate_private_key(ec.SECP256R1()), "ES256"
        ),
        "RS256 header with the attacker's RSA key": sign_as(
            payload, rsa.generate_private_key(public_exponent=65537, key_size=2048), "RS256"
        ),
        "ES256 header over the genuine EdDSA signature": replace_segment(
            genuine, "header", b64json({"alg": "ES256", "typ": "JWT"})
        ),
        "kid of the attacker's key": sign_as(payload, attacker, "EdDSA", kid="attacker-key-1"),
        "embedded jwk of the attacker's key": ed_sign(
            {"alg": "EdDSA", "jwk": {"kty": "OKP", "crv": "Ed25519", "x": b64url(attacker_raw)}},
            payload,
            attacker,
        ),
        "jku pointing at the attacker": ed_sign(
            {"alg": "EdDSA", "jku": "https://evil.example/jwks"}, payload, attacker
        ),
        "x5c chain of the attacker": ed_sign({"alg": "EdDSA", "x5c": ["MIIBattacker"]}, payload, attacker),
        "crit header": ed_sign({"alg": "EdDSA", "crit": ["exp"], "exp": 1}, payload, key),
        # Forged or damaged signatures.
        "signed by another Ed25519 key": ed_sign(header, payload, attacker),
        "one signature bit flipped": replace_segment(genuine, "signature", b64url(bytes(flipped))),
        "signature stripped": replace_segment(genuine, "signature", ""),
        "payload altered under the genuine signature": replace_segment(
            genuine, "payload", b64json({**payload, "tenant": TENANT_B})
        ),
        # Claims the cluster's own key signed, but not for this call.
        "expired": resigned(iat=now - 7200, nbf=now - 7200, exp=now - 3600),
        "not valid yet (nbf)": resigned(iat=now, nbf=now + 3600, exp=now + 7200),
        "issued in the future (iat)": resigned(iat=now + 3600),
        "another cluster": resigned(cluster_id="someone-else"),
        "another issuer": resigned(iss="evil-server"),
        "duplicate claims": ed_sign(
            header, b'{"kind":"agent","kind":"operator","sub":"' + str(payload["sub"]).encode() + b'"}', key
        ),
        # Not a JWT at all.
        "empty": "",
        "garbage": "not-a-jwt",
        "two segments": ".".join(genuine.split(".")[:2]),
        "four segments": genuine + ".e30",
        "truncated in the payload": genuine[: len(header_segment) + 20],
        "truncated in the signature": genuine[:-7],
        "leading whitespace": " " + genuine,
        "padded base64": genuine.replace(".", "==.", 1),
        "non-ASCII": "é.ü.ñ",
        "oversized": "eyJ" + "A" * 20_000 + ".e30.",
    }
    for claim in REQUIRED_CLAIMS:
        tokens[f"missing claim {claim}"] = resigned(**{claim: _DROP})
    return tokens


async def refusals(
    shard: SecurityShard, method: str, tokens: dict[str, str]
) -> dict[str, tuple[grpc.StatusCode, str]]:
    """(code, details) of each token sent to ``method`` with a fresh P-256 key; successes fail the test."""
    out: dict[str, tuple[grpc.StatusCode, str]] = {}
    async with shard.registration_channel() as channel:
        call = getattr(shard.registration(channel), method)
        for name, token in tokens.items():
            request = registration_pb2.RegisterClientRequest(
                registration_nonce_jwt=token, public_key_pem=p256_pem()
            )
            try:
                await call(request, timeout=CALL_TIMEOUT)
            except grpc.aio.AioRpcError as exc:
                out[name] = (exc.code(), exc.details() or "")
            else:
                pytest.fail(f"{method} accepted the forged nonce: {name}")
    return out


def assert_all_unauthenticated(shard: SecurityShard, refused: dict[str, tuple[grpc.StatusCode, str]]) -> None:
    wrong = {name: got for name, got in refused.items() if got[0] != grpc.StatusCode.UNAUTHENTICATED}
    assert wrong == {}, wrong
    for name, (_, details) in refused.items():
        assert "registration nonce" in details, (name, details)
        shard.assert_no_secrets(details)


async def test_every_forged_agent_nonce_is_unauthenticated_and_consumes_nothing(shard: SecurityShard) -> None:
    instance_id, genuine = shard.create_instance(TENANT_A)
    tokens = forgeries(shard, genuine)
    tokens["another shard"] = shard.sign(shard.agent_claims(instance_id, shard="zone-b"))
    tokens["an operator nonce (wrong kind)"] = shard.sign(
        operator_nonce_claims(cluster_id=CLUSTER, tenant=TENANT_A)
    )
    tokens["subject is not an instance id"] = shard.sign(shard.agent_claims("../../etc/passwd"))

    refused = await refusals(shard, "RegisterAgent", tokens)

    assert_all_unauthenticated(shard, refused)
    assert "only EdDSA is accepted" in refused["HS256 keyed with the public key (PEM)"][1]
    assert "uses algorithm 'none'" in refused["alg none"][1]
    assert "signature is invalid" in refused["signed by another Ed25519 key"][1]
    assert "expired" in refused["expired"][1]
    assert "not valid before" in refused["not valid yet (nbf)"][1]
    assert "shard 'zone-b'" in refused["another shard"][1]
    assert "kind 'operator'" in refused["an operator nonce (wrong kind)"][1]
    assert "missing required claim(s): sub" in refused["missing claim sub"][1]
    assert shard.record(TENANT_A, instance_id).get("registered_at") in (None, "")

    async with shard.registration_channel() as channel:  # the genuine nonce is still good
        issued = await shard.registration(channel).RegisterAgent(
            registration_pb2.RegisterClientRequest(registration_nonce_jwt=genuine, public_key_pem=p256_pem()),
            timeout=CALL_TIMEOUT,
        )
    assert issued.client_certificate_pem.startswith(b"-----BEGIN CERTIFICATE-----")
    shard.assert_healthy()


async def test_every_forged_operator_nonce_is_unauthenticated_and_binds_nothing(shard: SecurityShard) -> None:
    genuine = shard.sign(operator_nonce_claims(cluster_id=CLUSTER, tenant=TENANT_A))
    tokens = forgeries(shard, genuine)
    _, agent_nonce = shard.create_instance(TENANT_A)
    tokens["an agent nonce (wrong kind)"] = agent_nonce
    tokens["subject is not the cluster"] = shard.sign(
        dataclasses.replace(operator_nonce_claims(cluster_id=CLUSTER, tenant=TENANT_A), sub="other")
    )

    refused = await refusals(shard, "RegisterOperator", tokens)

    assert_all_unauthenticated(shard, refused)
    assert "subject 'other' is not the cluster id" in refused["subject is not the cluster"][1]
    bindings = set(shard.cluster.cluster.list("operator-nonce/"))
    assert not any(operator_nonce_key(token) in bindings for token in tokens.values())
    shard.assert_healthy()


async def test_a_validly_signed_nonce_the_server_never_issued_is_not_found(shard: SecurityShard) -> None:
    stranger = str(new_instance_id("app"))
    token = shard.sign(shard.agent_claims(stranger))
    async with shard.registration_channel() as channel:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await shard.registration(channel).RegisterAgent(
                registration_pb2.RegisterClientRequest(
                    registration_nonce_jwt=token, public_key_pem=p256_pem()
                ),
                timeout=CALL_TIMEOUT,
            )
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert stranger in (info.value.details() or "")
    shard.assert_no_secrets(info.value.details() or "")


def test_issued_agent_nonces_live_at_most_five_minutes(shard: SecurityShard) -> None:
    _, nonce = shard.create_instance(TENANT_B, "secret")
    header, claims, _ = split(nonce)
    assert header["alg"] == "EdDSA"
    assert claims["exp"] - claims["iat"] <= 300
    assert claims["exp"] - claims["nbf"] <= 300
    assert (claims["kind"], claims["cluster_id"], claims["tenant"]) == ("agent", CLUSTER, TENANT_B)
