"""JSON bytes exactly as Go's ``encoding/json`` writes them (``Marshal`` and ``MarshalIndent``).

Go sorts map keys (by bytes), escapes ``<``, ``>`` and ``&`` as ``\\u003c``, ``\\u003e``,
``\\u0026`` and U+2028/U+2029 as ``\\u2028``/``\\u2029``, writes other non-ASCII text as UTF-8,
control characters as ``\\n``, ``\\r``, ``\\t``, ``\\b``, ``\\f`` or ``\\u00XX``, numbers that came
from JSON as float64 (integers print without a fraction; the exponent form below 1e-6 and from
1e21 on, ``1e+21``, ``1e-7``), and ``MarshalIndent`` puts no newline after the last ``}``; empty
objects and arrays print as ``{}`` and ``[]``. A Go struct is written as a ``GoStruct``: its members
in the order given (the struct's field order; leaving out an ``omitempty`` field is the caller's job),
not sorted as a map's keys are. Files the server pushes (``json`` kind), ``groups.jsonc`` and the
config hashes are written with these functions, so their bytes (and the hashes over them) match a Go
server's. Pure functions.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b",
            "\f": "\\f", "<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028",
            "\u2029": "\\u2029"}  # fmt: skip


class GoStruct(dict[str, Any]):
    """A Go struct value: written with its members in insertion order, not sorted like a map."""

    __slots__ = ()


#: A character ``_string`` must escape; text without one is written as it is (the common case).
_SPECIAL = re.compile(r'["\\\x00-\x1f<>&\u2028\u2029\ud800-\udfff]')


def _escape(match: re.Match[str]) -> str:
    ch = match.group()
    escaped = _ESCAPES.get(ch)
    if escaped is not None:
        return escaped
    return f"\\u{ord(ch):04x}" if ch < " " else "\\ufffd"  # a lone surrogate: not UTF-8, as Go


def _string(text: str) -> str:
    if _SPECIAL.search(text) is None:
        return f'"{text}"'
    return f'"{_SPECIAL.sub(_escape, text)}"'


def _float(value: float) -> str:
    if math.isnan(value) or math.isinf(value):
        raise ValueError(f"json: unsupported value: {value}")
    if value == 0:
        return "-0" if math.copysign(1.0, value) < 0 else "0"
    magnitude = abs(value)
    if magnitude < 1e-6 or magnitude >= 1e21:
        text = repr(value)
        mantissa, _, exponent = text.partition("e")
        if mantissa.endswith(".0"):
            mantissa = mantissa[:-2]
        sign = exponent[0] if exponent[:1] in "+-" else "+"
        digits = exponent.lstrip("+-").lstrip("0") or "0"
        return f"{mantissa}e{sign}{digits}"
    return format(Decimal(repr(value)).normalize(), "f")


def _number(value: int | float) -> str:
    """A JSON number as Go prints it after decoding into ``interface{}`` (a float64)."""
    if isinstance(value, int):
        if abs(value) < 2**53:
            return str(value)
        return _float(float(value))
    return _float(value)


def _sorted_keys(value: Mapping[Any, Any]) -> list[Any]:
    """A map's keys in Go's order: by the bytes of their UTF-8 encoding.

    For string keys that is Python's string order (UTF-8 keeps code point order), the fast path.
    """
    try:
        keys = sorted(value)
    except TypeError:
        keys = None
    if keys is None or type(keys[0]) is not str:
        keys = sorted(value, key=lambda k: str(k).encode("utf-8"))
    return keys


def _object(value: Mapping[Any, Any], indent: str | None, level: int, out: list[str]) -> None:
    if not value:
        out.append("{}")
        return
    if indent is None:
        separator, between, colon, close = "{", ",", ":", "}"
    else:
        pad = "\n" + indent * (level + 1)
        separator, between, colon, close = "{" + pad, "," + pad, ": ", "\n" + indent * level + "}"
    for key in value if isinstance(value, GoStruct) else _sorted_keys(value):
        out.append(separator)
        separator = between
        out.append(_string(str(key)))
        out.append(colon)
        item = value[key]
        if type(item) is str:
            out.append(_string(item))
        else:
            _encode(item, indent, level + 1, out)
    out.append(close)


def _array(value: list[Any] | tuple[Any, ...], indent: str | None, level: int, out: list[str]) -> None:
    if not value:
        out.append("[]")
        return
    if indent is None:
        separator, between, close = "[", ",", "]"
    else:
        pad = "\n" + indent * (level + 1)
        separator, between, close = "[" + pad, "," + pad, "\n" + indent * level + "]"
    for item in value:
        out.append(separator)
        separator = between
        _encode(item, indent, level + 1, out)
    out.append(close)


def _encode(value: Any, indent: str | None, level: int, out: list[str]) -> None:
    if type(value) is str:
        out.append(_string(value))
    elif value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, (int, float)):
        out.append(_number(value))
    elif isinstance(value, str):
        out.append(_string(value))
    elif isinstance(value, Mapping):
        _object(value, indent, level, out)
    elif isinstance(value, (list, tuple)):
        _array(value, indent, level, out)
    else:
        raise TypeError(f"json: unsupported type: {type(value).__name__}")


def go_marshal(value: Any) -> bytes:
    """``json.Marshal(value)``."""
    out: list[str] = []
    _encode(value, None, 0, out)
    return "".join(out).encode("utf-8")


def go_marshal_indent(value: Any, indent: str = "  ") -> bytes:
    """``json.MarshalIndent(value, "", indent)``: no trailing newline."""
    out: list[str] = []
    _encode(value, indent, 0, out)
    return "".join(out).encode("utf-8")
