"""Reading a YAML file a person wrote, with one plain line when it cannot be read.

``yaml_error_text`` turns a PyYAML parser error into ``line L, column C: not valid YAML: PROBLEM``
(PyYAML counts from 0, people from 1). ``read_yaml_mapping`` reads a file that must hold one YAML
mapping (a kubeconfig) and raises ``YamlFileError`` with the file's name and the reason: missing or
unreadable, not UTF-8, not YAML, empty or not a mapping. Must not: know what the mapping means.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


class YamlFileError(Exception):
    """A YAML file that cannot be used; the message names the file and says why."""


def yaml_error_text(exc: yaml.YAMLError) -> str:
    """``line L, column C: not valid YAML: PROBLEM`` (the position when the parser gave one)."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    problem = getattr(exc, "problem", None) or str(exc)
    return f"{where}not valid YAML: {problem}"


def read_yaml_mapping(path: str | Path) -> dict[Any, Any]:
    """The mapping in the YAML file at ``path``; ``YamlFileError`` with the reason otherwise."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise YamlFileError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise YamlFileError(f"{path} is not UTF-8 text (byte {exc.start})") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise YamlFileError(f"{path}: {yaml_error_text(exc)}") from None
    if not isinstance(doc, dict):
        got = "empty" if doc is None else f"a {type(doc).__name__}"
        raise YamlFileError(f"{path} must hold a YAML mapping (it is {got})")
    return doc
