"""Go-style duration strings, as written in configs made for the Go implementation."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nstance.core.durations import format_duration, parse_duration
from nstance.core.errors import InvalidArgument


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("90s", timedelta(seconds=90)),
        ("5m", timedelta(minutes=5)),
        ("504h", timedelta(hours=504)),
        ("1h30m", timedelta(hours=1, minutes=30)),
        ("250ms", timedelta(milliseconds=250)),
        ("1.5s", timedelta(seconds=1.5)),
        ("0", timedelta(0)),
        ("0s", timedelta(0)),
        ("-2m", timedelta(minutes=-2)),
        ("10us", timedelta(microseconds=10)),
    ],
)
def test_parse(text: str, expected: timedelta) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["", "5", "5 m", "m", "5x", "1h-2m"])
def test_refused(text: str) -> None:
    with pytest.raises(InvalidArgument, match="duration"):
        parse_duration(text)


#: Inputs and what Go's ``time.ParseDuration`` made of them (tests/fixtures/upstream/README.md).
GO_VECTORS = Path(__file__).parents[1] / "fixtures" / "upstream" / "go-duration-vectors.json"


def test_parse_gives_what_go_gives() -> None:
    """Each of Go's answers, truncated to the microsecond a timedelta holds; Go's refusals refused."""
    vectors = json.loads(GO_VECTORS.read_text(encoding="utf-8"))["vectors"]
    wrong = []
    for text, nanoseconds in vectors:
        try:
            got: timedelta | None = parse_duration(text)
        except InvalidArgument:
            got = None
        if nanoseconds is None:
            expected = None
        else:
            micros = abs(nanoseconds) // 1_000
            expected = timedelta(microseconds=-micros if nanoseconds < 0 else micros)
        if got != expected:
            wrong.append((text, nanoseconds, got))
    assert len(vectors) > 1_000
    assert not wrong, f"{len(wrong)} differ from Go, e.g. {wrong[:5]}"


@pytest.mark.parametrize("text", ["2562048h", "9223372036854775808ns", "2562047h47m16.854775808s"])
def test_beyond_gos_range_is_refused_with_its_limit(text: str) -> None:
    with pytest.raises(InvalidArgument, match="292 years"):
        parse_duration(text)


def test_the_most_negative_duration_is_go_s_too() -> None:
    assert parse_duration("-9223372036854775808ns") == -timedelta(microseconds=9223372036854775)


def test_surrounding_white_space_is_ignored() -> None:
    """Go refuses it; a value read from the environment may end in a newline, so it is let through."""
    assert parse_duration(" 90s\n") == timedelta(seconds=90)


def test_days_get_a_hint() -> None:
    with pytest.raises(InvalidArgument, match=r"504h"):
        parse_duration("21d")


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (timedelta(0), "0s"),
        (timedelta(minutes=5), "5m0s"),
        (timedelta(hours=1, minutes=30), "1h30m0s"),
        (timedelta(milliseconds=250), "250ms"),
        (timedelta(seconds=1.5), "1.5s"),
    ],
)
def test_format_like_go(value: timedelta, text: str) -> None:
    assert format_duration(value) == text


@given(st.integers(min_value=0, max_value=10**12))
def test_format_then_parse_round_trips(milliseconds: int) -> None:
    value = timedelta(milliseconds=milliseconds)
    assert parse_duration(format_duration(value)) == value
