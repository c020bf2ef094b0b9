"""The Proxmox VE provider against fakepve (a stateful fake of the PVE 9 API), plus its pure helpers.

Each test starts its own fake cluster in-process (HTTPS on 127.0.0.1, a self-signed certificate the
client verifies) with a template VM 9000, and drives the provider through proxmoxer as a shard server
would. Task durations are zero unless a test says otherwise; waits use a ManualClock and a sleep that
advances it, so timeouts are reached without waiting for them.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import struct
import subprocess
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from fakepve import FakePve  # type: ignore[import-untyped]
from fakepve.certs import make_cert  # type: ignore[import-untyped]

from nstance.config.loader import load_config_file
from nstance.config.merge import deep_merge
from nstance.core.backoff import Backoff
from nstance.core.clock import ManualClock
from nstance.core.errors import InvalidArgument
from nstance.providers.base import (
    CreateRequest,
    InstanceNotFound,
    InstanceStatus,
    ProviderInvalidRequest,
    ProviderThrottled,
    ProviderUnavailable,
)
from nstance.providers.proxmox import cidata, notes
from nstance.providers.proxmox.args import parse_clone_args
from nstance.providers.proxmox.client import Endpoint, PveClient
from nstance.providers.proxmox.options import proxmox_provider_from_options
from nstance.providers.proxmox.placement import NodeLoad, rank_nodes, topsis
from nstance.providers.proxmox.provider import ProxmoxProvider
from nstance.providers.proxmox.status import map_status
from nstance.providers.proxmox.vmid import VmidAllocator, VmidStateError
from nstance.testing.requests import sample_create_request

TOKEN_ID = "root@pam!nstance"
TOKEN_SECRET = "s3cr3t-token"
GIB = 1024**3


class _Pve(FakePve):  # type: ignore[misc]
    """fakepve with per-node usage figures and VMs hidden from /cluster/resources (listing lag)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.node_usage: dict[str, dict[str, float]] = {}
        self.hidden: set[int] = set()

    async def _resources(self, request: web.Request) -> web.Response:
        response = await super()._resources(request)
        body = json.loads(response.text)
        rows = []
        for item in body["data"]:
            if item.get("type") == "qemu" and item.get("vmid") in self.hidden:
                continue
            if item.get("type") == "node" and item["node"] in self.node_usage and item["status"] == "online":
                item.update(self.node_usage[item["node"]])
            rows.append(item)
        return web.json_response({"data": rows})


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    certfile, keyfile, _ = make_cert(str(tmp_path_factory.mktemp("pve-certs")))
    return certfile, keyfile


@pytest.fixture
async def pve(certs: tuple[str, str]) -> AsyncIterator[_Pve]:
    fake = _Pve(host="127.0.0.1", port=0)
    fake.apitokens[TOKEN_ID] = TOKEN_SECRET
    fake.add_node("pve2")
    fake.add_node("pve3")
    fake.add_ceph_storage("ceph")
    fake.add_vm(
        9000,
        "debian-tmpl",
        status="stopped",
        template=True,
        config={"template": 1, "memory": 1024, "cores": 1, "scsi0": "ceph:base-9000-disk-0,size=8G"},
    )
    await fake.start(*certs)
    yield fake
    for _ in range(200):  # let background tasks of slow-task tests end before the server goes
        if all(t["status"] == "stopped" for t in fake.tasks.values()):
            break
        await asyncio.sleep(0.01)
    await fake.stop()


@dataclass
class Sleeps:
    clock: ManualClock
    delays: list[float]

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)
        self.clock.advance(seconds)
        await asyncio.sleep(0.002)


@pytest.fixture
def sleeps() -> Sleeps:
    return Sleeps(ManualClock(), [])


