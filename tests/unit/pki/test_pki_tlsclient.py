"""Client-side OpenSSL TLS: when it is needed, target parsing, and the route's private directory."""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path

import pytest

from nstance.pki import tlspipe
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


def test_without_a_writable_temporary_directory_the_private_directory_goes_elsewhere(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Upstream's systemd units (``ProtectSystem=strict``, no ``PrivateTmp``) leave /tmp read-only: the
    server's and the TLS routes' private sockets then go to /dev/shm, or to a directory given."""
    real = tempfile.mkdtemp
    refused = {None, *(str(base) for base in tlspipe.FALLBACK_BASES)}

    def mkdtemp(prefix: str, dir: Path | str | None = None) -> str:
        if (str(dir) if dir is not None else None) in refused:
            raise OSError(errno.EROFS, "Read-only file system")
        return real(prefix=prefix, dir=dir)

    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp)
    made = tlspipe.private_directory("nstance-t-", fallbacks=(tmp_path,))
    assert made.parent == tmp_path
    assert stat.S_IMODE(made.stat().st_mode) == 0o700
    with pytest.raises(OSError, match="no writable directory for private sockets"):
        tlspipe.private_directory("nstance-t-")
