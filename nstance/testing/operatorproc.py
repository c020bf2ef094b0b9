"""Test and benchmark helpers: bootstrap objects for nstance-operator, and the operator as a process.

``bootstrap_objects`` returns what an installation puts into the operator's namespace before the
operator starts (the Helm chart creates the same objects): the ConfigMap with the operator config
(cluster id, tenant, shard addresses), the ConfigMap with the cluster CA certificate, the Secret
with a freshly signed operator registration nonce, and the workload ServiceAccount whose tokens the
operator writes into Cluster API's kubeconfig Secret. ``capi_machine_pool`` is the Cluster API
MachinePool body a user creates next to an NstanceMachinePool. ``OperatorProcess`` runs a real
``nstance-operator`` (``python -m nstance.operator``) against a kubeconfig, logs to a file, and waits
on its ``/readyz`` probe. Used by tests/e2e and bench/; nothing in the product imports this module,
and it must not import ``nstance.operator`` (the operator is exercised only as a user runs it).
"""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import yaml

from nstance.pki.nonce import operator_nonce_claims, sign_nonce
from nstance.testing.procs import (
    free_port,
    http_probe,
    log_tail,
    log_text,
    spawn_logged,
    stop_process,
    wait_for_ok,
)
from nstance.testing.shardproc import LocalCluster

CONFIG_CONFIGMAP = "nstance-operator-config"
CA_CONFIGMAP = "nstance-cluster-ca"
NONCE_SECRET = "nstance-operator-nonce"
CAPI_WORKLOAD_SERVICE_ACCOUNT = "nstance-capi-workload"
"""The chart's workload ServiceAccount (``nstance.operator.crds.names.CAPI_WORKLOAD_SERVICE_ACCOUNT``)."""
INFRASTRUCTURE_GROUP = "infrastructure.cluster.x-k8s.io"
"""API group of the Nstance infrastructure kinds (``nstance.operator.crds.names.GROUP``)."""


def bootstrap_objects(
    cluster: LocalCluster,
    shards: Mapping[str, Mapping[str, str]],
    *,
    namespace: str,
    tenant: str = "default",
    nonce_ttl: timedelta = timedelta(hours=3),
) -> list[dict[str, Any]]:
    """ConfigMaps (config, CA), the nonce Secret and the workload ServiceAccount; ``shards`` maps shard
    id → its server addresses."""
    identity = cluster.identity or cluster.init()
    config = {
        "cluster_id": cluster.cluster_id,
        "tenant": tenant,
        "shards": {
            shard: {"registration_addr": addrs["registration_addr"], "operator_addr": addrs["operator_addr"]}
            for shard, addrs in shards.items()
        },
    }
    nonce = sign_nonce(
        identity.nonce_key,
        operator_nonce_claims(cluster_id=cluster.cluster_id, tenant=tenant, ttl=nonce_ttl),
    )
    meta = {"namespace": namespace}
    return [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": CONFIG_CONFIGMAP, **meta},
            "data": {"config.yaml": yaml.safe_dump(config, sort_keys=False)},
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": CA_CONFIGMAP, **meta},
            "data": {"ca.crt": identity.ca.cert_pem.decode("ascii")},
        },
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": NONCE_SECRET, **meta},
            "type": "Opaque",
            "data": {"nonce.jwt": base64.b64encode(nonce.encode("ascii")).decode("ascii")},
        },
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": CAPI_WORKLOAD_SERVICE_ACCOUNT, **meta},
        },
    ]


def capi_machine_pool(name: str, namespace: str, cluster_name: str, replicas: int) -> dict[str, Any]:
    """A Cluster API MachinePool ``name`` with ``replicas`` whose machines are NstanceMachinePool ``name``
    (create it with the NstanceMachinePool; ``Kube.create`` adds apiVersion and kind)."""
    return {
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "clusterName": cluster_name,
            "replicas": replicas,
            "template": {
                "spec": {
                    "clusterName": cluster_name,
                    "bootstrap": {"dataSecretName": ""},
                    "infrastructureRef": {
                        "apiGroup": INFRASTRUCTURE_GROUP,
                        "kind": "NstanceMachinePool",
                        "name": name,
                    },
                }
            },
        },
    }


@dataclass
class OperatorProcess:
    """One ``nstance-operator`` child process."""

    kubeconfig: Path
    namespace: str
    log_path: Path
    args: Sequence[str] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    health_addr: str = field(default_factory=lambda: f"127.0.0.1:{free_port()}")
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> OperatorProcess:
        env = {**os.environ, "NSTANCE_NAMESPACE": self.namespace, **self.env}
        argv = [
            sys.executable,
            "-m",
            "nstance.operator",
            "--kubeconfig",
            str(self.kubeconfig),
            "--health-addr",
            self.health_addr,
            *self.args,
        ]
        self.proc = spawn_logged(argv, env, self.log_path)
        return self

    def http(self, path: str) -> tuple[int, str]:
        """GET ``path`` on the probe endpoint: (status, body); (0, error) when unreachable."""
        return http_probe(self.health_addr, path)

    def wait_ready(self, timeout: float = 30.0) -> str:
        """Wait until ``/readyz`` answers 200; return its body."""
        return wait_for_ok(
            lambda: self.http("/readyz"),
            self.proc,
            what="nstance-operator",
            state="ready",
            log=self.log,
            timeout=timeout,
            interval=0.1,
        )

    def log(self, tail: int = 12000) -> str:
        return log_tail(self.log_path, tail)

    def log_text(self) -> str:
        """The whole log so far (what a test counts lines in: they scroll out of ``log``)."""
        return log_text(self.log_path)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int:
        """Send ``sig`` and wait for the exit status."""
        return stop_process(self.proc, sig, timeout)
