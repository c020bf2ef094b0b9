"""gRPC channels from the agent to its shard server: TLS for registration, mTLS for the agent API.

Responsible for credentials (server verified against the cluster CA, server name ``nstance-server``
which every server certificate carries, so an IP address works as the target) and keepalive options.
grpcio's TLS is used unless the cluster CA is Ed25519 (an upstream cluster, whose servers present
Ed25519 certificates): then the channel runs over OpenSSL (``pki.tlsclient``). An Ed25519 identity
key works on either: grpcio signs with it when the server offers Ed25519.
It makes no calls.
"""

from __future__ import annotations

import grpc
import grpc.aio

from nstance.pki.certs import SERVER_COMMON_NAME
from nstance.pki.tlsclient import forwarded_aio_channel, needs_openssl

MAX_MESSAGE_BYTES = 4 * 1024 * 1024
KEEPALIVE_MS = 20_000
KEEPALIVE_TIMEOUT_MS = 10_000


def channel_options(*, keepalive: bool) -> list[tuple[str, int | str]]:
    options: list[tuple[str, int | str]] = [
        ("grpc.ssl_target_name_override", SERVER_COMMON_NAME),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.initial_reconnect_backoff_ms", 500),
        ("grpc.max_reconnect_backoff_ms", 30_000),
    ]
    if keepalive:
        options += [
            ("grpc.keepalive_time_ms", KEEPALIVE_MS),
            ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
        ]
    return options


def registration_channel(addr: str, ca_pem: bytes) -> grpc.aio.Channel:
    """Server-authenticated TLS channel to the RegistrationService."""
    if needs_openssl(ca_pem):
        return forwarded_aio_channel(addr, ca_pem, options=channel_options(keepalive=False))
    credentials = grpc.ssl_channel_credentials(root_certificates=ca_pem)
    return grpc.aio.secure_channel(addr, credentials, options=channel_options(keepalive=False))


def agent_channel(addr: str, ca_pem: bytes, key_pem: bytes, cert_pem: bytes) -> grpc.aio.Channel:
    """Mutual-TLS channel to the AgentService, with keepalive pings every 20 s."""
    if needs_openssl(ca_pem):
        return forwarded_aio_channel(addr, ca_pem, key_pem, cert_pem, options=channel_options(keepalive=True))
    credentials = grpc.ssl_channel_credentials(
        root_certificates=ca_pem, private_key=key_pem, certificate_chain=cert_pem
    )
    return grpc.aio.secure_channel(addr, credentials, options=channel_options(keepalive=True))
