"""Go's ``fmt`` printing for template values: ``Print``, ``Println``, ``Sprintf`` and ``%v``.

Covers what templates print: strings, ints, floats (``%v`` is Go's shortest ``%g``: ``1e+06``),
bools, nil, maps (``map[a:1 b:2]``, keys sorted), lists (``[a b]``) and structs (``{x y}``).
``go_sprintf`` implements the verbs ``%v %s %q %d %x %X %o %b %c %t %f %F %e %E %g %G %T %%`` with
flags ``+ - # 0 space``, width and precision (``*`` too), and Go's error forms for a wrong type
(``%!d(string=x)``), a missing argument (``%!d(MISSING)``) and extra arguments
(``%!(EXTRA int=1)``). Pure functions.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal
from typing import Any


def go_type(value: Any) -> str:
    """The Go type name a value stands for (``string``, ``int``, ``map[string]string``, ...)."""
    from nstance.config.goexec import GoStruct

    if value is None:
        return "<nil>"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float64"
    if isinstance(value, str):
        return "string"
    if isinstance(value, dict):
        return (
            "map[string]string"
            if all(isinstance(v, str) for v in value.values())
            else "map[string]interface {}"
        )
    if isinstance(value, (list, tuple)):
        return "[]interface {}"
    if isinstance(value, (bytes, bytearray)):
        return "[]uint8"
    if isinstance(value, GoStruct):
        return value.name
    return type(value).__name__


def _digits(value: float) -> tuple[str, int, bool]:
    """Shortest decimal digits of ``value`` (no trailing zeros), the decimal point position, the sign.

    ``0.0125`` gives ``("125", -1, False)``: the value is ``0.125 × 10**point``... read as
    ``"0." + "0" * -point + digits``.
    """
    _sign, digit_tuple, exponent = Decimal(repr(abs(value))).as_tuple()
    assert isinstance(exponent, int)
    text = "".join(map(str, digit_tuple))
    point = len(text) + exponent
    stripped = text.lstrip("0")
    point -= len(text) - len(stripped)
    stripped = stripped.rstrip("0")
    if not stripped:
        return "0", 1, math.copysign(1.0, value) < 0
    return stripped, point, math.copysign(1.0, value) < 0


def _exp_form(digits: str, point: int, negative: bool) -> str:
    exp = point - 1
    mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
    return f"{'-' if negative else ''}{mantissa}e{'-' if exp < 0 else '+'}{abs(exp):02d}"


def _plain_form(digits: str, point: int, negative: bool) -> str:
    if point <= 0:
        body = "0." + "0" * -point + digits
    elif point >= len(digits):
        body = digits + "0" * (point - len(digits))
    else:
        body = digits[:point] + "." + digits[point:]
    return ("-" if negative else "") + body


def format_float_g(value: float, verb: str = "g") -> str:
    """Go's ``strconv.FormatFloat(f, 'g', -1, 64)``: what ``%v`` and a bare ``%g`` print.

    Shortest digits; the exponent form when the exponent is below -4 or at least 6 (``1e+06``).
    """
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    digits, point, negative = _digits(value)
    if digits == "0":
        return "-0" if negative else "0"
    exp = point - 1
    text = (
        _exp_form(digits, point, negative) if exp < -4 or exp >= 6 else _plain_form(digits, point, negative)
    )
    return text.upper() if verb == "G" else text


def go_quote(text: str) -> str:
    """Go's ``strconv.Quote``: double quotes, Go escapes, printable Unicode kept."""
    out = ['"']
    escapes = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v",
               '"': '\\"', "\\": "\\\\"}  # fmt: skip
    for ch in text:
        if ch in escapes:
            out.append(escapes[ch])
        elif ch == " " or (ch.isprintable() and not ch.isspace()):
            out.append(ch)
        elif 0xD800 <= ord(ch) <= 0xDFFF:
            out.append("\\ufffd")
        elif ord(ch) < 0x80:
            out.append(f"\\x{ord(ch):02x}")
        elif ord(ch) <= 0xFFFF:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(f"\\U{ord(ch):08x}")
    out.append('"')
    return "".join(out)


def go_value_string(value: Any, top: bool = False) -> str:
    """How Go's ``fmt.Print`` (and a ``{{ }}`` action) prints ``value``."""
    from nstance.config.goexec import GoStruct

    if value is None:
        return "<no value>" if top else "<nil>"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return format_float_g(value)
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        return "map[" + " ".join(f"{k}:{go_value_string(value[k])}" for k in sorted(value)) + "]"
    if isinstance(value, (list, tuple)):
        return "[" + " ".join(go_value_string(v) for v in value) + "]"
    if isinstance(value, (bytes, bytearray)):
        return "[" + " ".join(str(b) for b in value) + "]"
    if isinstance(value, GoStruct):
        return "{" + " ".join(go_value_string(v) for v in value.fields.values()) + "}"
    return str(value)


def go_sprint(*args: Any) -> str:
    """Go's ``fmt.Sprint``: a space between operands when neither side is a string."""
    out: list[str] = []
    for i, arg in enumerate(args):
        if i > 0 and not isinstance(arg, str) and not isinstance(args[i - 1], str):
            out.append(" ")
        out.append(go_value_string(arg))
    return "".join(out)


def go_sprintln(*args: Any) -> str:
    """Go's ``fmt.Sprintln``: operands separated by spaces, then a newline."""
    return " ".join(go_value_string(arg) for arg in args) + "\n"


