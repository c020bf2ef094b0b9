"""Google's cloud client libraries stay where the other cloud SDKs stay: in object storage (``gcs``), the
secret stores (Secret Manager) and the ``gcp`` provider, plus the test fakes in ``nstance.testing``.

import-linter cannot forbid subpackages of an external package (``google.protobuf`` is used everywhere,
``google.cloud`` must not be), so this reads every module's imports instead.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "nstance"
CLOUD = ("google.cloud", "google.auth", "google.api_core", "google.oauth2")
ALLOWED = ("objectstore/gcs.py", "secrets/", "providers/gcp/", "testing/")


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_google_cloud_libraries_are_imported_only_at_the_cloud_edges() -> None:
    offenders = []
    for path in sorted(ROOT.rglob("*.py")):
        where = path.relative_to(ROOT).as_posix()
        if where.startswith(("rpc/", *ALLOWED)):
            continue
        found = sorted(n for n in _imports(path) if n.startswith(CLOUD) or n in ("google",))
        offenders += [f"{where}: {name}" for name in found]
    assert offenders == []


def test_the_check_sees_an_import_it_must_refuse(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "from google.cloud import storage\nimport google.auth\nfrom google.protobuf import any_pb2\n"
    )
    assert {n for n in _imports(module) if n.startswith(CLOUD)} == {"google.cloud", "google.auth"}
