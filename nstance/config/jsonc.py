r"""Parse JSONC text (JSON with comments and trailing commas) into plain Python values.

Exactly what upstream's parser (hujson, then Go's encoding/json) accepts: JSON plus ``//`` and
``/* */`` comments and trailing commas. Comments and trailing commas are blanked out (so positions stay
put) and the rest is read by the standard library's strict JSON decoder. Anything else of JSON5 (single
quotes, unquoted keys, hex numbers, ``Infinity``, escapes such as ``\ `` that JSON does not have) is
refused: upstream's servers refuse such a document, and an unknown escape was silently dropped from a
userdata script. On an error pyjson5 reads the text again for a message in plain words; its offsets
become ``line N, column M`` problems inside a ``ConfigError``. It does not know the config schema and
performs no I/O.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pyjson5

from nstance.config.errors import ConfigError, Problem

_NEAR = re.compile(r"(?:starting )?near (\d+)")
_CODEPOINT = re.compile(r"U\+([0-9A-Fa-f]{4,6})")
_WORDS = {
    "b'JSON5Value'": "a value",
    "b'comma'": "','",
    "b'colon'": "':'",
    "b'string'": "string",
    "b'array'": "array",
    "b'object'": "object",
    "b'NumericLiteral'": "number",
    "b'IdentifierName'": "name",
}


def _char(match: re.Match[str]) -> str:
    code = int(match.group(1), 16)
    if code < 0x20 or code == 0x7F:
        return f"control character U+{code:04X}"
    return repr(chr(code))


def _plain(message: str) -> str:
    text = _NEAR.sub("", message)
    for raw, word in _WORDS.items():
        text = text.replace(raw, word)
    text = _CODEPOINT.sub(_char, text)
    text = re.sub(r"\s+", " ", text).replace(" ,", ",").strip()
    return text[:1].lower() + text[1:]


def _offset(text: str, exc: Exception) -> int:
    """Return the 0-based character offset the parser complained about."""
    match = _NEAR.search(str(exc.args[0]) if exc.args else "")
    if match is None:
        return len(text)
    near = int(match.group(1))
    if isinstance(exc, pyjson5.Json5ExtraData):
        # Offset of the end of the parsed value; point at the first junk character instead.
        pos = near
        while pos < len(text) and text[pos].isspace():
            pos += 1
        return pos
    # The other errors report a 1-based position of the offending character.
    return max(near - 1, 0)


def line_column(text: str, offset: int) -> tuple[int, int]:
    """Convert a 0-based character offset into 1-based (line, column)."""
    offset = min(max(offset, 0), len(text))
    line = text.count("\n", 0, offset) + 1
    column = offset - (text.rfind("\n", 0, offset) + 1) + 1
    return line, column


#: A JSON string (kept as it is), or a comment (blanked).
_COMMENTS = re.compile(r'"(?:[^"\\\n]|\\.)*"|//[^\n]*|/\*[\s\S]*?\*/')
#: A JSON string (kept), or a comma that only whitespace separates from the ``}`` or ``]`` it ends.
_TRAILING_COMMAS = re.compile(r'"(?:[^"\\\n]|\\.)*"|,(?=\s*[}\]])')


_MAYBE_TRAILING = re.compile(r",\s*[}\]]")


def _blank_comment(match: re.Match[str]) -> str:
    found = match.group(0)
    if found.startswith('"'):
        return found
    return re.sub(r"[^\n]", " ", found)


def _blank_comma(match: re.Match[str]) -> str:
    found = match.group(0)
    return found if found.startswith('"') else " "


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def strict_json(text: str) -> Any:
    """``text`` read as JSONC: comments and trailing commas blanked, the rest strict JSON."""
    try:  # what Go writes (groups.jsonc) has neither: read as it is, no pass over its strings
        return json.loads(text, parse_constant=_no_constants)
    except json.JSONDecodeError:
        pass
    plain = _COMMENTS.sub(_blank_comment, text) if "/" in text else text
    if _MAYBE_TRAILING.search(plain):  # documents Go writes have neither: no pass over their strings
        plain = _TRAILING_COMMAS.sub(_blank_comma, plain)
    return json.loads(plain, parse_constant=_no_constants)


def parse_jsonc(text: str, source: str = "<config>") -> Any:
    """Parse JSONC ``text``; raise ConfigError naming line and column on a syntax error."""
    try:
        return strict_json(text)
    except json.JSONDecodeError as strict:
        not_jsonc = strict
    except ValueError as exc:  # NaN, Infinity
        raise ConfigError(source, [Problem("", f"invalid JSONC: {exc}")]) from None
    except RecursionError as exc:
        raise ConfigError(source, [Problem("", f"invalid JSONC: {exc}")]) from None
    try:
        pyjson5.decode(text)
    except pyjson5.Json5Exception as exc:
        if isinstance(exc, pyjson5.Json5EOF) and not text.strip():
            detail = "the document is empty (expected a JSON object)"
            line, column = 1, 1
        else:
            detail = _plain(str(exc.args[0]) if exc.args else type(exc).__name__)
            line, column = line_column(text, _offset(text, exc))
        problem = Problem("", f"line {line}, column {column}: invalid JSONC: {detail}")
        raise ConfigError(source, [problem]) from None
    except (ValueError, RecursionError, OverflowError, TypeError) as exc:
        raise ConfigError(source, [Problem("", f"invalid JSONC: {exc}")]) from None
    # JSON5 reads it, JSON with comments does not: single quotes, unquoted keys, an escape JSON lacks...
    detail = not_jsonc.msg[:1].lower() + not_jsonc.msg[1:]
    problem = Problem(
        "",
        f"line {not_jsonc.lineno}, column {not_jsonc.colno}: invalid JSONC: {detail} (JSON5 syntax; only "
        "comments and trailing commas may be added to JSON, as upstream's parser reads it)",
    )
    raise ConfigError(source, [problem]) from None
