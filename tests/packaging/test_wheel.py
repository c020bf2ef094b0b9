"""The installed package works on its own: what the Dockerfile's build does, without Docker.

Builds the wheel from the sources the Dockerfile's builder stage copies (``pip wheel --no-deps``, with
build isolation as in the image), creates a clean virtual environment (no system site-packages, no
pip of its own), installs the wheel with its runtime dependencies (no dev extras), and then, from a
directory outside the repository: runs each console script's ``--help``, imports the generated gRPC
code, checks that the alembic migrations are inside the installed package, and starts the installed
``nstance-server`` on a fresh temporary directory to see it create and migrate its SQLite cache.

To stay fast, dependencies are pinned to the versions of the environment running the tests (so pip
takes them from its cache or the configured wheel source instead of resolving anew); the build and
install take about 20-30 s on the 2-core development machine.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from alembic.script import ScriptDirectory
from image_spec import REPO, builder_sources

from nstance.db.engine import alembic_config
from nstance.db.models import Base
from nstance.testing.procs import free_port, http_probe
from nstance.testing.waiting import eventually_sync

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

#: ``--help`` of each console script: the text every one must print.
HELP_TEXT = {
    "nstance-server": "Run the shard server",
    "nstance-agent": "Run the agent.",
    "nstance-operator": "Run the operator.",
    "nstance-admin": "Nstance administration",
}
NOT_PINNED = {"nstance", "pip", "setuptools", "wheel"}


@dataclass
class Installed:
    root: Path
    wheel: Path
    python: Path
    bin: Path
    workdir: Path  # an empty directory outside the repository, the cwd of every check

    def env(self) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")
        }
        env.update(
            {
                "PATH": f"{self.bin}{os.pathsep}{env.get('PATH', '')}",
                "PYTHONNOUSERSITE": "1",
                "PYTHONDONTWRITEBYTECODE": "1",
                "COLUMNS": "120",
                "NO_COLOR": "1",
                "TERM": "dumb",
            }
        )
        return env


def run(argv: list[str], *, cwd: Path | None = None, timeout: float = 180) -> str:
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)
    assert done.returncode == 0, f"{argv[:5]} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def copy_build_context(destination: Path) -> None:
    """Copy what the Dockerfile's builder stage copies (symlinks kept, caches left out)."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", ".mypy_cache")
    destination.mkdir()
    for source in builder_sources():
        path = REPO / source.rstrip("/")
        if path.is_dir():
            shutil.copytree(path, destination / path.name, symlinks=True, ignore=ignore)
        else:
            shutil.copy2(path, destination / path.name)


def running_versions() -> str:
    """Constraints: every distribution of the test environment at its installed version."""
    pins: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if name and name.lower() not in NOT_PINNED:
            pins.setdefault(name.lower(), f"{name}=={dist.version}")
    return "\n".join(sorted(pins.values())) + "\n"


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    root = tmp_path_factory.mktemp("wheel")
    copy_build_context(root / "src")
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir", str(root / "dist"),
         str(root / "src")])  # fmt: skip
    wheels = list((root / "dist").glob("nstance-*.whl"))
    assert len(wheels) == 1, wheels

    venv = root / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    cfg = (venv / "pyvenv.cfg").read_text(encoding="utf-8")
    assert "include-system-site-packages = false" in cfg
    python = venv / "bin" / "python"
    constraints = root / "constraints.txt"
    constraints.write_text(running_versions(), encoding="utf-8")
    run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--constraint",
         str(constraints), str(wheels[0])])  # fmt: skip
    workdir = root / "work"
    workdir.mkdir()
    yield Installed(root=root, wheel=wheels[0], python=python, bin=venv / "bin", workdir=workdir)
    shutil.rmtree(root, ignore_errors=True)  # a few hundred MB; pytest would keep three runs of it


def test_no_dev_dependency_is_installed(installed: Installed) -> None:
    listed = run([sys.executable, "-m", "pip", "--python", str(installed.python), "list", "--format", "json"])
    names = {d["name"].lower().replace("_", "-") for d in json.loads(listed)}
    assert "nstance" in names
    assert not names & {"pytest", "ruff", "mypy", "moto", "hypothesis", "grpcio-tools", "fakepve"}


def test_every_console_script_runs_its_help(installed: Installed) -> None:
    procs = {
        name: subprocess.Popen(
            [str(installed.bin / name), "--help"],
            cwd=installed.workdir,
            env=installed.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for name in HELP_TEXT
    }
    for name, proc in procs.items():
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, f"{name} --help exited {proc.returncode}:\n{out}"
        assert f"Usage: {name}" in out
        assert HELP_TEXT[name] in out
    scripts = (installed.bin / "nstance-server").read_text(encoding="utf-8").splitlines()[0]
    assert scripts == f"#!{installed.python}"


def test_generated_code_and_migrations_are_in_the_installed_package(installed: Installed) -> None:
    probe = (
        "import json, pathlib, nstance\n"
        "import nstance.rpc, nstance.rpc.agent_pb2_grpc, nstance.rpc.registration_pb2_grpc\n"
        "import nstance.rpc.operator_pb2_grpc\n"
        "from nstance.db.engine import migrations_path\n"
        "m = pathlib.Path(migrations_path())\n"
        "print(json.dumps({'package': nstance.__file__, 'rpc': nstance.rpc.operator_pb2_grpc.__file__,\n"
        "  'migrations': str(m), 'symlink': m.is_symlink(), 'env': (m / 'env.py').is_file(),\n"
        "  'versions': sorted(p.name for p in (m / 'versions').glob('*.py'))}))\n"
    )
    found = json.loads(run([str(installed.python), "-c", probe], cwd=installed.workdir))
    site = installed.root / "venv" / "lib"
    for key in ("package", "rpc", "migrations"):
        assert Path(found[key]).is_relative_to(site), f"{key} not from the venv: {found[key]}"
    assert not found["symlink"], "the installed migrations must be files, not a link into the repository"
    assert found["env"]
    assert found["versions"] == sorted(p.name for p in (REPO / "migrations" / "versions").glob("*.py"))


def test_installed_server_migrates_a_fresh_sqlite_cache(installed: Installed, tmp_path: Path) -> None:
    health = f"127.0.0.1:{free_port()}"
    (tmp_path / "bucket").mkdir()  # an existing, empty bucket directory: the server waits for a config
    argv = [str(installed.bin / "nstance-server"), "--id", "wheel-test", "--shard", "zone-a",
            "--storage", "file", "--bucket", str(tmp_path / "bucket"), "--cachedir", str(tmp_path / "cache"),
            "--health-addr", health]  # fmt: skip
    log = tmp_path / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, cwd=installed.workdir, env=installed.env(), stdout=out, stderr=out)
    try:
        # The server migrates its cache before it serves /health, then waits for a shard config.

        def answered_or_exited() -> tuple[int, str] | None:
            if proc.poll() is not None:
                return 0, ""
            status, body = http_probe(health, "/health", timeout=1.0)
            return (status, body) if status else None

        status, body = eventually_sync(
            answered_or_exited, within=60, every=0.2, what="an answer on /health", log=log.read_text
        )
        assert proc.poll() is None, f"nstance-server exited {proc.returncode}:\n{log.read_text()}"
        assert status == 503, (status, body)
        assert "config" in body
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
    assert code == 0, log.read_text()

    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    with sqlite3.connect(tmp_path / "cache" / "db" / "nstance.db") as db:
        revision = db.execute("SELECT version_num FROM alembic_version").fetchall()
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert revision == [(head,)]
    assert set(Base.metadata.tables) <= tables