@pytest.fixture
async def provider_for(
    pve: _Pve, certs: tuple[str, str], tmp_path: Path, sleeps: Sleeps
) -> AsyncIterator[Callable[..., ProxmoxProvider]]:
    """Build providers on the same fake and VMID state file (a second one is a restarted server)."""
    built: list[ProxmoxProvider] = []

    def build(**kwargs: Any) -> ProxmoxProvider:
        client = PveClient(
            Endpoint(
                api_url=pve.url + "/api2/json", token_id=TOKEN_ID, token_secret=TOKEN_SECRET, verify=certs[0]
            )
        )
        provider = ProxmoxProvider(
            client,
            clock=sleeps.clock,
            allocator=VmidAllocator(tmp_path / "vmid.json"),
            sleep=sleeps,
            backoff=Backoff(base=0.5, cap=4.0, jitter=0.0),
            **kwargs,
        )
        built.append(provider)
        return provider

    yield build
    for provider in built:
        await provider.close()


@pytest.fixture
def provider(provider_for: Callable[..., ProxmoxProvider]) -> ProxmoxProvider:
    return provider_for()


def request_for(**changes: Any) -> CreateRequest:
    changes.setdefault("args", {"TemplateVMID": 9000})
    changes.setdefault("subnet_id", "vmbr0")
    changes.setdefault("userdata", b"#cloud-config\nhostname: from-nstance\n")
    return sample_create_request(**changes)


def clones(pve: _Pve) -> int:
    return sum(1 for t in pve.tasklog if t["type"] == "qmclone")


def vm_named(pve: _Pve, name: str) -> Any:
    return next(vm for vm in pve.vms if vm.name == name)


# ---- create, read, list, delete -----------------------------------------------------------------


async def test_create_clones_the_template_names_tags_annotates_and_starts_the_vm(
    pve: _Pve, provider: ProxmoxProvider
) -> None:
    request = request_for()

    made = await provider.create_instance(request)

    vm = vm_named(pve, request.instance_id)
    assert made.provider_id == str(vm.vmid)
    assert vm.vmid >= 10000
    assert made.status == InstanceStatus.RUNNING
    assert vm.status == "running"
    assert (made.cluster_id, made.shard, made.group, made.kind) == ("c1", "s1", "web", "web")
    assert made.launched_at == request.created_at
    assert notes.parse_tags(vm.config["tags"]) >= {"nstance", "nstance-cluster-c1", "nstance-shard-s1"}
    annotations = notes.parse_notes(vm.config["description"])
    assert annotations["group"] == "web"
    assert annotations["kind"] == "web"
    assert annotations["created-at"] == request.created_at.isoformat()
    assert vm.config["net0"].startswith("virtio")
    assert "bridge=vmbr0" in vm.config["net0"]
    # The userdata reached the VM as a NoCloud seed ISO on the VM's node.
    seed = f"nstance-{request.instance_id}.iso"
    assert vm.config["ide2"] == f"local:iso/{seed},media=cdrom"
    assert pve.uploaded["filename"] == seed
    assert _iso_files(pve.uploaded["data"])["user-data"] == request.userdata


async def test_vm_is_found_by_vmid_or_by_instance_id_and_listed_only_under_its_cluster_and_shard(
    pve: _Pve, provider: ProxmoxProvider
) -> None:
    mine = await provider.create_instance(request_for())
    other_cluster = await provider.create_instance(request_for(cluster_id="c2"))
    other_shard = await provider.create_instance(request_for(shard="s2"))
    pve.add_vm(500, "someone-elses-vm", status="running", config={"tags": "prod"})

    assert (await provider.get_instance(mine.instance_id, "")).provider_id == mine.provider_id
    assert (await provider.get_instance("", mine.provider_id)).instance_id == mine.instance_id
    assert [i.provider_id for i in await provider.list_instances("c1", "s1")] == [mine.provider_id]
    assert [i.provider_id for i in await provider.list_instances("c2", "s1")] == [other_cluster.provider_id]
    assert [i.provider_id for i in await provider.list_instances("c1", "s2")] == [other_shard.provider_id]
    with pytest.raises(InstanceNotFound):
        await provider.get_instance(mine.instance_id, "500")  # a VMID that names another VM


