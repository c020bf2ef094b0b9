"""Parse and check a template's merged ``args`` for the Proxmox provider.

Recognised keys (PVE-style CamelCase, as upstream Nstance): exactly one of ``TemplateVMID`` /
``TemplateName``; ``StoragePool`` (full clone onto this storage), ``FullClone``, ``Pool``, ``Bridge``,
``VLANTag``, ``Cores``, ``Sockets``, ``Memory`` (MiB), ``DiskSize`` (e.g. ``32G``), ``Disk`` (the disk to
resize, default ``scsi0``), ``StartOnBoot``. Numbers may be given as JSON numbers or digit strings (args
are templated, so rendered values are strings). Every error names the config path
``templates.<template>.args.<Key>`` (args merge defaults -> template -> group; the key may come from any).

Pure validation; no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nstance.providers.base import ProviderInvalidRequest

ARG_KEYS: tuple[str, ...] = (
    "TemplateVMID",
    "TemplateName",
    "StoragePool",
    "FullClone",
    "Pool",
    "Bridge",
    "VLANTag",
    "Cores",
    "Sockets",
    "Memory",
    "DiskSize",
    "Disk",
    "StartOnBoot",
)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_DISK = re.compile(r"^(scsi|virtio|sata|ide)\d{1,2}$")
_SIZE = re.compile(r"^\d+(\.\d+)?[KMGT]$")


@dataclass(frozen=True, slots=True)
class CloneArgs:
    """What a create needs from the args, validated."""

    template_vmid: int | None
    template_name: str | None
    storage_pool: str | None = None
    full_clone: bool | None = None
    pool: str | None = None
    bridge: str | None = None
    vlan_tag: int | None = None
    cores: int | None = None
    sockets: int | None = None
    memory_mib: int | None = None
    disk_size: str | None = None
    disk: str = "scsi0"
    start_on_boot: bool | None = None


def parse_clone_args(args: Mapping[str, Any], template: str) -> CloneArgs:
    """Validate ``args``; raise ProviderInvalidRequest naming the config path of the first problem."""
    prefix = f"templates.{template}.args"
    unknown = sorted(set(args) - set(ARG_KEYS))
    if unknown:
        raise ProviderInvalidRequest(
            f"{prefix}.{unknown[0]}: not an argument of the proxmox provider; allowed: {', '.join(ARG_KEYS)}"
        )
    has_id = args.get("TemplateVMID") not in (None, "")
    has_name = args.get("TemplateName") not in (None, "")
    if has_id == has_name:
        which = "both are set" if has_id else "neither is set"
        raise ProviderInvalidRequest(
            f"{prefix}.TemplateVMID / {prefix}.TemplateName: give exactly one of them ({which}); "
            "TemplateVMID is the numeric id of the VM template to clone, TemplateName its name"
        )
    template_vmid = _int(args, "TemplateVMID", prefix, 100, 999_999_999) if has_id else None
    template_name = _name(args, "TemplateName", prefix) if has_name else None
    disk = _name(args, "Disk", prefix) or "scsi0"
    if not _DISK.match(disk):
        raise ProviderInvalidRequest(
            f"{prefix}.Disk: must name a disk such as scsi0 or virtio0 (got {disk!r})"
        )
    disk_size = args.get("DiskSize")
    if disk_size is not None:
        if isinstance(disk_size, int) and not isinstance(disk_size, bool):
            disk_size = f"{disk_size}G"
        if not isinstance(disk_size, str) or not _SIZE.match(disk_size):
            raise ProviderInvalidRequest(
                f"{prefix}.DiskSize: must be a size such as 32G or 512M, or a number of GiB "
                f"(got {disk_size!r})"
            )
    return CloneArgs(
        template_vmid=template_vmid,
        template_name=template_name,
        storage_pool=_name(args, "StoragePool", prefix),
        full_clone=_bool(args, "FullClone", prefix),
        pool=_name(args, "Pool", prefix),
        bridge=_name(args, "Bridge", prefix),
        vlan_tag=_int(args, "VLANTag", prefix, 1, 4094),
        cores=_int(args, "Cores", prefix, 1, 8192),
        sockets=_int(args, "Sockets", prefix, 1, 16),
        memory_mib=_int(args, "Memory", prefix, 16, 64 * 1024 * 1024),
        disk_size=disk_size,
        disk=disk,
        start_on_boot=_bool(args, "StartOnBoot", prefix),
    )


def _int(args: Mapping[str, Any], key: str, prefix: str, low: int, high: int) -> int | None:
    value = args.get(key)
    if value is None or value == "":
        return None
    number: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, float) and value.is_integer():
        number = int(value)
    elif isinstance(value, str) and value.strip().isdigit():
        number = int(value.strip())
    if number is None or not low <= number <= high:
        raise ProviderInvalidRequest(
            f"{prefix}.{key}: must be a whole number from {low} to {high} (got {value!r})"
        )
    return number


def _name(args: Mapping[str, Any], key: str, prefix: str) -> str | None:
    value = args.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str) or not _NAME.match(value):
        raise ProviderInvalidRequest(
            f"{prefix}.{key}: must be a name of letters, digits, '.', '_' and '-' (got {value!r})"
        )
    return value


def _bool(args: Mapping[str, Any], key: str, prefix: str) -> bool | None:
    value = args.get(key)
    if value is None:
        return None
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false", "1", "0"):
        return value.lower() in ("true", "1")
    raise ProviderInvalidRequest(f"{prefix}.{key}: must be true or false (got {value!r})")
