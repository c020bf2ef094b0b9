"""The front of the gRPC ports in its own process, so TLS and accept work do not share the server's loop.

Measured (``bench/health_ingest.py``): run on the server's event loop, the front's Python-level TLS
and forwarding starved the loop under 2,000 agent streams (lease renewals late, the shard lost). In a
child process it runs on the other core, and the server's loop only sees plain HTTP/2 on Unix sockets,
which grpc core reads in its own threads.

``FrontProcess`` (in the server) binds the listening sockets itself, so ports and bind errors are
known at once, and starts ``python -m nstance.server.net.frontproc`` with those sockets and one end of a
control socket pair. The child runs one ``TlsFront`` per mTLS listener and one ``TcpFront`` per plain
one (the registration port, whose TLS grpcio terminates behind it); each admits connections through a
``ConnectionLimiter`` with the listener's caps (for the port, and per client address when set), so a
flood's connections are refused in the child, before TLS, and never reach the server's process.
Before it forwards the first byte
of a verified connection it sends ``A <peer> <base64 DER>`` over the control socket and waits for
``K <peer>``; the server adds the entry to its ``PeerTable`` before it answers, so the interceptor
always finds it. ``D <peer>`` retracts an entry when the connection closes. The child exits when the
control socket closes (the server went away); the server restarts a child that exits on its own, on
the same listening sockets, so connections in the kernel's backlog wait rather than fail.

The child's configuration (PEM material, socket numbers, paths) arrives as one JSON document on its
standard input; its logs go to standard error in the server's JSON format.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from nstance.core.logformat import JsonFormatter
from nstance.core.logthrottle import LogThrottle
from nstance.pki.tlspipe import HANDSHAKE_TIMEOUT
from nstance.server.net.connlimit import ConnectionLimiter
from nstance.server.net.tcpfront import TcpFront
from nstance.server.net.tlsfront import UNLIMITED, PeerTable, TlsFront, server_ssl_context

log = logging.getLogger(__name__)

#: Seconds between restarts of a child that exited on its own.
RESTART_DELAY: Final = 1.0
#: Seconds the child gets to exit after SIGTERM before it is killed.
STOP_TIMEOUT: Final = 5.0


@dataclass(frozen=True)
class Listener:
    """One port: its listening socket, the gRPC server's Unix socket, a name for logs, and its caps.

    ``tls``: the front terminates mTLS (agent and operator ports); otherwise it forwards the bytes as
    they come (the registration port). ``max_connections`` caps the port, ``per_address`` (when set)
    each client address; ``limit_names`` are the two caps' config keys, for the log.
    """

    sock: socket.socket
    backend: Path
    what: str
    tls: bool = True
    max_connections: int = UNLIMITED
    per_address: int | None = None
    limit_names: tuple[str, str] = ("max_connections", "max_connections_per_address")


class FrontProcess:
    """Runs the mTLS fronts in a child process and keeps ``peers`` in step with its connections."""

    def __init__(
        self,
        peers: PeerTable,
        *,
        directory: Path,
        key_pem: bytes,
        cert_pem: bytes,
        ca_pem: bytes,
        handshake_timeout: float = HANDSHAKE_TIMEOUT,
    ) -> None:
        self.peers = peers
        self.directory = directory
        self._handshake_timeout = handshake_timeout
        self._material = {
            "key_pem": key_pem.decode("ascii"),
            "cert_pem": cert_pem.decode("ascii"),
            "ca_pem": ca_pem.decode("ascii"),
        }
        self._listeners: list[Listener] = []
        self._proc: asyncio.subprocess.Process | None = None
        self._control: socket.socket | None = None
        self._supervisor: asyncio.Task[None] | None = None
        self._control_task: asyncio.Task[None] | None = None
        self._stopping = False
        self._generation = 0

    def add(self, listener: Listener) -> None:
        self._listeners.append(listener)

    @property
    def pid(self) -> int | None:
        """The child's process id (None before it started)."""
        return self._proc.pid if self._proc is not None else None

    @property
    def backends(self) -> list[Path]:
        """The gRPC servers' Unix sockets, in the order the listeners were added."""
        return [listener.backend for listener in self._listeners]

    async def start(self) -> None:
        """Start the child (and restart it whenever it exits until ``close``)."""
        await self._spawn()
        self._supervisor = asyncio.get_running_loop().create_task(self._supervise(), name="tls-front")

    async def _spawn(self) -> None:
        # The dead child's connections are gone; a new child names its connections afresh.
        self.peers.clear()
        self._generation += 1
        parent_end, child_end = socket.socketpair()
        fds = [child_end.fileno(), *(listener.sock.fileno() for listener in self._listeners)]
        config = {
            **self._material,
            "directory": str(self.directory),
            "name_prefix": f"g{self._generation}.",
            "handshake_timeout": self._handshake_timeout,
            "control_fd": child_end.fileno(),
            "listeners": [
                {
                    "fd": listener.sock.fileno(),
                    "backend": str(listener.backend),
                    "what": listener.what,
                    "tls": listener.tls,
                    "max_connections": listener.max_connections,
                    "per_address": listener.per_address,
                    "limit_names": list(listener.limit_names),
                }
                for listener in self._listeners
            ],
        }
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "nstance.server.net.frontproc",
                stdin=asyncio.subprocess.PIPE,
                pass_fds=fds,
            )
        finally:
            child_end.close()
        # Owned at once, so ``close`` stops it even if it is cancelled while this finishes.
        await self._stop_control()
        self._proc = proc
        self._control = parent_end
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(config).encode("utf-8"))
        await proc.stdin.drain()
        proc.stdin.close()
        self._control_task = asyncio.get_running_loop().create_task(
            self._serve_control(parent_end), name="tls-front-control"
        )

    async def _serve_control(self, sock: socket.socket) -> None:
        """Apply the child's announcements until it closes the channel (the socket stays ours)."""
        loop = asyncio.get_running_loop()
        sock.setblocking(False)
        buffered = b""
        try:
            while chunk := await loop.sock_recv(sock, 65536):
                buffered += chunk
                *lines, buffered = buffered.split(b"\n")
                for line in lines:
                    op, _, rest = line.decode("ascii").partition(" ")
                    if op == "A":
                        peer, _, der = rest.partition(" ")
                        self.peers.add(peer, base64.b64decode(der))
                        await loop.sock_sendall(sock, f"K {peer}\n".encode("ascii"))
                    elif op == "D":
                        self.peers.remove(rest)
        except (OSError, ValueError) as exc:  # the child died mid-line or the socket was closed
            log.warning("TLS front control channel: %s", exc)

    async def _stop_control(self) -> None:
        if self._control_task is not None:
            self._control_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._control_task
            self._control_task = None
        if self._control is not None:
            self._control.close()
            self._control = None

    async def _supervise(self) -> None:
        while not self._stopping:
            proc = self._proc
            assert proc is not None
            code = await proc.wait()
            if self._stopping:
                return
            log.error("the TLS front process exited (code %s); restarting it in %.0fs", code, RESTART_DELAY)
            await asyncio.sleep(RESTART_DELAY)
            if not self._stopping:
                await self._spawn()

    async def close(self) -> None:
        """Stop the child and close the listening sockets."""
        self._stopping = True
        if self._supervisor is not None:
            self._supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._supervisor
        proc = self._proc
        if proc is not None and proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), STOP_TIMEOUT)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        await self._stop_control()
        for listener in self._listeners:
            listener.sock.close()


