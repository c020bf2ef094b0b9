"""Split a flag value into items as upstream's repeatable list flags do (pflag's StringSlice).

Upstream reads each occurrence of such a flag as one record of comma-separated values in CSV form
(Go's ``encoding/csv`` with its defaults): ``a=1,b=2`` is two items, and an item holding a comma or a
double quote is written in double quotes, a quote inside it doubled: ``"k=a,b"``, and
``"k=say ""hi"" twice"`` for ``k=say "hi" twice``.
A double quote inside an unquoted item, or text after a closing quote, is an error, as in Go; nothing
is trimmed. An empty value is no items.

One difference: Go reads only the first line of a value and silently drops the rest; here a line
break outside quotes is refused (line breaks at the very end are dropped, as Go drops them). A quoted
line break is kept, a quoted CR LF read as LF, as Go reads it.
"""

from __future__ import annotations

QUOTE = '"'
SEPARATOR = ","
LINE_ENDS = "\r\n"


class StringSliceError(ValueError):
    """The value is not a CSV record as upstream's flag parser accepts it (the message says why)."""


def split_string_slice(text: str) -> list[str]:
    """The items of one flag value (see the module docstring); StringSliceError if it is malformed."""
    if text == "":
        return []
    body = text.rstrip(LINE_ENDS)
    if not body:
        raise StringSliceError("holds only a line break")
    items: list[str] = []
    pos = 0
    while True:
        if body.startswith(QUOTE, pos):
            item, pos = _quoted(body, pos + 1)
            items.append(item)
            if pos == len(body):
                return items
            if body[pos] in LINE_ENDS:
                raise StringSliceError(_LINE_BREAK)
            if body[pos] != SEPARATOR:
                raise StringSliceError(f'text after the closing " of item {len(items)}')
            pos += 1
            continue
        end = body.find(SEPARATOR, pos)
        item = body[pos:] if end < 0 else body[pos:end]
        if QUOTE in item:
            raise StringSliceError(
                f'bare " in unquoted item {item!r}; quote the item and double each quote in it, '
                'as in "k=say ""hi"""'
            )
        if any(char in item for char in LINE_ENDS):
            raise StringSliceError(_LINE_BREAK)
        items.append(item)
        if end < 0:
            return items
        pos = end + 1


_LINE_BREAK = "holds a line break outside quotes (upstream would read only the first line)"


def _quoted(body: str, pos: int) -> tuple[str, int]:
    """The quoted item starting after its opening quote at ``pos``, and the position after its close."""
    parts: list[str] = []
    while True:
        close = body.find(QUOTE, pos)
        if close < 0:
            raise StringSliceError('a quoted item has no closing "')
        parts.append(body[pos:close])
        pos = close + 1
        if not body.startswith(QUOTE, pos):
            return "".join(parts).replace("\r\n", "\n"), pos
        parts.append(QUOTE)
        pos += 1
