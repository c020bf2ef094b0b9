"""A ready-made provider ``CreateRequest`` for provider tests (every field filled, a fresh instance id).

Tests override what they assert on (``sample_create_request(shard="s2", userdata=b"...")``); nothing
here is used by the server.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from nstance.core.clock import ManualClock
from nstance.core.ids import new_instance_id
from nstance.providers.base import CreateRequest


def sample_create_request(
    *, cluster_id: str = "c1", shard: str = "s1", token: str | None = None, **changes: Any
) -> CreateRequest:
    """A create request for group ``web`` (kind ``web``); ``token`` defaults to one per instance id."""
    instance_id = new_instance_id("web")
    request = CreateRequest(
        cluster_id=cluster_id,
        shard=shard,
        tenant="default",
        group="web",
        template="web",
        kind="web",
        instance_id=instance_id,
        instance_type="small",
        subnet_id="subnet-a",
        arch="amd64",
        userdata=b"#cloud-config\n",
        idempotency_token=token or f"tok-{instance_id}",
        created_at=ManualClock().now(),
        ca_pem=b"-----BEGIN CERTIFICATE-----\n",
        nonce="nonce.jwt.value",
        server_registration_addr="127.0.0.1:9991",
        server_agent_addr="127.0.0.1:9992",
    )
    return replace(request, **changes)
