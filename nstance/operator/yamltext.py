"""Reading a YAML file a person wrote, with one plain line when it cannot be read.

``yaml_error_text`` turns a PyYAML parser error into ``line L, column C: not valid YAML: PROBLEM``
(PyYAML counts from 0, people from 1). ``read_text`` reads a file as UTF-8 text and raises
``YamlFileError`` with the reason (unreadable, a directory, not UTF-8). ``read_yaml_mapping`` reads a
file that must hold one YAML mapping (a kubeconfig) and raises ``YamlFileError`` naming the file and
the reason: any of those, not YAML, empty or not a mapping. Must not: know what the mapping means.
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


def read_text(path: str | Path) -> str:
    """The file at ``path`` as UTF-8 text; ``YamlFileError`` with the reason (not the name) otherwise."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise YamlFileError(f"cannot read: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise YamlFileError(f"not UTF-8 text (byte {exc.start})") from None


def read_yaml_mapping(path: str | Path) -> dict[Any, Any]:
    """The mapping in the YAML file at ``path``; ``YamlFileError`` naming the file and the reason
    otherwise."""
    try:
        doc = yaml.safe_load(read_text(path))
    except YamlFileError as exc:
        raise YamlFileError(f"{path}: {exc}") from None
    except yaml.YAMLError as exc:
        raise YamlFileError(f"{path}: {yaml_error_text(exc)}") from None
    if not isinstance(doc, dict):
        got = "empty" if doc is None else f"a {type(doc).__name__}"
        raise YamlFileError(f"{path}: must hold a YAML mapping (it is {got})")
    return doc
