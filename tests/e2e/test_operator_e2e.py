"""The whole system as a user runs it: Kubernetes API, nstance-operator, two shard servers, real agents.

Every test runs twice: on the project's emulator (``nstance.testing.kubeapi``, with the minimal Cluster
API CRDs of config/crd/capi) and on a real kube-apiserver (the session's ``nstance.testing.realkube``
control plane, or the cluster of ``KUBECONFIG`` when that is set) in a fresh namespace, with the Nstance
CRDs of config/crd/bases and Cluster API's own CRDs (config/crd/cluster-api, generated from its Go types)
installed, so their validation applies; there kube-apiserver itself calls the operator's static-group
webhook over TLS. The operator is the ``nstance-operator`` program in its own process,
bootstrapped as the Helm chart would (config ConfigMap, CA ConfigMap, nonce Secret); the shard
servers are ``nstance-server`` processes with the ``local`` provider, whose instances are real
``nstance-agent`` processes that register and report health. Every assertion is something a user
sees: objects in Kubernetes, groups and instances on the servers.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from google.protobuf.empty_pb2 import Empty
from kubernetes_asyncio.client import Configuration

from nstance.operator.crds import names
from nstance.operator.kube import (
    CONFIGMAPS,
    NODES,
    PODS,
    SECRETS,
    SERVICE_ACCOUNTS,
    Kube,
    KubeError,
    Resource,
    load_configuration,
)
from nstance.rpc import agent_pb2, operator_pb2_grpc
from nstance.testing.kubeapi import KubeAPIServer
from nstance.testing.kubeapi.manifests import load_manifests
from nstance.testing.operatorproc import OperatorProcess, bootstrap_objects, capi_machine_pool
from nstance.testing.shardproc import (
    LocalCluster,
    ServerProcess,
    instance_state,
    server_addrs,
    shard_config,
    start_leader,
)
from nstance.testing.waiting import eventually

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
SHARDS = ("zone-a", "zone-b")
POOLS = Resource(names.GROUP, names.VERSION, names.NSTANCE_MACHINE_POOLS, names.KIND_MACHINE_POOL)
SHARD_GROUPS = Resource(names.GROUP, names.VERSION, names.NSTANCE_SHARD_GROUPS, names.KIND_SHARD_GROUP)
MACHINES = Resource(names.GROUP, names.VERSION, names.NSTANCE_MACHINES, names.KIND_MACHINE)
CAPI_POOLS = Resource(names.CAPI_GROUP, names.CAPI_VERSION, names.MACHINE_POOLS, names.CAPI_KIND_MACHINE_POOL)
CAPI_MACHINES = Resource(names.CAPI_GROUP, names.CAPI_VERSION, names.MACHINES, names.CAPI_KIND_MACHINE)
DAEMON_SETS = Resource("apps", "v1", "daemonsets", "DaemonSet")
KUBECTL = shutil.which("kubectl")
LIVE = ("pending", "running", "registered", "healthy")


@dataclass
class ShardServer:
    shard: str
    addrs: dict[str, str]
    root: Path
    process: ServerProcess | None = None


@dataclass
class System:
    root: Path
    kubeconfig: Path
    namespace: str
    cluster: LocalCluster
    shards: dict[str, ShardServer]
    operator: OperatorProcess | None = None
    backend: str = "emulator"
    identity: Path = field(init=False)

    def __post_init__(self) -> None:
        self.identity = self.cluster.operator_identity(self.root / "admin-identity")

    # --- shard servers ------------------------------------------------------------------------

    def config(self, shard: str) -> dict[str, Any]:
        server = self.shards[shard]
        return shard_config(
            shard=shard,
            addrs=server.addrs,
            provider="local",
            election={"frequent_interval": "200ms", "infrequent_interval": "1s", "leader_timeout": "6s"},
            provider_options={
                "instances_dir": str(server.root / "instances"),
                "stop_instances_on_close": True,
            },
            groups={"web": {"template": "app", "size": 0}},
            shard_extra={"health_check_interval": "1s", "default_drain_timeout": "60s"},
        )

    def start_shard(self, shard: str) -> None:
        server = self.shards[shard]
        self.cluster.write_config(shard, self.config(shard))
        server.process = start_leader(
            self.cluster, server.root, shard=shard, env={"NSTANCE_REPORT_INTERVAL": "300ms"}
        )

    def stub(self, shard: str) -> operator_pb2_grpc.OperatorServiceStub:
        return self.cluster.operator_stub(self.identity, self.shards[shard].addrs["operator_addr"])

    def group_sizes_of(self, shard: str, group: str) -> int | None:
        """Desired size of ``group`` on ``shard`` (None where the group does not exist)."""
        groups = self.stub(shard).ListGroups(Empty(), timeout=10).groups
        return next((g.size for g in groups if g.key == group), None)

    def group_sizes(self, group: str) -> dict[str, int | None]:
        """Desired size of ``group`` on each shard (None where the group does not exist)."""
        sizes: dict[str, int | None] = {}
        for shard in SHARDS:
            groups = self.stub(shard).ListGroups(Empty(), timeout=10).groups
            sizes[shard] = next((g.size for g in groups if g.key == group), None)
        return sizes

    def records(self, shard: str) -> list[dict[str, Any]]:
        store = self.cluster.shard_store(shard)
        return [json.loads(store.get(key)[0]) for key in store.list("instance/")]

    def status(self, shard: str, instance_id: str) -> str:
        try:
            return instance_state(self.stub(shard), instance_id)
        except grpc.RpcError:
            return "gone"

    def live(self, shard: str, group: str) -> list[dict[str, Any]]:
        return [
            r
            for r in self.records(shard)
            if r.get("group") == group and r["status"] not in ("deleting", "deleted", "failed")
        ]

    def healthy(self, shard: str, group: str) -> list[str]:
        return [
            r["instance_id"]
            for r in self.live(shard, group)
            if self.status(shard, r["instance_id"]) in ("registered", "healthy")
        ]

    # --- operator -----------------------------------------------------------------------------

    def operator_log(self) -> str:
        return self.operator.log() if self.operator is not None else ""

    async def kube(self) -> Kube:
        return Kube.from_configuration(await load_configuration(str(self.kubeconfig)))

    async def bootstrap(self) -> None:
        kube = await self.kube()
        try:
            shards = {shard: s.addrs for shard, s in self.shards.items()}
            for obj in bootstrap_objects(self.cluster, shards, namespace=self.namespace):
                # The ServiceAccount is the chart's workload account: its tokens go into Cluster
                # API's kubeconfig Secret.
                res = {"ConfigMap": CONFIGMAPS, "Secret": SECRETS, "ServiceAccount": SERVICE_ACCOUNTS}
                await kube.create(res[obj["kind"]], obj, self.namespace)
        finally:
            await kube.close()

    def start_operator(self) -> OperatorProcess:
        self.operator = OperatorProcess(
            kubeconfig=self.kubeconfig,
            namespace=self.namespace,
            log_path=self.root / "operator.log",
            args=[
                "--log-format",
                "text",
                "--resync-interval",
                "2s",
                "--unreachable-retry",
                "1s",
                "--error-retry",
                "2s",
                "--backoff-cap",
                "2s",
                "--drain-poll",
                "200ms",
                "--leader-elect-lease-duration",
                "4s",
                "--leader-elect-renew-interval",
                "1s",
                "--leader-elect-renew-deadline",
                "3s",
                "--webhook-self-signed",
                "--webhook-managed",
                "e2e.operator.nstance.dev",  # webhook names need 3+ dot-separated segments
                "--webhook-host",
                "127.0.0.1",
                "--webhook-addr",
                "127.0.0.1:0",
            ],
        ).start()
        return self.operator

    def stop(self) -> None:
        if self.operator is not None:
            self.operator.stop()
        for server in self.shards.values():
            if server.process is not None:
                server.process.stop()


CRDS = Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", False)
NAMESPACES = Resource("", "v1", "namespaces", "Namespace", namespaced=False)
REAL_CRDS = (REPO / "config" / "crd" / "bases", REPO / "config" / "crd" / "cluster-api")


async def install_crds(kubeconfig: Path) -> None:
    """Create the CRDs of ``REAL_CRDS`` (kept when already there) and wait until each is Established."""
    kube = Kube.from_configuration(await load_configuration(str(kubeconfig)))
    try:
        documents = load_manifests(REAL_CRDS)
        for crd in documents:
            with contextlib.suppress(KubeError):  # 409: installed by an earlier module of the session
                await kube.create(CRDS, crd)
        for crd in documents:

            async def established(name: str = crd["metadata"]["name"]) -> bool:
                conditions = ((await kube.get(CRDS, name) or {}).get("status") or {}).get("conditions") or []
                return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)

            await eventually(
                established, within=30, what=f"CRD {crd['metadata']['name']} established", every=0.2
            )
    finally:
        await kube.close()


async def namespace_op(kubeconfig: Path, namespace: str, create: bool) -> None:
    kube = Kube.from_configuration(await load_configuration(str(kubeconfig)))
    try:
        if create:
            await kube.create(NAMESPACES, {"metadata": {"name": namespace}})
        else:
            await kube.delete(NAMESPACES, namespace)
    finally:
        await kube.close()


@contextlib.contextmanager
def kubernetes(root: Path, request: pytest.FixtureRequest, backend: str) -> Iterator[tuple[Path, str]]:
    """(kubeconfig, namespace): the emulator, or a real API server (with the CRDs) in a fresh namespace."""
    if backend == "real":
        external = os.environ.get("KUBECONFIG")
        kubeconfig = Path(external) if external else request.getfixturevalue("real_kube").kubeconfig
        namespace = f"nstance-e2e-{uuid.uuid4().hex[:6]}"
        asyncio.run(install_crds(kubeconfig))
        asyncio.run(namespace_op(kubeconfig, namespace, True))
        try:
            yield kubeconfig, namespace
        finally:
            asyncio.run(namespace_op(kubeconfig, namespace, False))
        return
    crds = [REPO / "config" / "crd" / "bases", REPO / "config" / "crd" / "capi"]
    with KubeAPIServer.in_thread(crds=crds) as server:
        yield server.write_kubeconfig(root / "kubeconfig"), "default"


def make_system(root: Path, kubeconfig: Path, namespace: str, backend: str = "emulator") -> System:
    cluster = LocalCluster(root / "bucket")
    cluster.init()
    shards = {s: ShardServer(s, server_addrs(), root / s) for s in SHARDS}
    return System(root, kubeconfig, namespace, cluster, shards, backend=backend)


@pytest.fixture(scope="module", params=["emulator", "real"])
def system(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    root = tmp_path_factory.mktemp("e2e")
    with kubernetes(root, request, request.param) as (kubeconfig, namespace):
        sys_ = make_system(root, kubeconfig, namespace, request.param)
        try:
            for shard in SHARDS:
                sys_.start_shard(shard)
            asyncio.run(sys_.bootstrap())
            sys_.start_operator().wait_ready(60)
            yield sys_
        finally:
            sys_.stop()


def daemon_set_body(name: str, namespace: str) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "c", "image": "x"}]},
            },
        },
    }


async def create_pool(kube: Kube, system: System, name: str, shards: list[str], replicas: int) -> None:
    pool = capi_machine_pool(name, system.namespace, f"{system.cluster.cluster_id}--default", replicas)
    await kube.create(CAPI_POOLS, pool, system.namespace)
    await kube.create(
        POOLS,
        {
            "metadata": {"name": name, "namespace": system.namespace},
            "spec": {"group": name, "shards": shards, "template": "app"},
        },
        system.namespace,
    )


async def test_a_pool_spreads_over_two_shards_scales_and_is_deleted(system: System) -> None:
    kube = await system.kube()
    log = system.operator_log
    try:
        await create_pool(kube, system, "workers", list(SHARDS), 5)

        async def spread() -> bool:
            return system.group_sizes("workers") == {"zone-a": 3, "zone-b": 2}

        await eventually(spread, what="sizes 3 and 2 on the two shards", log=log, within=60, every=0.2)

        async def registered() -> bool:
            return [len(system.healthy(s, "workers")) for s in SHARDS] == [3, 2]

        await eventually(registered, within=90, what="3 + 2 registered instances", log=log, every=0.2)

        async def shard_groups_ready() -> bool:
            pool = await kube.get(POOLS, "workers", system.namespace) or {}
            status = pool.get("status") or {}
            return bool(status.get("ready")) and status.get("replicas") == 5

        await eventually(
            shard_groups_ready, what="pool status ready with 5 replicas", log=log, within=60, every=0.2
        )

        await kube.patch(CAPI_POOLS, "workers", {"spec": {"replicas": 1}}, system.namespace)

        async def scaled() -> bool:
            return system.group_sizes("workers") == {"zone-a": 1, "zone-b": 0} and [
                len(system.live(s, "workers")) for s in SHARDS
            ] == [1, 0]

        await eventually(scaled, within=90, what="scale-down to 1 instance on zone-a", log=log, every=0.2)

        await kube.delete(POOLS, "workers", system.namespace)
        await kube.delete(CAPI_POOLS, "workers", system.namespace)

        async def deleted() -> bool:
            gone = await kube.get(POOLS, "workers", system.namespace) is None
            return gone and system.group_sizes("workers") == {"zone-a": None, "zone-b": None}

        await eventually(deleted, what="the group deleted on both shards", log=log, within=60, every=0.2)
    finally:
        await kube.close()


async def test_a_spot_notice_cordons_evicts_acknowledges_and_replaces(system: System) -> None:
    kube = await system.kube()
    log = system.operator_log
    try:
        await create_pool(kube, system, "spot", ["zone-a"], 1)

        async def one_healthy() -> list[str]:
            return system.healthy("zone-a", "spot")

        (iid,) = await eventually(
            one_healthy, within=60, what="the spot instance registered", log=log, every=0.2
        )
        record = next(r for r in system.records("zone-a") if r["instance_id"] == iid)
        provider_id = str(record["provider_instance_id"])
        node_name = f"node-{iid.lower()}"
        await kube.create(
            NODES,
            {"metadata": {"name": node_name}, "spec": {"providerID": f"local:///{provider_id}"}},
        )
        ns = system.namespace
        daemon_set_uid = str(uuid.uuid4())
        if system.backend == "real":  # its garbage collector would delete a pod whose owner does not exist
            daemon_set = await kube.create(DAEMON_SETS, daemon_set_body("logs", ns), ns)
            daemon_set_uid = daemon_set["metadata"]["uid"]
        for pod, owner in (("app-1", None), ("logs-agent", "DaemonSet")):
            meta: dict[str, Any] = {"name": pod, "namespace": ns}
            if owner:
                meta["ownerReferences"] = [
                    {"apiVersion": "apps/v1", "kind": owner, "name": "logs", "uid": daemon_set_uid}
                ]
            await kube.create(
                PODS,
                {
                    "metadata": meta,
                    "spec": {"nodeName": node_name, "containers": [{"name": "c", "image": "x"}]},
                },
                ns,
            )

        # The spot notice, sent with the instance's own identity as its agent's poller would.
        agent_dir = system.cluster.agent_identity(system.root / f"agent-{iid}", iid)
        agent = system.cluster.agent_stub(agent_dir, system.shards["zone-a"].addrs["agent_addr"])
        notice = agent_pb2.TerminationNotice(action="terminate")
        notice.deadline.GetCurrentTime()
        agent.SubmitHealthReport(iter([agent_pb2.HealthReportRequest(termination_notice=notice)]), timeout=10)

        async def drained() -> bool:
            node = await kube.get(NODES, node_name) or {}
            app = await kube.get(PODS, "app-1", ns)
            daemon = await kube.get(PODS, "logs-agent", ns)
            # A pod bound to a node is deleted gracefully: without a kubelet to confirm, a real server
            # keeps it Terminating (deletionTimestamp set), which is what the eviction achieves.
            evicted = app is None or bool(app["metadata"].get("deletionTimestamp"))
            if app is not None and evicted:  # act as the kubelet: the containers stopped, the pod goes
                await kube.delete(PODS, "app-1", ns, grace_period=0)
            return bool((node.get("spec") or {}).get("unschedulable")) and evicted and daemon is not None

        await eventually(
            drained, what="node cordoned, app pod evicted, DaemonSet pod kept", log=log, within=60, every=0.2
        )

        async def replaced() -> bool:
            live = [r["instance_id"] for r in system.live("zone-a", "spot")]
            return iid not in live and len(live) == 1

        # The group's drain timeout is 60 s: a replacement well before it means the drain was acknowledged.
        await eventually(
            replaced, within=40, what="the noticed instance replaced after the ack", log=log, every=0.2
        )
    finally:
        with contextlib.suppress(KubeError):
            await kube.delete(POOLS, "spot", system.namespace)
            await kube.delete(CAPI_POOLS, "spot", system.namespace)
        await kube.close()


async def test_an_on_demand_pod_gets_its_own_vm_which_goes_with_the_pod(system: System) -> None:
    kube = await system.kube()
    log = system.operator_log
    ns = system.namespace
    try:
        await kube.create(
            PODS,
            {
                "metadata": {
                    "name": "batch-job",
                    "namespace": ns,
                    "annotations": {"on-demand.nstance.dev/group": "web"},
                },
                "spec": {"containers": [{"name": "c", "image": "x"}]},
            },
            ns,
        )

        async def created() -> dict[str, Any] | None:
            # The instance ID is written before CreateInstance (crash safety) and replaced when the
            # shard asks for another kind prefix: only the InstanceCreated condition makes it final.
            machine = await kube.get(MACHINES, "on-demand-batch-job", ns)
            status = (machine or {}).get("status") or {}
            conditions = status.get("conditions") or []
            if not any(c.get("type") == "InstanceCreated" and c.get("status") == "True" for c in conditions):
                return None
            return status if status.get("instanceID") and status.get("shard") else None

        status = await eventually(
            created, what="an NstanceMachine with an instance", log=log, within=60, every=0.2
        )
        shard, iid = str(status["shard"]), str(status["instanceID"])
        assert await kube.get(CAPI_MACHINES, "on-demand-batch-job", ns) is not None

        async def vm_exists() -> bool:
            return any(r["instance_id"] == iid and r.get("on_demand") for r in system.live(shard, "web"))

        await eventually(vm_exists, what="the on-demand VM on its shard", log=log, within=60, every=0.2)

        await kube.delete(PODS, "batch-job", ns)

        async def cleaned() -> bool:
            machine = await kube.get(MACHINES, "on-demand-batch-job", ns)
            capi = await kube.get(CAPI_MACHINES, "on-demand-batch-job", ns)
            vm_live = any(r["instance_id"] == iid for r in system.live(shard, "web"))
            return machine is None and capi is None and not vm_live

        await eventually(
            cleaned, what="machine objects and VM gone with the pod", log=log, within=60, every=0.2
        )
    finally:
        await kube.close()


async def test_the_webhook_refuses_changing_the_template_of_a_static_group(system: System) -> None:
    kube = await system.kube()
    log = system.operator_log
    try:

        async def imported() -> dict[str, Any] | None:
            pool = await kube.get(POOLS, "web", system.namespace)
            return pool if pool and (pool.get("status") or {}).get("isStatic") else None

        pool = await eventually(
            imported, what="static group web imported with isStatic", log=log, within=60, every=0.2
        )
        assert pool["spec"]["shards"] == list(SHARDS)
        with pytest.raises(KubeError) as refused:
            await kube.patch(POOLS, "web", {"spec": {"template": "other"}}, system.namespace)
        assert refused.value.status in (400, 403, 422)
        assert "spec.template" in refused.value.message
        assert "denied the request" in refused.value.message
        # Changing what static groups allow (vars) still works.
        await kube.patch(POOLS, "web", {"spec": {"vars": {"tier": "gold"}}}, system.namespace)
    finally:
        await kube.close()


EXAMPLES = REPO / "examples" / "kubernetes"
LEASES = Resource("coordination.k8s.io", "v1", "leases", "Lease")
CAPI_CLUSTERS = Resource(names.CAPI_GROUP, names.CAPI_VERSION, "clusters", "Cluster")
NSTANCE_CLUSTERS = Resource(names.GROUP, names.VERSION, "nstanceclusters", "NstanceCluster")
EXAMPLE_KINDS = {
    r.kind: r
    for r in (
        CAPI_CLUSTERS,
        NSTANCE_CLUSTERS,
        CAPI_POOLS,
        POOLS,
        PODS,
        Resource(names.CAPI_GROUP, names.CAPI_VERSION, "machinedeployments", "MachineDeployment"),
        Resource(names.GROUP, names.VERSION, "nstancemachinetemplates", "NstanceMachineTemplate"),
    )
}


async def apply_example(kube: Kube, namespace: str, filename: str) -> None:
    """Create every object of ``examples/kubernetes/<filename>`` in ``namespace``, as ``kubectl apply``."""
    for doc in load_manifests([EXAMPLES / filename]):
        body = {k: v for k, v in doc.items() if k not in ("apiVersion", "kind")}
        await kube.create(EXAMPLE_KINDS[doc["kind"]], body, namespace)


def kubectl(system: System, *args: str) -> str:
    done = subprocess.run(
        [str(KUBECTL), "--kubeconfig", str(system.kubeconfig), "-n", system.namespace, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
    return done.stdout


async def test_the_examples_apply_and_the_machine_pool_scales(system: System) -> None:
    kube = await system.kube()
    log = system.operator_log
    try:
        await apply_example(kube, system.namespace, "cluster.yaml")
        await apply_example(kube, system.namespace, "machinepool.yaml")
        if system.backend == "real":  # Cluster API's own CRDs: MachineDeployment is served there
            await apply_example(kube, system.namespace, "machinedeployment.yaml")

        async def spread() -> bool:
            return system.group_sizes("workers") == {"zone-a": 2, "zone-b": 1}

        await eventually(
            spread, what="the example pool's 3 replicas spread 2 + 1", log=log, within=60, every=0.2
        )

        async def cluster_ready() -> bool:
            obj = await kube.get(NSTANCE_CLUSTERS, "demo", system.namespace) or {}
            return bool(((obj.get("status") or {}).get("initialization") or {}).get("provisioned"))

        await eventually(
            cluster_ready, what="the example NstanceCluster provisioned", log=log, within=60, every=0.2
        )

        if system.backend == "real" and KUBECTL:  # the scale subresource of Cluster API's MachinePool CRD
            assert "scaled" in kubectl(system, "scale", "machinepool", "workers", "--replicas", "1")
            columns = kubectl(system, "get", "nstancemachinepools", "workers").splitlines()[0].split()
            assert columns == ["NAME", "GROUP", "SHARDS", "REPLICAS", "READY", "STATIC", "AGE"]
        else:
            await kube.patch(CAPI_POOLS, "workers", {"spec": {"replicas": 1}}, system.namespace)

        async def scaled() -> bool:
            return system.group_sizes("workers") == {"zone-a": 1, "zone-b": 0}

        await eventually(scaled, within=90, what="the example pool scaled to 1", log=log, every=0.2)
    finally:
        with contextlib.suppress(KubeError):
            await kube.delete(POOLS, "workers", system.namespace)
            await kube.delete(CAPI_POOLS, "workers", system.namespace)
        await kube.close()


async def test_the_operator_writes_cluster_apis_kubeconfig_secret(system: System) -> None:
    cluster = f"{system.cluster.cluster_id}--default"
    kube = await system.kube()
    try:

        async def written() -> dict[str, Any] | None:
            return await kube.get(SECRETS, f"{cluster}-kubeconfig", system.namespace)

        secret = await eventually(
            written, within=30, what="Secret <cluster>-kubeconfig", log=system.operator_log, every=0.2
        )
        assert secret["metadata"]["labels"][names.CAPI_CLUSTER_NAME_LABEL] == cluster
        assert names.TOKEN_EXPIRY_ANNOTATION in secret["metadata"]["annotations"]
        config = yaml.safe_load(base64.b64decode(secret["data"][names.KUBECONFIG_SECRET_KEY]))
        assert config["current-context"] == cluster
        assert config["clusters"][0]["cluster"]["server"] == "https://kubernetes.default.svc:443"
        token = config["users"][0]["user"]["token"]
        if system.backend == "real":
            # The token is the workload ServiceAccount's, for this API server.
            review = Resource("authentication.k8s.io", "v1", "selfsubjectreviews", "SelfSubjectReview", False)
            admin = await load_configuration(str(system.kubeconfig))
            bearer = Configuration()
            bearer.host, bearer.ssl_ca_cert = admin.host, admin.ssl_ca_cert
            bearer.api_key = {"BearerToken": token}
            bearer.api_key_prefix = {"BearerToken": "Bearer"}
            as_account = Kube.from_configuration(bearer)
            try:
                answer = await as_account.create(review, {})
            finally:
                await as_account.close()
            user = answer["status"]["userInfo"]["username"]
            assert user == f"system:serviceaccount:{system.namespace}:{names.CAPI_WORKLOAD_SERVICE_ACCOUNT}"
    finally:
        await kube.close()


async def test_the_operator_holds_the_lease_and_renews_it(system: System) -> None:
    kube = await system.kube()
    try:
        lease = await kube.get(LEASES, names.LEADER_ELECTION_LEASE, system.namespace)
        assert lease is not None
        holder, renewed = lease["spec"]["holderIdentity"], lease["spec"]["renewTime"]
        assert holder

        async def renewed_again() -> bool:
            current = await kube.get(LEASES, names.LEADER_ELECTION_LEASE, system.namespace) or {}
            spec = current.get("spec") or {}
            return spec.get("holderIdentity") == holder and spec.get("renewTime") != renewed

        await eventually(
            renewed_again,
            within=20,
            what="the Lease renewed by its holder",
            log=system.operator_log,
            every=0.2,
        )
    finally:
        await kube.close()


async def test_a_shard_down_and_back_gets_its_share(system: System) -> None:
    kube = await system.kube()
    log = system.operator_log
    try:
        await create_pool(kube, system, "resilient", list(SHARDS), 2)

        async def one_each() -> bool:
            return system.group_sizes("resilient") == {"zone-a": 1, "zone-b": 1}

        await eventually(one_each, what="1 + 1 before the shard goes down", log=log, within=60, every=0.2)
        server = system.shards["zone-b"]
        assert server.process is not None
        server.process.stop()
        await kube.patch(CAPI_POOLS, "resilient", {"spec": {"replicas": 4}}, system.namespace)
        assert system.operator is not None
        assert system.operator.proc is not None

        async def zone_a_grows() -> bool:
            return system.group_sizes_of("zone-a", "resilient") == 2

        await eventually(
            zone_a_grows, what="zone-a given its share while zone-b is down", log=log, within=60, every=0.2
        )
        assert system.operator.proc.poll() is None
        system.start_shard("zone-b")

        async def two_each() -> bool:
            return system.group_sizes("resilient") == {"zone-a": 2, "zone-b": 2}

        await eventually(two_each, within=90, what="zone-b given its share once back", log=log, every=0.2)
    finally:
        with contextlib.suppress(KubeError):
            await kube.delete(POOLS, "resilient", system.namespace)
            await kube.delete(CAPI_POOLS, "resilient", system.namespace)
        await kube.close()


def test_no_pool_is_created_until_every_shard_has_answered(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    with kubernetes(tmp_path, request, "emulator") as (kubeconfig, namespace):
        sys_ = make_system(tmp_path, kubeconfig, namespace)
        try:
            sys_.start_shard("zone-a")
            asyncio.run(sys_.bootstrap())
            operator = sys_.start_operator()
            operator.wait_ready(60)

            async def pools() -> list[str]:
                kube = await sys_.kube()
                try:
                    return [p["metadata"]["name"] for p in await kube.list(POOLS, namespace)]
                finally:
                    await kube.close()

            # Absence is proven by events, not by a pause: the operator has decided to wait for zone-b
            # and has since failed to reach it again twice (each failure is followed by a write pass).
            async def decided_repeatedly() -> bool:
                text = operator.log_text()
                return (
                    "waiting for ListGroups of shard(s) zone-b" in text
                    and text.count("shard zone-b: WatchGroups lost") >= 2
                )

            asyncio.run(
                eventually(
                    decided_repeatedly,
                    what="the operator waiting for zone-b twice",
                    log=operator.log,
                    within=60,
                    every=0.2,
                )
            )
            assert operator.proc is not None
            assert operator.proc.poll() is None
            assert asyncio.run(pools()) == []
            sys_.start_shard("zone-b")

            async def created() -> bool:
                return await pools() == ["web"]

            asyncio.run(
                eventually(created, within=60, what="pool web once zone-b is up", log=operator.log, every=0.2)
            )
        finally:
            sys_.stop()
