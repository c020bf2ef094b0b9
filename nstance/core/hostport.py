"""``host:port`` addresses and reported host names: the rules the server's config, the server and the
agent share.

Accepted: ``host:port``, ``:port`` (empty host) and ``[v6]:port``, with a decimal port from 1 to
65535, as Go's ``net.SplitHostPort`` followed by upstream's port check accepts them. Refused: no
colon, an IPv6 address without brackets (``::1:8080`` is ambiguous), port 0, a port out of range and
named ports (``localhost:http``). A host name an agent reports must be printable, without spaces
and at most ``MAX_HOSTNAME_LENGTH`` characters. Pure; resolves nothing.
"""

from __future__ import annotations

import re

MAX_HOSTNAME_LENGTH = 253
_WHITESPACE = re.compile(r"\s")


def split_host_port(addr: str, *, any_port: bool = False) -> tuple[str, int] | None:
    """``(host, port)`` of ``addr`` (an IPv6 host keeps its brackets, an empty host stays empty); None
    if ``addr`` is not an address of the form above. ``any_port`` also accepts port 0: a listener
    the caller lets the kernel give a free port (tests)."""
    host, sep, port = addr.rpartition(":")
    lowest = 0 if any_port else 1
    if not sep or not port.isascii() or not port.isdigit() or not lowest <= int(port) <= 65535:
        return None
    if ":" in host and not (host.startswith("[") and host.endswith("]")):
        return None
    return host, int(port)


def hostname_problem(hostname: str) -> str | None:
    """Why ``hostname`` is not a host name an agent may report; None when it is."""
    if len(hostname) > MAX_HOSTNAME_LENGTH or not hostname.isprintable() or _WHITESPACE.search(hostname):
        return f"is not a host name (printable, no spaces, at most {MAX_HOSTNAME_LENGTH} characters)"
    return None
