"""Templates render as Go's text/template renders them: outputs and refusals printed by Go itself.

``tests/fixtures/upstream/go-template-vectors.json`` holds 1,506 templates and what Go 1.26's
``text/template`` (``missingkey=zero``) made of each on the data below, declared there as Go structs:
the output, or null where parsing or executing failed (the README of the fixtures says how it was
made): random templates from a grammar of the constructs this project supports, ``printf`` of
random floats, and hand-written edge cases (variable scope, number literals, ``printf`` verbs,
flags and operand indexes, runes out of range).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nstance.config.goexec import ExecError, GoStruct, execute
from nstance.config.gotemplate import GoTemplateError, parse

VECTORS = Path(__file__).parents[2] / "fixtures" / "upstream" / "go-template-vectors.json"

#: The Go program's data: ``main.Data`` and ``main.Inner`` with these values.
DATA = GoStruct(
    "main.Data",
    {
        "S": 'héllo <w>&"q"',
        "E": "",
        "N": 42,
        "Z": 0,
        "F": 2.5,
        "B": True,
        "T": False,
        "L": ["a", "b b", "c"],
        "LE": [],
        "I": [3, -1, 0, 7],
        "M": {"a": "1", "b": "", "z z": "zz"},
        "ME": {},
        "MI": {"x": 1, "y": 0},
        "In": GoStruct("main.Inner", {"Name": "in", "Count": 2, "Tags": ["t1"]}),
    },
)


def _render(source: str) -> str | None:
    try:
        return execute(parse(source), DATA)
    except (GoTemplateError, ExecError):
        return None


def test_every_template_renders_as_go_renders_it() -> None:
    vectors = json.loads(VECTORS.read_text(encoding="utf-8"))["vectors"]
    wrong = [(source, expected, got) for source, expected in vectors if (got := _render(source)) != expected]
    assert len(vectors) > 1_000
    assert sum(expected is None for _, expected in vectors) > 300, "refusals are half the point"
    assert not wrong, f"{len(wrong)} of {len(vectors)} differ from Go, e.g. {wrong[:3]}"


@pytest.mark.parametrize(
    "source", ["{{ if false }}{{ $typo }}{{ end }}", "{{ range $v := .L }}{{ end }}{{ $v }}"]
)
def test_a_variable_used_outside_its_scope_is_refused_when_parsed(source: str) -> None:
    """Go refuses these at parse time, so a typo in a branch that does not run is still caught."""
    with pytest.raises(GoTemplateError, match="undefined variable"):
        parse(source)
