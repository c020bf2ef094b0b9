"""``--var`` values split as upstream's pflag StringSlice flags split them (one CSV record each).

The vectors are what Go 1.26's ``encoding/csv`` returns for ``csv.NewReader(strings.NewReader(v)).Read()``
(how pflag reads a StringSlice value; an empty value is no items), printed by a scratch Go program.
"""

from __future__ import annotations

import pytest

from nstance.admin.stringslice import StringSliceError, split_string_slice

# (value, the items Go reads)
GO_ITEMS = [
    ("", []),
    ("a=1", ["a=1"]),
    ("a=1,b=2", ["a=1", "b=2"]),
    ("a=1,,b=2", ["a=1", "", "b=2"]),
    (",", ["", ""]),
    ("a=1,", ["a=1", ""]),
    ('"a=1,2",b=3', ["a=1,2", "b=3"]),
    ('"a=1,2"', ["a=1,2"]),
    ('"k=say ""hi"""', ['k=say "hi"']),
    ('"a""b",c', ['a"b', "c"]),
    ('"",""', ["", ""]),
    (" a=1 , b=2 ", [" a=1 ", " b=2 "]),
    ("a=é,b=ü", ["a=é", "b=ü"]),
    ('"a=x\ny"', ["a=x\ny"]),
    ('"x\r\ny"', ["x\ny"]),
    ("a=1\n", ["a=1"]),
    ("a=1\r\n", ["a=1"]),
    ("a=1\r", ["a=1"]),
]
# values Go refuses (its error in the comment)
GO_ERRORS = [
    'k=say "hi"',  # parse error on line 1, column 7: bare " in non-quoted-field
    'k="v"',  # parse error on line 1, column 3: bare " in non-quoted-field
    'a"b',  # parse error on line 1, column 2: bare " in non-quoted-field
    '"a=1"x',  # parse error on line 1, column 5: extraneous or missing " in quoted-field
    '"a=1',  # parse error on line 1, column 5: extraneous or missing " in quoted-field
    "\n",  # EOF
]
# values Go reads only the first line of (dropping the rest, shown in the comment): refused here
LINE_BREAKS = [
    "a=1\nb=2",  # Go: ["a=1"]
    "\na=1",  # Go: ["a=1"]
    '"a=1"\r\nb',  # Go: ["a=1"]
]


@pytest.mark.parametrize(("value", "items"), GO_ITEMS)
def test_values_split_into_the_items_go_reads(value: str, items: list[str]) -> None:
    assert split_string_slice(value) == items


@pytest.mark.parametrize("value", GO_ERRORS)
def test_values_go_refuses_are_refused(value: str) -> None:
    with pytest.raises(StringSliceError):
        split_string_slice(value)


@pytest.mark.parametrize("value", LINE_BREAKS)
def test_a_line_break_outside_quotes_is_refused_rather_than_dropping_the_rest(value: str) -> None:
    with pytest.raises(StringSliceError, match="line break outside quotes"):
        split_string_slice(value)


def test_a_bare_quote_error_says_how_to_quote() -> None:
    with pytest.raises(StringSliceError, match='double each quote in it, as in "k=say ""hi"""'):
        split_string_slice('k=say "hi"')
