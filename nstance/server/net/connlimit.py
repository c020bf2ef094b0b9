"""Admission of accepted TCP connections: a cap per port and a cap per client address.

A port's total cap alone lets one client take every slot of it (the registration port needs no
certificate, so anyone who can reach it can). ``ConnectionLimiter`` admits a connection only while the
port holds fewer than ``total`` and its client address fewer than ``per_address``; the connection is
counted until ``release``. Addresses are grouped as a client can change them cheaply: an IPv4 address
is itself, an IPv6 address counts for its /64 (one host usually holds a whole /64), and an IPv4 address
mapped into IPv6 (a dual-stack listener) is the IPv4 address. Pure bookkeeping: no sockets, no I/O.
"""

from __future__ import annotations

import ipaddress
from collections import Counter

#: Prefix length an IPv6 client address is counted by.
IPV6_PREFIX = 64


def address_key(host: str) -> str:
    """The name a client address is counted under (see the module docstring)."""
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host  # not an IP address (a Unix socket's peer): counted as given
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network(f"{address}/{IPV6_PREFIX}", strict=False))
    return str(address)


class ConnectionLimiter:
    """Counts a port's open connections in all and per client address (module docstring)."""

    def __init__(self, *, total: int, per_address: int | None) -> None:
        if total < 1 or (per_address is not None and per_address < 1):
            raise ValueError("connection limits must be at least 1")
        self.total = total
        self.per_address = per_address
        self._open: Counter[str] = Counter()
        self._count = 0
        #: Connections refused so far, for the whole port and for one address over its share.
        self.refused_total = 0
        self.refused_address = 0

    @property
    def open(self) -> int:
        return self._count

    def held_by(self, host: str) -> int:
        """Connections open from ``host``'s address group."""
        return self._open[address_key(host)]

    def admit(self, host: str) -> str | None:
        """Count a new connection from ``host`` and return its key for ``release``; None if refused."""
        if self._count >= self.total:
            self.refused_total += 1
            return None
        key = address_key(host)
        if self.per_address is not None and self._open[key] >= self.per_address:
            self.refused_address += 1
            return None
        self._open[key] += 1
        self._count += 1
        return key

    def release(self, key: str) -> None:
        """Stop counting a connection ``admit`` returned ``key`` for."""
        if self._open[key] <= 1:
            del self._open[key]
        else:
            self._open[key] -= 1
        self._count -= 1
