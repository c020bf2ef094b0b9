"""The whole operator runtime on the Kubernetes API emulator with real shard servers.

What a user sees:

* ``/readyz`` says exactly what is missing (here the nonce Secret) and turns ready once the operator has
  registered and reached a shard; ``/healthz`` and ``/metrics`` answer;
* the leader runs kopf with the handlers (reached through ``memo.ctx``), a self-signed validating webhook
  kopf registers itself, ``ensure_cluster`` and the sync/drain loops;
* editing the ConfigMap adds and removes a shard without a restart; an invalid edit keeps the running
  config and leaves an Event on the ConfigMap;
* ``nstance-operator`` (the CLI) becomes ready and exits 0 on SIGTERM, and on SIGHUP.

Every wait is bounded and fails with what it waited for (a runtime that does not stop fails with the
place it is stuck at) instead of running into the suite's timeout.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import kopf
import pytest
from operator_harness import CRDS, connect

from nstance.core.backoff import Backoff
from nstance.operator import runtime as runtime_module
from nstance.operator.context import OperatorContext
from nstance.operator.kube import CONFIGMAPS, EVENTS, LEASES, SECRETS, Kube, KubeError
from nstance.operator.runtime import OperatorRuntime, RuntimeOptions
from nstance.operator.settings import OperatorSettings, SettingsError, build_settings
from nstance.pki.nonce import operator_nonce_claims, sign_nonce
from nstance.testing.kubeapi import KubeAPIServer
from nstance.testing.procs import popen_as_terminal_job
from nstance.testing.shardproc import (
    LocalCluster,
    ServerProcess,
    free_port,
    server_addrs,
    shard_config,
    start_leader,
)
from nstance.testing.waiting import eventually

ELECTION = {"frequent_interval": "200ms", "infrequent_interval": "1s", "leader_timeout": "6s"}


@pytest.fixture(scope="module")
def shards(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[LocalCluster, dict[str, dict[str, str]], Path]]:
    root = tmp_path_factory.mktemp("runtime")
    cluster = LocalCluster(root / "bucket")
    cluster.init()
    addrs = {shard: server_addrs() for shard in ("zone-a", "zone-b")}
    processes: list[ServerProcess] = []
    try:
        for shard in ("zone-a", "zone-b"):
            cluster.write_config(shard, shard_config(shard=shard, addrs=addrs[shard], election=ELECTION))
            processes.append(start_leader(cluster, root / shard, shard=shard))
        yield cluster, addrs, root
    finally:
        for process in processes:
            process.stop()


@pytest.fixture
async def emulator(tmp_path: Path) -> AsyncIterator[tuple[KubeAPIServer, Kube, Path]]:
    async with KubeAPIServer(crds=[CRDS]) as server:
        kubeconfig = tmp_path / "kubeconfig"
        kube = await connect(server, kubeconfig)
        try:
            yield server, kube, kubeconfig
        finally:
            await kube.close()


def config_yaml(addrs: dict[str, dict[str, str]], *shards: str) -> str:
    lines = ["cluster_id: test", "tenant: default", "shards:"]
    for shard in shards:
        reg, op = addrs[shard]["registration_addr"], addrs[shard]["operator_addr"]
        lines.append(f"  {shard}: {{registration_addr: '{reg}', operator_addr: '{op}'}}")
    return "\n".join(lines) + "\n"


def http_get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except (urllib.error.URLError, OSError) as exc:
        return 0, str(exc)


async def get(port: int, path: str) -> tuple[int, str]:
    return await asyncio.to_thread(http_get, port, path)


async def stopped(task: asyncio.Task[None], within: float, what: str) -> None:
    """Wait, bounded, for a runtime to end (not asyncio.wait_for: after its timeout it waits for the
    cancelled task without a limit); a runtime that does not end fails with the place it is stuck at."""
    done, _ = await asyncio.wait([task], timeout=within)
    if not done:
        where = io.StringIO()
        task.print_stack(file=where)
        task.cancel()
        pytest.fail(f"timed out after {within:g}s waiting for {what}; it is at:\n{where.getvalue()}")
    if not task.cancelled():
        task.exception()  # retrieved here; the caller decides whether an error fails the test


class Recorder:
    """What the lead session handed to ensure_cluster, the loops and the kopf handlers."""

    def __init__(self) -> None:
        self.clusters: list[str] = []
        self.loops: list[str] = []
        self.handled: list[tuple[str, str]] = []

    async def ensure_cluster(self, ctx: OperatorContext) -> None:
        self.clusters.append(ctx.capi_cluster_name)

    def component(self, label: str) -> Callable[[OperatorContext], Any]:
        recorder = self

        class Loop:
            def __init__(self, ctx: OperatorContext) -> None:
                self.ctx = ctx

            async def run(self) -> None:
                recorder.loops.append(f"{label}:{self.ctx.tenant}")
                await asyncio.Event().wait()

        return Loop

    def register(self, registry: kopf.OperatorRegistry) -> None:
        @kopf.on.create("", "v1", "configmaps", labels={"probe": "yes"}, registry=registry)
        async def seen(name: str, memo: kopf.Memo, **_: Any) -> None:
            self.handled.append((name, memo.ctx.cluster_id))

        @kopf.on.validate(
            "", "v1", "configmaps", labels={"probe": "yes"}, id="probe-check", registry=registry
        )
        def check(body: Any, **_: Any) -> None:
            if (body.get("data") or {}).get("bad"):
                raise kopf.AdmissionError("probe: 'bad' is not allowed")


async def test_the_runtime_registers_leads_and_follows_its_configmap(
    shards: tuple[LocalCluster, dict[str, dict[str, str]], Path],
    emulator: tuple[KubeAPIServer, Kube, Path],
    tmp_path: Path,
) -> None:
    cluster, addrs, _ = shards
    server, kube, kubeconfig = emulator
    assert cluster.identity is not None
    ca = {
        "metadata": {"name": "nstance-cluster-ca"},
        "data": {"ca.crt": cluster.identity.ca.cert_pem.decode()},
    }
    await kube.create(CONFIGMAPS, ca, "default")
    config_map = {
        "metadata": {"name": "nstance-operator-config"},
        "data": {"config.yaml": config_yaml(addrs, "zone-a")},
    }
    await kube.create(CONFIGMAPS, config_map, "default")

    health = free_port()
    settings = build_settings(
        namespace="default",
        kubeconfig=str(kubeconfig),
        health_addr=f"127.0.0.1:{health}",
        webhook_addr=f"127.0.0.1:{free_port()}",
        webhook_self_signed=True,
        webhook_managed="test.operator.nstance.dev",
        webhook_host="127.0.0.1",
        # Not a test of Lease timing: a deadline a starved machine does not reach (at load 28 a 2 s one
        # passed on its own and the replica went standby in the middle of the test).
        leader_elect_lease_duration="15s",
        leader_elect_renew_interval="1s",
        leader_elect_renew_deadline="10s",
        holder_identity="runtime-test",
        environ={},
    )
    recorder = Recorder()
    runtime = OperatorRuntime(
        settings,
        options=RuntimeOptions(identity_backoff=Backoff(base=0.05, cap=0.2), webhook_dir=tmp_path),
        register_handlers=recorder.register,
        ensure_cluster=recorder.ensure_cluster,
        components=[("sync manager", recorder.component("sync")), ("drain", recorder.component("drain"))],
    )
    task = asyncio.create_task(runtime.run())
    try:
        assert (await get_eventually(health, "/healthz")) == (200, "ok\n")

        async def says_nonce_missing() -> bool:
            status, body = await get(health, "/readyz")
            return status == 503 and "nstance-operator-nonce" in body

        await eventually(says_nonce_missing, what="/readyz to name the missing nonce Secret")
        _, body = await get(health, "/readyz")
        assert "leader: no operator identity" in body
        assert "nstance-admin cluster nonce --cluster-id test --tenant default" in body

        token = sign_nonce(
            cluster.identity.nonce_key, operator_nonce_claims(cluster_id="test", tenant="default")
        )
        nonce = {"metadata": {"name": "nstance-operator-nonce"}, "data": {"nonce.jwt": b64(token)}}
        await kube.create(SECRETS, nonce, "default")
        await eventually(lambda: runtime.active, what="the lead session to start")

        async def leading_and_ready() -> bool:  # a following standby is ready (200) as well
            status, body = await get(health, "/readyz")
            return status == 200 and body.startswith("leader: zone-a: reachable")

        await eventually(leading_and_ready, within=60, what="/readyz 200 as the leader")
        assert await kube.get(SECRETS, "nstance-operator-nonce", "default") is None
        # Once per session (a starved machine may cost an extra term, which starts another).
        assert recorder.clusters
        assert set(recorder.clusters) == {"test--default"}
        await eventually(
            lambda: sorted(recorder.loops) == ["drain:default", "sync:default"], what="the loops"
        )
        _, metrics = await get(health, "/metrics")
        assert "nstance_operator_leader 1.0" in metrics
        assert 'nstance_operator_registrations_total{result="ok"} 1.0' in metrics

        # kopf runs the handlers with the context in memo, and serves the webhook it registered itself.
        probe = {"metadata": {"name": "probe", "labels": {"probe": "yes"}}, "data": {"x": "1"}}
        await eventually(
            lambda: server.store.find(webhook_type(server), None, "test.operator.nstance.dev") is not None,
            what="kopf to register its ValidatingWebhookConfiguration",
        )
        await kube.create(CONFIGMAPS, probe, "default")
        await eventually(lambda: recorder.handled == [("probe", "test")], what="the kopf handler")
        bad = {"metadata": {"name": "bad", "labels": {"probe": "yes"}}, "data": {"bad": "1"}}
        with pytest.raises(KubeError) as refused:
            await kube.create(CONFIGMAPS, bad, "default")
        assert "probe: 'bad' is not allowed" in refused.value.message

        # A ConfigMap edit adds zone-b, then removes it; no restart.
        await edit_config(kube, config_yaml(addrs, "zone-a", "zone-b"))
        await eventually(
            lambda: runtime.shards is not None and list(runtime.shards.configured()) == ["zone-a", "zone-b"],
            what="zone-b to be added",
        )
        await eventually(
            lambda: runtime.shards is not None and runtime.shards.reachable("zone-b"), what="zone-b up"
        )
        await edit_config(kube, config_yaml(addrs, "zone-a"))
        await eventually(
            lambda: runtime.shards is not None and list(runtime.shards.configured()) == ["zone-a"],
            what="zone-b to be removed",
        )

        # An invalid edit keeps the running config and is reported on the ConfigMap.
        await edit_config(kube, "cluster_id: test\ntenant: default\nshards: {}\n")

        async def invalid_event() -> bool:
            events = await kube.list(EVENTS, "default")
            return any(
                e.get("reason") == "InvalidConfig"
                and e["involvedObject"].get("name") == "nstance-operator-config"
                for e in events
            )

        await eventually(invalid_event, what="an InvalidConfig Event")
        assert runtime.shards is not None
        assert list(runtime.shards.configured()) == ["zone-a"]
        assert runtime.active

        runtime.request_stop()
        await stopped(task, 15, "the runtime to stop after request_stop")
        task.result()  # it ended without an error
        lease = await kube.get(LEASES, "nstance-operator-leader-election", "default")
        assert lease is not None
        assert lease["spec"]["holderIdentity"] == ""  # released for a standby
    finally:
        runtime.request_stop()
        await stopped(task, 20, "the runtime to stop")


def webhook_type(server: KubeAPIServer) -> Any:
    rtype = server.registry.lookup("admissionregistration.k8s.io", "v1", "validatingwebhookconfigurations")
    assert rtype is not None
    return rtype


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


async def get_eventually(port: int, path: str) -> tuple[int, str]:
    result: tuple[int, str] = (0, "")

    async def answered() -> bool:
        nonlocal result
        result = await get(port, path)
        return result[0] != 0

    await eventually(answered, what=f"{path} to answer")
    return result


async def edit_config(kube: Kube, text: str) -> None:
    await kube.patch(CONFIGMAPS, "nstance-operator-config", {"data": {"config.yaml": text}}, "default")


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
async def test_the_cli_runs_the_operator_and_exits_cleanly_on_a_stop_signal(
    shards: tuple[LocalCluster, dict[str, dict[str, str]], Path],
    emulator: tuple[KubeAPIServer, Kube, Path],
    tmp_path: Path,
    stop: signal.Signals,
) -> None:
    cluster, addrs, _ = shards
    _, kube, kubeconfig = emulator
    identity = cluster.operator_identity(tmp_path / "identity")
    await kube.create(
        CONFIGMAPS,
        {"metadata": {"name": "nstance-cluster-ca"}, "data": {"ca.crt": (identity / "ca.crt").read_text()}},
        "default",
    )
    data = {
        "tls.crt": b64((identity / "identity.crt").read_text()),
        "tls.key": b64((identity / "identity.key").read_text()),
    }
    secret = {"metadata": {"name": "nstance-operator-cert"}, "type": "kubernetes.io/tls", "data": data}
    await kube.create(SECRETS, secret, "default")
    config = tmp_path / "config.yaml"
    config.write_text(config_yaml(addrs, "zone-a"))
    health = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NSTANCE_", "KUBERNETES_"))}
    log_path = tmp_path / "operator.log"
    with log_path.open("wb") as log_file:
        process = popen_as_terminal_job(  # SIGHUP at its default even when the tests run under nohup
            [
                sys.executable,
                "-m",
                "nstance.operator",
                "--config",
                str(config),
                "--kubeconfig",
                str(kubeconfig),
                "--namespace",
                "default",
                "--health-addr",
                f"127.0.0.1:{health}",
                "--no-leader-elect",
                "--disable-webhooks",
            ],
            env=env,
            stdout=log_file,
            stderr=log_file,
        )
    try:

        async def ready() -> bool:
            if process.poll() is not None:
                raise AssertionError(f"the operator exited with {process.returncode}: {log_path.read_text()}")
            return (await get(health, "/readyz"))[0] == 200

        await eventually(ready, within=60, what="the CLI operator to become ready")
        _, body = await get(health, "/readyz")
        assert body.startswith("leader: zone-a: reachable")
        process.send_signal(stop)
        code = await asyncio.to_thread(process.wait, 20)
        assert code == 0, log_path.read_text()[-4000:]
        lines = [json.loads(line) for line in log_path.read_text().splitlines() if line.startswith("{")]
        assert any("using the operator certificate" in line["msg"] for line in lines)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)


class Partitioned:
    """The elector's view of the API server during a partition: Lease calls hang."""

    async def get(self, *args: Any, **kwargs: Any) -> Any:
        await asyncio.Event().wait()

    async def replace(self, *args: Any, **kwargs: Any) -> Any:
        await asyncio.Event().wait()

    async def create(self, *args: Any, **kwargs: Any) -> Any:
        await asyncio.Event().wait()


