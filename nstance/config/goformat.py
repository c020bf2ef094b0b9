"""Go's ``fmt`` printing for template values: ``Print``, ``Println``, ``Sprintf`` and ``%v``.

Covers what templates print: strings, ints, floats (``%v`` is Go's shortest ``%g``: ``1e+06``),
bools, nil, maps (``map[a:1 b:2]``, keys sorted), lists (``[a b]``) and structs (``{x y}``).
``go_sprintf`` implements the verbs ``%v %s %q %d %x %X %o %O %b %c %U %t %f %F %e %E %g %G %T %%``
(``%x``, ``%X`` and ``%b`` of floats too) with flags ``+ - # 0 space``, width and precision (``*``
too), explicit operand indexes (``%[2]d``), and Go's error forms for a wrong type
(``%!d(string=x)``, the operand printed with the directive's flags), a missing argument
(``%!d(MISSING)``), a bad index, width or precision and extra arguments (``%!(EXTRA int=1)``).
Maps, lists and structs are formatted element by element, as Go does (``%q`` of a map quotes each
key and value; ``%+v`` names struct fields). Pure functions.
"""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Any


class GoByte(int):
    """A byte of a string (``index "ab" 0``): an int whose Go type is ``uint8``."""


def go_type(value: Any) -> str:
    """The Go type name a value stands for (``string``, ``int``, ``map[string]string``, ...)."""
    from nstance.config.goexec import GoStruct

    if value is None:
        return "<nil>"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, GoByte):
        return "uint8"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float64"
    if isinstance(value, str):
        return "string"
    if isinstance(value, dict):
        if all(isinstance(v, str) for v in value.values()):
            return "map[string]string"
        if all(isinstance(v, int) and not isinstance(v, bool) for v in value.values()):
            return "map[string]int"
        return "map[string]interface {}"
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


def go_quote(text: str, ascii_only: bool = False) -> str:
    """Go's ``strconv.Quote``: double quotes, Go escapes, printable Unicode kept (escaped too with
    ``ascii_only``, as ``strconv.QuoteToASCII`` does)."""
    out = ['"']
    escapes = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v",
               '"': '\\"', "\\": "\\\\"}  # fmt: skip
    for ch in text:
        if ch in escapes:
            out.append(escapes[ch])
        elif ch == " " or (ch.isprintable() and not ch.isspace() and not (ascii_only and ord(ch) >= 0x80)):
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


def _pad(text: str, flags: str, width: int | None, numeric: bool) -> str:
    """Pad to ``width``: right with spaces (``-``); else left with zeros (``0``; after the sign of
    a number), else left with spaces. Go pads strings and bools with zeros too."""
    if width is None or len(text) >= width:
        return text
    if "-" in flags:
        return text + " " * (width - len(text))
    if "0" in flags:
        sign = text[0] if numeric and text[:1] in "+- " else ""
        return sign + "0" * (width - len(text)) + text[len(sign) :]
    return " " * (width - len(text)) + text


def _rune(value: int) -> str:
    """The character of a code point; U+FFFD for what is not one (negative, a surrogate, too large)."""
    if 0 <= value <= 0x10FFFF and not 0xD800 <= value <= 0xDFFF:
        return chr(value)
    return "\ufffd"


def _quote_rune(value: int, ascii_only: bool) -> str:
    """Go's ``strconv.QuoteRune`` (``QuoteRuneToASCII`` with ``ascii_only``)."""
    body = go_quote(_rune(value), ascii_only)[1:-1]
    return "'" + body.replace('\\"', '"').replace("'", "\\'") + "'"


def _can_backquote(text: str) -> bool:
    """Go's ``strconv.CanBackquote``: one line, no backquote, no control character but tab."""
    return all(ch == "\t" or (ch >= " " and ch not in "`\x7f\ufeff") for ch in text)


def _integer(verb: str, flags: str, prec: int | None, value: int) -> str:
    base = {"d": 10, "v": 10, "x": 16, "X": 16, "o": 8, "O": 8, "b": 2}[verb]
    digits = format(abs(value), {10: "d", 16: "x", 8: "o", 2: "b"}[base])
    if verb == "X":
        digits = digits.upper()
    if prec is not None:
        digits = digits.zfill(prec) if not (prec == 0 and value == 0) else ""
    if verb == "O":
        digits = "0o" + digits
    elif "#" in flags:
        prefix = {"x": "0x", "X": "0X", "b": "0b"}.get(verb, "")
        if verb == "o" and not digits.startswith("0"):
            prefix = "0"
        digits = prefix + digits
    sign = "-" if value < 0 else ("+" if "+" in flags else (" " if " " in flags else ""))
    return sign + digits


