"""Cluster API's CRDs in config/crd/cluster-api/ are what controller-gen makes of Cluster API's Go types.

Regenerates them with the controller-gen that scripts/build_kube.sh builds (skipped where it has not run,
required where ``NSTANCE_KUBE_BIN`` says it has) and compares byte for byte.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from nstance.testing.realkube import capi_binaries

REPO = Path(__file__).resolve().parents[2]


def test_cluster_api_crds_match_a_fresh_generation() -> None:
    tools = capi_binaries()
    if tools is None:
        pytest.skip("Cluster API tools not built here: run scripts/build_kube.sh")
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "gen_capi_crds.py"),
            "--check",
            "--controller-gen",
            str(tools / "controller-gen"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    names = sorted(p.name for p in (REPO / "config" / "crd" / "cluster-api").glob("*.yaml"))
    assert "cluster.x-k8s.io_machinepools.yaml" in names
    assert "cluster.x-k8s.io_machinedeployments.yaml" in names