async def test_losing_the_lease_stops_kopf_at_once_and_leading_again_restarts_it(
    shards: tuple[LocalCluster, dict[str, dict[str, str]], Path],
    emulator: tuple[KubeAPIServer, Kube, Path],
    tmp_path: Path,
) -> None:
    cluster, addrs, _ = shards
    _, kube, kubeconfig = emulator
    identity = cluster.operator_identity(tmp_path / "identity")
    ca = {"metadata": {"name": "nstance-cluster-ca"}, "data": {"ca.crt": (identity / "ca.crt").read_text()}}
    await kube.create(CONFIGMAPS, ca, "default")
    data = {
        "tls.crt": b64((identity / "identity.crt").read_text()),
        "tls.key": b64((identity / "identity.key").read_text()),
    }
    secret = {"metadata": {"name": "nstance-operator-cert"}, "type": "kubernetes.io/tls", "data": data}
    await kube.create(SECRETS, secret, "default")
    config_map = {
        "metadata": {"name": "nstance-operator-config"},
        "data": {"config.yaml": config_yaml(addrs, "zone-a")},
    }
    await kube.create(CONFIGMAPS, config_map, "default")
    settings = build_settings(
        namespace="default",
        kubeconfig=str(kubeconfig),
        health_addr=f"127.0.0.1:{free_port()}",
        disable_webhooks=True,
        # A renew deadline a starved machine does not reach by itself (at load 24 the 1.2 s one cost
        # terms over and over, and kopf never got to handle anything); the partition reaches it.
        leader_elect_lease_duration="8s",
        leader_elect_renew_interval="500ms",
        leader_elect_renew_deadline="5s",
        holder_identity="fenced",
        environ={},
    )
    recorder = Recorder()
    runtime = OperatorRuntime(
        settings,
        register_handlers=recorder.register,
        ensure_cluster=recorder.ensure_cluster,
        components=[("sync manager", recorder.component("sync"))],
    )
    kopf_starts: list[int] = []
    """For each start of kopf: how many objects had been handled by then."""
    runtime.on_kopf_started = lambda: kopf_starts.append(len(recorder.handled))
    task = asyncio.create_task(runtime.run())
    try:
        # Should the renew deadline still pass on its own, each loss ends the session and each new term
        # starts one: counts below are relative, not fixed.
        await eventually(lambda: len(kopf_starts) >= 1, within=60, what="kopf to start")
        probe = {"metadata": {"name": "first", "labels": {"probe": "yes"}}}
        await kube.create(CONFIGMAPS, probe, "default")
        await eventually(
            lambda: ("first", "test") in recorder.handled, within=60, what="the first object to be handled"
        )

        # A task started by someone else while kopf runs (a shard stream, say) must survive kopf's stop.
        bystander = asyncio.create_task(asyncio.Event().wait())
        assert runtime.elector is not None
        real = runtime.elector.kube
        runtime.elector.kube = Partitioned()  # type: ignore[assignment]
        # Stopping before another replica may take over (the order) is shown with two replicas in
        # test_operator_leader; this bound only keeps a hang from running into the suite's timeout.
        await eventually(lambda: not runtime.active, within=30, what="the session to stop")
        assert not task.done()
        starts = len(kopf_starts)  # no new term while partitioned
        late = {"metadata": {"name": "late", "labels": {"probe": "yes"}}}
        await kube.create(CONFIGMAPS, late, "default")
        assert runtime.readiness()[1].startswith("standby")
        assert not bystander.done()
        bystander.cancel()

        runtime.elector.kube = real
        await eventually(
            lambda: len(kopf_starts) > starts, within=60, what="kopf to start again after re-election"
        )
        await eventually(
            lambda: ("late", "test") in recorder.handled, within=60, what="the missed object to be handled"
        )
        # Nobody acted on it while the Lease was not held: it was handled only after kopf started again.
        assert recorder.handled.index(("late", "test")) >= kopf_starts[starts]
        # The new term's session ensured the cluster again (as every session does, first thing).
        assert runtime.sessions >= 2
        assert len(recorder.clusters) >= 2
        assert set(recorder.clusters) == {"test--default"}
    finally:
        runtime.request_stop()
        await stopped(task, 20, "the runtime to stop")


