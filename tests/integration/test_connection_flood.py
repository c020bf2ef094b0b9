"""A flood of idle TCP connections leaves leadership and ``/health`` untouched.

A real server process with 1,024 file descriptors (``prlimit``), on loopback only: 1,500 connections
that never start a TLS handshake are opened to its registration port (the one that needs no client
certificate) and held for several election renewals. Connections beyond the port's cap are closed at
once, idle handshakes time out, and the descriptors reserved for storage and the election stay free:
the server keeps leading, ``/health`` keeps answering, and the log stays short. The flood stops by
itself (the test closes every socket).
"""

from __future__ import annotations

import shutil
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nstance.testing.procs import free_port, wait_for_ok
from nstance.testing.shardproc import LocalCluster, ServerProcess, server_addrs, shard_config

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(shutil.which("prlimit") is None, reason="needs prlimit (util-linux)"),
]
FLOOD = 1_500
#: Relaxed election timing, so that a loaded test machine cannot cost the lease: only the flood can.
ELECTION = {"frequent_interval": "500ms", "infrequent_interval": "2s", "leader_timeout": "4s"}
HOLD_SECONDS = 8.0  # two leader timeouts


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[ServerProcess, dict[str, str]]]:
    cluster = LocalCluster(tmp_path / "bucket")
    cluster.init()
    addrs = server_addrs()
    cluster.write_config("zone-a", shard_config(addrs=addrs, election=ELECTION))
    process = ServerProcess(
        server_id="s1",
        shard="zone-a",
        bucket=cluster.bucket,
        cachedir=tmp_path / "cache",
        health_addr=f"127.0.0.1:{free_port()}",
        log_path=tmp_path / "server.log",
        launcher=["prlimit", "--nofile=1024:1024"],
    ).start()
    try:
        process.wait_healthy()
        yield process, addrs
    finally:
        process.stop()


def log_lines(process: ServerProcess) -> list[str]:
    assert process.log_path is not None
    return process.log_path.read_text(errors="replace").splitlines()


def open_idle(port: int, count: int) -> list[socket.socket]:
    socks: list[socket.socket] = []
    for _ in range(count):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.settimeout(2.0)
        try:
            sock.connect(("127.0.0.1", port))
        except OSError:
            sock.close()
            continue  # a full backlog refuses: that is the server protecting itself
        socks.append(sock)
    return socks


def test_an_idle_connection_flood_leaves_leadership_and_health_untouched(
    server: tuple[ServerProcess, dict[str, str]],
) -> None:
    process, addrs = server
    wait_for_ok(
        lambda: process.http("/leader/health"),
        process.proc,
        what="the server",
        state="leading",
        log=process.log,
        timeout=20,
        interval=0.05,
    )
    lines_before = len(log_lines(process))
    port = int(addrs["registration_addr"].rsplit(":", 1)[1])
    socks = open_idle(port, FLOOD)
    try:
        assert len(socks) > 1_024  # more than the server has descriptors
        deadline = time.monotonic() + HOLD_SECONDS
        while time.monotonic() < deadline:
            status, body = process.http("/health")
            assert (status, body.strip()) == (200, "ok: leader"), process.log()
            assert process.is_leader(), process.log()
            time.sleep(0.2)
    finally:
        for sock in socks:
            sock.close()
    assert process.is_leader()
    after = log_lines(process)[lines_before:]
    assert not [line for line in after if "Too many open files" in line], process.log()
    assert len(after) < 100, process.log()
