"""Cluster API tools on our artifacts: the CRDs of config/crd/cluster-api/ are what controller-gen makes of
Cluster API's Go types, and clusterctl generates a cluster from deploy/clusterctl/cluster-template.yaml.

Both programs are the ones scripts/build_kube.sh builds (skipped where it has not run, required where
``NSTANCE_KUBE_BIN`` says it has). The CRDs are regenerated and compared byte for byte.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

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


def test_clusterctl_generates_a_cluster_from_the_template(tmp_path: Path) -> None:
    tools = capi_binaries()
    if tools is None:
        pytest.skip("Cluster API tools not built here: run scripts/build_kube.sh")
    env = {
        "HOME": str(tmp_path),  # clusterctl keeps its config and cache under $HOME
        "PATH": "/usr/bin:/bin",
        "CONTROL_PLANE_ENDPOINT_HOST": "10.0.0.1",
        "NSTANCE_SHARDS": "[zone-a, zone-b]",
        "WORKER_MACHINE_COUNT": "3",
    }
    done = subprocess.run(
        [
            str(tools / "clusterctl"),
            "generate",
            "cluster",
            "demo",
            "--target-namespace",  # clusterctl's ${NAMESPACE}; without it, it asks a management cluster
            "team-a",
            "--from",
            str(REPO / "deploy" / "clusterctl" / "cluster-template.yaml"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    documents = {doc["kind"]: doc for doc in yaml.safe_load_all(done.stdout) if doc}
    assert set(documents) == {"Cluster", "NstanceCluster", "MachinePool", "NstanceMachinePool"}
    assert documents["Cluster"]["metadata"] == {"name": "demo", "namespace": "team-a"}
    assert documents["MachinePool"]["spec"]["replicas"] == 3
    pool = documents["NstanceMachinePool"]
    assert pool["metadata"]["name"] == "demo-workers"
    assert pool["spec"] == {"group": "workers", "shards": ["zone-a", "zone-b"], "template": "app"}