async def test_template_can_be_named_and_both_or_neither_template_key_is_refused(
    pve: _Pve, provider: ProxmoxProvider
) -> None:
    made = await provider.create_instance(request_for(args={"TemplateName": "debian-tmpl"}))
    assert made.status == InstanceStatus.RUNNING

    for args in ({"TemplateVMID": 9000, "TemplateName": "debian-tmpl"}, {}):
        with pytest.raises(ProviderInvalidRequest, match=r"templates\.web\.args\.TemplateVMID"):
            await provider.create_instance(request_for(args=args))
    with pytest.raises(ProviderInvalidRequest, match=r"templates\.web\.args\.TemplateName.*'nope'"):
        await provider.create_instance(request_for(args={"TemplateName": "nope"}))
    with pytest.raises(ProviderInvalidRequest, match=r"templates\.web\.args\.TemplateVMID.*not a template"):
        await provider.create_instance(request_for(args={"TemplateVMID": made.provider_id}))
    with pytest.raises(ProviderInvalidRequest, match=r"templates\.web\.args\.Memroy"):
        await provider.create_instance(request_for(args={"TemplateVMID": 9000, "Memroy": 512}))
    assert clones(pve) == 1


async def test_args_set_cpu_memory_vlan_and_a_full_clone_onto_the_storage_pool(
    pve: _Pve, provider: ProxmoxProvider
) -> None:
    request = request_for(
        args={
            "TemplateVMID": "9000",
            "Cores": 4,
            "Memory": "2048",
            "StoragePool": "local-lvm",
            "StartOnBoot": True,
        },
        subnet_id="vmbr1:42",
    )

    await provider.create_instance(request)

    vm = vm_named(pve, request.instance_id)
    assert (vm.config["cores"], vm.config["memory"], vm.config["onboot"]) == ("4", "2048", "1")
    assert "bridge=vmbr1" in vm.config["net0"]
    assert "tag=42" in vm.config["net0"]
    assert vm.config["scsi0"].startswith("local-lvm:vm-")


async def test_delete_stops_and_destroys_the_vm_and_its_seed_and_tolerates_missing_vms(
    pve: _Pve, provider: ProxmoxProvider
) -> None:
    request = request_for()
    made = await provider.create_instance(request)
    kept = await provider.create_instance(request_for())
    assert pve.storages["local"]["files"] == {
        f"nstance-{request.instance_id}.iso",
        f"nstance-{kept.instance_id}.iso",
    }

    await provider.delete_instance(request.instance_id, made.provider_id)

    assert [vm.name for vm in pve.vms if not vm.template] == [kept.instance_id]
    assert pve.storages["local"]["files"] == {f"nstance-{kept.instance_id}.iso"}
    with pytest.raises(InstanceNotFound):
        await provider.get_instance(request.instance_id, made.provider_id)
    await provider.delete_instance(request.instance_id, made.provider_id)  # again: not an error
    await provider.delete_instance("webneverexisted", "")
    assert [i.instance_id for i in await provider.list_instances("c1", "s1")] == [kept.instance_id]


# ---- idempotency -------------------------------------------------------------------------------


async def test_a_repeated_create_with_the_same_token_returns_the_same_vm_without_cloning_again(
    pve: _Pve, provider_for: Callable[..., ProxmoxProvider]
) -> None:
    request = request_for()
    first = await provider_for().create_instance(request)

    again = await provider_for().create_instance(request)  # a restarted server retrying

    assert again.provider_id == first.provider_id
    assert clones(pve) == 1
    with pytest.raises(ProviderInvalidRequest, match="another idempotency token"):
        await provider_for().create_instance(replace(request, idempotency_token="other"))


async def test_a_token_cannot_be_reused_for_another_instance(pve: _Pve, provider: ProxmoxProvider) -> None:
    await provider.create_instance(request_for(token="shared"))

    with pytest.raises(ProviderInvalidRequest, match="shared"):
        await provider.create_instance(request_for(token="shared"))
    assert clones(pve) == 1


