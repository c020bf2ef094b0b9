"""Client-side OpenSSL TLS: when it is needed, target parsing, and the route's private directory."""

from __future__ import annotations

import os
import stat

import pytest

from nstance.pki.ca import create_ca
from nstance.pki.tlsclient import TlsRoute, needs_openssl, split_target


def test_only_an_ed25519_ca_needs_openssl() -> None:
    assert needs_openssl(create_ca(key_type="ed25519").cert_pem)
    assert not needs_openssl(create_ca(key_type="ecdsa-p256").cert_pem)


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("10.0.0.5:8993", ("10.0.0.5", 8993)),
        ("shard-a.internal:8994", ("shard-a.internal", 8994)),
        ("[fd00::5]:8993", ("fd00::5", 8993)),
        ("dns:///shard-a.internal:8993", ("shard-a.internal", 8993)),
    ],
)
def test_targets_split_into_host_and_port(target: str, expected: tuple[str, int]) -> None:
    assert split_target(target) == expected


@pytest.mark.parametrize("target", ["shard-a.internal", "host:port", ""])
def test_a_target_without_a_port_is_refused(target: str) -> None:
    with pytest.raises(ValueError, match="is not host:port"):
        split_target(target)


def test_a_route_listens_in_a_private_directory_and_removes_it_on_close() -> None:
    ca = create_ca(key_type="ed25519")
    route = TlsRoute.open("127.0.0.1:1", ca.cert_pem)
    try:
        assert route.grpc_target == f"unix:{route.path}"
        assert stat.S_ISSOCK(os.stat(route.path).st_mode)
        assert stat.S_IMODE(os.stat(route.directory).st_mode) == 0o700
    finally:
        route.close()
    assert not route.directory.exists()
