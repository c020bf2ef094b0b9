"""``core.listener.Listener``: every accepted connection is served or closed, whenever it arrives."""

from __future__ import annotations

import asyncio
import errno
import gc
import logging
import socket
import warnings
from pathlib import Path

import pytest

from nstance.core import listener as listener_module
from nstance.core.listener import Listener
from nstance.testing.waiting import eventually


def _unix_listening(path: Path, cls: type[socket.socket] = socket.socket) -> socket.socket:
    sock = cls(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.listen(16)
    return sock


def _no_leaks() -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gc.collect()
    return [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]


def _client(path: Path) -> socket.socket:
    """A non-blocking client connected to ``path`` (in the listener's backlog at once)."""
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.setblocking(False)
    client.connect(str(path))
    return client


async def _closed_by_peer(client: socket.socket) -> bool:
    loop = asyncio.get_running_loop()
    try:
        return await loop.sock_recv(client, 1) == b""
    except ConnectionResetError:
        return True


@pytest.mark.parametrize("turns", range(6))
async def test_a_connection_arriving_as_the_listener_closes_is_closed(tmp_path: Path, turns: int) -> None:
    served: list[str] = []

    async def serve(conn: socket.socket, host: str) -> None:
        served.append(host)
        await asyncio.Event().wait()

    listener = Listener(_unix_listening(tmp_path / "s.sock"), serve, what="test")
    listener.start()
    client = _client(tmp_path / "s.sock")
    try:
        for _ in range(turns):
            await asyncio.sleep(0)
        await listener.close()
        assert await asyncio.wait_for(_closed_by_peer(client), 10)
    finally:
        client.close()
    assert served in ([], [""])  # a Unix socket's peer has no host
    assert not _no_leaks()


async def test_closing_ends_every_connection_being_served(tmp_path: Path) -> None:
    entered: list[socket.socket] = []

    async def serve(conn: socket.socket, host: str) -> None:
        entered.append(conn)
        await asyncio.Event().wait()

    listener = Listener(_unix_listening(tmp_path / "s.sock"), serve, what="test")
    listener.start()
    clients = [_client(tmp_path / "s.sock") for _ in range(5)]
    try:
        await eventually(lambda: len(entered) == 5, what="five connections served")
        await listener.close()
        for client in clients:
            assert await asyncio.wait_for(_closed_by_peer(client), 10)
        assert all(conn.fileno() == -1 for conn in entered)
        assert listener.sock.fileno() == -1
    finally:
        for client in clients:
            client.close()


async def test_a_failing_serve_is_logged_and_its_connection_closed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def serve(conn: socket.socket, host: str) -> None:
        raise RuntimeError("boom")

    listener = Listener(_unix_listening(tmp_path / "s.sock"), serve, what="test listener")
    listener.start()
    client = _client(tmp_path / "s.sock")  # served only once this test awaits, in the block below
    try:
        with caplog.at_level(logging.ERROR, logger="nstance.core.listener"):
            assert await asyncio.wait_for(_closed_by_peer(client), 10)
            await eventually(lambda: "test listener: serving a connection failed" in caplog.text)
    finally:
        client.close()
        await listener.close()


class _OutOfDescriptors(socket.socket):
    """A listening socket whose first accept fails as when the process is out of descriptors."""

    failed = 0

    def accept(self) -> tuple[socket.socket, object]:
        if not type(self).failed:
            type(self).failed += 1
            raise OSError(errno.EMFILE, "Too many open files")
        return super().accept()


async def test_a_failing_accept_pauses_then_accepts_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(listener_module, "ACCEPT_RETRY", 0.05)
    monkeypatch.setattr(_OutOfDescriptors, "failed", 0)
    served = asyncio.Event()

    async def serve(conn: socket.socket, host: str) -> None:
        served.set()

    listener = Listener(_unix_listening(tmp_path / "s.sock", _OutOfDescriptors), serve, what="test")
    listener.start()
    client = _client(tmp_path / "s.sock")  # served only once this test awaits, in the block below
    try:
        with caplog.at_level(logging.WARNING, logger="nstance.core.listener"):
            await asyncio.wait_for(served.wait(), 10)
        assert "test: cannot accept a connection ([Errno 24] Too many open files); retrying" in caplog.text
        assert _OutOfDescriptors.failed == 1
    finally:
        client.close()
        await listener.close()
