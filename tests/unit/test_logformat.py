"""The shared log line formats: JSON (server, operator --log-format json) and plain text (operator, agent)."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime

from nstance.core.logformat import TEXT_FORMAT, JsonFormatter


def record(msg: str, *args: object, level: int = logging.WARNING, exc: bool = False) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise ValueError("bad shard address")
        except ValueError:
            exc_info = sys.exc_info()
    rec = logging.LogRecord("nstance.operator.sync", level, __file__, 1, msg, args, exc_info)
    rec.created = datetime(2026, 3, 4, 5, 6, 7, 891_000, tzinfo=UTC).timestamp()
    return rec


def test_a_json_line_carries_time_level_logger_and_the_formatted_message() -> None:
    line = JsonFormatter().format(record("shard %s lost (%d tries)", "zone-a", 3))
    assert "\n" not in line
    assert json.loads(line) == {
        "time": "2026-03-04T05:06:07.891+00:00",
        "level": "warning",
        "logger": "nstance.operator.sync",
        "msg": "shard zone-a lost (3 tries)",
    }


def test_a_json_line_of_an_exception_carries_its_traceback_under_error() -> None:
    entry = json.loads(JsonFormatter().format(record("cannot connect", level=logging.ERROR, exc=True)))
    assert entry["level"] == "error"
    assert entry["msg"] == "cannot connect"
    assert entry["error"].startswith("Traceback (most recent call last):")
    assert entry["error"].endswith("ValueError: bad shard address")


def test_quotes_and_newlines_in_a_message_stay_one_valid_json_line() -> None:
    line = JsonFormatter().format(record('group "web"\nrefused'))
    assert "\n" not in line
    assert json.loads(line)["msg"] == 'group "web"\nrefused'


def test_the_text_layout_names_level_and_logger_before_the_message() -> None:
    text = logging.Formatter(TEXT_FORMAT).format(record("shard %s lost", "zone-a"))
    assert text.endswith(" WARNING nstance.operator.sync: shard zone-a lost")
