"""The addresses this server listens on and announces: ``shard.bind``/``shard.advertise`` and the host flags.

One config serves every server of a shard, so the per-server parts come from flags:

* ``--bind-host`` (ours) replaces the host of every ``shard.bind`` address;
* ``--advertise-host`` (upstream's) replaces the host of ``shard.advertise.health_addr`` and
  ``election_addr`` only - the addresses that belong to one server. Both must then be written without
  a host (``":8991"``, or a wildcard host), as upstream requires: a host already there is an error, not
  silently replaced. ``registration_addr``, ``operator_addr`` and ``agent_addr`` are the shard's
  (typically the leader's floating IP, ``shard.leader_network``) and are never touched by the flag;
* any advertised address still without a host that can be dialled (empty, ``0.0.0.0``, ``::``) gets
  the ``--bind-host`` host when that names one, else this host's primary IP, as upstream fills it.

Decisions only (``primary_ip`` asks the kernel for a route, nothing else); errors are one line.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable, Mapping
from typing import Final

from nstance.core.errors import InvalidArgument
from nstance.core.hostport import split_host_port

#: The advertised addresses ``--advertise-host`` sets: those of this one server.
PER_SERVER: Final = ("health_addr", "election_addr")


def _wildcard(host: str) -> bool:
    return host.strip("[]") in ("", "0.0.0.0", "::")


def _join(host: str, port: int) -> str:
    bare = host.strip("[]")
    return f"[{bare}]:{port}" if ":" in bare else f"{bare}:{port}"


def _port(addr: str) -> int:
    parsed = split_host_port(addr)
    return parsed[1] if parsed else 0


def bound_addresses(addrs: Mapping[str, str], bind_host: str) -> dict[str, str]:
    """``shard.bind`` with the host of every address replaced by ``bind_host`` (unchanged when "")."""
    if not bind_host:
        return dict(addrs)
    return {name: _join(bind_host, _port(addr)) for name, addr in addrs.items()}


def primary_ip() -> str:
    """This host's primary IPv4 address: the source address of its default route ("" if none).

    A UDP "connect" only selects a route; no packet is sent.
    """
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("192.0.2.1", 9))  # TEST-NET-1: never routed anywhere, so nothing leaves
        return str(probe.getsockname()[0])
    return ""


def apply_advertise_host(addrs: Mapping[str, str], advertise_host: str) -> dict[str, str]:
    """``addrs`` with ``advertise_host`` as the host of health_addr and election_addr.

    Raises InvalidArgument when one of them already names a host: the config and the flag would
    disagree about where this server is reached.
    """
    out = dict(addrs)
    if not advertise_host:
        return out
    for name in PER_SERVER:
        addr = addrs.get(name)
        if addr is None:
            continue
        parsed = split_host_port(addr)
        if parsed is None:
            raise InvalidArgument(f'shard.advertise.{name}: "{addr}" is not host:port')
        host, port = parsed
        if not _wildcard(host):
            raise InvalidArgument(
                f"--advertise-host cannot be used when shard.advertise.{name} already names a host "
                f'("{addr}"); write it port-only (":{port}")'
            )
        out[name] = _join(advertise_host, port)
    return out


def fill_advertised_hosts(addrs: Mapping[str, str], detect: Callable[[], str] = primary_ip) -> dict[str, str]:
    """``addrs`` with an empty, ``0.0.0.0`` or ``::`` host replaced by ``detect()`` (asked at most once).

    Such a host cannot be dialled by agents and operators. When ``detect()`` finds nothing the value
    is left as it is.
    """
    out = dict(addrs)
    detected: str | None = None
    for name, addr in addrs.items():
        parsed = split_host_port(addr)
        if parsed is None or not _wildcard(parsed[0]):
            continue
        if detected is None:
            detected = detect()
        if detected:
            out[name] = _join(detected, parsed[1])
    return out


def advertised_addresses(
    addrs: Mapping[str, str],
    *,
    advertise_host: str = "",
    bind_host: str = "",
    detect: Callable[[], str] = primary_ip,
) -> dict[str, str]:
    """``shard.advertise`` as this server announces it (see the module docstring for the rules)."""
    with_flag = apply_advertise_host(addrs, advertise_host)
    if bind_host and not _wildcard(bind_host):
        return fill_advertised_hosts(with_flag, lambda: bind_host)
    return fill_advertised_hosts(with_flag, detect)