_VERB = re.compile(r"%([-+# 0]*)(\*|\d+)?(?:\.(\*|\d+)?)?(.)?", re.DOTALL)


def _pad(text: str, flags: str, width: int | None, numeric: bool) -> str:
    if width is None or len(text) >= width:
        return text
    if "-" in flags:
        return text + " " * (width - len(text))
    if "0" in flags and numeric:
        sign = text[0] if text[:1] in "+-" else ""
        return sign + "0" * (width - len(text)) + text[len(sign) :]
    return " " * (width - len(text)) + text


def _bad(verb: str, value: Any) -> str:
    if value is None:
        return f"%!{verb}(<nil>)"
    return f"%!{verb}({go_type(value)}={go_value_string(value)})"


def _integer(verb: str, flags: str, prec: int | None, value: int) -> str:
    base = {"d": 10, "x": 16, "X": 16, "o": 8, "b": 2}[verb]
    digits = format(abs(value), {10: "d", 16: "x", 8: "o", 2: "b"}[base])
    if verb == "X":
        digits = digits.upper()
    if prec is not None:
        digits = digits.zfill(prec) if not (prec == 0 and value == 0) else ""
    if "#" in flags:
        digits = {"x": "0x", "X": "0X", "o": "0", "b": "0b"}.get(verb, "") + digits
    sign = "-" if value < 0 else ("+" if "+" in flags else (" " if " " in flags else ""))
    return sign + digits


def _floating(verb: str, flags: str, prec: int | None, value: float) -> str:
    if math.isnan(value) or math.isinf(value):
        text = format_float_g(value)
        return ("+" + text) if "+" in flags and not text.startswith(("+", "-")) else text
    if verb in "gG" and prec is None:
        text = format_float_g(value, verb)
    else:
        spec = verb.lower() if verb in "Ff" else verb
        text = format(value, f"{'#' if '#' in flags else ''}.{6 if prec is None else prec}{spec}")
    if "+" in flags and not text.startswith("-"):
        text = "+" + text
    elif " " in flags and not text.startswith("-"):
        text = " " + text
    return text


def go_sprintf(template: Any, *args: Any) -> str:
    """Go's ``fmt.Sprintf`` for the verbs listed in the module docstring."""
    if not isinstance(template, str):
        raise ValueError(f"printf format has type {go_type(template)}; should be string")
    out: list[str] = []
    pos = 0
    argi = 0
    while pos < len(template):
        start = template.find("%", pos)
        if start < 0:
            out.append(template[pos:])
            break
        out.append(template[pos:start])
        match = _VERB.match(template, start)
        assert match is not None
        flags, width_s, prec_s, verb = match.group(1), match.group(2), match.group(3), match.group(4)
        pos = match.end()
        if verb is None:
            out.append("%!(NOVERB)")
            break
        if verb == "%":
            out.append("%")
            continue
        width = prec = None
        if width_s == "*":
            width, argi = (args[argi] if argi < len(args) and isinstance(args[argi], int) else None), argi + 1
        elif width_s:
            width = int(width_s)
        if prec_s == "*":
            prec, argi = (args[argi] if argi < len(args) and isinstance(args[argi], int) else None), argi + 1
        elif prec_s is not None:
            prec = int(prec_s)
        elif "." in match.group(0)[1:]:
            prec = 0
        if argi >= len(args):
            out.append(f"%!{verb}(MISSING)")
            continue
        value = args[argi]
        argi += 1
        out.append(_format_one(verb, flags, width, prec, value))
    if argi < len(args):
        extra = ", ".join("<nil>" if a is None else f"{go_type(a)}={go_value_string(a)}" for a in args[argi:])
        out.append(f"%!(EXTRA {extra})")
    return "".join(out)


def _format_one(verb: str, flags: str, width: int | None, prec: int | None, value: Any) -> str:
    numeric = False
    is_int = isinstance(value, int) and not isinstance(value, bool)
    if verb == "v":
        text = go_value_string(value)
        numeric = is_int or isinstance(value, float)
    elif verb == "T":
        text = go_type(value)
    elif verb == "s":
        if isinstance(value, str):
            text = value if prec is None else value[:prec]
        elif isinstance(value, (bytes, bytearray)):
            text = value.decode("utf-8", "replace")
        elif isinstance(value, (dict, list, tuple)) or value is None:
            text = go_value_string(value) if value is not None else "%!s(<nil>)"
        else:
            text = _bad("s", value)
    elif verb == "q":
        if isinstance(value, str):
            text = go_quote(value)
        elif is_int:
            text = "'" + go_quote(chr(value))[1:-1].replace("'", "\\'").replace('\\"', '"') + "'"
        else:
            text = _bad("q", value)
    elif verb in "dxXob":
        if is_int:
            text, numeric = _integer(verb, flags, prec, value), True
        elif verb in "xX" and isinstance(value, str):
            text = value.encode("utf-8").hex()
            text = text.upper() if verb == "X" else text
        else:
            text = _bad(verb, value)
    elif verb == "c":
        text = chr(value) if is_int and 0 <= value <= 0x10FFFF else _bad("c", value)
    elif verb == "t":
        text = ("true" if value else "false") if isinstance(value, bool) else _bad("t", value)
    elif verb in "fFeEgG":
        if isinstance(value, float):
            text, numeric = _floating(verb, flags, prec, value), True
        else:
            text = _bad(verb, value)
    else:
        text = _bad(verb, value)
    return _pad(text, flags, width, numeric)