async def stored_identity_settings(
    shards: tuple[LocalCluster, dict[str, dict[str, str]], Path],
    emulator: tuple[KubeAPIServer, Kube, Path],
    tmp_path: Path,
    **options: Any,
) -> OperatorSettings:
    """Settings of an operator whose CA, certificate and config are in place (no registration)."""
    cluster, addrs, _ = shards
    _, kube, kubeconfig = emulator
    identity = cluster.operator_identity(tmp_path / "identity")
    ca = {"metadata": {"name": "nstance-cluster-ca"}, "data": {"ca.crt": (identity / "ca.crt").read_text()}}
    await kube.create(CONFIGMAPS, ca, "default")
    data = {
        "tls.crt": b64((identity / "identity.crt").read_text()),
        "tls.key": b64((identity / "identity.key").read_text()),
    }
    secret = {"metadata": {"name": "nstance-operator-cert"}, "type": "kubernetes.io/tls", "data": data}
    await kube.create(SECRETS, secret, "default")
    config = tmp_path / "config.yaml"
    config.write_text(config_yaml(addrs, "zone-a"))
    return build_settings(
        namespace="default",
        kubeconfig=str(kubeconfig),
        config_file=config,
        health_addr=f"127.0.0.1:{free_port()}",
        disable_webhooks=True,
        environ={},
        **options,
    )


