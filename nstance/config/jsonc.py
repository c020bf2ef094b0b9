"""Parse JSONC text (JSON with comments and trailing commas) into plain Python values.

pyjson5 does the parsing (JSON5 is a superset of JSONC). Its exceptions report a character offset;
this module turns them into ``line N, column M`` problems inside a ``ConfigError``. It does not know
the config schema and performs no I/O.
"""

from __future__ import annotations

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


def parse_jsonc(text: str, source: str = "<config>") -> Any:
    """Parse JSONC ``text``; raise ConfigError naming line and column on a syntax error."""
    try:
        return pyjson5.decode(text)
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
