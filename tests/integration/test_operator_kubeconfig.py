"""Cluster API's kubeconfig Secret, written and renewed by the operator, on two API servers.

Every test runs on the Kubernetes API emulator and on a real kube-apiserver (the session's
``nstance.testing.realkube`` control plane; skipped where it is not built), in a fresh namespace holding
the ``nstance-capi-workload`` ServiceAccount. On the real server the operator's client is the
``nstance-operator`` ServiceAccount bound to the generated ClusterRole (``manifests.rbac_rules``), so the
RBAC the chart installs is what is tested, and the written kubeconfig's token is used against the server
with the generated ``nstance-capi-workload`` role: Cluster API's probe of ``/``, its Node reads and its pod
lookup are allowed, reading Secrets is not.

What a user sees: the Secret ``test--default-kubeconfig`` appears with the label and annotations Cluster
API and the operator read; a token near its expiry is replaced; a Secret the operator did not write is
never touched; a missing ServiceAccount is reported and the Secret appears once it exists; the loop runs
until cancelled (upstream's TestRefreshKubeconfigRunsUntilCanceled).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import ssl
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from kubernetes_asyncio.client import Configuration
from operator_harness import CRDS, connect

from nstance.core.clock import ManualClock
from nstance.operator.context import OperatorContext, Timings
from nstance.operator.controllers.kubeconfig import WorkloadKubeconfig
from nstance.operator.controllers.kubeconfig_secret import Action, WorkloadAccess
from nstance.operator.controllers.resources import NSTANCE_CLUSTERS
from nstance.operator.crds import manifests, names
from nstance.operator.kube import (
    SECRETS,
    SERVICE_ACCOUNTS,
    Kube,
    KubeError,
    Object,
    Resource,
    load_configuration,
)
from nstance.operator.nodes import NodeIndex
from nstance.operator.runtime import default_ensure_cluster
from nstance.rpc import operator_pb2_grpc
from nstance.testing.kubeapi import KubeAPIServer
from nstance.testing.realkube import RealKube
from nstance.testing.waiting import eventually

pytestmark = pytest.mark.timeout(120)

SECRET = "test--default-kubeconfig"
NAMESPACES = Resource("", "v1", "namespaces", "Namespace", namespaced=False)
CLUSTER_ROLES = Resource("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", namespaced=False)
CLUSTER_ROLE_BINDINGS = Resource(
    "rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", namespaced=False
)
FAST = Timings(backoff_base=0.01, backoff_cap=0.05)


class NoShards:
    """The kubeconfig loop never calls a shard."""

    def configured(self) -> Sequence[str]:
        return ()

    def stub(self, shard: str) -> operator_pb2_grpc.OperatorServiceStub:
        raise AssertionError("no shard call expected")

    def reachable(self, shard: str) -> bool:
        return False

    def report(self, shard: str, ok: bool, error: str = "") -> None:
        pass

    async def wait_changed(self) -> None:
        await asyncio.Event().wait()


@dataclass
class Env:
    """One test's API server: an admin client, the namespace, the operator's client and a clock."""

    admin: Kube
    operator: Kube
    ns: str
    clock: ManualClock
    emulator: KubeAPIServer | None
    real: RealKube | None

    def ctx(self) -> OperatorContext:
        return OperatorContext(
            namespace=self.ns,
            cluster_id="test",
            tenant="default",
            kube=self.operator,
            shards=NoShards(),
            nodes=NodeIndex(self.operator),
            clock=self.clock,
            timings=FAST,
        )

    def loop(self, **kwargs: Any) -> WorkloadKubeconfig:
        return WorkloadKubeconfig(self.ctx(), WorkloadAccess(), **kwargs)

    async def secret(self) -> Object | None:
        return await self.admin.get(SECRETS, SECRET, self.ns)

    async def add_workload_account(self) -> None:
        body = {"metadata": {"name": names.CAPI_WORKLOAD_SERVICE_ACCOUNT, "namespace": self.ns}}
        await self.admin.create(SERVICE_ACCOUNTS, body, self.ns)

    def token_requests(self) -> int:
        assert self.emulator is not None
        return sum(1 for method, path in self.emulator.requests if method == "POST" and "/token" in path)


def kubeconfig_of(secret: Object) -> dict[str, Any]:
    return dict(yaml.safe_load(base64.b64decode(secret["data"][names.KUBECONFIG_SECRET_KEY])))


async def bound(admin: Kube, name: str, rules: list[Object], account: str, ns: str) -> None:
    """A ClusterRole ``name`` with ``rules`` bound to ServiceAccount ``ns/account`` (real server only)."""
    await admin.create(CLUSTER_ROLES, {"metadata": {"name": name}, "rules": rules})
    binding = {
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": ns}],
    }
    await admin.create(CLUSTER_ROLE_BINDINGS, binding)


async def service_account_client(admin: Kube, real: RealKube, account: str, ns: str) -> Kube:
    """A client authenticated as ServiceAccount ``ns/account`` with one of its tokens."""
    answer = await admin.request_token(account, ns, expiration_seconds=3600)
    configuration = Configuration()
    configuration.host = real.url
    configuration.ssl_ca_cert = str(real.ca_file)
    configuration.api_key = {"BearerToken": answer["status"]["token"]}
    configuration.api_key_prefix = {"BearerToken": "Bearer"}
    return Kube.from_configuration(configuration)


@pytest.fixture(params=["emulator", "real"])
async def env(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Env]:
    clock = ManualClock(datetime.now(UTC))
    async with contextlib.AsyncExitStack() as stack:
        if request.param == "emulator":
            server = await stack.enter_async_context(KubeAPIServer(crds=[CRDS]))
            admin = await connect(server, tmp_path / "kubeconfig")
            stack.push_async_callback(admin.close)
            yield Env(admin, admin, "default", clock, server, None)
            return
        real: RealKube = request.getfixturevalue("real_kube")
        admin = Kube.from_configuration(await load_configuration(str(real.kubeconfig)))
        stack.push_async_callback(admin.close)
        ns = f"kubeconfig-{uuid.uuid4().hex[:8]}"
        await admin.create(NAMESPACES, {"metadata": {"name": ns}})
        stack.push_async_callback(admin.delete, NAMESPACES, ns)
        operator_role = f"nstance-operator-{ns}"
        stack.push_async_callback(admin.delete, CLUSTER_ROLE_BINDINGS, operator_role)
        stack.push_async_callback(admin.delete, CLUSTER_ROLES, operator_role)
        await admin.create(SERVICE_ACCOUNTS, {"metadata": {"name": names.OPERATOR_NAME, "namespace": ns}}, ns)
        await bound(admin, operator_role, manifests.rbac_rules(), names.OPERATOR_NAME, ns)
        operator = await service_account_client(admin, real, names.OPERATOR_NAME, ns)
        stack.push_async_callback(operator.close)

        async def authorized() -> bool:  # the new binding reaches the authorizer's cache
            await operator.get(SECRETS, SECRET, ns)
            return True

        await eventually(authorized, within=20, every=0.1, ignoring=KubeError, what="the operator's RBAC")
        yield Env(admin, operator, ns, clock, None, real)


async def test_the_first_check_writes_the_secret_cluster_api_reads(env: Env) -> None:
    await env.add_workload_account()
    decision = await env.loop().check()
    assert decision.action is Action.CREATE
    secret = await env.secret()
    assert secret is not None
    meta = secret["metadata"]
    assert meta["labels"] == {"cluster.x-k8s.io/cluster-name": "test--default"}
    assert meta["annotations"][names.MANAGED_BY_ANNOTATION] == names.MANAGED_BY_VALUE
    expiry = datetime.fromisoformat(meta["annotations"][names.TOKEN_EXPIRY_ANNOTATION])
    assert timedelta(minutes=59) < expiry - datetime.now(UTC) <= timedelta(hours=1)
    assert secret["type"] == "Opaque"
    config = kubeconfig_of(secret)
    assert config["current-context"] == "test--default"
    assert config["clusters"][0]["cluster"]["server"] == "https://kubernetes.default.svc:443"
    token = config["users"][0]["user"]["token"]
    assert token.count(".") == 2
    # Nothing changes while the token is fresh.
    assert (await env.loop().check()).action is Action.KEEP
    again = await env.secret()
    assert again is not None
    assert again["metadata"]["resourceVersion"] == meta["resourceVersion"]
    if env.real is not None:
        await token_may_do_what_cluster_api_does(env, config)


async def token_may_do_what_cluster_api_does(env: Env, config: dict[str, Any]) -> None:
    """On the real server: the kubeconfig's CA verifies the server, and its token (of
    ``nstance-capi-workload``, bound to the generated role) may do what Cluster API does, and no more."""
    assert env.real is not None
    role = f"nstance-capi-workload-{env.ns}"
    try:
        await bound(
            env.admin, role, manifests.capi_workload_rules(), names.CAPI_WORKLOAD_SERVICE_ACCOUNT, env.ns
        )
        ca = base64.b64decode(config["clusters"][0]["cluster"]["certificate-authority-data"])
        assert ca == env.real.ca_file.read_bytes()
        context = ssl.create_default_context(cadata=ca.decode())
        headers = {"Authorization": f"Bearer {config['users'][0]['user']['token']}"}
        async with aiohttp.ClientSession(headers=headers) as session:

            async def status(path: str) -> int:
                async with session.get(env.real.url + path, ssl=context) as response:  # type: ignore[union-attr]
                    return response.status

            async def allowed() -> bool:
                return await status("/") == 200

            await eventually(allowed, within=20, every=0.1, what="the nstance-capi-workload binding")
            assert await status("/api/v1/nodes") == 200
            assert await status(f"/api/v1/namespaces/{env.ns}/pods/capi-controller") == 404  # not 403
            assert await status(f"/api/v1/namespaces/{env.ns}/secrets") == 403
    finally:
        await env.admin.delete(CLUSTER_ROLE_BINDINGS, role)
        await env.admin.delete(CLUSTER_ROLES, role)


async def test_a_token_near_its_expiry_is_replaced_in_place(env: Env) -> None:
    await env.add_workload_account()
    loop = env.loop()
    await loop.check()
    first = await env.secret()
    assert first is not None
    await env.admin.patch(SECRETS, SECRET, {"metadata": {"labels": {"team": "infra"}}}, env.ns)
    env.clock.advance(timedelta(minutes=51))  # nine minutes left
    assert (await loop.check()).action is Action.RENEW
    renewed = await env.secret()
    assert renewed is not None
    assert renewed["metadata"]["uid"] == first["metadata"]["uid"]
    assert renewed["metadata"]["labels"]["team"] == "infra"
    assert kubeconfig_of(renewed)["users"] != kubeconfig_of(first)["users"]


async def test_upstreams_secret_is_renewed_and_an_admins_secret_never_touched(env: Env) -> None:
    await env.add_workload_account()
    body = {
        "metadata": {
            "name": SECRET,
            "namespace": env.ns,
            "labels": {names.CAPI_CLUSTER_NAME_LABEL: "test--default"},
        },
        "data": {"value": base64.b64encode(b"apiVersion: v1\nkind: Config\n").decode()},
    }
    admins = await env.admin.create(SECRETS, body, env.ns)
    loop = env.loop()
    assert (await loop.check()).action is Action.FOREIGN
    env.clock.advance(timedelta(days=1))
    assert (await loop.check()).action is Action.FOREIGN
    unchanged = await env.secret()
    assert unchanged is not None
    assert unchanged["metadata"]["resourceVersion"] == admins["metadata"]["resourceVersion"]
    if env.emulator is not None:
        assert env.token_requests() == 0

    # A Secret upstream's Go operator wrote carries only the expiry annotation, in its own time zone.
    expired = (env.clock.now() - timedelta(hours=1)).astimezone().isoformat(timespec="seconds")
    await env.admin.patch(
        SECRETS, SECRET, {"metadata": {"annotations": {names.TOKEN_EXPIRY_ANNOTATION: expired}}}, env.ns
    )
    assert (await loop.check()).action is Action.RENEW
    renewed = await env.secret()
    assert renewed is not None
    assert renewed["metadata"]["annotations"][names.MANAGED_BY_ANNOTATION] == names.MANAGED_BY_VALUE
    assert kubeconfig_of(renewed)["users"][0]["user"]["token"]


class Ticks:
    """The loop's sleep: records each delay and returns when the test sends a tick."""

    def __init__(self) -> None:
        self.delays: list[float] = []
        self.waiting = asyncio.Event()
        self._ticks: asyncio.Queue[None] = asyncio.Queue()

    async def sleep(self, delay: float) -> None:
        self.delays.append(delay)
        self.waiting.set()
        await self._ticks.get()
        self.waiting.clear()

    def tick(self) -> None:
        self._ticks.put_nowait(None)


