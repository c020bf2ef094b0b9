"""One client address cannot take every connection of the registration or operator port.

A real server process on loopback with ``max_registration_connections_per_address`` and
``max_operator_connections_per_address`` set to 4: one address (127.0.0.1) holds four connections that
finished their TLS handshake, the fifth from it is closed before its handshake, and another address
(127.0.0.2, the same loopback interface) still gets through. Once the first address lets go, it is
served again - a real RegisterAgent call through the front answers UNAUTHENTICATED for a garbage nonce.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from nstance.rpc import registration_pb2, registration_pb2_grpc
from nstance.testing.netprobe import tls_connect
from nstance.testing.procs import free_port, wait_for_ok
from nstance.testing.shardproc import LocalCluster, ServerProcess, server_addrs, shard_config

pytestmark = pytest.mark.timeout(120)
PER_ADDRESS = 4
LIMITS = {
    "max_registration_connections_per_address": PER_ADDRESS,
    "max_operator_connections_per_address": PER_ADDRESS,
    "handshake_timeout": "60s",  # the held connections must outlive the test
}


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[ServerProcess, dict[str, str], LocalCluster]]:
    cluster = LocalCluster(tmp_path / "bucket")
    cluster.init()
    addrs = server_addrs()
    cluster.write_config("zone-a", shard_config(addrs=addrs, shard_extra={"limits": LIMITS}))
    process = ServerProcess(
        server_id="s1",
        shard="zone-a",
        bucket=cluster.bucket,
        cachedir=tmp_path / "cache",
        health_addr=f"127.0.0.1:{free_port()}",
        log_path=tmp_path / "server.log",
    ).start()
    try:
        process.wait_healthy(timeout=60)  # a loaded machine starts slowly; an error ends the wait at once
        yield process, addrs, cluster
    finally:
        process.stop()


def _context(cluster: LocalCluster, identity: Path | None) -> ssl.SSLContext:
    assert cluster.identity is not None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.load_verify_locations(cadata=cluster.identity.ca.cert_pem.decode("ascii"))
    ctx.set_alpn_protocols(["h2"])
    if identity is not None:
        ctx.load_cert_chain(identity / "identity.crt", identity / "identity.key")
    return ctx


def _one_address_is_capped(ctx: ssl.SSLContext, addr: str) -> None:
    held = [tls_connect(addr, ctx, source="127.0.0.1") for _ in range(PER_ADDRESS)]
    try:
        assert all(conn is not None for conn in held)
        assert tls_connect(addr, ctx, source="127.0.0.1") is None  # the fifth: closed before its handshake
        other = tls_connect(addr, ctx, source="127.0.0.2")
        assert other is not None  # another address is still served
        other.close()
    finally:
        for conn in held:
            if conn is not None:
                conn.close()


def test_one_address_cannot_take_the_registration_port(
    server: tuple[ServerProcess, dict[str, str], LocalCluster],
) -> None:
    process, addrs, cluster = server
    _one_address_is_capped(_context(cluster, None), addrs["registration_addr"])

    assert cluster.identity is not None
    credentials = grpc.ssl_channel_credentials(root_certificates=cluster.identity.ca.cert_pem)

    def refused_garbage_nonce() -> tuple[int, str]:
        # Once the held connections are released, 127.0.0.1 is served again, through the front.
        with grpc.secure_channel(
            addrs["registration_addr"],
            credentials,
            options=[("grpc.ssl_target_name_override", "nstance-server")],
        ) as channel:
            stub = registration_pb2_grpc.RegistrationServiceStub(channel)
            try:
                stub.RegisterAgent(
                    registration_pb2.RegisterClientRequest(
                        registration_nonce_jwt="garbage", public_key_pem=b"x"
                    ),
                    timeout=5,
                )
            except grpc.RpcError as exc:
                if exc.code() is grpc.StatusCode.UNAUTHENTICATED:
                    return 200, ""
                return 0, f"{exc.code()}: {exc.details()}"
        return 0, "accepted"

    wait_for_ok(
        refused_garbage_nonce,
        process.proc,
        what="RegisterAgent",
        state="UNAUTHENTICATED",
        log=process.log,
        timeout=20,
        interval=0.2,
    )
    assert "max_registration_connections_per_address" in process.log()


def test_one_address_cannot_take_the_operator_port(
    server: tuple[ServerProcess, dict[str, str], LocalCluster], tmp_path: Path
) -> None:
    process, addrs, cluster = server
    identity = cluster.operator_identity(tmp_path / "operator")
    _one_address_is_capped(_context(cluster, identity), addrs["operator_addr"])
    assert "max_operator_connections_per_address" in process.log()
