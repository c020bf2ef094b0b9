"""Matching a shard server's provider instance ID with a Kubernetes Node's ``spec.providerID``.

Shard servers report the provider's own ID (``i-0abc…`` on AWS, the instance name on GCP, the VMID on
Proxmox, a process name for ``local``); cloud controller managers write it into a URI on the Node:

* AWS:      ``aws:///us-west-2a/i-0abc…`` (also ``aws://us-west-2a/i-0abc…``)
* GCP:      ``gce://project/us-central1-a/instance-name``
* Proxmox:  ``proxmox://region/123`` or ``proxmox:///123`` (VMID last), and bare UUID forms
* anything else of the form ``scheme://…/id`` or a bare id.

A Node is indexed under ``node_keys`` of its providerID; an instance is looked up with
``instance_key``. Both reduce to the last path segment, so every form above meets the raw ID. Pure
functions only: no Kubernetes access here.
"""

from __future__ import annotations

from typing import Final

_SEPARATOR: Final = "://"


def last_segment(provider_id: str) -> str:
    """The trailing ID of a providerID URI (the whole string when it is not a URI)."""
    value = provider_id.strip()
    if _SEPARATOR in value:
        value = value.split(_SEPARATOR, 1)[1]
    return value.rstrip("/").rsplit("/", 1)[-1]


def node_keys(provider_id: str) -> set[str]:
    """Keys under which a Node with this ``spec.providerID`` is indexed (empty for none)."""
    value = provider_id.strip()
    if not value:
        return set()
    keys = {value}
    tail = last_segment(value)
    if tail:
        keys.add(tail)
    return keys


def instance_key(provider_instance_id: str) -> str:
    """The key to look a server-reported provider instance ID up in a ``node_keys`` index."""
    return last_segment(provider_instance_id)


def matches(provider_instance_id: str, node_provider_id: str) -> bool:
    """Whether the server's provider instance ID names the machine behind this Node."""
    key = instance_key(provider_instance_id)
    return bool(key) and key in node_keys(node_provider_id)
