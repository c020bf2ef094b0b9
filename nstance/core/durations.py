"""Go-style duration strings (``"90s"``, ``"5m"``, ``"1h30m"``, ``"504h"``, ``"250ms"``).

Config files written for the Go implementation use ``time.ParseDuration`` syntax, so we parse the
same grammar: an optional sign, then one or more ``<number><unit>`` pairs with units ns, us (µs),
ms, s, m, h. ``"0"`` alone is zero. Days (``"21d"``) are refused with a hint, as Go refuses them.
"""

from __future__ import annotations

import re
from datetime import timedelta

from nstance.core.errors import InvalidArgument

_UNITS_NS = {
    "ns": 1,
    "us": 1_000,
    "µs": 1_000,
    "μs": 1_000,
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60 * 1_000_000_000,
    "h": 3600 * 1_000_000_000,
}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


def parse_duration(text: str) -> timedelta:
    """Parse a Go duration string into a timedelta (microsecond resolution)."""
    if not isinstance(text, str):
        raise InvalidArgument(f'duration must be a string like "90s" or "5m" (got {text!r})')
    raw = text.strip()
    sign = 1
    if raw[:1] in "+-" and raw:
        sign = -1 if raw[0] == "-" else 1
        raw = raw[1:]
    if raw == "0":
        return timedelta(0)
    if not raw:
        raise InvalidArgument(f"invalid duration {text!r}: empty")
    total_ns = 0.0
    pos = 0
    while pos < len(raw):
        match = _PART.match(raw, pos)
        if match is None:
            hint = ""
            if re.search(r"\d+d", raw):
                hint = ' (days are not a unit; write hours, e.g. "504h" for 21 days)'
            raise InvalidArgument(
                f"invalid duration {text!r}{hint}: expected <number><unit> with unit ns, us, ms, s, m or h"
            )
        total_ns += float(match.group(1)) * _UNITS_NS[match.group(2)]
        pos = match.end()
    return sign * timedelta(microseconds=total_ns / 1_000)


def format_duration(value: timedelta) -> str:
    """Format a timedelta the way Go's ``Duration.String`` does (``1h30m0s``, ``250ms``, ``0s``)."""
    total_us = round(value / timedelta(microseconds=1))
    if total_us == 0:
        return "0s"
    sign = "-" if total_us < 0 else ""
    total_us = abs(total_us)
    if total_us < 1_000_000:
        if total_us % 1_000 == 0:
            return f"{sign}{total_us // 1_000}ms"
        return f"{sign}{_trim(total_us / 1_000)}ms"
    hours, rest = divmod(total_us, 3_600_000_000)
    minutes, rest = divmod(rest, 60_000_000)
    seconds = rest / 1_000_000
    out = sign
    if hours:
        out += f"{hours}h"
    if hours or minutes:
        out += f"{minutes}m"
    return out + f"{_trim(seconds)}s"


def _trim(number: float) -> str:
    text = f"{number:.6f}".rstrip("0").rstrip(".")
    return text or "0"