def _hex_float(verb: str, prec: int | None, value: float) -> str:
    """Go's ``%x``/``%X`` of a float: ``-0x1.8p+01``, the mantissa shortest or to ``prec`` hex digits."""
    negative = math.copysign(1.0, value) < 0
    value = abs(value)
    if value == 0:
        mantissa, exponent = 0, 0
    else:
        fraction, exponent = math.frexp(value)  # value == fraction * 2**exponent, 0.5 <= fraction < 1
        mantissa, exponent = int(fraction * (1 << 53)), exponent - 1  # 1.xxx (53 bits) times 2**exponent
    digits = 13
    if prec is not None and prec < digits:
        shift = 4 * (digits - prec)
        rounded = mantissa >> shift
        rest = mantissa & ((1 << shift) - 1)
        half = 1 << (shift - 1)
        if rest > half or (rest == half and rounded & 1):
            rounded += 1
        mantissa = rounded << shift
        if mantissa >> 53:  # 1.fff... rounded up to 2.0
            mantissa >>= 1
            exponent += 1
        text = format(mantissa >> shift, "x").rjust(prec + 1, "0")
        fraction_digits = text[1:]
    else:
        fraction_digits = format(mantissa & ((1 << 52) - 1), "013x")
        fraction_digits = fraction_digits.rstrip("0") if prec is None else fraction_digits.ljust(prec, "0")
    lead = "1" if value else "0"
    point = "." + fraction_digits if fraction_digits else ""
    body = f"0x{lead}{point}p{'-' if exponent < 0 else '+'}{abs(exponent):02d}"
    body = ("-" if negative else "") + body
    return body.upper() if verb == "X" else body


def _binary_float(value: float) -> str:
    """Go's ``%b`` of a float: the 53-bit mantissa as an integer, ``p``, the binary exponent."""
    if value == 0:
        return ("-" if math.copysign(1.0, value) < 0 else "") + "0p-1074"
    fraction, exponent = math.frexp(abs(value))
    mantissa, exponent = int(fraction * (1 << 53)), exponent - 53
    if exponent < -1074:  # subnormal: Go writes the unnormalised mantissa
        mantissa >>= -1074 - exponent
        exponent = -1074
    return f"{'-' if value < 0 else ''}{mantissa}p{'-' if exponent < 0 else '+'}{abs(exponent)}"


def _six_digits(text: str) -> str:
    """``%#g`` without a precision: Go's shortest digits, a decimal point, and zeros up to six
    significant digits (``1e+17`` becomes ``1.00000e+17``, ``0.125`` becomes ``0.125000``)."""
    cut = text.find("e") if "e" in text else text.find("E")
    number, tail = (text[:cut], text[cut:]) if cut >= 0 else (text, "")
    significant = number.lstrip("-+").replace(".", "").lstrip("0")
    missing = 6 - len(significant) if significant else 5
    if "." not in number:
        number += "."
    return number + "0" * max(0, missing) + tail


def _floating(verb: str, flags: str, prec: int | None, value: float) -> str:
    if math.isnan(value) or math.isinf(value):
        text = format_float_g(value)
        return ("+" + text) if "+" in flags and not text.startswith(("+", "-")) else text
    if verb in "xX":
        text = _hex_float(verb, prec, value)
    elif verb == "b":
        text = _binary_float(value)
    elif verb in "gGv" and prec is None:
        text = format_float_g(value, "G" if verb == "G" else "g")
        if "#" in flags and verb != "v":  # %#v is Go syntax: the shortest form as it is
            text = _six_digits(text)
    else:
        spec = {"F": "f", "v": "g"}.get(verb, verb)
        text = format(value, f"{'#' if '#' in flags else ''}.{6 if prec is None else prec}{spec}")
    if "+" in flags and not text.startswith("-"):
        text = "+" + text
    elif " " in flags and not text.startswith("-"):
        text = " " + text
    return text


