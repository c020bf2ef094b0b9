"""Client identities (key + certificate) for tests that call a server over mTLS.

``make_identity`` issues an agent or operator certificate from a CA exactly as registration would,
optionally valid at another time (``clock``, ``ttl``) and optionally trusting another CA than the
issuer (``trust``), so a test can present a certificate from a foreign CA, an expired one, or one
that is not valid yet. Certificates are issued against the real clock by default, because grpc's TLS
checks validity against it. Nothing in the product imports this module.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import grpc
import grpc.aio

from nstance.core.clock import Clock, ManualClock
from nstance.pki.ca import CertificateAuthority
from nstance.pki.certs import SERVER_COMMON_NAME, issue_client_certificate
from nstance.pki.keys import generate_private_key, private_key_to_pem
from nstance.pki.tlsclient import forwarded_channel

SERVER_NAME_OPTIONS = [("grpc.ssl_target_name_override", SERVER_COMMON_NAME)]
"""Channel options that verify the server as ``nstance-server``, the name every server certificate carries."""


def real_now_clock() -> ManualClock:
    """A manual clock set to the current time (whole seconds)."""
    return ManualClock(datetime.now(UTC).replace(microsecond=0))


@dataclass(frozen=True)
class ClientIdentity:
    """A client's private key and certificate, and the CA certificate it trusts for the server."""

    key_pem: bytes
    cert_pem: bytes
    serial: str
    ca_pem: bytes

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca_pem, private_key=self.key_pem, certificate_chain=self.cert_pem
        )

    def channel(self, target: str) -> grpc.Channel:
        """A blocking mTLS channel to ``target`` that verifies the server as ``nstance-server``."""
        return grpc.secure_channel(target, self.credentials(), options=SERVER_NAME_OPTIONS)

    def aio_channel(self, target: str) -> grpc.aio.Channel:
        """An asyncio mTLS channel to ``target`` that verifies the server as ``nstance-server``."""
        return grpc.aio.secure_channel(target, self.credentials(), options=SERVER_NAME_OPTIONS)

    def openssl_channel(self, target: str) -> grpc.Channel:
        """A blocking mTLS channel over OpenSSL TLS (any key type, as upstream's clients connect)."""
        return forwarded_channel(
            target, self.ca_pem, self.key_pem, self.cert_pem, options=SERVER_NAME_OPTIONS
        )


def make_identity(
    ca: CertificateAuthority,
    *,
    role: str,
    tenant: str,
    client_id: str | None = None,
    trust: CertificateAuthority | None = None,
    ttl: timedelta = timedelta(days=1),
    clock: Clock | None = None,
    key_type: str = "ecdsa-p256",
) -> ClientIdentity:
    """A fresh key (``key_type``) with a ``role`` certificate of ``tenant`` issued by ``ca``.

    ``client_id`` (the CN) defaults to ``{role}-client-1``; ``trust`` is the CA the client trusts
    for the server (default: ``ca``); ``clock`` sets when the certificate starts (default: now).
    """
    key = generate_private_key(key_type)
    issued = issue_client_certificate(
        ca,
        key.public_key(),
        client_id=client_id or f"{role}-client-1",
        tenant=tenant,
        role=role,
        ttl=ttl,
        clock=clock or real_now_clock(),
    )
    return ClientIdentity(private_key_to_pem(key), issued.cert_pem, issued.serial_hex, (trust or ca).cert_pem)
