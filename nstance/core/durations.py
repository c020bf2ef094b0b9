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
#: The largest magnitude a Go ``time.Duration`` holds, in nanoseconds (``-1 << 63`` .. ``1<<63 - 1``).
_LIMIT = 1 << 63


def parse_duration(text: str) -> timedelta:
    """Parse a Go duration string into a timedelta.

    The value is the one Go's ``time.ParseDuration`` gives, to the nanosecond (a fraction is scaled as
    Go scales it, in binary floating point, and truncated), then truncated to the microsecond a
    timedelta holds. What Go refuses is refused, durations beyond Go's range of about 292 years
    included; surrounding white space, which Go refuses too, is ignored.
    """
    if not isinstance(text, str):
        raise InvalidArgument(f'duration must be a string like "90s" or "5m" (got {text!r})')
    raw = text.strip()
    negative = raw[:1] == "-"
    if raw[:1] in ("-", "+"):
        raw = raw[1:]
    if raw == "0":
        return timedelta(0)
    if not raw:
        raise InvalidArgument(f"invalid duration {text!r}: empty")
    total = 0
    pos = 0
    while pos < len(raw):
        part, pos = _part_ns(raw, pos, text)
        total += part
        if total > _LIMIT:
            raise _out_of_range(text)
    if not negative and total == _LIMIT:
        raise _out_of_range(text)
    micros = total // 1_000
    return timedelta(microseconds=-micros if negative else micros)


def _part_ns(raw: str, pos: int, text: str) -> tuple[int, int]:
    """One ``<number><unit>`` of ``raw`` from ``pos``: its nanoseconds, and where the next one starts."""
    start = pos
    whole, pos, overflow = _digits(raw, pos)
    if overflow:
        raise _out_of_range(text)
    has_whole = pos > start
    fraction, scale = 0, 1.0
    has_fraction = False
    if pos < len(raw) and raw[pos] == ".":
        begin = pos + 1
        fraction, scale, pos = _fraction(raw, begin)
        has_fraction = pos > begin
    if not (has_whole or has_fraction):
        raise _malformed(text, raw)
    unit_start = pos
    while pos < len(raw) and raw[pos] != "." and not ("0" <= raw[pos] <= "9"):
        pos += 1
    unit = _UNITS_NS.get(raw[unit_start:pos])
    if unit is None:
        raise _malformed(text, raw)
    if whole > _LIMIT // unit:
        raise _out_of_range(text)
    value = whole * unit
    if fraction:
        value += int(float(fraction) * (float(unit) / scale))
        if value > _LIMIT:
            raise _out_of_range(text)
    return value, pos


def _digits(raw: str, pos: int) -> tuple[int, int, bool]:
    """The decimal number at ``pos``, where it ends, and whether it overflowed Go's 64 bits."""
    value = 0
    while pos < len(raw) and "0" <= raw[pos] <= "9":
        if value > _LIMIT // 10:
            return value, pos, True
        value = value * 10 + ord(raw[pos]) - 48
        if value > _LIMIT:
            return value, pos, True
        pos += 1
    return value, pos, False


def _fraction(raw: str, pos: int) -> tuple[int, float, int]:
    """The digits after a decimal point: their value, ten to their count (as Go keeps it, a float64,
    ignoring digits beyond 64 bits), and where they end."""
    value, scale, full = 0, 1.0, False
    while pos < len(raw) and "0" <= raw[pos] <= "9":
        if not full:
            grown = value * 10 + ord(raw[pos]) - 48
            if value > (_LIMIT - 1) // 10 or grown > _LIMIT:
                full = True
            else:
                value, scale = grown, scale * 10
        pos += 1
    return value, scale, pos


def _malformed(text: str, raw: str) -> InvalidArgument:
    hint = ""
    if re.search(r"\d+d", raw):
        hint = ' (days are not a unit; write hours, e.g. "504h" for 21 days)'
    return InvalidArgument(
        f"invalid duration {text!r}{hint}: expected <number><unit> with unit ns, us, ms, s, m or h"
    )


def _out_of_range(text: str) -> InvalidArgument:
    return InvalidArgument(f"invalid duration {text!r}: longer than Go's limit of about 292 years (2562047h)")


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