async def test_a_retry_after_a_crash_between_clone_and_start_finishes_the_vm(
    pve: _Pve, provider: ProxmoxProvider
) -> None:
    request = request_for()
    description = notes.render_notes(
        "",
        {"instance-id": request.instance_id, "idempotency-token": request.idempotency_token, "group": "web"},
    )
    pve.add_vm(10500, request.instance_id, status="stopped", config={"description": description})

    made = await provider.create_instance(request)

    vm = vm_named(pve, request.instance_id)
    assert made.provider_id == "10500"
    assert vm.status == "running"
    assert notes.association_of(notes.parse_tags(vm.config["tags"])) == ("c1", "s1")
    assert clones(pve) == 0


async def test_a_vm_missing_from_the_cluster_listing_right_after_create_is_still_found(
    pve: _Pve, provider: ProxmoxProvider
) -> None:
    request = request_for()
    made = await provider.create_instance(request)
    pve.hidden.add(int(made.provider_id))  # /cluster/resources lags behind the clone

    got = await provider.get_instance(request.instance_id, made.provider_id)

    assert got.status == InstanceStatus.RUNNING
    await provider.delete_instance(request.instance_id, made.provider_id)
    assert all(vm.name != request.instance_id for vm in pve.vms)


# ---- VMIDs -------------------------------------------------------------------------------------


async def test_vmids_start_at_10000_rise_above_the_cluster_and_are_never_reused(
    pve: _Pve, provider_for: Callable[..., ProxmoxProvider]
) -> None:
    provider = provider_for()
    first = await provider.create_instance(request_for())
    assert first.provider_id == "10000"
    await provider.delete_instance(first.instance_id, first.provider_id)

    second = await provider_for().create_instance(request_for())  # a restarted server
    assert second.provider_id == "10001"

    pve.add_vm(20000, "hand-made", status="stopped")
    third = await provider_for().create_instance(request_for())
    assert third.provider_id == "20001"


def test_the_allocator_persists_its_mark_and_refuses_a_corrupt_state_file(tmp_path: Path) -> None:
    path = tmp_path / "state" / "vmid.json"
    allocator = VmidAllocator(path)
    assert [allocator.allocate(0), allocator.allocate(0), allocator.allocate(12000)] == [10000, 10001, 12001]
    assert VmidAllocator(path).allocate(0) == 12002
    assert path.stat().st_mode & 0o777 == 0o600
    assert VmidAllocator(None, floor=200).allocate(150) == 200

    path.write_text('{"last_vmid": "x"}')
    with pytest.raises(VmidStateError, match="last_vmid"):
        VmidAllocator(path)


async def test_a_vmid_taken_by_someone_else_between_listing_and_clone_is_skipped(
    pve: _Pve, provider: ProxmoxProvider
) -> None:
    pve.fail(
        "POST", "/qemu/9000/clone", 500, "unable to create VM 10000: config file already exists", times=1
    )

    made = await provider.create_instance(request_for())

    assert made.provider_id == "10001"


# ---- placement ---------------------------------------------------------------------------------


async def test_vms_go_to_the_node_with_most_free_memory_and_cpu_skipping_offline_nodes(
    pve: _Pve, provider: ProxmoxProvider
) -> None:
    pve.node_usage = {
        "pve1": {"mem": 7 * GIB, "maxmem": 8 * GIB, "cpu": 0.9, "maxcpu": 4},
        "pve2": {"mem": 1 * GIB, "maxmem": 64 * GIB, "cpu": 0.0, "maxcpu": 32},
        "pve3": {"mem": 8 * GIB, "maxmem": 32 * GIB, "cpu": 0.1, "maxcpu": 16},
    }
    first = await provider.create_instance(request_for())
    assert vm_named(pve, first.instance_id).node == "pve2"

    pve.set_node_offline("pve2")
    second = await provider.create_instance(request_for())
    assert vm_named(pve, second.instance_id).node == "pve3"
    # A VM on an offline node reads as unknown, not as gone.
    assert (
        await provider.get_instance(first.instance_id, first.provider_id)
    ).status == InstanceStatus.UNKNOWN

    pve.set_node_offline("pve1")
    pve.set_node_offline("pve3")
    with pytest.raises(ProviderUnavailable, match="no online node"):
        await provider.create_instance(request_for())


