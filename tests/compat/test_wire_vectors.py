"""What the Go implementation puts on the wire, read by this one: nonce JWTs, client certificates and an
Ed25519 server certificate shaped as upstream's servers issue them.

The upstream binaries cannot be built here (the Go module proxy answers 403 for
``github.com/nstance-dev/nstance`` and ``.../v2``), so the vectors are built from the facts in
upstream's own tests and generators: ``pkg/nonce`` (claims and EdDSA signing; header ``alg`` EdDSA,
``typ`` JWT), the JWT helpers of ``internal/server/api`` (all claims set; the servers' issuer
``nstance-server``, which this implementation requires while upstream's validator ignores it),
``internal/server/pki`` (client certificates: Ed25519 key, serial = Unix nanoseconds, CN = client id, O
= [tenant], KeyUsage digitalSignature, EKU clientAuth, CA:false, the role extension as ``asn1.Marshal``
of a Go string; server certificates: Ed25519 key, CN ``nstance-server``, O ``Nstance Server``, C ``US``,
SANs the bind host plus ``nstance-server``, ``localhost``, 127.0.0.1 and ::1).
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import grpc.aio
import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ed25519
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from nstance.pki.ca import CertificateAuthority, certificate_to_pem, create_ca
from nstance.pki.certs import ROLE_OID, issue_client_certificate
from nstance.pki.keys import private_key_to_pem, public_key_to_pem
from nstance.pki.nonce import agent_nonce_claims, sign_nonce, verify_nonce
from nstance.pki.peer import verify_client_certificate
from nstance.pki.tlsclient import forwarded_channel
from nstance.pki.tlspipe import private_directory, remove_private_directory
from nstance.server.net.tlsfront import PeerTable, TlsFront, server_ssl_context
from nstance.testing.jwtforge import b64url, b64url_decode

SERVER_NAME_OPTIONS = [("grpc.ssl_target_name_override", "nstance-server")]


def go_nonce(key: ed25519.Ed25519PrivateKey, **claims: object) -> str:
    """A compact JWS as golang-jwt signs ``nonce.Claims`` with SigningMethodEdDSA."""
    header = b64url(json.dumps({"alg": "EdDSA", "typ": "JWT"}, separators=(",", ":")).encode())
    payload = b64url(json.dumps(claims, separators=(",", ":")).encode())
    signature = key.sign(f"{header}.{payload}".encode("ascii"))
    return f"{header}.{payload}.{b64url(signature)}"


def test_an_upstream_agent_nonce_verifies_here() -> None:
    key = ed25519.Ed25519PrivateKey.generate()
    now = int(time.time())
    token = go_nonce(
        key,
        iss="nstance-server",  # what upstream's servers write (its test helper writes "-test"; see the docs)
        sub="app-01jx0000000000000000000000",
        exp=now + 300,
        nbf=now,
        iat=now,
        kind="agent",
        config_hash="",
        cluster_id="test-cluster",
        shard="test-shard",
        group="web",
        on_demand=False,
        tenant="default",
    )
    claims = verify_nonce(
        token, key.public_key(), expected_kind="agent", cluster_id="test-cluster", shard="test-shard"
    )
    assert (claims.sub, claims.group, claims.tenant, claims.on_demand) == (
        "app-01jx0000000000000000000000",
        "web",
        "default",
        False,
    )


def test_a_nonce_signed_here_has_the_claims_upstreams_validator_requires() -> None:
    key = ed25519.Ed25519PrivateKey.generate()
    token = sign_nonce(
        key,
        agent_nonce_claims(
            instance_id="app-01jx0000000000000000000000",
            cluster_id="c1",
            shard="s1",
            group="web",
            tenant="default",
            config_hash="abc",
        ),
    )
    header_b64, payload_b64, signature_b64 = token.split(".")
    header = json.loads(b64url_decode(header_b64))
    payload = json.loads(b64url_decode(payload_b64))
    assert header["alg"] == "EdDSA"  # the only method upstream's Validate accepts
    key.public_key().verify(b64url_decode(signature_b64), f"{header_b64}.{payload_b64}".encode("ascii"))
    # Validate requires kind == the expected kind and non-empty sub, cluster_id and tenant
    assert payload["kind"] == "agent"
    assert payload["sub"]
    assert payload["cluster_id"] == "c1"
    assert payload["tenant"] == "default"
    for name in ("exp", "nbf", "iat"):
        assert isinstance(payload[name], int)  # NumericDate
    assert (payload["shard"], payload["group"], payload["config_hash"]) == ("s1", "web", "abc")
    assert isinstance(payload.get("on_demand", False), bool)


def go_client_certificate(
    ca: CertificateAuthority, key: ed25519.Ed25519PrivateKey, *, client_id: str, role: str, tenant: str
) -> x509.Certificate:
    """A client certificate with exactly the fields upstream's GenerateClientCertificate sets."""
    now = datetime.now(UTC).replace(microsecond=0)
    role_der = b"\x13" + bytes([len(role)]) + role.encode("ascii")  # asn1.Marshal("agent")
    builder = (
        x509.CertificateBuilder()
        .serial_number(time.time_ns())
        .subject_name(
            x509.Name(
                [
                    x509.NameAttribute(NameOID.ORGANIZATION_NAME, tenant),
                    x509.NameAttribute(NameOID.COMMON_NAME, client_id),
                ]
            )
        )
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .not_valid_before(now)
        .not_valid_after(now + timedelta(hours=24))
        .add_extension(
            x509.KeyUsage(True, False, False, False, False, False, False, False, False), critical=True
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.UnrecognizedExtension(ROLE_OID, role_der), critical=False)
    )
    return builder.sign(ca.private_key, None)


