"""Regenerate the Python wire code in ``nstance/rpc/`` from ``protos/nstance/v1/*.proto``.

Responsible for: running ``grpc_tools.protoc`` with the protobuf, gRPC and mypy-protobuf
generators so that the output is importable as ``nstance.rpc.<name>_pb2`` (and the ``_pb2_grpc``
modules import their messages as ``from nstance.rpc import <name>_pb2``), replacing the
committed generated files, and checking the committed files for drift (``--check``).

Must not: touch anything in ``nstance/rpc/`` other than ``*_pb2*`` files (``__init__.py`` is
hand-written), depend on the current working directory, or produce different bytes for the same
inputs and tool versions.

Usage::

    python scripts/gen_proto.py           # rewrite nstance/rpc/*_pb2*
    python scripts/gen_proto.py --check   # exit 1 and list the differing files on drift
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = REPO_ROOT / "protos" / "nstance" / "v1"
RPC_DIR = REPO_ROOT / "nstance" / "rpc"

# Where the protos are placed, relative to the include root, so that protoc names the generated
# modules nstance.rpc.<name>_pb2 and the _pb2_grpc modules import them from nstance.rpc.
_PACKAGE_PARTS = ("nstance", "rpc")
_GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")
# "quiet" stops mypy-protobuf from printing its banner on every run.
_MYPY_PARAMETERS = "quiet"


class GenerationError(RuntimeError):
    """protoc or one of its plugins failed."""


def is_generated(path: Path) -> bool:
    """Tell whether ``path`` names a file this script owns (a ``*_pb2*`` module or stub)."""
    return path.is_file() and path.name.endswith(_GENERATED_SUFFIXES)


def generated_files(directory: Path) -> list[Path]:
    """The generated files present in ``directory``, sorted by name."""
    if not directory.is_dir():
        return []
    return sorted((p for p in directory.iterdir() if is_generated(p)), key=lambda p: p.name)


def _plugin(name: str) -> Path:
    """Locate a protoc plugin installed next to the running interpreter (or on PATH)."""
    beside = Path(sys.executable).parent / name
    if beside.is_file():
        return beside
    found = shutil.which(name)
    if found is None:
        raise GenerationError(f"protoc plugin {name!r} not found next to {sys.executable} or on PATH")
    return Path(found)


def _protoc_command(include_root: Path, out: Path, protos: Sequence[str]) -> list[str]:
    return [
        sys.executable,
        "-m",
        "grpc_tools.protoc",  # adds grpc_tools' bundled google/protobuf/*.proto to the include path
        f"--proto_path={include_root}",
        f"--python_out={out}",
        f"--grpc_python_out={out}",
        f"--plugin=protoc-gen-mypy={_plugin('protoc-gen-mypy')}",
        f"--mypy_out={_MYPY_PARAMETERS}:{out}",
        f"--plugin=protoc-gen-mypy_grpc={_plugin('protoc-gen-mypy_grpc')}",
        f"--mypy_grpc_out={_MYPY_PARAMETERS}:{out}",
        *protos,
    ]


def generate(out_dir: Path, proto_dir: Path = PROTO_DIR) -> None:
    """Generate the ``*_pb2*`` files for every ``.proto`` in ``proto_dir`` into ``out_dir``.

    Stale generated files in ``out_dir`` are removed first; other files there are left alone.
    """
    sources = sorted(proto_dir.glob("*.proto"), key=lambda p: p.name)
    if not sources:
        raise GenerationError(f"no .proto files in {proto_dir}")
    with tempfile.TemporaryDirectory(prefix="nstance-gen-proto-") as tmp:
        include_root = Path(tmp) / "src"
        staged = include_root.joinpath(*_PACKAGE_PARTS)
        staged.mkdir(parents=True)
        for source in sources:
            shutil.copyfile(source, staged / source.name)
        raw_out = Path(tmp) / "out"
        raw_out.mkdir()
        relative = ["/".join((*_PACKAGE_PARTS, source.name)) for source in sources]
        result = subprocess.run(
            _protoc_command(include_root, raw_out, relative),
            cwd=include_root,
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise GenerationError(f"protoc failed (exit {result.returncode}):\n{result.stderr}")
        fresh = generated_files(raw_out.joinpath(*_PACKAGE_PARTS))
        if not fresh:
            raise GenerationError("protoc produced no files")
        out_dir.mkdir(parents=True, exist_ok=True)
        for stale in generated_files(out_dir):
            stale.unlink()
        for path in fresh:
            shutil.copyfile(path, out_dir / path.name)


def diff(expected_dir: Path, actual_dir: Path) -> list[str]:
    """Names of generated files that differ between two directories (missing, extra or changed)."""
    expected = {p.name: p for p in generated_files(expected_dir)}
    actual = {p.name: p for p in generated_files(actual_dir)}
    problems: list[str] = []
    for name in sorted(expected.keys() | actual.keys()):
        if name not in actual:
            problems.append(f"{name} (missing)")
        elif name not in expected:
            problems.append(f"{name} (stale, not generated from protos/)")
        elif expected[name].read_bytes() != actual[name].read_bytes():
            problems.append(f"{name} (differs)")
    return problems


def check(rpc_dir: Path = RPC_DIR, proto_dir: Path = PROTO_DIR) -> list[str]:
    """Regenerate into a temporary directory and return the files in ``rpc_dir`` that drifted."""
    with tempfile.TemporaryDirectory(prefix="nstance-gen-proto-check-") as tmp:
        fresh = Path(tmp)
        generate(fresh, proto_dir)
        return diff(fresh, rpc_dir)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--check",
        action="store_true",
        help="do not write; exit 1 if nstance/rpc/ differs from a fresh generation",
    )
    args = parser.parse_args(argv)
    try:
        if args.check:
            problems = check()
            if problems:
                print("nstance/rpc/ is out of date with protos/ (run `make proto`):", file=sys.stderr)
                for problem in problems:
                    print(f"  nstance/rpc/{problem}", file=sys.stderr)
                return 1
            print("nstance/rpc/ is up to date")
            return 0
        generate(RPC_DIR)
    except GenerationError as exc:
        print(f"gen_proto: {exc}", file=sys.stderr)
        return 2
    print(f"generated {len(generated_files(RPC_DIR))} files in {RPC_DIR.relative_to(REPO_ROOT)}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