async def test_a_loop_that_ignores_its_stop_does_not_keep_the_operator_from_stopping(
    shards: tuple[LocalCluster, dict[str, dict[str, str]], Path],
    emulator: tuple[KubeAPIServer, Kube, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    kube = emulator[1]
    settings = await stored_identity_settings(
        shards,
        emulator,
        tmp_path,
        leader_elect_lease_duration="2s",
        leader_elect_renew_interval="300ms",
        leader_elect_renew_deadline="1200ms",
        holder_identity="stubborn",
    )
    # How long a cancelled task gets before it is cancelled again, then left behind (5 s in production).
    monkeypatch.setattr(runtime_module, "STOP_TIMEOUT", 0.5)
    started = asyncio.Event()

    class Stubborn:
        """A loop stuck in a library call that swallows the first cancel."""

        def __init__(self, ctx: OperatorContext) -> None:
            self.ctx = ctx

        async def run(self) -> None:
            started.set()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.Event().wait()
            await asyncio.Event().wait()

    async def no_cluster(ctx: OperatorContext) -> None:
        return None

    runtime = OperatorRuntime(
        settings,
        options=RuntimeOptions(run_kopf=False),
        ensure_cluster=no_cluster,
        components=[("stubborn loop", Stubborn)],
    )
    task = asyncio.create_task(runtime.run())
    try:
        await eventually(started.is_set, what="the stubborn loop to start")
        runtime.request_stop()
        await stopped(task, 10, "the runtime to stop although a loop ignored its cancel")
        task.result()
        assert "did not stop within 0.5s of being cancelled (stubborn loop); cancelling again" in caplog.text
        lease = await kube.get(LEASES, "nstance-operator-leader-election", "default")
        assert lease is not None
        assert lease["spec"]["holderIdentity"] == ""  # released for a standby all the same
    finally:
        runtime.request_stop()
        await stopped(task, 20, "the runtime to stop")


async def test_rbac_without_the_cluster_rules_does_not_keep_the_operator_from_starting(
    shards: tuple[LocalCluster, dict[str, dict[str, str]], Path],
    emulator: tuple[KubeAPIServer, Kube, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # upstream's first Helm chart grants no rules on nstanceclusters or CAPI clusters: the operator
    # retried the Cluster for ever and never started its controllers
    metrics_port = free_port()
    settings = await stored_identity_settings(
        shards,
        emulator,
        tmp_path,
        metrics_bind_address=f"127.0.0.1:{metrics_port}",  # the chart's :8080
    )
    monkeypatch.setattr(runtime_module, "FORBIDDEN_RETRY_S", 0.2)
    started = asyncio.Event()
    tries = 0

    class Loop:
        def __init__(self, ctx: OperatorContext) -> None:
            self.ctx = ctx

        async def run(self) -> None:
            started.set()
            await asyncio.Event().wait()

    async def forbidden_twice(ctx: OperatorContext) -> None:
        nonlocal tries
        tries += 1
        if tries <= 2:
            raise KubeError(403, "Forbidden", "nstanceclusters.infrastructure.cluster.x-k8s.io is forbidden")

    runtime = OperatorRuntime(
        settings,
        options=RuntimeOptions(run_kopf=False),
        ensure_cluster=forbidden_twice,
        components=[("a loop", Loop)],
    )
    task = asyncio.create_task(runtime.run())
    try:
        await eventually(started.is_set, what="the session's loops to start without the Cluster")
        await eventually(lambda: tries >= 3, what="the Cluster to be tried again in the background")
        assert "not allowed to ensure the NstanceCluster and CAPI Cluster" in caplog.text
        status, body = await asyncio.to_thread(http_get, metrics_port, "/metrics")
        assert status == 200
        assert "nstance_operator_" in body
        assert (await asyncio.to_thread(http_get, metrics_port, "/healthz"))[0] == 404
    finally:
        runtime.request_stop()
        await stopped(task, 20, "the runtime to stop")


async def test_a_bad_capi_endpoint_stops_the_start_with_one_line_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("NSTANCE_CAPI_ENDPOINT", "https://workload.example.com:port")
    runtime = OperatorRuntime(build_settings(namespace="default", disable_webhooks=True, environ={}))
    with pytest.raises(SettingsError, match=r"^NSTANCE_CAPI_ENDPOINT='https://workload.example.com:port': "):
        await runtime.run()

    env = {k: v for k, v in os.environ.items() if not k.startswith(("NSTANCE_", "KUBERNETES_"))}
    env["NSTANCE_CAPI_SERVICEACCOUNT"] = "Bad_Name"
    command = [sys.executable, "-m", "nstance.operator", "--namespace", "default", "--disable-webhooks"]
    done = await asyncio.to_thread(
        subprocess.run, command, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("nstance-operator: NSTANCE_CAPI_SERVICEACCOUNT='Bad_Name': ")
    assert len(done.stderr.strip().splitlines()) == 1
