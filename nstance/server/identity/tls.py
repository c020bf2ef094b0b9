"""TLS credentials for the shard server's gRPC listeners.

``server_credentials`` issues a fresh server certificate from the cluster CA (an ECDSA P-256 key by
default, because grpcio clients cannot verify Ed25519 server certificates; grpcio as a server can
present an Ed25519 one to clients that offer Ed25519, as upstream's do) and builds
``grpc.ssl_server_credentials`` that trust the cluster CA for client certificates. With
``require_client_cert=True`` a client without a CA-signed certificate fails the handshake; with ``False``
(Registration API) no client certificate is requested, as upstream's ``NoClientCert``.

The mTLS ports of the server itself terminate TLS in OpenSSL (``frontproc``, ``tlsfront``), so that
Ed25519 client certificates are accepted too; ``server_credentials`` with ``require_client_cert=True``
remains for tests and benchmarks that want grpcio's own mTLS.

``advertised_hosts`` turns listener addresses (``host:port``) into the host names and IPs the
certificate must name.

This module only builds credentials: it does not listen, persist certificates or record them in the
certificate log (the caller does that with the returned ``IssuedCertificate``). grpcio offers no
minimum-TLS-version setting, so the protocol floor is grpc core's default (TLS 1.2).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import grpc

from nstance.core.clock import Clock
from nstance.core.errors import FailedPrecondition
from nstance.pki.ca import CertificateAuthority
from nstance.pki.certs import IssuedCertificate, issue_server_certificate

#: Bind hosts that mean "every interface": never written into a certificate.
_WILDCARD_HOSTS = frozenset({"", "*", "0.0.0.0", "::", "0:0:0:0:0:0:0:0"})


def server_credentials(
    ca: CertificateAuthority,
    *,
    hosts: Sequence[str],
    clock: Clock,
    require_client_cert: bool = True,
    key_type: str = "ecdsa-p256",
) -> tuple[grpc.ServerCredentials, IssuedCertificate]:
    """Issue a server certificate naming ``hosts`` (plus the defaults) and build gRPC credentials.

    Returns the credentials and the issued certificate (serial and expiry, for the certificate log).
    Raises ``InvalidArgument`` for a host that is neither an IP address nor a DNS name, and
    ``FailedPrecondition`` when the CA has expired.
    """
    issued = issue_server_certificate(ca, hosts=hosts, clock=clock, key_type=key_type)
    key_pem = issued.key_pem
    if key_pem is None:  # pragma: no cover - issue_server_certificate always generates the key
        raise FailedPrecondition("the server certificate was issued without its private key")
    credentials = grpc.ssl_server_credentials(
        [(key_pem, issued.cert_pem)],
        root_certificates=ca.cert_pem,
        require_client_auth=require_client_cert,
    )
    return credentials, issued


def _host_of(addr: str) -> str:
    text = addr.strip()
    if text.startswith("["):
        end = text.find("]")
        return text[1:end] if end > 0 else text[1:]
    if text.count(":") == 1:
        return text.rpartition(":")[0]
    # No port ("host"), or a bare IPv6 address ("fd00::5") that cannot carry one without brackets.
    return text


def advertised_hosts(addrs: Iterable[str]) -> list[str]:
    """The hosts of ``host:port`` listener addresses, for a server certificate's SANs.

    ``[v6]:port`` is unbracketed; empty and wildcard hosts (``:8993``, ``0.0.0.0``, ``[::]``) are
    skipped; duplicates are dropped, first occurrence kept.
    """
    hosts: list[str] = []
    for addr in addrs:
        host = _host_of(addr)
        if host.lower() in _WILDCARD_HOSTS or host in hosts:
            continue
        hosts.append(host)
    return hosts
