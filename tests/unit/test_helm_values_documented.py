"""Every key of the operator chart's values.yaml is documented in docs/operator-resources.md.

The chart's values table (section "Helm chart") lists keys in backticks in its first column; a row may
name several keys (``nameOverride``, ``fullnameOverride``). Every value (every key that is not a group
of further keys, like ``webhook``) counts as documented when it or one of its parents has a row:
objects passed through to Kubernetes as they are (``resources``, ``podSecurityContext``) are
documented as a whole. Rows must name keys that exist, and a
default written as one literal in backticks must be the value in values.yaml.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
VALUES = REPO / "deploy" / "helm" / "nstance-operator" / "values.yaml"
DOC = REPO / "docs" / "operator-resources.md"


def value_paths(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Every key of ``values`` by dotted path, nested ones included, with its value."""
    paths: dict[str, Any] = {}
    for key, value in values.items():
        path = f"{prefix}{key}"
        paths[path] = value
        if isinstance(value, dict):
            paths.update(value_paths(value, path + "."))
    return paths


def documented_rows() -> dict[str, str]:
    """Key -> its Default cell, from the values table in the doc's "Helm chart" section."""
    text = DOC.read_text(encoding="utf-8")
    section = text.split("\n## Helm chart", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, str] = {}
    in_table = False
    for line in section.splitlines():
        if line.startswith("| Value | Default |"):
            in_table = True
            continue
        if not in_table or line.startswith("|---"):
            continue
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        for key in re.findall(r"`([^`]+)`", cells[0]):
            rows[key] = cells[1]
    assert rows, f"no values table found in the Helm chart section of {DOC.name}"
    return rows


def render(value: object) -> str:
    """How a scalar or empty default is written in the table."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value == "":
        return '""'
    if value == {}:
        return "{}"
    if value == []:
        return "[]"
    return str(value)


def test_every_values_key_is_documented() -> None:
    paths = value_paths(yaml.safe_load(VALUES.read_text(encoding="utf-8")))
    rows = documented_rows()
    missing = []
    for path, value in paths.items():
        if isinstance(value, dict) and value:
            continue  # a group such as `webhook`: documented through its keys
        parts = path.split(".")
        if not any(".".join(parts[:n]) in rows for n in range(1, len(parts) + 1)):
            missing.append(path)
    assert not missing, f"values.yaml keys not in the {DOC.name} values table: {missing}"


def test_every_documented_key_exists() -> None:
    paths = value_paths(yaml.safe_load(VALUES.read_text(encoding="utf-8")))
    stale = sorted(set(documented_rows()) - set(paths))
    assert not stale, f"{DOC.name} documents values that values.yaml does not have: {stale}"


def test_literal_defaults_match_values_yaml() -> None:
    paths = value_paths(yaml.safe_load(VALUES.read_text(encoding="utf-8")))
    wrong = {}
    for key, default in documented_rows().items():
        literal = re.fullmatch(r"`([^`]*)`", default)
        value = paths.get(key)
        if literal is None or (isinstance(value, dict | list) and value):
            continue  # prose ("chart `appVersion`", "empty") or a structured default
        if literal.group(1) != render(value):
            wrong[key] = (default, value)
    assert not wrong, f"defaults in {DOC.name} that differ from values.yaml: {wrong}"