# --- the child ---------------------------------------------------------------------------------------


class _ControlChannel:
    """The child's side of the control socket, as the fronts' ``PeerRegistry``."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._waiting: dict[str, asyncio.Future[None]] = {}

    async def announce(self, peer: str, der: bytes) -> None:
        done = asyncio.get_running_loop().create_future()
        self._waiting[peer] = done
        self._writer.write(f"A {peer} {base64.b64encode(der).decode('ascii')}\n".encode("ascii"))
        try:
            await done
        finally:
            self._waiting.pop(peer, None)

    def retract(self, peer: str) -> None:
        if not self._writer.is_closing():
            self._writer.write(f"D {peer}\n".encode("ascii"))

    async def run(self) -> None:
        """Resolve acknowledgements until the server closes the channel."""
        with contextlib.suppress(ConnectionError):
            await self._acknowledgements()

    async def _acknowledgements(self) -> None:
        while line := await self._reader.readline():
            op, _, peer = line.decode("ascii").strip().partition(" ")
            waiter = self._waiting.get(peer)
            if op == "K" and waiter is not None and not waiter.done():
                waiter.set_result(None)


async def _child(config: dict[str, Any]) -> None:
    directory = Path(config["directory"])
    ctx = server_ssl_context(
        config["key_pem"].encode("ascii"),
        config["cert_pem"].encode("ascii"),
        config["ca_pem"].encode("ascii"),
        scratch=directory,
    )
    control_sock = socket.socket(fileno=config["control_fd"])
    reader, writer = await asyncio.open_connection(sock=control_sock)
    channel = _ControlChannel(reader, writer)
    fronts: list[TlsFront | TcpFront] = []
    for item in config["listeners"]:
        limiter = ConnectionLimiter(total=int(item["max_connections"]), per_address=item["per_address"])
        limit_names = (str(item["limit_names"][0]), str(item["limit_names"][1]))
        front: TlsFront | TcpFront
        if item["tls"]:
            front = TlsFront(
                ctx,
                directory=directory,
                backend=Path(item["backend"]),
                peers=channel,
                what=item["what"],
                name_prefix=config["name_prefix"],
                handshake_timeout=float(config["handshake_timeout"]),
                limiter=limiter,
                limit_names=limit_names,
            )
        else:
            front = TcpFront(
                directory=directory,
                backend=Path(item["backend"]),
                limiter=limiter,
                limit_names=limit_names,
                what=item["what"],
                name_prefix=config["name_prefix"],
            )
        sock = socket.socket(fileno=item["fd"])
        sock.setblocking(False)
        await front.start_on(sock)
        fronts.append(front)
    try:
        await channel.run()  # returns when the server closes the control socket
    finally:
        for front in fronts:
            await front.close()


def main() -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(LogThrottle())  # a flood's refusals: a few lines a minute, not thousands
    logging.getLogger().handlers[:] = [handler]
    logging.getLogger().setLevel(logging.INFO)
    config = json.loads(sys.stdin.read())
    os.close(0)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_child(config))


if __name__ == "__main__":
    main()
