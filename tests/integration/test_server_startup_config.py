"""What a server takes from its config at start-up, as upstream does: a server in this process.

* Without ``--health-addr`` the health endpoint serves on ``shard.bind.health_addr`` (upstream listens
  only there), after serving on the default address while the config was not loaded yet.
* ``--advertise-host`` with a config that already names the host is a config error, shown on
  ``/health`` until the document is fixed (upstream refuses to load such a config).
* Templates see ``shard.infra.provider`` as written (``.Provider.Kind``), not its normalised name.
* Ports bound to an address this machine does not have (upstream's Terraform binds the registration,
  operator and agent ports to the shard's leader IP, which only the leader's machine carries) do not
  stop the server: it listens for the address and leads.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from nstance.core.clock import SystemClock
from nstance.server import app as server_app
from nstance.server.app import ServerApp, ServerOptions
from nstance.server.shard.build import build_shard as real_build_shard
from nstance.server.state.provisioning import ShardIdentity, prepare_instance
from nstance.testing.procs import http_probe
from nstance.testing.shardproc import ENCRYPTION_KEY_B64, LocalCluster, free_port, server_addrs, shard_config
from nstance.testing.waiting import eventually

pytestmark = pytest.mark.timeout(120)

SHARD = "zone-a"


def port_only(addrs: dict[str, str], *names: str) -> dict[str, str]:
    return {name: (":" + addr.rsplit(":", 1)[1] if name in names else addr) for name, addr in addrs.items()}


@asynccontextmanager
async def running(cluster: LocalCluster, tmp_path: Path, **options: Any) -> AsyncIterator[ServerApp]:
    """A server of ``cluster`` in this process until the block ends."""
    app = ServerApp(
        ServerOptions(
            server_id="s1",
            shard=SHARD,
            storage="file",
            bucket=str(cluster.bucket),
            cachedir=tmp_path / "cache",
            environ={"NSTANCE_ENCRYPTION_KEY": ENCRYPTION_KEY_B64},
            **options,
        )
    )
    stop = asyncio.Event()
    task = asyncio.create_task(app.run(stop))
    try:
        yield app
    finally:
        stop.set()
        assert await asyncio.wait_for(task, 60) == 0


async def answers(addr: str, path: str = "/health") -> tuple[int, str]:
    return await asyncio.to_thread(http_probe, addr, path)


def until(addr: str, wanted: Callable[[int, str], bool]) -> Callable[[], Any]:
    async def check() -> tuple[int, str] | None:
        status, body = await answers(addr)
        return (status, body) if wanted(status, body) else None

    return check


@pytest.fixture
def cluster(tmp_path: Path) -> LocalCluster:
    made = LocalCluster(tmp_path / "bucket")
    made.init()
    return made


async def test_without_health_addr_the_endpoint_moves_to_shard_bind_health_addr(
    cluster: LocalCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    early = f"127.0.0.1:{free_port()}"
    monkeypatch.setattr(server_app, "DEFAULT_HEALTH_ADDR", early)  # instead of :8990, busy on CI hosts
    addrs = server_addrs()
    async with running(cluster, tmp_path):
        # No config yet: the default address says why.
        _, body = await eventually(
            until(early, lambda s, _: s == 503), within=30, what="the early health endpoint"
        )
        assert body.startswith("config not loaded: ")

        cluster.write_config(SHARD, shard_config(shard=SHARD, addrs=addrs))
        await eventually(
            until(addrs["health_addr"], lambda s, _: s == 200),
            within=60,
            what="health on the config's address",
        )
        assert (await answers(early))[0] == 0, "the early address is closed once the config names another"


async def test_an_explicit_health_addr_is_kept(cluster: LocalCluster, tmp_path: Path) -> None:
    given = f"127.0.0.1:{free_port()}"
    addrs = server_addrs()
    cluster.write_config(SHARD, shard_config(shard=SHARD, addrs=addrs))
    async with running(cluster, tmp_path, health_addr=given):
        await eventually(until(given, lambda s, _: s == 200), within=60, what="health on --health-addr")
        assert (await answers(addrs["health_addr"]))[0] == 0


async def test_advertise_host_with_a_host_in_the_config_is_a_config_error_until_fixed(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    given = f"127.0.0.1:{free_port()}"
    addrs = server_addrs()
    cluster.write_config(SHARD, shard_config(shard=SHARD, addrs=addrs))
    async with running(cluster, tmp_path, health_addr=given, advertise_host="127.0.0.1"):
        _, body = await eventually(
            until(given, lambda s, b: s == 503 and "advertise" in b), within=60, what="the refusal"
        )
        port = addrs["health_addr"].rsplit(":", 1)[1]
        assert body == (
            "config not loaded: --advertise-host cannot be used when shard.advertise.health_addr already "
            f'names a host ("127.0.0.1:{port}"); write it port-only (":{port}")\n'
        )

        config = shard_config(shard=SHARD, addrs=addrs)
        config["shard"]["advertise"] = port_only(addrs, "health_addr", "election_addr")
        cluster.write_config(SHARD, config)  # fixed in storage: no restart needed
        await eventually(until(given, lambda s, _: s == 200), within=60, what="the fixed config to load")


async def test_ports_bound_to_the_leader_address_this_machine_lacks_do_not_stop_the_server(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    addrs = server_addrs()
    config = shard_config(shard=SHARD, addrs=addrs)
    leader_ip = "192.0.2.10"  # TEST-NET-1: never an address of this machine
    for name in ("registration_addr", "operator_addr", "agent_addr"):
        config["shard"]["bind"][name] = f"{leader_ip}:{free_port()}"
    cluster.write_config(SHARD, config)
    async with running(cluster, tmp_path, health_addr=addrs["health_addr"]):
        await eventually(
            until(addrs["health_addr"], lambda s, b: s == 200 and "leader" in b),
            within=60,
            what="the server to start and lead without the leader address",
        )


@pytest.mark.parametrize(("written", "runs_as"), [("mock", "sim"), ("sim", "sim")])
async def test_templates_see_the_provider_as_written(
    cluster: LocalCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, written: str, runs_as: str
) -> None:
    built: dict[str, Any] = {}

    def build_shard(**kwargs: Any) -> Any:
        built.update(kwargs)
        return real_build_shard(**kwargs)

    monkeypatch.setattr(server_app, "build_shard", build_shard)
    given = f"127.0.0.1:{free_port()}"
    kind_test = '{{ if eq .Provider.Kind "mock" }}upstream dev{{ else }}{{ .Provider.Kind }}{{ end }}'
    config = shard_config(
        shard=SHARD,
        addrs=server_addrs(),
        provider=written,
        template_extra={
            "userdata": {"content": f"#!/bin/sh\n# {kind_test}\n"},
            "args": {"provider": "{{ .Provider.Kind }}"},
        },
    )
    cluster.write_config(SHARD, config)
    async with running(cluster, tmp_path, health_addr=given):
        await eventually(until(given, lambda s, _: s == 200), within=60, what="the server to start")

    identity: ShardIdentity = built["identity"]
    snapshot = built["config"].snapshot()
    assert snapshot.config.shard.infra.provider == runs_as
    assert identity.provider_kind == written
    merged = snapshot.merged("default", "web")

    async def room(_subnet: str) -> bool:
        return True

    prepared = await prepare_instance(
        merged,
        shard=identity,
        nonce_key=built["nonce_key"],
        has_capacity=room,
        subnet_pools={"default": ["net-1"]},
        registration_timeout=timedelta(hours=1),
        clock=SystemClock(),
    )
    expected = "upstream dev" if written == "mock" else written
    assert prepared.request.userdata.decode() == f"#!/bin/sh\n# {expected}\n"
    assert prepared.request.args["provider"] == written
