"""The ``proxmox`` provider: every instance is a QEMU VM cloned from a template on a Proxmox VE cluster.

Create: parse the args (TemplateVMID xor TemplateName), look the VM up by name (the instance id) so a
retried create finds what the first one made, refuse an idempotency token already used by another VM,
rank the online nodes by free memory and CPU, allocate a fresh VMID (monotonic, floor 10000, persisted),
upload a cloud-init NoCloud seed ISO with the userdata to the chosen node, clone the template with the
annotations already in the notes, wait for the clone task, then set the association tags, CPU, memory,
NIC and seed drive, resize the disk if asked, and start the VM. A VM found by name on a retry is brought
to the same end state (configured and started) instead of being cloned again.

Read: ``/cluster/resources`` gives name, node, status, lock and tags of every VM in one call; the
annotations (group, kind, created-at...) come from the notes, read once per VM and cached (they never
change). Just after a clone a VM may be missing from ``/cluster/resources`` for a few seconds; VMs this
process made are then read from their node directly. Delete: remove the seed ISO, stop the VM if
running, destroy it with its disks; a VM that does not exist is not an error.

Every blocking proxmoxer call runs in a worker thread. Throttling (HTTP 429/503) is retried with
exponential backoff and jitter up to ``max_attempts`` and then raised as ProviderThrottled; idempotent
reads are also retried on transient failures. Task waits poll with growing intervals and give up after
their timeout. This module never decides whether to create or delete.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

from nstance.core.backoff import Backoff
from nstance.core.clock import Clock
from nstance.providers.base import (
    CreateRequest,
    InstanceNotFound,
    ProviderInstance,
    ProviderInvalidRequest,
    ProviderThrottled,
    ProviderUnavailable,
)
from nstance.providers.proxmox import cidata, notes
from nstance.providers.proxmox.args import CloneArgs, parse_clone_args
from nstance.providers.proxmox.client import PveClient, PveError, quote_segment
from nstance.providers.proxmox.placement import node_loads, rank_nodes
from nstance.providers.proxmox.status import map_status
from nstance.providers.proxmox.vmid import VmidAllocator, VmidExhausted, VmidStateError

log = logging.getLogger(__name__)

T = TypeVar("T")
Sleep = Callable[[float], Awaitable[None]]

MIB = 1024 * 1024
_VMID_RETRIES = 5
_CONFIG_READS = 8  # concurrent config reads when a listing has VMs whose notes are not cached yet
_RESERVATION_SECONDS = 120.0


class _TaskFailed(Exception):
    """A PVE task ended with an exit status other than OK."""

    def __init__(self, upid: str, exitstatus: str) -> None:
        super().__init__(exitstatus)
        self.upid = upid
        self.exitstatus = exitstatus


@dataclass(frozen=True, slots=True)
class _Vm:
    """One VM as ``/cluster/resources`` (or ``status/current``) shows it."""

    vmid: int
    name: str
    node: str
    status: str
    template: bool
    tags: frozenset[str]
    lock: str | None = None
    hastate: str | None = None
    qmpstatus: str | None = None
    maxmem: int = 0

    @staticmethod
    def from_item(item: Mapping[str, Any], node: str = "") -> _Vm | None:
        vmid = item.get("vmid")
        if isinstance(vmid, bool) or not isinstance(vmid, int):
            try:
                vmid = int(str(vmid))
            except ValueError:
                return None
        return _Vm(
            vmid=vmid,
            name=str(item.get("name") or ""),
            node=str(item.get("node") or node),
            status=str(item.get("status") or "unknown"),
            template=str(item.get("template", 0)) in ("1", "True", "true"),
            tags=frozenset(notes.parse_tags(item.get("tags"))),
            lock=str(item["lock"]) if item.get("lock") else None,
            hastate=str(item["hastate"]) if item.get("hastate") else None,
            qmpstatus=str(item["qmpstatus"]) if item.get("qmpstatus") else None,
            maxmem=_whole(item.get("maxmem")),
        )


@dataclass(slots=True)
class _Snapshot:
    """One ``/cluster/resources`` answer, split by type."""

    vms: list[_Vm]
    items: list[Mapping[str, Any]] = field(default_factory=list)

    def by_name(self, name: str) -> list[_Vm]:
        return [vm for vm in self.vms if vm.name == name and not vm.template]

    def by_vmid(self, vmid: int) -> _Vm | None:
        return next((vm for vm in self.vms if vm.vmid == vmid), None)

    def max_vmid(self) -> int:
        return max((vm.vmid for vm in self.vms), default=0)


class ProxmoxProvider:
    """VMs on a Proxmox VE cluster; see the module docstring."""

    def __init__(
        self,
        client: PveClient,
        *,
        clock: Clock,
        allocator: VmidAllocator,
        zone: str = "",
        iso_storage: str = "local",
        cloud_init_drive: str = "ide2",
        nodes: tuple[str, ...] | None = None,
        clone_timeout: float = 600.0,
        task_timeout: float = 120.0,
        max_attempts: int = 5,
        backoff: Backoff | None = None,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self._client = client
        self._clock = clock
        self._allocator = allocator
        self._zone = zone
        self._iso_storage = iso_storage
        self._cd_drive = cloud_init_drive
        self._nodes = nodes
        self._clone_timeout = clone_timeout
        self._task_timeout = task_timeout
        self._max_attempts = max(1, max_attempts)
        self._backoff = backoff or Backoff(base=0.5, cap=10.0)
        self._sleep = sleep
        self._annotations: dict[int, dict[str, str]] = {}
        self._recent: dict[str, tuple[int, str]] = {}  # instance id -> (vmid, node) made by this process
        self._reserved: dict[str, list[tuple[float, int]]] = {}  # node -> (expiry, bytes)
        self._create_locks: dict[str, tuple[asyncio.Lock, int]] = {}  # per instance id, with users
        self._placement_lock = asyncio.Lock()

    @property
    def kind(self) -> str:
        return "proxmox"

    # ---- the Provider protocol -------------------------------------------------------------

    async def create_instance(self, request: CreateRequest) -> ProviderInstance:
        args = parse_clone_args(request.args, request.template)
        lock, users = self._create_locks.get(request.instance_id, (asyncio.Lock(), 0))
        self._create_locks[request.instance_id] = (lock, users + 1)
        try:
            async with lock:
                return await self._create(request, args)
        except PveError as exc:
            raise self._error(exc, f"creating {request.instance_id}") from exc
        finally:
            lock, users = self._create_locks[request.instance_id]
            if users <= 1:
                del self._create_locks[request.instance_id]
            else:
                self._create_locks[request.instance_id] = (lock, users - 1)

    async def delete_instance(self, instance_id: str, provider_id: str) -> None:
        vmid = _parse_provider_id(provider_id)
        try:
            snap = await self._snapshot("vm")
            vm = self._find(snap, instance_id, vmid)
            if vm is None:
                vm = await self._recent_vm(instance_id, vmid)
            if vm is None:
                self._recent.pop(instance_id, None)
                return
            await self._destroy(vm)
        except PveError as exc:
            raise self._error(exc, f"deleting {instance_id or provider_id}") from exc
        self._recent.pop(vm.name, None)
        self._annotations.pop(vm.vmid, None)

    async def get_instance(self, instance_id: str, provider_id: str) -> ProviderInstance:
        vmid = _parse_provider_id(provider_id)
        if not instance_id and vmid is None:
            raise ProviderInvalidRequest("proxmox: give an instance id or a provider id (the VMID)")
        try:
            snap = await self._snapshot("vm")
            vm = self._find(snap, instance_id, vmid)
            if vm is None:
                vm = await self._recent_vm(instance_id, vmid)
            if vm is None:
                raise InstanceNotFound(
                    f"proxmox: no VM named {instance_id or '?'} (VMID {provider_id or '?'}) in the cluster"
                )
            return await self._to_instance(vm)
        except PveError as exc:
            raise self._error(exc, f"reading {instance_id or provider_id}") from exc

    async def list_instances(self, cluster_id: str, shard: str) -> list[ProviderInstance]:
        try:
            snap = await self._snapshot("vm")
            mine = [
                vm
                for vm in sorted(snap.vms, key=lambda v: v.vmid)
                if not vm.template and notes.association_of(set(vm.tags)) == (cluster_id, shard)
            ]
            gate = asyncio.Semaphore(_CONFIG_READS)

            async def one(vm: _Vm) -> ProviderInstance:
                async with gate:  # notes are read once per VM, then cached
                    return await self._to_instance(vm)

            return list(await asyncio.gather(*(one(vm) for vm in mine)))
        except PveError as exc:
            raise self._error(exc, f"listing the VMs of cluster {cluster_id} shard {shard}") from exc

    async def check_subnet_capacity(self, subnet_id: str) -> bool:
        return True  # a bridge has no address accounting Nstance can read

    async def close(self) -> None:
        self._annotations.clear()
        self._recent.clear()
        await asyncio.to_thread(self._client.close)

    # ---- create ----------------------------------------------------------------------------

    async def _create(self, request: CreateRequest, args: CloneArgs) -> ProviderInstance:
        snap = await self._snapshot(None)
        existing = snap.by_name(request.instance_id)
        if existing:
            return await self._resume(request, args, existing[0])
        wanted = notes.token_tag(request.idempotency_token) if request.idempotency_token else ""
        if wanted:
            for vm in snap.vms:
                if wanted in vm.tags and vm.name != request.instance_id:
                    raise ProviderInvalidRequest(
                        f"idempotency token {request.idempotency_token!r} was already used to create "
                        f"instance {vm.name} (VMID {vm.vmid}); a new instance needs a new token"
                    )
        template, node = await self._place(request, args, snap)
        bridge, vlan = self._network(request, args)
        seed_volume = await self._upload_seed(request, node)
        vmid = await self._clone(request, args, template, node, snap.max_vmid(), seed_volume)
        vm = _Vm(vmid, request.instance_id, node, "stopped", False, frozenset())
        await self._configure(request, args, vm, bridge, vlan, seed_volume)
        await self._start(vm)
        return await self._get_fresh(vm)

    async def _resume(self, request: CreateRequest, args: CloneArgs, vm: _Vm) -> ProviderInstance:
        """Finish (or just report) the VM an earlier create with this token made."""
        config = await self._call(
            lambda: self._client.get(f"nodes/{vm.node}/qemu/{vm.vmid}/config"), idempotent=True
        )
        found = notes.parse_notes(config.get("description") if isinstance(config, dict) else None)
        if found.get("instance-id") != request.instance_id or (
            request.idempotency_token and found.get("idempotency-token") != request.idempotency_token
        ):
            raise ProviderInvalidRequest(
                f"proxmox: a VM named {request.instance_id} (VMID {vm.vmid}) already exists but was created "
                "with another idempotency token (or not by Nstance); retry with its original token or choose "
                "a new instance id"
            )
        self._recent[request.instance_id] = (vm.vmid, vm.node)
        self._annotations[vm.vmid] = found
        if vm.lock in ("clone", "create"):
            vm = await self._wait_unlocked(vm)
        if notes.association_of(set(vm.tags)) is None:
            bridge, vlan = self._network(request, args)
            seed = self._seed_volume(request) if request.userdata else None
            await self._configure(request, args, vm, bridge, vlan, seed)
        if vm.status == "stopped" and vm.lock is None:
            await self._start(vm)
        return await self._get_fresh(vm)

    async def _place(self, request: CreateRequest, args: CloneArgs, snap: _Snapshot) -> tuple[_Vm, str]:
        """The template to clone and the node the clone goes to."""
        prefix = f"templates.{request.template}.args"
        if args.template_vmid is not None:
            template = snap.by_vmid(args.template_vmid)
            if template is None:
                raise ProviderInvalidRequest(
                    f"{prefix}.TemplateVMID: there is no VM {args.template_vmid} in the Proxmox cluster "
                    "(or the API token may not audit it)"
                )
            if not template.template:
                raise ProviderInvalidRequest(
                    f"{prefix}.TemplateVMID: VM {args.template_vmid} ({template.name}) is not a template; "
                    "convert it with 'qm template' or name another"
                )
            copies = [template]
        else:
            copies = sorted(
                (vm for vm in snap.vms if vm.template and vm.name == args.template_name), key=lambda v: v.vmid
            )
            if not copies:
                raise ProviderInvalidRequest(
                    f"{prefix}.TemplateName: no VM template named {args.template_name!r} in the Proxmox "
                    "cluster"
                )
        need = (args.memory_mib * MIB) if args.memory_mib else max(vm.maxmem for vm in copies)
        allowed: set[str] | None = set(self._nodes) if self._nodes is not None else None
        if len(copies) > 1:  # a template per node (local storage): only those nodes can clone locally
            here = {vm.node for vm in copies}
            allowed = here if allowed is None else allowed & here
        async with self._placement_lock:
            ranked = rank_nodes(
                node_loads(snap.items), need_memory=need, allowed=allowed, reserved=self._reservations()
            )
            if not ranked:
                raise ProviderUnavailable(
                    f"proxmox: no online node has {need // MIB} MiB of memory free for {request.instance_id}"
                    + (f" among {', '.join(sorted(allowed))}" if allowed is not None else "")
                    + "; free memory, bring a node back online or lower Memory"
                )
            node = ranked[0]
            self._reserved.setdefault(node, []).append((self._clock.monotonic() + _RESERVATION_SECONDS, need))
        template = next((vm for vm in copies if vm.node == node), copies[0])
        return template, node

    def _reservations(self) -> dict[str, int]:
        now = self._clock.monotonic()
        out: dict[str, int] = {}
        for node, held in list(self._reserved.items()):
            live = [(expiry, size) for expiry, size in held if expiry > now]
            if live:
                self._reserved[node] = live
                out[node] = sum(size for _, size in live)
            else:
                del self._reserved[node]
        return out

    def _network(self, request: CreateRequest, args: CloneArgs) -> tuple[str, int | None]:
        if args.bridge:
            return args.bridge, args.vlan_tag
        bridge, _, vlan = request.subnet_id.partition(":")
        if not bridge or not bridge.replace("_", "").replace("-", "").replace(".", "").isalnum():
            raise ProviderInvalidRequest(
                f"shard.subnet_pools: subnet {request.subnet_id!r} of instance {request.instance_id} is "
                "not a Proxmox bridge; list bridges such as vmbr0 (or vmbr0:<vlan>), or set "
                f"templates.{request.template}.args.Bridge"
            )
        if vlan:
            if not vlan.isdigit() or not 1 <= int(vlan) <= 4094:
                raise ProviderInvalidRequest(
                    f"shard.subnet_pools: subnet {request.subnet_id!r}: the VLAN after ':' must be 1-4094"
                )
            return bridge, int(vlan)
        return bridge, args.vlan_tag

    def _seed_name(self, request: CreateRequest) -> str:
        return f"nstance-{request.instance_id}.iso"

    def _seed_volume(self, request: CreateRequest) -> str:
        return f"{self._iso_storage}:iso/{self._seed_name(request)}"

    async def _upload_seed(self, request: CreateRequest, node: str) -> str | None:
        if not request.userdata:
            return None
        image = cidata.nocloud_seed(
            request.userdata,
            cidata.meta_data(request.instance_id, request.instance_id),
            now=self._clock.now(),
        )
        volume = self._seed_volume(request)
        await self._delete_volume(node, volume)  # a retry after a crash may have left one
        try:
            upid = await self._call(
                lambda: self._client.upload(node, self._iso_storage, self._seed_name(request), image),
                idempotent=False,
            )
            await self._wait_task(
                str(upid), self._task_timeout, f"uploading the cloud-init seed for {request.instance_id}"
            )
        except PveError as exc:
            lowered = exc.message.lower()
            config_problem = exc.kind in ("invalid", "not_found") or any(
                word in lowered for word in ("storage", "content", "file based", "upload")
            )
            if config_problem:
                raise ProviderInvalidRequest(
                    f"shard.infra.options.cloud_init_iso_storage: cannot upload the cloud-init seed ISO to "
                    f"storage {self._iso_storage!r} on node {node}: {exc.message}; name a file-based storage "
                    "with 'ISO image' content available on every node"
                ) from exc
            raise
        except _TaskFailed as exc:
            raise ProviderUnavailable(
                f"proxmox: uploading the cloud-init seed of {request.instance_id} to {self._iso_storage} on "
                f"{node} failed: {exc.exitstatus}"
            ) from exc
        return volume

    async def _clone(
        self,
        request: CreateRequest,
        args: CloneArgs,
        template: _Vm,
        node: str,
        cluster_max: int,
        seed_volume: str | None,
    ) -> int:
        prefix = f"templates.{request.template}.args"
        description = notes.render_notes("", _annotations_of(request))
        params: dict[str, Any] = {"name": request.instance_id, "description": description}
        if node != template.node:
            params["target"] = node
        if args.storage_pool:
            params.update(full=1, storage=args.storage_pool)
        elif args.full_clone is not None:
            params["full"] = 1 if args.full_clone else 0
        if args.pool:
            params["pool"] = args.pool
        seen_max = cluster_max
        for _ in range(_VMID_RETRIES):
            try:
                vmid = await asyncio.to_thread(self._allocator.allocate, seen_max)
            except (VmidExhausted, VmidStateError) as exc:
                raise ProviderUnavailable(
                    f"proxmox: cannot allocate a VMID for {request.instance_id}: {exc}"
                ) from exc
            path = f"nodes/{template.node}/qemu/{template.vmid}/clone"
            try:
                upid = await self._call(
                    functools.partial(self._client.post, path, newid=vmid, **params), idempotent=False
                )
            except PveError as exc:
                if exc.kind == "conflict" or "already exists" in exc.message:
                    seen_max = vmid  # someone else took it; never reuse, go above
                    continue
                await self._cleanup_seed(node, seed_volume)
                if exc.kind in ("invalid", "not_found") or (exc.status == 500 and "clone" in exc.message):
                    raise ProviderInvalidRequest(
                        f"{prefix}: cloning template {template.vmid} ({template.name}) on {template.node} "
                        f"to node {node} was refused: {exc.message}; check TemplateVMID/TemplateName, "
                        "StoragePool (a cross-node clone needs shared storage) and Pool"
                    ) from exc
                raise
            self._recent[request.instance_id] = (vmid, node)
            try:
                await self._wait_task(str(upid), self._clone_timeout, f"cloning {request.instance_id}")
            except _TaskFailed as exc:
                await self._cleanup_failed_clone(vmid, node, template.node)
                await self._cleanup_seed(node, seed_volume)
                self._recent.pop(request.instance_id, None)
                raise ProviderUnavailable(
                    f"proxmox: cloning template {template.vmid} ({template.name}) to VM {vmid} on {node} for "
                    f"{request.instance_id} failed: {exc.exitstatus} (VMID {vmid} will not be reused)"
                ) from exc
            return vmid
        raise ProviderUnavailable(
            f"proxmox: {_VMID_RETRIES} VMIDs in a row were taken by someone else while creating "
            f"{request.instance_id}; another tool is allocating VMIDs in the same range"
        )

    async def _cleanup_failed_clone(self, vmid: int, *nodes: str) -> None:
        for node in dict.fromkeys(nodes):
            try:
                path = f"nodes/{node}/qemu/{vmid}"
                upid = await self._call(
                    functools.partial(self._client.delete, path, purge=1), idempotent=False
                )
                await self._wait_task(str(upid), self._task_timeout, f"removing the failed clone {vmid}")
                return
            except (PveError, _TaskFailed, ProviderUnavailable) as exc:
                log.debug("no failed clone %s to remove on %s: %s", vmid, node, exc)

    async def _cleanup_seed(self, node: str, volume: str | None) -> None:
        if volume is None:
            return
        try:
            await self._delete_volume(node, volume)
        except PveError as exc:
            log.warning("could not remove the cloud-init seed %s on %s: %s", volume, node, exc)

    async def _configure(
        self,
        request: CreateRequest,
        args: CloneArgs,
        vm: _Vm,
        bridge: str,
        vlan: int | None,
        seed_volume: str | None,
    ) -> None:
        config: dict[str, Any] = {
            "tags": notes.join_tags(
                notes.association_tags(request.cluster_id, request.shard, request.idempotency_token)
            ),
            "net0": f"virtio,bridge={bridge}" + (f",tag={vlan}" if vlan is not None else ""),
        }
        if seed_volume:
            config[self._cd_drive] = f"{seed_volume},media=cdrom"
        if args.cores is not None:
            config["cores"] = args.cores
        if args.sockets is not None:
            config["sockets"] = args.sockets
        if args.memory_mib is not None:
            config["memory"] = args.memory_mib
        if args.start_on_boot is not None:
            config["onboot"] = 1 if args.start_on_boot else 0
        path = f"nodes/{vm.node}/qemu/{vm.vmid}"
        try:
            result = await self._call(lambda: self._client.put(f"{path}/config", **config), idempotent=True)
            if isinstance(result, str) and result.startswith("UPID:"):
                await self._wait_task(result, self._task_timeout, f"configuring {request.instance_id}")
            if args.disk_size:
                size = args.disk_size
                result = await self._call(
                    lambda: self._client.put(f"{path}/resize", disk=args.disk, size=size), idempotent=True
                )
                if isinstance(result, str) and result.startswith("UPID:"):
                    await self._wait_task(
                        result, self._task_timeout, f"resizing the disk of {request.instance_id}"
                    )
        except PveError as exc:
            if exc.kind == "invalid":
                raise ProviderInvalidRequest(
                    f"templates.{request.template}.args: Proxmox refused the configuration of "
                    f"{request.instance_id} (VM {vm.vmid}): {exc.message}"
                ) from exc
            raise
        except _TaskFailed as exc:
            raise ProviderUnavailable(
                f"proxmox: configuring {request.instance_id} (VM {vm.vmid}) failed: {exc.exitstatus}"
            ) from exc

    async def _start(self, vm: _Vm) -> None:
        try:
            upid = await self._call(
                lambda: self._client.post(f"nodes/{vm.node}/qemu/{vm.vmid}/status/start"), idempotent=False
            )
            await self._wait_task(str(upid), self._task_timeout, f"starting {vm.name}")
        except _TaskFailed as exc:
            if "already running" in exc.exitstatus:
                return
            raise ProviderUnavailable(
                f"proxmox: VM {vm.vmid} ({vm.name}) was created on {vm.node} but did not start: "
                f"{exc.exitstatus}"
            ) from exc

    async def _wait_unlocked(self, vm: _Vm) -> _Vm:
        """Poll until another create's clone of this VM is done (its lock is gone)."""
        deadline = self._clock.monotonic() + self._clone_timeout
        delay = 0.2
        while True:
            current = await self._status_current(vm.node, vm.vmid)
            if current is None:
                raise ProviderUnavailable(
                    f"proxmox: VM {vm.vmid} ({vm.name}) disappeared while it was cloned"
                )
            if current.lock not in ("clone", "create"):
                return current
            if self._clock.monotonic() >= deadline:
                raise ProviderUnavailable(
                    f"proxmox: VM {vm.vmid} ({vm.name}) is still being cloned after {self._clone_timeout:g}s"
                )
            await self._sleep(delay)
            delay = min(delay * 2, 5.0)

    # ---- delete ----------------------------------------------------------------------------

    async def _destroy(self, vm: _Vm) -> None:
        if vm.lock in ("clone", "create"):
            raise ProviderUnavailable(
                f"proxmox: VM {vm.vmid} ({vm.name}) is still being cloned; retry the delete when it is done"
            )
        seed = f"{self._iso_storage}:iso/nstance-{vm.name}.iso"
        await self._cleanup_seed(vm.node, seed)
        base = f"nodes/{vm.node}/qemu/{vm.vmid}"
        try:
            if vm.status == "running":
                upid = await self._call(lambda: self._client.post(f"{base}/status/stop"), idempotent=False)
                await self._wait_task(str(upid), self._task_timeout, f"stopping {vm.name}")
            upid = await self._call(
                lambda: self._client.delete(base, purge=1, **{"destroy-unreferenced-disks": 1}),
                idempotent=False,
            )
            await self._wait_task(str(upid), self._task_timeout, f"destroying {vm.name}")
        except PveError as exc:
            if exc.kind == "not_found":
                return
            raise
        except _TaskFailed as exc:
            if "does not exist" in exc.exitstatus:
                return
            raise ProviderUnavailable(
                f"proxmox: deleting VM {vm.vmid} ({vm.name}) on {vm.node} failed: {exc.exitstatus}"
            ) from exc

    async def _delete_volume(self, node: str, volume: str) -> None:
        storage = volume.partition(":")[0]
        path = f"nodes/{node}/storage/{storage}/content/{quote_segment(volume)}"
        try:
            upid = await self._call(lambda: self._client.delete(path), idempotent=True)
        except PveError as exc:
            if exc.kind in ("not_found", "invalid") or exc.status == 500:
                return  # not there (PVE words a missing file in several ways)
            raise
        if isinstance(upid, str) and upid.startswith("UPID:"):
            try:
                await self._wait_task(upid, self._task_timeout, f"removing {volume}")
            except _TaskFailed as exc:
                log.debug("removing %s on %s: %s", volume, node, exc.exitstatus)

    # ---- reading ---------------------------------------------------------------------------

    async def _snapshot(self, kind: str | None) -> _Snapshot:
        params = {"type": kind} if kind else {}
        items = await self._call(lambda: self._client.get("cluster/resources", **params), idempotent=True)
        rows: list[Mapping[str, Any]] = [i for i in (items or []) if isinstance(i, dict)]
        vms = [vm for vm in (_Vm.from_item(i) for i in rows if i.get("type") == "qemu") if vm is not None]
        return _Snapshot(vms=vms, items=rows)

    def _find(self, snap: _Snapshot, instance_id: str, vmid: int | None) -> _Vm | None:
        if vmid is not None:
            vm = snap.by_vmid(vmid)
            if vm is None or vm.template or (instance_id and vm.name != instance_id):
                return None  # gone, or the VMID now names someone else's VM
            return vm
        named = snap.by_name(instance_id)
        return min(named, key=lambda v: v.vmid) if named else None

    async def _recent_vm(self, instance_id: str, vmid: int | None) -> _Vm | None:
        """A VM this process made that /cluster/resources does not show yet, read from its node."""
        hint = self._recent.get(instance_id) if instance_id else None
        if hint is None and vmid is not None:
            hint = next(((v, n) for v, n in self._recent.values() if v == vmid), None)
        if hint is None or (vmid is not None and hint[0] != vmid):
            return None
        vm = await self._status_current(hint[1], hint[0])
        if vm is None or (instance_id and vm.name != instance_id):
            return None
        return vm

    async def _status_current(self, node: str, vmid: int) -> _Vm | None:
        try:
            data = await self._call(
                lambda: self._client.get(f"nodes/{node}/qemu/{vmid}/status/current"), idempotent=True
            )
        except PveError as exc:
            if exc.kind == "not_found":
                return None
            raise
        if not isinstance(data, dict):
            return None
        return _Vm.from_item(dict(data, vmid=vmid), node=node)

    async def _get_fresh(self, vm: _Vm) -> ProviderInstance:
        current = await self._status_current(vm.node, vm.vmid)
        return await self._to_instance(current or vm)

    async def _to_instance(self, vm: _Vm) -> ProviderInstance:
        found = self._annotations.get(vm.vmid)
        if found is None and vm.status == "unknown":
            found = {}  # its node is offline: report what the listing knows rather than wait on it
        elif found is None:
            config = await self._call(
                lambda: self._client.get(f"nodes/{vm.node}/qemu/{vm.vmid}/config"), idempotent=True
            )
            found = notes.parse_notes(config.get("description") if isinstance(config, dict) else None)
            if found:
                self._annotations[vm.vmid] = found
        association = notes.association_of(set(vm.tags))
        cluster_id, shard = (
            association if association else (found.get("cluster-id", ""), found.get("shard", ""))
        )
        launched: datetime | None = None
        if found.get("created-at"):
            try:
                launched = datetime.fromisoformat(found["created-at"])
            except ValueError:
                launched = None
        return ProviderInstance(
            instance_id=vm.name,
            provider_id=str(vm.vmid),
            status=map_status(vm.status, lock=vm.lock, qmpstatus=vm.qmpstatus, hastate=vm.hastate),
            cluster_id=cluster_id,
            shard=shard,
            group=found.get("group", ""),
            kind=found.get("kind", ""),
            tenant=found.get("tenant", ""),
            template=found.get("template", ""),
            on_demand=found.get("on-demand") == "true",
            instance_type=found.get("instance-type", ""),
            subnet_id=found.get("subnet", ""),
            hostname=vm.name,
            zone=self._zone or vm.node,
            launched_at=launched,
        )

    # ---- calls, retries and tasks ----------------------------------------------------------

    async def _call(self, fn: Callable[[], T], *, idempotent: bool) -> T:
        """Run one blocking API call in a thread; retry throttling (and, if idempotent, transient faults)."""
        attempt = 0
        while True:
            try:
                return await asyncio.to_thread(fn)
            except PveError as exc:
                retry = exc.kind == "throttled" or (idempotent and exc.kind in ("unavailable", "locked"))
                if not retry or attempt + 1 >= self._max_attempts:
                    raise
                await self._sleep(self._backoff.delay(attempt))
                attempt += 1

    async def _wait_task(self, upid: str, within: float, what: str) -> None:
        """Poll a task until it stops; raise _TaskFailed unless it ended OK (or with warnings only)."""
        node = upid.split(":")[1] if upid.startswith("UPID:") and upid.count(":") >= 2 else ""
        if not node:
            raise ProviderUnavailable(
                f"proxmox: {what}: the API returned {upid!r} where a task id (UPID) was due"
            )
        deadline = self._clock.monotonic() + within
        delay = 0.1
        while True:
            status = await self._call(
                lambda: self._client.get(f"nodes/{node}/tasks/{upid}/status"), idempotent=True
            )
            if isinstance(status, dict) and status.get("status") == "stopped":
                exit_status = str(status.get("exitstatus") or "")
                if exit_status == "OK" or exit_status.startswith("WARNINGS"):
                    return
                raise _TaskFailed(upid, exit_status or "task failed without an exit status")
            if self._clock.monotonic() >= deadline:
                raise ProviderUnavailable(
                    f"proxmox: {what}: task {upid} still running after {within:g}s; it may finish later "
                    "(the next reconcile sees the result)"
                )
            await self._sleep(delay)
            delay = min(delay * 2, 2.0)

    def _error(self, exc: PveError, what: str) -> Exception:
        """The provider error for an API failure that escaped the retries."""
        text = f"proxmox: {what}: {exc}"
        if exc.kind == "throttled":
            return ProviderThrottled(f"{text} (still throttled after {self._max_attempts} attempts)")
        if exc.kind == "not_found":
            return InstanceNotFound(text)
        if exc.kind == "invalid":
            return ProviderInvalidRequest(text)
        if exc.kind == "denied":
            return ProviderInvalidRequest(
                f"{text}; the API token (shard.infra.options.token_id / PROXMOX_TOKEN_ID) lacks a privilege "
                "or its secret is wrong; see docs/provider-proxmox.md for the role to grant"
            )
        return ProviderUnavailable(text)


