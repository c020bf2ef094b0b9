"""The local provider with real agent processes: what they receive, how long they live, and that a
restarted server (a new LocalProvider on the same directory) finds them. No process outlives a test."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from nstance import __version__
from nstance.core.clock import ManualClock
from nstance.core.errors import InvalidArgument
from nstance.core.ids import new_instance_id
from nstance.pki.ca import create_ca
from nstance.providers.base import CreateRequest, InstanceNotFound, InstanceStatus
from nstance.providers.local import LocalProvider, local_provider_from_options
from nstance.testing.requests import sample_create_request
from nstance.testing.shardproc import free_port
from nstance.testing.waiting import eventually

CA_PEM = create_ca().cert_pem  # a real CA: the agent refuses to start with an unreadable ca.crt


def req(cluster_id: str = "c1", shard: str = "s1") -> CreateRequest:
    return sample_create_request(
        cluster_id=cluster_id,
        shard=shard,
        instance_type="local",
        subnet_id="lo",
        userdata=b"#!/bin/sh\necho hello\n",
        ca_pem=CA_PEM,
        nonce="eyJhbGciOiJFZERTQSJ9.claims.sig",
        server_registration_addr="127.0.0.1:8991",
        server_agent_addr="127.0.0.1:8992",
    )


def pid_of(provider: LocalProvider, instance_id: str) -> int:
    pid = json.loads((provider.instance_dir(instance_id) / "instance.json").read_text())["pid"]
    assert isinstance(pid, int)
    return pid


def running(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


def agent_log(provider: LocalProvider, instance_id: str) -> str:
    log = provider.instance_dir(instance_id) / "agent.log"
    return log.read_text() if log.exists() else ""


def agent_waiting(provider: LocalProvider, instance_id: str) -> bool:
    return f"nstance-agent {__version__} for {instance_id}" in agent_log(provider, instance_id)


@pytest.fixture
async def make_provider(tmp_path: Path) -> AsyncIterator[Callable[..., LocalProvider]]:
    """Build LocalProviders on one directory; afterwards stop every agent and prove none is left."""
    base = tmp_path / "instances"
    clock = ManualClock()
    made: list[LocalProvider] = []

    def make(**kwargs: object) -> LocalProvider:
        provider = LocalProvider(base, clock=clock, **kwargs)  # type: ignore[arg-type]
        made.append(provider)
        return provider

    yield make
    pids = [
        json.loads(p.read_text())["pid"]
        for p in base.glob("*/instance.json")
        if json.loads(p.read_text())["pid"]
    ]
    await LocalProvider(base, clock=clock, stop_instances_on_close=True).close()
    for provider in made:
        await provider.close()
    assert [pid for pid in pids if running(pid)] == [], "agent processes outlived the test"


async def test_agent_gets_its_files_with_private_modes_and_runs_until_deleted(
    make_provider: Callable[..., LocalProvider],
) -> None:
    provider = make_provider()
    request = req()
    made = await provider.create_instance(request)
    directory = provider.instance_dir(request.instance_id)
    pid = pid_of(provider, request.instance_id)

    assert made.provider_id == f"local-{request.instance_id}"
    assert made.status == InstanceStatus.RUNNING
    await eventually(
        lambda: agent_waiting(provider, request.instance_id),
        within=10,
        what="the agent's first log line",
        log=lambda: agent_log(provider, request.instance_id),
    )
    assert running(pid)
    assert (directory / "userdata").read_bytes() == request.userdata
    assert (directory / "identity" / "nonce.jwt").read_text() == request.nonce
    assert (directory / "identity" / "ca.crt").read_bytes() == CA_PEM
    info = json.loads((directory / "instance.json").read_text())
    assert info["server_registration_addr"] == "127.0.0.1:8991"
    assert info["server_agent_addr"] == "127.0.0.1:8992"
    assert (info["cluster_id"], info["shard"], info["group"], info["pid"]) == ("c1", "s1", "web", pid)
    for path in (directory, directory / "identity"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700, path
    for path in (directory / "userdata", directory / "identity" / "nonce.jwt", directory / "instance.json"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    # The agent cannot reach the (absent) server: it retries and does not exit on its own. Two failed
    # attempts logged, one backoff apart, show it lived through a failure and kept going.
    await eventually(
        lambda: agent_log(provider, request.instance_id).count("retrying in") >= 2,
        within=20,
        what="two failed attempts logged",
        log=lambda: agent_log(provider, request.instance_id),
    )
    assert running(pid)

    await provider.delete_instance(request.instance_id, made.provider_id)

    assert not running(pid)
    assert (
        await provider.get_instance(request.instance_id, made.provider_id)
    ).status == InstanceStatus.DELETED
    assert await provider.list_instances("c1", "s1") == []
    assert not (directory / "identity").exists()  # the secrets go with the VM
    assert "received SIGTERM" in (directory / "agent.log").read_text()  # the log stays for a while


async def test_a_new_provider_object_finds_running_agents_and_can_delete_them(
    make_provider: Callable[..., LocalProvider],
) -> None:
    first = make_provider()
    request = req()
    made = await first.create_instance(request)
    other_shard = await first.create_instance(req(shard="s2"))
    pid = pid_of(first, request.instance_id)
    await first.close()  # a server stopping without stop_instances_on_close: VMs outlive it
    assert running(pid)

    restarted = make_provider()
    listed = await restarted.list_instances("c1", "s1")

    assert [(i.provider_id, i.status) for i in listed] == [(made.provider_id, InstanceStatus.RUNNING)]
    replay = await restarted.create_instance(request)
    assert replay.provider_id == made.provider_id
    assert pid_of(restarted, request.instance_id) == pid  # nothing relaunched
    await restarted.delete_instance(request.instance_id, made.provider_id)
    assert not running(pid)
    assert [i.provider_id for i in await restarted.list_instances("c1", "s2")] == [other_shard.provider_id]


async def test_stop_instances_on_close_stops_every_agent(make_provider: Callable[..., LocalProvider]) -> None:
    provider = make_provider(stop_instances_on_close=True)
    requests = [req(), req()]
    for request in requests:
        await provider.create_instance(request)
    pids = [pid_of(provider, r.instance_id) for r in requests]
    assert sorted(make_provider().running_agents()) == sorted(r.instance_id for r in requests)

    await provider.close()

    assert [pid for pid in pids if running(pid)] == []
    statuses = {i.status for i in await make_provider().list_instances("c1", "s1")}
    assert statuses == {InstanceStatus.STOPPED}
    assert make_provider().running_agents() == []


async def test_an_agent_that_died_reads_as_stopped(make_provider: Callable[..., LocalProvider]) -> None:
    provider = make_provider()
    request = req()
    made = await provider.create_instance(request)
    pid = pid_of(provider, request.instance_id)
    os.kill(pid, signal.SIGKILL)
    await eventually(lambda: not running(pid), within=10, what=f"pid {pid} to end")

    got = await provider.get_instance(request.instance_id, made.provider_id)

    assert got.status == InstanceStatus.STOPPED
    assert [i.status for i in await provider.list_instances("c1", "s1")] == [InstanceStatus.STOPPED]


async def test_a_reused_pid_is_neither_reported_running_nor_signalled(
    make_provider: Callable[..., LocalProvider],
) -> None:
    provider = make_provider()
    request = req()
    made = await provider.create_instance(request)
    await provider.delete_instance(request.instance_id, made.provider_id)
    # Pretend the instance never stopped and its pid now belongs to an unrelated process.
    stranger = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"])  # noqa: ASYNC220
    try:
        path = provider.instance_dir(request.instance_id) / "instance.json"
        info = json.loads(path.read_text())
        info.update(pid=stranger.pid, status="running", deleted_at=None)
        path.write_text(json.dumps(info))

        restarted = make_provider(stop_timeout=0.2)
        assert (await restarted.get_instance(request.instance_id, "")).status == InstanceStatus.STOPPED
        assert restarted.running_agents() == []  # the stranger is not counted
        await restarted.delete_instance(request.instance_id, "")

        assert stranger.poll() is None  # still alive: never signalled
    finally:
        stranger.kill()
        stranger.wait()


async def test_unknown_instances_are_not_found(make_provider: Callable[..., LocalProvider]) -> None:
    provider = make_provider()
    with pytest.raises(InstanceNotFound):
        await provider.get_instance(new_instance_id("web"), "")


def test_agent_refuses_a_directory_without_identity_files(tmp_path: Path) -> None:
    (tmp_path / "identity").mkdir()
    (tmp_path / "identity" / "ca.crt").write_bytes(CA_PEM)

    result = subprocess.run(
        [sys.executable, "-m", "nstance.agent", "--instance-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=30,
    )

    assert result.returncode == 2
    assert "identity/nonce.jwt" in result.stderr


def test_agent_exits_cleanly_on_sigterm(tmp_path: Path) -> None:
    (tmp_path / "identity").mkdir()
    (tmp_path / "identity" / "ca.crt").write_bytes(CA_PEM)
    (tmp_path / "identity" / "nonce.jwt").write_text("x")
    instance_id = new_instance_id("app")
    env = {
        **os.environ,
        "NSTANCE_INSTANCE_ID": instance_id,
        "NSTANCE_SERVER_REGISTRATION_ADDR": f"127.0.0.1:{free_port()}",  # nothing listens: it retries
        "NSTANCE_SERVER_AGENT_ADDR": f"127.0.0.1:{free_port()}",
    }
    agent = subprocess.Popen(
        [sys.executable, "-m", "nstance.agent", "--instance-dir", str(tmp_path)],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert agent.stderr is not None
        assert f"for {instance_id}: registration" in agent.stderr.readline()
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=10) == 0
    finally:
        agent.kill()
        agent.wait()
        if agent.stderr is not None:
            agent.stderr.close()


def test_options_choose_the_directory_and_refuse_unknown_keys(tmp_path: Path) -> None:
    clock = ManualClock()
    provider = local_provider_from_options({"instances_dir": "vms"}, clock=clock, base_dir=tmp_path)
    assert provider.base_dir == tmp_path / "vms"

    with pytest.raises(InvalidArgument, match=r"^shard\.infra\.options\.instance_dir: unknown option"):
        local_provider_from_options({"instance_dir": "vms"}, clock=clock, base_dir=tmp_path)
    with pytest.raises(InvalidArgument, match=r"^shard\.infra\.options\.stop_instances_on_close: must be"):
        local_provider_from_options({"stop_instances_on_close": "yes"}, clock=clock, base_dir=tmp_path)