async def test_the_nodes_option_limits_placement(
    pve: _Pve, provider_for: Callable[..., ProxmoxProvider]
) -> None:
    provider = provider_for(nodes=("pve3",))
    made = await provider.create_instance(request_for())
    assert vm_named(pve, made.instance_id).node == "pve3"


def test_ranking_prefers_free_memory_then_cpu_and_respects_reservations() -> None:
    nodes = [
        NodeLoad("a", True, mem=2 * GIB, maxmem=16 * GIB, cpu=0.5, maxcpu=8),
        NodeLoad("b", True, mem=2 * GIB, maxmem=16 * GIB, cpu=0.0, maxcpu=8),
        NodeLoad("c", False, mem=0, maxmem=256 * GIB, cpu=0.0, maxcpu=64),
        NodeLoad("d", True, mem=15 * GIB, maxmem=16 * GIB, cpu=0.0, maxcpu=8),
    ]
    assert rank_nodes(nodes) == ["b", "a", "d"]
    assert rank_nodes(nodes, need_memory=4 * GIB) == ["b", "a"]
    assert rank_nodes(nodes, need_memory=4 * GIB, reserved={"b": 11 * GIB}) == ["a"]
    assert rank_nodes(nodes, allowed=["d"]) == ["d"]
    scores = topsis([(10.0, 1.0), (5.0, 1.0)], (0.6, 0.4))
    assert scores[0] == pytest.approx(1.0)
    assert scores[1] == pytest.approx(0.0)


# ---- failures, tasks and throttling ------------------------------------------------------------


async def test_a_failing_clone_is_reported_and_leaves_no_vm_seed_or_reused_vmid(
    pve: _Pve, provider: ProxmoxProvider
) -> None:
    pve.storages["small"] = {
        "type": "dir",
        "path": "/small",
        "active": 1,
        "content": "images",
        "files": set(),
        "avail": 1,
    }
    request = request_for(args={"TemplateVMID": 9000, "StoragePool": "small"})
    pve.storages["ceph"]["volumes"] = {
        "base-9000-disk-0": {"content": "images", "format": "raw", "size": 8 * GIB}
    }

    with pytest.raises(
        ProviderUnavailable, match=r"clon.*No space left on device.*VMID 10000 will not be reused"
    ):
        await provider.create_instance(request)

    assert [vm.vmid for vm in pve.vms] == [9000]
    assert pve.storages["local"]["files"] == set()
    made = await provider.create_instance(request_for())
    assert made.provider_id == "10001"


async def test_a_clone_task_that_outlives_its_timeout_is_unavailable_and_a_retry_adopts_it(
    pve: _Pve, provider_for: Callable[..., ProxmoxProvider]
) -> None:
    pve.time_scale = 0.01
    pve.ceph_slow(20)  # the clone takes 20 PVE seconds = 0.2 s
    request = request_for()

    with pytest.raises(ProviderUnavailable, match="still running after 5s"):
        await provider_for(clone_timeout=5.0).create_instance(request)

    made = await provider_for(clone_timeout=3600.0).create_instance(request)
    assert made.status == InstanceStatus.RUNNING
    assert clones(pve) == 1


async def test_throttling_is_retried_with_backoff_then_reported(
    pve: _Pve, provider: ProxmoxProvider, sleeps: Sleeps
) -> None:
    await provider.create_instance(request_for())
    pve.fail("GET", "/cluster/resources", 429, "Too Many Requests", times=2)

    listed = await provider.list_instances("c1", "s1")

    assert len(listed) == 1
    assert sleeps.delays[-2:] == [0.5, 1.0]
    before = len(pve.requests)
    pve.fail("GET", "/cluster/resources", 429, "Too Many Requests")
    with pytest.raises(ProviderThrottled, match="5 attempts"):
        await provider.list_instances("c1", "s1")
    assert sum(1 for r in pve.requests[before:] if r[1].endswith("/cluster/resources")) == 5