async def test_the_loop_reports_a_missing_account_retries_sooner_and_runs_until_cancelled(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    ticks = Ticks()
    caplog.set_level(logging.WARNING, "nstance.operator.controllers.kubeconfig")
    task = asyncio.create_task(env.loop(sleep=ticks.sleep).run())
    try:
        await eventually(lambda: len(ticks.delays) == 1, within=10, every=0.02, what="the first check")
        assert ticks.delays[0] <= FAST.backoff_cap * 1.25  # a failure is retried with backoff
        assert (
            f"the ServiceAccount {env.ns}/{names.CAPI_WORKLOAD_SERVICE_ACCOUNT} does not exist" in caplog.text
        )
        assert await env.secret() is None

        await env.add_workload_account()
        ticks.tick()
        await eventually(lambda: len(ticks.delays) == 2, within=10, every=0.02, what="the second check")
        assert await env.secret() is not None
        assert ticks.delays[1] == 300.0  # then every five minutes

        await env.admin.delete(SECRETS, SECRET, env.ns)
        ticks.tick()
        await eventually(lambda: len(ticks.delays) == 3, within=10, every=0.02, what="the third check")
        assert await env.secret() is not None  # written again
    finally:
        task.cancel()
        done, _ = await asyncio.wait([task], timeout=5)
    assert done, "the kubeconfig loop did not stop when cancelled"


async def test_an_external_endpoint_is_the_control_plane_endpoint(env: Env) -> None:
    if env.emulator is None:
        pytest.skip("the NstanceCluster CRDs are installed on the emulator only")
    access = WorkloadAccess.from_environ({"NSTANCE_CAPI_ENDPOINT": "https://workload.example.com:6443"})
    await default_ensure_cluster(access)(env.ctx())
    cluster = await env.admin.get(NSTANCE_CLUSTERS, "test--default", env.ns)
    assert cluster is not None
    assert cluster["spec"]["controlPlaneEndpoint"] == {"host": "workload.example.com", "port": 6443}
    assert await env.secret() is None
