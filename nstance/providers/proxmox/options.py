"""``shard.infra.options`` of the ``proxmox`` provider, and building the provider from them.

The API token secret is read only from ``PROXMOX_TOKEN_SECRET`` (never from config); the URL and token
id come from the options or ``PROXMOX_API_URL`` / ``PROXMOX_TOKEN_ID``. Each option is checked with
the shared readers of ``nstance.providers.options``; a bad one is refused naming its path.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nstance.core.clock import Clock
from nstance.core.errors import InvalidArgument
from nstance.providers import options as opt
from nstance.providers.proxmox.client import Endpoint, PveClient
from nstance.providers.proxmox.provider import ProxmoxProvider, Sleep
from nstance.providers.proxmox.vmid import DEFAULT_FLOOR, VmidAllocator, VmidStateError

DEFAULT_API_URL = "https://localhost:8006/api2/json"
OPTION_KEYS: tuple[str, ...] = (
    "api_url",
    "token_id",
    "insecure_tls",
    "ca_file",
    "cloud_init_iso_storage",
    "cloud_init_drive",
    "vmid_state_file",
    "vmid_floor",
    "nodes",
    "clone_timeout",
    "task_timeout",
    "request_timeout",
    "max_attempts",
)
CLOUD_INIT_DRIVES = ("ide0", "ide1", "ide2", "ide3", "sata0", "sata1", "sata2", "sata3", "sata4", "sata5")


def proxmox_provider_from_options(
    options: Mapping[str, Any],
    *,
    clock: Clock,
    base_dir: Path,
    zone: str = "",
    env: Mapping[str, str] | None = None,
    sleep: Sleep = asyncio.sleep,
) -> ProxmoxProvider:
    """Build a ProxmoxProvider from ``shard.infra.options`` and the PROXMOX_* environment."""
    prefix = opt.PREFIX
    environ = os.environ if env is None else env
    opt.check_known(options, OPTION_KEYS, "proxmox")
    api_url = opt.text(options, "api_url") or environ.get("PROXMOX_API_URL") or DEFAULT_API_URL
    token_id = opt.text(options, "token_id") or environ.get("PROXMOX_TOKEN_ID", "")
    token_secret = environ.get("PROXMOX_TOKEN_SECRET", "")
    if not token_id or not token_secret:
        raise InvalidArgument(
            f"{prefix}.token_id: the proxmox provider needs an API token: set token_id (or PROXMOX_TOKEN_ID) "
            "to user@realm!name and PROXMOX_TOKEN_SECRET to its secret"
        )
    insecure = opt.flag(options, "insecure_tls")
    ca_path = opt.path(options, "ca_file", base_dir)
    verify: bool | str = True
    if insecure and ca_path is not None:
        raise InvalidArgument(f"{prefix}.ca_file: give ca_file or insecure_tls, not both")
    if ca_path is not None:
        if not ca_path.is_file():
            raise InvalidArgument(f"{prefix}.ca_file: {ca_path} is not a readable file")
        verify = str(ca_path)
    elif insecure:
        verify = False
    nodes_opt = options.get("nodes")
    nodes: tuple[str, ...] | None = None
    if nodes_opt is not None:
        if (
            not isinstance(nodes_opt, list)
            or not nodes_opt
            or not all(isinstance(n, str) and n for n in nodes_opt)
        ):
            raise InvalidArgument(
                f"{prefix}.nodes: must be a non-empty list of node names (got {nodes_opt!r})"
            )
        nodes = tuple(nodes_opt)
    floor = opt.whole(options, "vmid_floor", DEFAULT_FLOOR, 100, 999_999_999)
    attempts = opt.whole(options, "max_attempts", 5, 1, 20)
    state_path = opt.path(options, "vmid_state_file", base_dir, "proxmox-vmid.json")
    assert state_path is not None  # it has a default
    drive = opt.text(options, "cloud_init_drive", "ide2")
    if drive not in CLOUD_INIT_DRIVES:
        raise InvalidArgument(
            f"{prefix}.cloud_init_drive: must be an IDE or SATA slot such as ide2 (got {drive!r})"
        )
    try:
        client = PveClient(
            Endpoint(
                api_url=api_url,
                token_id=token_id,
                token_secret=token_secret,
                verify=verify,
                timeout=opt.seconds(options, "request_timeout", 30.0),
            )
        )
        allocator = VmidAllocator(state_path, floor=floor)
    except ValueError as exc:
        raise InvalidArgument(f"{prefix}: {exc}") from exc
    except VmidStateError as exc:
        raise InvalidArgument(f"{prefix}.vmid_state_file: {exc}") from exc
    return ProxmoxProvider(
        client,
        clock=clock,
        allocator=allocator,
        zone=zone,
        iso_storage=opt.text(options, "cloud_init_iso_storage", "local"),
        cloud_init_drive=drive,
        nodes=nodes,
        clone_timeout=opt.seconds(options, "clone_timeout", 600.0),
        task_timeout=opt.seconds(options, "task_timeout", 120.0),
        max_attempts=attempts,
        sleep=sleep,
    )
