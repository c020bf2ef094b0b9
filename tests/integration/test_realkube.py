"""The real control plane fixture (``nstance.testing.realkube``): it serves, signs service-account tokens,
answers ``kubectl`` with its client-certificate kubeconfig, and leaves no process behind.

Skipped where scripts/build_kube.sh has not built the binaries (required where ``NSTANCE_KUBE_BIN`` is set).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from nstance.testing.procs import processes_mentioning
from nstance.testing.realkube import RealKube, binaries
from nstance.testing.waiting import eventually_sync

pytestmark = pytest.mark.slow


def test_starts_serves_and_stops_without_leftovers(tmp_path: Path) -> None:
    bin_dir = binaries()
    if bin_dir is None:
        pytest.skip("real Kubernetes control plane not built here: run scripts/build_kube.sh")
    kube = RealKube(bin_dir, root=tmp_path / "kube").start()
    try:
        assert len(processes_mentioning(str(tmp_path / "kube"))) == 3  # etcd, apiserver, controller manager
        with pytest.raises(RuntimeError, match="already started"):
            kube.start()  # `with RealKube(...).start()` did this: a second set, the first one leaked
        assert len(processes_mentioning(str(tmp_path / "kube"))) == 3
        status, body = kube.get("/version")
        assert status == 200
        assert json.loads(body)["gitVersion"] == bin_dir.name
        request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}}
        status, body = kube.request(
            "POST", "/api/v1/namespaces/default/serviceaccounts/default/token", request
        )
        assert status == 201, body
        assert json.loads(body)["status"]["token"].count(".") == 2  # a signed JWT
        kubectl = shutil.which("kubectl")
        if kubectl:
            out = subprocess.run(
                [kubectl, "--kubeconfig", str(kube.kubeconfig), "auth", "whoami", "-o", "json"],
                capture_output=True,
                text=True,
                timeout=60,
                check=True,
            ).stdout
            assert json.loads(out)["status"]["userInfo"]["groups"][:1] == ["system:masters"]
    finally:
        kube.stop()
    eventually_sync(
        lambda: processes_mentioning(str(tmp_path / "kube")) == [],
        within=10,
        every=0.1,
        what=lambda: f"the control plane's processes to end: {processes_mentioning(str(tmp_path / 'kube'))}",
    )
