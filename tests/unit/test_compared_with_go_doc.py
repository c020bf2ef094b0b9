"""docs/compared-with-go.md: every row of its "Kept true by" tables names the test that keeps it true,
and that test exists (a renamed or deleted test makes this fail, so the page cannot drift from the
suite). The "Mixed fleets" table keeps its own "Proven by" column."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "compared-with-go.md"
REF = re.compile(r"`(tests/[\w/]+\.py)::(test_\w+)(?:\[[^\]`]*\])?`")


def _rows() -> list[str]:
    """Body rows of every table whose header has a "Kept true by" column."""
    rows: list[str] = []
    checked = False
    for line in PAGE.read_text(encoding="utf-8").splitlines():
        if not line.startswith("|"):
            checked = False
            continue
        if "Kept true by" in line:
            checked = True
            continue
        if checked and not line.startswith("|---"):
            rows.append(line)
    return rows


def test_every_row_names_a_test_that_exists() -> None:
    rows = _rows()
    assert len(rows) > 40
    for row in rows:
        refs = REF.findall(row)
        assert refs, f"row without a test that keeps it true: {row[:80]}"
        for path, name in refs:
            source = (ROOT / path).read_text(encoding="utf-8")
            found = re.search(rf"^(async )?def {name}\(", source, re.MULTILINE)
            assert found, f"{path}::{name} does not exist"
