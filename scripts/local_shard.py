"""Helpers of ``make run`` (scripts/run_local.sh) that are easier to get right in Python.

``settings CONFIG``     print ``CLUSTER=``, ``SHARD=``, ``HEALTH_ADDR=`` and ``OPERATOR_ADDR=`` lines
                        (shell-quoted) read from the config's cluster.id, shard.id and shard.bind.
``check-ports CONFIG``  exit 1 with one line per address when any of the config's shard.bind addresses
                        cannot be bound (another server, or another copy of ``make run``, holds it).
``wait-leader ADDR PID`` wait until ``http://ADDR/leader/health`` answers 200: exit 0; exit 3 as soon as
                        process PID has exited, 4 after 60 seconds.
``stop-agents DIR``     stop the agent processes of the local provider's instance directory DIR, and
                        only those: a process is signalled only when its pid is recorded in one of
                        DIR's ``instance.json`` files *and* its command line names that instance's
                        directory (the local provider's own rule, so a reused pid is never hit).
"""

from __future__ import annotations

import asyncio
import errno
import os
import shlex
import socket
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nstance.config.jsonc import parse_jsonc
from nstance.core.clock import SystemClock
from nstance.core.errors import NstanceError
from nstance.providers.local import LocalProvider


def _config(path: str) -> dict[str, Any]:
    raw = parse_jsonc(Path(path).read_text(encoding="utf-8"), source=path)
    if not isinstance(raw, dict):
        raise SystemExit(f"error: {path}: the top level must be an object")
    return raw


def _bind_addrs(raw: dict[str, Any]) -> dict[str, str]:
    bind = (raw.get("shard") or {}).get("bind") or {}
    return {f"shard.bind.{name}": str(addr) for name, addr in sorted(bind.items()) if addr}


def settings(path: str) -> int:
    raw = _config(path)
    bind = _bind_addrs(raw)
    values = {
        "CLUSTER": (raw.get("cluster") or {}).get("id", ""),
        "SHARD": (raw.get("shard") or {}).get("id", ""),
        "HEALTH_ADDR": bind.get("shard.bind.health_addr", "127.0.0.1:8990"),
        "OPERATOR_ADDR": bind.get("shard.bind.operator_addr", ""),
    }
    for key, value in values.items():
        print(f"{key}={shlex.quote(str(value))}")
    return 0


def _in_use(addr: str) -> bool:
    host, _, port = addr.rpartition(":")
    host = host.strip("[]") or "0.0.0.0"
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        # The servers set SO_REUSEADDR too, so a socket in TIME_WAIT from a previous run is no clash.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, int(port)))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


def check_ports(path: str) -> int:
    busy = [(key, addr) for key, addr in _bind_addrs(_config(path)).items() if _in_use(addr)]
    for key, addr in busy:
        print(f"error: {addr} ({key} in {path}) is already in use", file=sys.stderr)
    return 1 if busy else 0


def wait_leader(addr: str, pid: str) -> int:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            return 3
        try:
            with urllib.request.urlopen(f"http://{addr}/leader/health", timeout=2) as response:
                if response.status == 200:
                    return 0
        except OSError:
            pass
        time.sleep(0.2)
    return 4


def stop_agents(directory: str) -> int:
    base = Path(directory)
    if not base.is_dir():
        return 0
    provider = LocalProvider(base, clock=SystemClock(), stop_instances_on_close=True)
    try:
        asyncio.run(provider.close())
    except NstanceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str]) -> int:
    commands: dict[str, Callable[..., int]] = {
        "settings": settings,
        "check-ports": check_ports,
        "wait-leader": wait_leader,
        "stop-agents": stop_agents,
    }
    arity = {"wait-leader": 2}
    if not argv or argv[0] not in commands or len(argv) != 1 + arity.get(argv[0], 1):
        print(f"usage: local_shard.py {{{'|'.join(commands)}}} ARG...", file=sys.stderr)
        return 2
    return commands[argv[0]](*argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