async def test_a_bad_token_is_a_clear_error(pve: _Pve, provider: ProxmoxProvider) -> None:
    pve.apitokens[TOKEN_ID] = "rotated"
    with pytest.raises(ProviderInvalidRequest, match="PROXMOX_TOKEN_ID"):
        await provider.list_instances("c1", "s1")


async def test_provider_from_options_reads_the_token_from_the_environment(
    pve: _Pve, certs: tuple[str, str], tmp_path: Path
) -> None:
    env = {"PROXMOX_TOKEN_ID": TOKEN_ID, "PROXMOX_TOKEN_SECRET": TOKEN_SECRET}
    options = {"api_url": pve.url + "/api2/json", "ca_file": certs[0], "vmid_floor": 30000}
    provider = proxmox_provider_from_options(options, clock=ManualClock(), base_dir=tmp_path, env=env)

    try:
        made = await provider.create_instance(request_for())
    finally:
        await provider.close()

    assert made.provider_id == "30000"
    assert json.loads((tmp_path / "proxmox-vmid.json").read_text()) == {"last_vmid": 30000}
    with pytest.raises(InvalidArgument, match=r"shard\.infra\.options\.token_id"):
        proxmox_provider_from_options(options, clock=ManualClock(), base_dir=tmp_path, env={})
    with pytest.raises(InvalidArgument, match=r"shard\.infra\.options\.bogus"):
        proxmox_provider_from_options({"bogus": 1}, clock=ManualClock(), base_dir=tmp_path, env=env)
    with pytest.raises(InvalidArgument, match=r"shard\.infra\.options\.clone_timeout"):
        proxmox_provider_from_options(
            {"clone_timeout": "soon"}, clock=ManualClock(), base_dir=tmp_path, env=env
        )


async def test_an_iso_storage_without_iso_content_is_named_in_the_error(
    pve: _Pve, provider_for: Callable[..., ProxmoxProvider]
) -> None:
    provider = provider_for(iso_storage="local-lvm")

    with pytest.raises(ProviderInvalidRequest, match=r"shard\.infra\.options\.cloud_init_iso_storage"):
        await provider.create_instance(request_for())
    assert clones(pve) == 0


async def test_a_vm_on_an_offline_node_reads_as_unknown_without_waiting_on_the_node(
    pve: _Pve, provider_for: Callable[..., ProxmoxProvider], sleeps: Sleeps
) -> None:
    made = await provider_for(nodes=("pve2",)).create_instance(request_for())
    pve.set_node_offline("pve2")

    listed = await provider_for().list_instances("c1", "s1")  # a restarted server: nothing cached

    assert [(i.provider_id, i.status) for i in listed] == [(made.provider_id, InstanceStatus.UNKNOWN)]
    assert sleeps.delays == []


