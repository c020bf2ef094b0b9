"""Byte forwarding between two asyncio transports, for the OpenSSL TLS layers around grpc.

grpcio's TLS cannot sign or verify Ed25519 in a handshake, so the server's mTLS ports
(``nstance.server.net.tlsfront``) and the clients that talk to Ed25519 servers (``nstance.pki.tlsclient``)
run TLS in Python's ``ssl`` (OpenSSL) and hand plain HTTP/2 to grpc over a private Unix socket. This
module holds what both sides share: ``Pipe`` (an asyncio protocol copying bytes to its partner, with
flow control in both directions: a full write buffer pauses reading on the other side),
``load_key_pair`` and the private socket directory. It knows nothing about gRPC or certificates.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import ssl
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final

#: Seconds a TLS handshake may take before the connection is closed.
HANDSHAKE_TIMEOUT: Final = 10.0
#: Bytes buffered for one direction before the other side stops being read.
WRITE_HIGH_WATER: Final = 256 * 1024


def load_key_pair(ctx: ssl.SSLContext, key_pem: bytes, cert_pem: bytes, *, scratch: Path) -> None:
    """Load a PEM key and certificate into ``ctx`` through short-lived 0600 files in ``scratch``."""
    fd, name = tempfile.mkstemp(dir=scratch, suffix=".pem")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(key_pem.rstrip(b"\n") + b"\n" + cert_pem)
        ctx.load_cert_chain(name)
    finally:
        os.unlink(name)


class Pipe(asyncio.Protocol):
    """One side of a forwarded connection: writes what it reads to the other side's transport.

    ``on_made`` runs when the transport is up (after the TLS handshake on a TLS transport);
    ``on_lost`` is resolved when it closes. Bytes read before ``attach`` are kept for the other side.
    """

    def __init__(
        self,
        *,
        on_made: Callable[[Pipe, asyncio.Transport], None] | None = None,
        on_lost: asyncio.Future[None] | None = None,
    ) -> None:
        self.transport: asyncio.Transport | None = None
        self.other: Pipe | None = None
        self._on_made = on_made
        self._on_lost = on_lost
        self._pending: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
        if self._on_made is not None:
            self._on_made(self, transport)

    def data_received(self, data: bytes) -> None:
        other = self.other
        if other is not None and other.transport is not None:
            other.transport.write(data)
        else:  # the other side is not connected yet
            self._pending.append(data)

    def attach(self, other: Pipe) -> None:
        self.other = other
        pending, self._pending = self._pending, []
        if other.transport is not None:
            for chunk in pending:
                other.transport.write(chunk)

    def eof_received(self) -> bool | None:
        self.close()
        return None

    def pause_writing(self) -> None:
        if self.other is not None and self.other.transport is not None:
            self.other.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.other is not None and self.other.transport is not None:
            self.other.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self.other is not None:
            self.other.close()
        if self._on_lost is not None and not self._on_lost.done():
            self._on_lost.set_result(None)

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()


#: Where a private directory is made when the temporary directory is not writable: upstream's systemd
#: units run with ``ProtectSystem=strict`` and no ``PrivateTmp``, so /tmp is read-only there, while
#: /dev/shm (under /dev) stays writable.
FALLBACK_BASES: tuple[Path, ...] = (Path("/dev/shm"),)


def private_directory(prefix: str = "nstance-tls-", fallbacks: Sequence[Path] = ()) -> Path:
    """A fresh 0700 directory for the backend sockets, short enough for a Unix socket path.

    In the temporary directory; where that cannot be written, under ``FALLBACK_BASES`` and then under
    ``fallbacks`` (a directory the program must be able to write anyway, such as its cache). Raises
    OSError naming every place tried when none can be written.
    """
    tried: list[str] = []
    for base in (None, *FALLBACK_BASES, *fallbacks):
        try:
            return Path(tempfile.mkdtemp(prefix=prefix, dir=base))
        except OSError as exc:
            tried.append(f"{base or 'the temporary directory'}: {exc.strerror or exc}")
    raise OSError(f"no writable directory for private sockets ({'; '.join(tried)})")


def remove_private_directory(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
