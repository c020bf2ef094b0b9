"""The Proxmox VE provider (proxmoxer): VMs cloned from templates, tagged and annotated per the spec.

Exports the provider and its config constructor; the modules are ``provider`` (the Provider protocol),
``options`` (``shard.infra.options`` and building the provider from them),
``client`` (proxmoxer wrapper and error classes), ``vmid`` (VMID allocator), ``placement`` (node
ranking), ``status`` (status mapping), ``notes`` (tags and notes annotations), ``args`` (template args)
and ``cidata`` (the cloud-init seed ISO). Importing this package imports proxmoxer; the factory imports it
only when ``shard.infra.provider`` is ``proxmox``.
"""

from __future__ import annotations

from nstance.providers.proxmox.options import proxmox_provider_from_options
from nstance.providers.proxmox.provider import ProxmoxProvider

__all__ = ["ProxmoxProvider", "proxmox_provider_from_options"]
