"""Go-style duration strings, as written in configs made for the Go implementation."""

from __future__ import annotations

from datetime import timedelta

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
