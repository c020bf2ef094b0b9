"""The real ``kubectl`` against the Kubernetes API emulator, as someone running it for a demo uses it.

Each test runs the ``kubectl`` binary on the machine (skipped where there is none) with a kubeconfig for a
fresh emulator holding the Nstance and minimal Cluster API CRDs: ``apply`` with kubectl's default
validation (the emulator serves OpenAPI v3, so kubectl asks for server-side ``fieldValidation=Strict``),
``get`` with the CRDs' printer columns (the Table format), ``get -w``, ``wait --for=condition=Ready``,
``explain``, ``apply --server-side`` with two field managers (a conflict, then ``--force-conflicts``) and
``scale`` through a CRD's scale subresource.
"""

from __future__ import annotations

import json
import queue
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from nstance.testing.kubeapi import KubeAPIServer

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "kubernetes"
KUBECTL = shutil.which("kubectl")

pytestmark = pytest.mark.skipif(KUBECTL is None, reason="no kubectl on this machine")


@dataclass
class Kubectl:
    kubeconfig: Path

    def argv(self, *args: str) -> list[str]:
        return [str(KUBECTL), "--kubeconfig", str(self.kubeconfig), *args]

    def run(self, *args: str, stdin: str | None = None, check: bool = True) -> str:
        """stdout (with stderr appended when ``check`` is false, for failures the test expects)."""
        done = subprocess.run(
            self.argv(*args), input=stdin, capture_output=True, text=True, timeout=60, check=False
        )
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} exited {done.returncode}: {done.stderr}")
        return done.stdout if check else done.stdout + done.stderr

    def start(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(self.argv(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.fixture
def kubectl(tmp_path: Path) -> Iterator[Kubectl]:
    crds = [REPO / "config" / "crd" / "bases", REPO / "config" / "crd" / "capi"]
    with KubeAPIServer.in_thread(crds=crds) as server:
        yield Kubectl(server.write_kubeconfig(tmp_path / "kubeconfig"))


COLUMNS = ["NAME", "GROUP", "SHARDS", "REPLICAS", "READY", "STATIC", "AGE"]


def test_apply_validates_and_get_shows_the_printer_columns(kubectl: Kubectl) -> None:
    out = kubectl.run("apply", "-f", str(EXAMPLES / "cluster.yaml"), "-f", str(EXAMPLES / "machinepool.yaml"))
    assert "nstancemachinepool.infrastructure.cluster.x-k8s.io/workers created" in out
    assert "machinepool.cluster.x-k8s.io/workers created" in out
    assert "unchanged" in kubectl.run("apply", "-f", str(EXAMPLES / "machinepool.yaml"))
    # A change is a client-side patch; kubectl asks for OpenAPI v2 on the way and carries on without it.
    changed = (EXAMPLES / "machinepool.yaml").read_text().replace("replicas: 3", "replicas: 4")
    assert "machinepool.cluster.x-k8s.io/workers configured" in kubectl.run("apply", "-f", "-", stdin=changed)
    assert "pod/batch-job created" in kubectl.run("apply", "-f", str(EXAMPLES / "on-demand-pod.yaml"))

    lines = kubectl.run("get", "nstancemachinepools").splitlines()
    assert lines[0].split() == COLUMNS
    assert lines[1].split()[:3] == ["workers", "workers", '["zone-a","zone-b"]']

    bad = (
        "apiVersion: infrastructure.cluster.x-k8s.io/v1beta1\nkind: NstanceMachinePool\n"
        "metadata: {name: bad}\nspec: {group: g, shards: [a], bogus: 1}\n"
    )
    refused = kubectl.run("apply", "-f", "-", stdin=bad, check=False)
    assert 'strict decoding error: unknown field "spec.bogus"' in refused
    assert kubectl.run("get", "nstancemachinepool", "bad", check=False).startswith(
        "Error from server (NotFound)"
    )


def test_wait_for_a_condition_and_watch(kubectl: Kubectl) -> None:
    kubectl.run("apply", "-f", str(EXAMPLES / "machinepool.yaml"))
    waiting = kubectl.start("wait", "--for=condition=Ready", "nstancemachinepool/workers", "--timeout=60s")
    watching = kubectl.start("get", "nstancemachinepools", "-w")
    try:
        condition = {
            "type": "Ready",
            "status": "True",
            "reason": "Test",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        }
        patch = json.dumps({"status": {"ready": True, "replicas": 3, "conditions": [condition]}})
        kubectl.run(
            "patch", "nstancemachinepool", "workers", "--subresource=status", "--type=merge", "-p", patch
        )
        out, err = waiting.communicate(timeout=60)
        assert waiting.returncode == 0, err
        assert "nstancemachinepool.infrastructure.cluster.x-k8s.io/workers condition met" in out
        rows = read_rows_until(
            watching, ["workers", "workers", '["zone-a","zone-b"]', "3", "true"], within=30
        )
    finally:
        waiting.kill()
        waiting.wait()
        watching.kill()
        watching.communicate(timeout=20)
    assert rows[0] == COLUMNS
    assert rows.count(COLUMNS) == 1  # the header once, then one row per change


def read_rows_until(proc: subprocess.Popen[str], prefix: list[str], within: float) -> list[list[str]]:
    """Rows ``kubectl get -w`` printed, read until one starts with ``prefix`` (fails after ``within`` s)."""
    assert proc.stdout is not None
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout or ()], daemon=True).start()
    rows: list[list[str]] = []
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            rows.append(lines.get(timeout=max(0.0, deadline - time.monotonic())).split())
        except queue.Empty:
            break
        if rows[-1][: len(prefix)] == prefix:
            return rows
    raise AssertionError(f"kubectl get -w never printed a row starting {prefix}; printed {rows}")


def test_explain_reads_the_crd_schema(kubectl: Kubectl) -> None:
    out = kubectl.run("explain", "nstancemachinepool.spec")
    assert "KIND:       NstanceMachinePool" in out
    assert "group\t<string> -required-" in out
    assert "shards\t<[]string> -required-" in out


def test_server_side_apply_reports_a_conflict_until_forced(kubectl: Kubectl) -> None:
    manifest = (EXAMPLES / "machinepool.yaml").read_text()
    out = kubectl.run("apply", "--server-side", "--field-manager=gitops", "-f", "-", stdin=manifest)
    assert "machinepool.cluster.x-k8s.io/workers serverside-applied" in out
    assert "nstancemachinepool.infrastructure.cluster.x-k8s.io/workers serverside-applied" in out

    tuned = manifest.replace("replicas: 3", "replicas: 7")
    refused = kubectl.run(
        "apply", "--server-side", "--field-manager=tuner", "-f", "-", stdin=tuned, check=False
    )
    assert 'Apply failed with 1 conflict: conflict with "gitops": .spec.replicas' in refused
    assert kubectl.run("get", "machinepool", "workers", "-o", "jsonpath={.spec.replicas}") == "3"

    forced = kubectl.run(
        "apply", "--server-side", "--field-manager=tuner", "--force-conflicts", "-f", "-", stdin=tuned
    )
    assert "machinepool.cluster.x-k8s.io/workers serverside-applied" in forced
    pool = json.loads(kubectl.run("get", "machinepool", "workers", "-o", "json", "--show-managed-fields"))
    assert pool["spec"]["replicas"] == 7
    owned = {m["manager"]: m["fieldsV1"] for m in pool["metadata"]["managedFields"]}
    assert "f:replicas" in owned["tuner"]["f:spec"]
    assert "f:replicas" not in owned["gitops"]["f:spec"]
    assert "f:clusterName" in owned["gitops"]["f:spec"]


def test_scale_uses_the_scale_subresource(kubectl: Kubectl) -> None:
    kubectl.run("apply", "-f", str(EXAMPLES / "machinepool.yaml"))
    assert "machinepool.cluster.x-k8s.io/workers scaled" in kubectl.run(
        "scale", "machinepool", "workers", "--replicas=5"
    )
    assert kubectl.run("get", "machinepool", "workers", "-o", "jsonpath={.spec.replicas}") == "5"
    scale = json.loads(kubectl.run("get", "machinepool", "workers", "--subresource=scale", "-o", "json"))
    assert (scale["kind"], scale["spec"]) == ("Scale", {"replicas": 5})
    refused = kubectl.run(
        "scale", "machinepool", "workers", "--replicas=6", "--current-replicas=4", check=False
    )
    assert "Expected replicas to be 4, was 5" in refused
