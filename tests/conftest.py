"""What every test tier shares: each test is marked with its tier from its folder (``pytest -m unit``,
``-m "not e2e"``; the tiers are registered in pyproject.toml), in-process AWS (moto) for the secret
stores, and the real Kubernetes control plane (etcd + kube-apiserver + kube-controller-manager,
``nstance.testing.realkube``), started once per session when a suite asks for it.

Where ``scripts/build_kube.sh`` has not been run the real-server tests are skipped with the command to
run; where ``NSTANCE_KUBE_BIN`` is set (CI sets it from the build script's output) they never skip.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from moto import mock_aws

from nstance.core.cli import DEBUG_ENV
from nstance.testing.realkube import RealKube, binaries

TESTS = Path(__file__).resolve().parent
TIERS = frozenset({"unit", "contract", "integration", "e2e", "security", "simulation", "compat", "packaging"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test with the tier its folder names."""
    for item in items:
        parts = item.path.resolve().relative_to(TESTS).parts
        if parts and parts[0] in TIERS:
            item.add_marker(getattr(pytest.mark, parts[0]))


@pytest.fixture(autouse=True)
def _debug_env_per_test(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test starts without NSTANCE_DEBUG: a CLI run in-process with ``-v`` sets it in
    ``os.environ`` (as the programs do for their own process), and it must not reach the next test."""
    monkeypatch.delenv(DEBUG_ENV, raising=False)


@pytest.fixture(autouse=True)
def _root_logging_per_test() -> Iterator[None]:
    """Every test ends with the root logger it started with. A program's main run in-process (through
    CliRunner) installs its own handler on the stream that was ``sys.stderr`` at that moment, which
    CliRunner closes afterwards; left behind, it made every later log line of the session print a
    "--- Logging error ---" traceback into whatever the next CLI test captured. pytest's own capture
    handlers come and go with each test phase and are left to it."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    ours = [h for h in root.handlers if type(h).__module__.startswith("_pytest.")]
    root.handlers[:] = [h for h in handlers if not type(h).__module__.startswith("_pytest.")] + ours
    root.setLevel(level)


@pytest.fixture
def mocked_aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """In-process AWS (moto) with fake credentials; no real endpoint or profile can leak in."""
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with mock_aws():
        yield


@pytest.fixture(scope="session")
def real_kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealKube]:
    bin_dir = binaries()
    if bin_dir is None:
        pytest.skip("real Kubernetes control plane not built here: run scripts/build_kube.sh")
    with RealKube(bin_dir, root=tmp_path_factory.mktemp("real-kube")) as kube:
        yield kube
