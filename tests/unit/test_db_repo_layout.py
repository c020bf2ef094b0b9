"""The repository package keeps its shape: one module per table behind one entry point.

Callers write ``repo.<function>``, so a public function added to a table module but not imported by
``nstance/db/repo/__init__.py`` would be unreachable, and a table module importing another would
start the tangle the split removed. Both are read from the source here.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

from nstance.db import repo

PACKAGE = Path(repo.__file__).resolve().parent
SHARED = "nstance.db.repo._sql"


def _table_modules() -> list[str]:
    return sorted(p.stem for p in PACKAGE.glob("*.py") if not p.stem.startswith("_"))


def _package_imports(tree: ast.Module) -> set[str]:
    """The ``nstance.db.repo.*`` modules one module imports."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("nstance.db.repo"):
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("nstance.db.repo"))
    return found


def _public_definitions(tree: ast.Module) -> set[str]:
    return {
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.ClassDef) and not node.name.startswith("_")
    }


def _tree(stem: str) -> ast.Module:
    path = PACKAGE / f"{stem}.py"
    return ast.parse(path.read_text(encoding="utf-8"), str(path))


def test_every_table_module_says_what_it_owns_and_must_not_do() -> None:
    missing = []
    for stem in [*_table_modules(), "_sql"]:
        docstring = ast.get_docstring(_tree(stem)) or ""
        if "must not" not in docstring.lower():
            missing.append(stem)
    assert missing == []


def test_table_modules_import_only_the_shared_helpers_from_the_package() -> None:
    crossings = []
    for stem in _table_modules():
        crossings += [f"{stem} -> {name}" for name in sorted(_package_imports(_tree(stem)) - {SHARED})]
    assert crossings == []


def test_the_entry_point_exports_every_public_function_of_every_table_module() -> None:
    expected = {"Bind", "normalize_serial"}
    for stem in _table_modules():
        module = importlib.import_module(f"nstance.db.repo.{stem}")
        for name in _public_definitions(_tree(stem)):
            expected.add(name)
            assert getattr(repo, name, None) is getattr(module, name), f"repo.{name} is not {stem}.{name}"
    assert set(repo.__all__) == expected


def test_the_import_check_sees_a_crossing(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "from nstance.db.repo._sql import Bind\nfrom nstance.db.repo.instances import get_instance\n"
        "import nstance.db.repo.groups\n"
    )
    found = _package_imports(ast.parse(module.read_text()))
    assert found - {SHARED} == {"nstance.db.repo.instances", "nstance.db.repo.groups"}
