"""The Proxmox VE provider (proxmoxer): VMs cloned from templates, tagged and annotated per the spec.

Exports the provider and its config constructor; the modules are ``provider`` (the Provider protocol),
``client`` (proxmoxer wrapper and error classes), ``vmid`` (VMID allocator), ``placement`` (node
ranking), ``status`` (status mapping), ``notes`` (tags and notes annotations), ``args`` (template args)
and ``cidata`` (the cloud-init seed ISO). Importing this package imports proxmoxer; the factory imports it
only when ``shard.infra.provider`` is ``proxmox``.
"""

from __future__ import annotations

from nstance.providers.proxmox.provider import ProxmoxProvider, proxmox_provider_from_options

__all__ = ["ProxmoxProvider", "proxmox_provider_from_options"]