class _Spec:
    """The parts of one ``%`` directive as ``go_sprintf`` reads them."""

    __slots__ = ("argi", "bad_index", "flags", "out", "pos", "prec", "reordered", "width")

    def __init__(self, argi: int, pos: int) -> None:
        self.argi, self.pos = argi, pos
        self.flags = ""
        self.width: int | None = None
        self.prec: int | None = None
        self.bad_index = False
        self.reordered = False
        self.out: list[str] = []


def _int_arg(args: tuple[Any, ...], spec: _Spec) -> int | None:
    """The int operand a ``*`` takes (None when it is missing, not an int, or beyond a million)."""
    if spec.argi >= len(args):
        return None
    value = args[spec.argi]
    spec.argi += 1
    if isinstance(value, bool) or not isinstance(value, int) or abs(value) > 1_000_000:
        return None
    return int(value)


def _arg_index(template: str, args: tuple[Any, ...], spec: _Spec) -> bool:
    """Read an explicit operand index ``[n]`` at ``spec.pos``; whether there was one."""
    if spec.pos >= len(template) or template[spec.pos] != "[":
        return False
    spec.reordered = True
    close = template.find("]", spec.pos)
    number = template[spec.pos + 1 : close] if close > 0 else ""
    if close < 0 or not number.isdigit() or not 1 <= int(number) <= len(args):
        spec.bad_index = True
        spec.pos = close + 1 if close > 0 else len(template)
        return True
    spec.argi = int(number) - 1
    spec.pos = close + 1
    return True


def _digits_at(template: str, pos: int) -> tuple[int | None, int]:
    end = pos
    while end < len(template) and template[end].isdigit():
        end += 1
    return (int(template[pos:end]) if end > pos else None), end


def go_sprintf(template: Any, *args: Any) -> str:
    """Go's ``fmt.Sprintf`` for the verbs listed in the module docstring, with explicit operand
    indexes (``%[2]d``, ``%[1]*d``) and Go's complaints (``%!d(MISSING)``, ``%!d(BADINDEX)``,
    ``%!(BADWIDTH)``, ``%!(BADPREC)``, ``%!(EXTRA ...)`` unless the operands were reordered)."""
    if not isinstance(template, str):
        raise ValueError(f"printf format has type {go_type(template)}; should be string")
    out: list[str] = []
    argi, pos, reordered = 0, 0, False
    while pos < len(template):
        start = template.find("%", pos)
        if start < 0:
            out.append(template[pos:])
            break
        out.append(template[pos:start])
        spec = _Spec(argi, start + 1)
        _directive(template, args, spec)
        out.extend(spec.out)
        argi, pos, reordered = spec.argi, spec.pos, reordered or spec.reordered
    if not reordered and argi < len(args):
        extra = ", ".join("<nil>" if a is None else f"{go_type(a)}={go_value_string(a)}" for a in args[argi:])
        out.append(f"%!(EXTRA {extra})")
    return "".join(out)


def _directive(template: str, args: tuple[Any, ...], spec: _Spec) -> None:
    """Read and format one directive from just after its ``%``; its text goes to ``spec.out``."""
    while spec.pos < len(template) and template[spec.pos] in "-+# 0":
        spec.flags += template[spec.pos]
        spec.pos += 1
    after_index = _arg_index(template, args, spec)
    if spec.pos < len(template) and template[spec.pos] == "*":
        spec.pos += 1
        spec.width = _int_arg(args, spec)
        if spec.width is None:
            spec.out.append("%!(BADWIDTH)")
        elif spec.width < 0:
            spec.width, spec.flags = -spec.width, spec.flags + "-"
        after_index = False
    else:
        spec.width, spec.pos = _digits_at(template, spec.pos)
        if after_index and spec.width is not None:
            spec.bad_index = True
    if spec.pos < len(template) and template[spec.pos] == ".":
        spec.pos += 1
        if after_index:
            spec.bad_index = True
        after_index = _arg_index(template, args, spec)
        if spec.pos < len(template) and template[spec.pos] == "*":
            spec.pos += 1
            spec.prec = _int_arg(args, spec)
            if spec.prec is not None and spec.prec < 0:
                spec.prec = None
            if spec.prec is None:
                spec.out.append("%!(BADPREC)")
            after_index = False
        else:
            digits, spec.pos = _digits_at(template, spec.pos)
            spec.prec = digits if digits is not None else 0
    if not after_index:
        after_index = _arg_index(template, args, spec)
    if spec.pos >= len(template):
        spec.out.append("%!(NOVERB)")
        return
    verb = template[spec.pos]
    spec.pos += 1
    if verb == "%":
        spec.out.append("%")
    elif spec.bad_index:
        spec.out.append(f"%!{verb}(BADINDEX)")
    elif spec.argi >= len(args):
        spec.out.append(f"%!{verb}(MISSING)")
    else:
        value = args[spec.argi]
        spec.argi += 1
        names = verb == "v" and "+" in spec.flags
        flags = spec.flags.replace("+", "") if names else spec.flags
        spec.out.append(_format_one(verb, flags, spec.width, spec.prec, value, names))