def test_an_upstream_agent_certificate_is_a_valid_identity_here() -> None:
    ca = create_ca(key_type="ed25519", cluster_id="test-cluster")
    cert = go_client_certificate(
        ca, ed25519.Ed25519PrivateKey.generate(), client_id="test-agent", role="agent", tenant="prod"
    )
    peer = verify_client_certificate(cert, ca)
    assert (peer.client_id, peer.role, peer.tenant) == ("test-agent", "agent", "prod")


def test_a_certificate_issued_here_for_an_ed25519_key_reads_as_upstream_expects() -> None:
    ca = create_ca(key_type="ed25519", cluster_id="test-cluster")
    key = ed25519.Ed25519PrivateKey.generate()
    issued = issue_client_certificate(
        ca, public_key_to_pem(key), client_id="test-agent", tenant="default", role="agent"
    )
    cert = issued.certificate
    # upstream's interceptor: CN = client id, Organization[0] = tenant, the role by asn1.Unmarshal
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "test-agent"
    assert [a.value for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)] == ["default"]
    role = cert.extensions.get_extension_for_oid(ROLE_OID)
    assert not role.critical
    assert isinstance(role.value, x509.UnrecognizedExtension)
    assert role.value.value == b"\x13\x05agent"
    assert (
        ExtendedKeyUsageOID.CLIENT_AUTH
        in cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    )
    assert cert.extensions.get_extension_for_class(x509.KeyUsage).value.digital_signature
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    assert cert.public_key() == key.public_key()
    cert.verify_directly_issued_by(ca.certificate)


def go_server_leaf(ca: CertificateAuthority, bind_host: str) -> tuple[bytes, bytes]:
    """An Ed25519 server key and certificate shaped as upstream's GenerateServerCertificate makes them."""
    key = ed25519.Ed25519PrivateKey.generate()
    now = datetime.now(UTC).replace(microsecond=0)
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.COUNTRY_NAME, "US"),
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Nstance Server"),
            x509.NameAttribute(NameOID.COMMON_NAME, "nstance-server"),
        ]
    )
    sans: list[x509.GeneralName] = [
        x509.IPAddress(ipaddress.ip_address(bind_host)),
        x509.DNSName("nstance-server"),
        x509.DNSName("localhost"),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.IPAddress(ipaddress.ip_address("::1")),
    ]
    cert = (
        x509.CertificateBuilder()
        .serial_number(time.time_ns())
        .subject_name(subject)
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .not_valid_before(now)
        .not_valid_after(now + timedelta(days=365))
        .add_extension(
            x509.KeyUsage(True, False, False, False, False, False, False, False, False), critical=True
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .sign(ca.private_key, None)
    )
    return private_key_to_pem(key), certificate_to_pem(cert)


async def test_this_client_reaches_a_server_presenting_an_upstream_ed25519_leaf(tmp_path: Path) -> None:
    """OpenSSL (our client route) accepts the leaf; grpcio's own TLS cannot, which is why the route exists."""
    ca = create_ca(key_type="ed25519", cluster_id="test-cluster")
    directory = private_directory()
    key_pem, cert_pem = go_server_leaf(ca, "127.0.0.1")
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health_aio.HealthServicer(), server)
    backend = directory / "health.sock"
    server.add_insecure_port(f"unix:{backend}")
    await server.start()
    front = TlsFront(
        server_ssl_context(key_pem, cert_pem, ca.cert_pem, scratch=directory),
        directory=directory,
        backend=backend,
        peers=PeerTable(),
    )
    port = await front.start("127.0.0.1", 0)
    client_key = ed25519.Ed25519PrivateKey.generate()
    client_cert = go_client_certificate(ca, client_key, client_id="opr", role="operator", tenant="default")
    target = f"127.0.0.1:{port}"
    try:

        def check_openssl() -> int:
            with forwarded_channel(
                target,
                ca.cert_pem,
                private_key_to_pem(client_key),
                certificate_to_pem(client_cert),
                options=SERVER_NAME_OPTIONS,
            ) as channel:
                reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
                return int(reply.status)

        assert await asyncio.to_thread(check_openssl) == health_pb2.HealthCheckResponse.SERVING

        def check_grpcio() -> None:
            credentials = grpc.ssl_channel_credentials(
                root_certificates=ca.cert_pem,
                private_key=private_key_to_pem(client_key),
                certificate_chain=certificate_to_pem(client_cert),
            )
            with grpc.secure_channel(target, credentials, options=SERVER_NAME_OPTIONS) as channel:
                health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=3)

        with pytest.raises(grpc.RpcError) as err:
            await asyncio.to_thread(check_grpcio)
        assert err.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
    finally:
        await server.stop(None)
        await front.close()
        remove_private_directory(directory)
