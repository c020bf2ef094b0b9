"""Fixtures shared by the test tiers: the real Kubernetes control plane (etcd + kube-apiserver +
kube-controller-manager, ``nstance.testing.realkube``), started once per session when a suite asks for it.

Where ``scripts/build_kube.sh`` has not been run the real-server tests are skipped with the command to
run; where ``NSTANCE_KUBE_BIN`` is set (CI sets it from the build script's output) they never skip.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from nstance.testing.realkube import RealKube, binaries


@pytest.fixture(scope="session")
def real_kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealKube]:
    bin_dir = binaries()
    if bin_dir is None:
        pytest.skip("real Kubernetes control plane not built here: run scripts/build_kube.sh")
    with RealKube(bin_dir, root=tmp_path_factory.mktemp("real-kube")) as kube:
        yield kube
