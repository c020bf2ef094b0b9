"""What a person sees from nstance-admin: one ``error: ...`` line and exit status 1 for an expected
failure, and rows as a table, as ``label: value`` details or as JSON.

Shared by every command group; it calls nothing and decides nothing about what the rows hold.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import typer
from google.protobuf.message import Message

from nstance.core.errors import NstanceError
from nstance.core.ids import identifier_problem

Row = dict[str, Any]
OUTPUT_FORMATS = ("table", "json")
Column = tuple[str, str]  # (header, row key)


def fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(1)


@contextmanager
def expected_errors() -> Iterator[None]:
    try:
        yield
    except NstanceError as exc:
        raise fail(str(exc)) from None


def checked_identifier(value: str, what: str) -> str:
    problem = identifier_problem(value)
    if problem:
        raise fail(f"{what} {value!r}: {problem}")
    return value


def rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def timestamp(message: Message, field: str) -> str | None:
    """RFC 3339 text of a Timestamp field, or None when the server left it unset."""
    if not message.HasField(field):
        return None
    value = getattr(message, field)
    return rfc3339(value.ToDatetime(tzinfo=UTC))


def cell(value: object) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dict):
        return ",".join(f"{k}={v}" for k, v in value.items()) or "-"
    if isinstance(value, list):
        return ",".join(str(v) for v in value) or "-"
    return str(value)


def print_table(rows: Sequence[Row], columns: Sequence[Column]) -> None:
    cells = [[header for header, _ in columns]]
    cells.extend([cell(row.get(key)) for _, key in columns] for row in rows)
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    for line in cells:
        typer.echo("   ".join(text.ljust(width) for text, width in zip(line, widths, strict=True)).rstrip())


def print_details(rows: Sequence[Row], fields: Sequence[Column]) -> None:
    width = max(len(label) for label, _ in fields) + 1
    for index, row in enumerate(rows):
        if index:
            typer.echo("")
        for label, key in fields:
            typer.echo(f"{label + ':':<{width}} {cell(row.get(key))}")


@dataclass(frozen=True, slots=True)
class View:
    """How a command shows its rows in table mode."""

    columns: Sequence[Column]
    empty: str = ""
    details: bool = False

    def show(self, rows: Sequence[Row]) -> None:
        if not rows:
            if self.empty:
                typer.echo(self.empty)
            return
        if self.details:
            print_details(rows, self.columns)
        else:
            print_table(rows, self.columns)