def _format_one(
    verb: str, flags: str, width: int | None, prec: int | None, value: Any, names: bool = False
) -> str:
    """One operand of ``Sprintf``: maps, lists and structs element by element, as Go does;
    ``names``: ``%+v``, whose plus writes the field names of structs instead of signs."""
    from nstance.config.goexec import GoStruct

    if verb == "T":
        return _pad(go_type(value), flags, width, False)
    if isinstance(value, dict):
        inner = " ".join(
            _format_one(verb, flags, width, prec, key, names)
            + ":"
            + _format_one(verb, flags, width, prec, value[key], names)
            for key in sorted(value)
        )
        return f"map[{inner}]"
    if isinstance(value, (list, tuple)):
        return "[" + " ".join(_format_one(verb, flags, width, prec, v, names) for v in value) + "]"
    if isinstance(value, GoStruct):
        parts = (
            (f"{name}:" if names else "") + _format_one(verb, flags, width, prec, v, names)
            for name, v in value.fields.items()
        )
        return "{" + " ".join(parts) + "}"
    text = _scalar(verb, flags, width, prec, value)
    if text is None:
        if value is None:
            return f"%!{verb}(<nil>)"
        return f"%!{verb}({go_type(value)}={_format_one('v', flags, width, prec, value)})"
    return text


def _scalar(verb: str, flags: str, width: int | None, prec: int | None, value: Any) -> str | None:
    """A string, number, bool or nil formatted with ``verb``, padded; None when the verb does not
    apply to it (the caller writes Go's ``%!verb(type=value)``)."""
    is_int = isinstance(value, int) and not isinstance(value, bool)
    numeric = False
    if value is None:
        if verb != "v":
            return None
        text = "<nil>"
    elif isinstance(value, bool):
        if verb not in "vt":
            return None
        text = "true" if value else "false"
    elif is_int:
        if verb in "vdxXoObB":
            if verb == "B":
                return None
            text, numeric = _integer(verb, flags, prec, value), True
            if prec is not None and "0" in flags:  # an explicit precision pads with spaces
                flags = flags.replace("0", "")
        elif verb == "c":
            text = _rune(value)
        elif verb == "q":
            text = _quote_rune(value, "+" in flags)
        elif verb == "U":
            text = f"U+{value & 0xFFFFFFFFFFFFFFFF:04X}"
            if "#" in flags and 0 <= value <= 0x10FFFF and _rune(value).isprintable():
                text += f" '{chr(value)}'"
        else:
            return None
    elif isinstance(value, float):
        if verb not in "vbeEfFgGxX":
            return None
        text, numeric = _floating(verb, flags, prec, value), True
        if math.isinf(value) or math.isnan(value):
            flags = flags.replace("0", "")
    elif isinstance(value, str):
        if verb in "vs":
            text = value if prec is None else value[:prec]
        elif verb == "q":
            cut = value if prec is None else value[:prec]
            text = f"`{cut}`" if "#" in flags and _can_backquote(cut) else go_quote(cut, "+" in flags)
        elif verb in "xX":
            data = value.encode("utf-8", "surrogatepass")
            data = data if prec is None else data[:prec]
            text = _hex_bytes(data, verb, flags)
        else:
            return None
    else:
        return None
    return _pad(text, flags, width, numeric)


def _hex_bytes(data: bytes, verb: str, flags: str) -> str:
    """``%x`` of a string: two digits a byte; ``% x`` spaces between bytes; ``#`` a 0x prefix (on each
    byte with a space)."""
    prefix = ("0X" if verb == "X" else "0x") if "#" in flags else ""
    pairs = [format(b, "02X" if verb == "X" else "02x") for b in data]
    if " " in flags:
        return " ".join(prefix + pair for pair in pairs)
    return prefix + "".join(pairs) if pairs else ""
