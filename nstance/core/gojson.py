"""JSON bytes exactly as Go's ``encoding/json`` writes them (``Marshal`` and ``MarshalIndent``).

Go sorts map keys (by bytes), escapes ``<``, ``>`` and ``&`` as ``\\u003c``, ``\\u003e``,
``\\u0026`` and U+2028/U+2029 as ``\\u2028``/``\\u2029``, writes other non-ASCII text as UTF-8,
control characters as ``\\n``, ``\\r``, ``\\t``, ``\\b``, ``\\f`` or ``\\u00XX``, numbers that came
from JSON as float64 (integers print without a fraction; the exponent form below 1e-6 and from
1e21 on, ``1e+21``, ``1e-7``), and ``MarshalIndent`` puts no newline after the last ``}``; empty
objects and arrays print as ``{}`` and ``[]``. Files the server pushes (``json`` kind) and
``groups.jsonc`` are written with these functions, so their bytes (and the hashes over them) match
a Go server's. Pure functions.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b",
            "\f": "\\f", "<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028",
            "\u2029": "\\u2029"}  # fmt: skip


def _string(text: str) -> str:
    out = ['"']
    for ch in text:
        escaped = _ESCAPES.get(ch)
        if escaped is not None:
            out.append(escaped)
        elif ch < " ":
            out.append(f"\\u{ord(ch):04x}")
        elif 0xD800 <= ord(ch) <= 0xDFFF:
            out.append("\\ufffd")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


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


def _encode(value: Any, indent: str | None, level: int, out: list[str]) -> None:
    if value is None:
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
        if not value:
            out.append("{}")
            return
        out.append("{")
        for i, key in enumerate(sorted(value, key=lambda k: str(k).encode("utf-8"))):
            if i:
                out.append(",")
            if indent is not None:
                out.append("\n" + indent * (level + 1))
            out.append(_string(str(key)))
            out.append(": " if indent is not None else ":")
            _encode(value[key], indent, level + 1, out)
        if indent is not None:
            out.append("\n" + indent * level)
        out.append("}")
    elif isinstance(value, (list, tuple)):
        if not value:
            out.append("[]")
            return
        out.append("[")
        for i, item in enumerate(value):
            if i:
                out.append(",")
            if indent is not None:
                out.append("\n" + indent * (level + 1))
            _encode(item, indent, level + 1, out)
        if indent is not None:
            out.append("\n" + indent * level)
        out.append("]")
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
