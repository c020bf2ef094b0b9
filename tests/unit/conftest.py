"""The unit tier starts no process and opens no network socket: it tests pure logic.

Every unit test runs with ``socket.bind``/``socket.connect`` on internet sockets and process creation
refused, so a test that needs a server, a port or a child process belongs in ``tests/integration``
(or ``contract``, ``e2e``, ``security``). Unix socket pairs (the event loop's own wake-up channel)
are allowed. The cloud SDKs are told there is no instance metadata service, so none goes looking for
credentials on the network.
"""

from __future__ import annotations

import socket
import subprocess
from typing import Any

import pytest

_NET = (socket.AF_INET, socket.AF_INET6)


class TierViolation(AssertionError):
    """A unit test reached for the network or a child process."""


@pytest.fixture(autouse=True)
def _no_sockets_or_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    real_bind, real_connect = socket.socket.bind, socket.socket.connect

    def bind(self: socket.socket, address: Any) -> None:
        if self.family in _NET:
            raise TierViolation(f"a unit test bound a network socket ({address!r}); move it to integration")
        real_bind(self, address)

    def connect(self: socket.socket, address: Any) -> None:
        if self.family in _NET:
            raise TierViolation(f"a unit test connected to {address!r}; move it to integration")
        real_connect(self, address)

    def popen(*args: Any, **kwargs: Any) -> None:
        raise TierViolation(f"a unit test started a process {args[1] if len(args) > 1 else kwargs!r}")

    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("NO_GCE_CHECK", "True")
    monkeypatch.setattr(socket.socket, "bind", bind)
    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(subprocess.Popen, "__init__", popen)