def test_the_example_config_is_accepted_by_the_provider(certs: tuple[str, str], tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    config = load_config_file(root / "examples" / "proxmox" / "config.jsonc")
    for tenant in config.groups.values():
        for group in tenant.values():
            template = config.templates[group.template]
            args = deep_merge(config.defaults.args, template.args, group.args)
            parsed = parse_clone_args(args, group.template)
            assert parsed.template_name == "debian-12-cloudinit"
    options = dict(config.shard.infra.options, ca_file=certs[0])
    env = {"PROXMOX_TOKEN_SECRET": "x"}
    provider = proxmox_provider_from_options(options, clock=ManualClock(), base_dir=tmp_path, env=env)
    assert provider.kind == "proxmox"


# ---- pure helpers ------------------------------------------------------------------------------


def test_status_mapping_covers_locks_power_and_offline_nodes() -> None:
    assert map_status("stopped", lock="clone") == InstanceStatus.PENDING
    assert map_status("running") == InstanceStatus.RUNNING
    assert map_status("running", qmpstatus="paused") == InstanceStatus.SUSPENDED
    assert map_status("stopped", lock="suspended") == InstanceStatus.SUSPENDED
    assert map_status("stopped", lock="destroyed") == InstanceStatus.DELETING
    assert map_status("running", hastate="recovery") == InstanceStatus.REPAIRING
    assert map_status("stopped") == InstanceStatus.STOPPED
    assert map_status("unknown") == InstanceStatus.UNKNOWN


def test_notes_block_round_trips_and_keeps_the_operators_own_text() -> None:
    text = notes.render_notes(
        "Owned by team web.\n", {"group": "web", "created-at": "2026-01-01T00:00:00+00:00"}
    )
    assert text.startswith("Owned by team web.\n")
    assert notes.parse_notes(text) == {"group": "web", "created-at": "2026-01-01T00:00:00+00:00"}
    updated = notes.render_notes(text, {"group": "api"})
    assert notes.parse_notes(updated) == {"group": "api"}
    assert updated.count(notes.BLOCK_BEGIN) == 1
    assert "Owned by team web." in updated
    assert notes.parse_notes("no block here") == {}


def test_the_seed_image_is_an_iso_labelled_cidata_with_the_nocloud_files() -> None:
    image = cidata.nocloud_seed(b"#cloud-config\n", cidata.meta_data("web1", "web1"))

    assert image[16 * 2048 + 1 : 16 * 2048 + 6] == b"CD001"
    assert image[16 * 2048 + 40 : 16 * 2048 + 72].rstrip() == b"cidata"
    assert _iso_files(image) == {
        "meta-data": b"instance-id: web1\nlocal-hostname: web1\n",
        "user-data": b"#cloud-config\n",
    }


def test_blkid_sees_an_iso9660_filesystem_labelled_cidata(tmp_path: Path) -> None:
    blkid = shutil.which("blkid") or ("/usr/sbin/blkid" if Path("/usr/sbin/blkid").exists() else None)
    if blkid is None:
        pytest.skip("blkid is not installed")
    path = tmp_path / "seed.iso"
    path.write_bytes(cidata.nocloud_seed(b"#cloud-config\n", b"instance-id: x\n"))
    out = subprocess.run([blkid, "-p", "-o", "export", str(path)], capture_output=True, text=True, check=True)
    fields = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
    assert (fields["TYPE"], fields["LABEL"]) == ("iso9660", "cidata")
    assert "Joliet" in fields.get("VERSION", "")


def _iso_files(image: bytes) -> dict[str, bytes]:
    """Read the root directory the Joliet descriptor points at (independently of the writer)."""
    sector = 16
    while image[sector * 2048] != 2:
        assert image[sector * 2048] != 255, "no Joliet descriptor"
        sector += 1
    root = image[sector * 2048 + 156 : sector * 2048 + 190]
    extent, size = struct.unpack_from("<I", root, 2)[0], struct.unpack_from("<I", root, 10)[0]
    directory = image[extent * 2048 : extent * 2048 + size]
    files: dict[str, bytes] = {}
    offset = 0
    while offset < len(directory) and directory[offset]:
        length = directory[offset]
        start, file_size = (
            struct.unpack_from("<I", directory, offset + 2)[0],
            struct.unpack_from("<I", directory, offset + 10)[0],
        )
        name_len = directory[offset + 32]
        raw = directory[offset + 33 : offset + 33 + name_len]
        if not directory[offset + 25] & 0x02:
            files[raw.decode("utf-16-be")] = image[start * 2048 : start * 2048 + file_size]
        offset += length
    return files


def test_seed_names_are_valid_iso_short_names() -> None:
    image = cidata.iso9660({"user-data": b"x", "meta-data": b"y"}, label="cidata")
    assert re.search(rb"USERDATA\.;1", image)
    assert re.search(rb"METADATA\.;1", image)