def _annotations_of(request: CreateRequest) -> dict[str, str]:
    out = {
        "instance-id": request.instance_id,
        "cluster-id": request.cluster_id,
        "shard": request.shard,
        "tenant": request.tenant,
        "group": request.group,
        "template": request.template,
        "kind": request.kind,
        "instance-type": request.instance_type,
        "subnet": request.subnet_id,
        "arch": request.arch,
        "created-at": request.created_at.isoformat(),
        "idempotency-token": request.idempotency_token,
        "on-demand": "true" if request.on_demand else "",
    }
    for key, value in request.tags.items():
        safe = "".join(c if c.isalnum() or c in "._-" else "-" for c in key.lower())
        out[f"tag.{safe}"] = value
    return {k: v for k, v in out.items() if v != ""}


def _whole(value: object) -> int:
    if isinstance(value, bool):
        return 0
    if isinstance(value, int | float):
        return int(value)
    try:
        return int(float(str(value)))
    except ValueError:
        return 0


def _parse_provider_id(provider_id: str) -> int | None:
    if not provider_id:
        return None
    text = provider_id.rsplit("/", 1)[-1]
    if not text.isdigit():
        raise ProviderInvalidRequest(f"proxmox: provider id {provider_id!r} is not a VMID")
    return int(text)
