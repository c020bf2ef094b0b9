"""`make run-k8s`: two local shards, nstance-operator and a Kubernetes API to drive them with kubectl.

Starts a real control plane (etcd + kube-apiserver + kube-controller-manager, ``nstance.testing.realkube``)
when ``scripts/build_kube.sh`` has built it on this machine, and the Kubernetes API emulator otherwise;
installs the Nstance CRDs and Cluster API's (its own, generated from its types, on the real server; the
minimal ones on the emulator); starts the shard servers ``zone-a`` and ``zone-b`` (local provider: every VM
is an nstance-agent process) and the operator with its static-group webhook; prints the KUBECONFIG to
export and the commands to try (the manifests of examples/kubernetes/). Ctrl-C, or closing the terminal,
stops everything.

State lives in .local/k8s/ and is started afresh on every run. Not part of the product: a demo built from
the test harness (``nstance.testing``).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from nstance.core.cli import stop_signals  # noqa: E402
from nstance.testing.kubeapi import KubeAPIServer  # noqa: E402
from nstance.testing.operatorproc import OperatorProcess, bootstrap_objects  # noqa: E402
from nstance.testing.realkube import RealKube, binaries  # noqa: E402
from nstance.testing.shardproc import LocalCluster, ServerProcess, server_addrs, shard_config, start_leader  # noqa: E402

STATE = REPO_ROOT / ".local" / "k8s"
SHARDS = ("zone-a", "zone-b")
NAMESPACE = "default"
NSTANCE_CRDS = REPO_ROOT / "config" / "crd" / "bases"


@contextlib.contextmanager
def kubernetes() -> Iterator[tuple[Path, str, KubeAPIServer | None]]:
    """(kubeconfig, description, emulator or None) of a running API server with the CRDs installed."""
    bin_dir = binaries()
    if bin_dir is not None:
        # In a session of its own: Ctrl-C reaches the operator and the servers, which stop while the
        # API still serves them (the operator gives its Lease back), and the API is stopped last.
        with RealKube(bin_dir, root=STATE / "kube", own_session=True) as kube:
            kube.install_crds([NSTANCE_CRDS, REPO_ROOT / "config" / "crd" / "cluster-api"])
            version = json.loads(kube.get("/version")[1])["gitVersion"]
            yield kube.kubeconfig, f"kube-apiserver {version} at {kube.url} (from {bin_dir})", None
        return
    crds = [NSTANCE_CRDS, REPO_ROOT / "config" / "crd" / "capi"]
    with KubeAPIServer.in_thread(crds=crds) as server:
        kubeconfig = server.write_kubeconfig(STATE / "kubeconfig")
        yield (
            kubeconfig,
            f"the Kubernetes API emulator at {server.url} (run scripts/build_kube.sh for a real one)",
            server,
        )


def apply(kubeconfig: Path, emulator: KubeAPIServer | None, documents: list[dict[str, object]]) -> None:
    if emulator is not None:
        emulator.apply_objects(documents)
        return
    import subprocess

    subprocess.run(
        ["kubectl", "--kubeconfig", str(kubeconfig), "apply", "-f", "-"],
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": documents}),
        text=True,
        check=True,
        stdout=subprocess.DEVNULL,
    )


def say(text: str) -> None:
    """Print ``text``; once the terminal is closed (SIGHUP) printing fails, and the stopping goes on."""
    with contextlib.suppress(OSError):
        print(text, flush=True)


def main() -> int:
    shutil.rmtree(STATE, ignore_errors=True)
    STATE.mkdir(parents=True)
    stopping = False
    started = False

    def stop(_signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        if not started:
            raise KeyboardInterrupt  # half-way through the start: unwind it, as Ctrl-C does

    # SIGHUP: the terminal was closed; by default it killed this script and left every process behind.
    for sig in stop_signals():
        if sig != signal.SIGINT:
            signal.signal(sig, stop)
    servers: list[ServerProcess] = []
    operator: OperatorProcess | None = None
    with kubernetes() as (kubeconfig, description, emulator):
        try:
            say(f"== Kubernetes API: {description}")
            cluster = LocalCluster(STATE / "bucket")
            cluster.init()
            addrs = {shard: server_addrs() for shard in SHARDS}
            for shard in SHARDS:
                root = STATE / shard
                config = shard_config(
                    shard=shard,
                    addrs=addrs[shard],
                    provider="local",
                    provider_options={
                        "instances_dir": str(root / "instances"),
                        "stop_instances_on_close": True,
                    },
                    shard_extra={"health_check_interval": "2s", "default_drain_timeout": "30s"},
                )
                cluster.write_config(shard, config)
                say(f"== starting nstance-server for shard {shard} (log: {root / 'server.log'})")
                servers.append(
                    start_leader(cluster, root, shard=shard, env={"NSTANCE_REPORT_INTERVAL": "1s"})
                )
            apply(kubeconfig, emulator, bootstrap_objects(cluster, addrs, namespace=NAMESPACE))
            operator = OperatorProcess(
                kubeconfig=kubeconfig,
                namespace=NAMESPACE,
                log_path=STATE / "operator.log",
                args=[
                    "--log-format",
                    "text",
                    "--resync-interval",
                    "5s",
                    "--webhook-self-signed",
                    "--webhook-managed",
                    "local.operator.nstance.dev",
                    "--webhook-host",
                    "127.0.0.1",
                    "--webhook-addr",
                    "127.0.0.1:0",
                ],
            ).start()
            say(f"== starting nstance-operator (log: {operator.log_path})")
            operator.wait_ready(60)
            examples = REPO_ROOT / "examples" / "kubernetes"
            say(
                f"""
Ready. In another terminal:

  export KUBECONFIG={kubeconfig}
  kubectl apply -f {examples / "cluster.yaml"} -f {examples / "machinepool.yaml"}
  kubectl get nstancemachinepools,nstanceshardgroups
  kubectl scale machinepool workers --replicas 5
  kubectl get nstancemachinepools -w

The VMs are nstance-agent processes under {STATE}/zone-*/instances. Ctrl-C stops everything."""
            )
            started = True
            while not stopping:
                for server in servers:
                    if server.proc is not None and server.proc.poll() is not None:
                        say(f"nstance-server of shard {server.shard} exited; see {server.log_path}")
                        return 1
                time.sleep(0.5)
        except KeyboardInterrupt:
            pass
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                signal.signal(sig, signal.SIG_IGN)  # stopping must finish once begun
            say("\n== stopping")
            if operator is not None:
                operator.stop()
            for server in servers:
                server.stop()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # stopped before the API server was up: what had started is stopped
        sys.exit(130)
