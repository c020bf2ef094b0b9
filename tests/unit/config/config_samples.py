"""Sample config documents shared by the config unit tests (plain dicts, serialised as JSON)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from nstance.config import ServerConfig, load_config_text, validate_config_text

REPO_ROOT = Path(__file__).resolve().parents[3]


def addrs(host: str = "127.0.0.1", first_port: int = 8990) -> dict[str, str]:
    names = ["health_addr", "election_addr", "registration_addr", "operator_addr", "agent_addr"]
    return {name: f"{host}:{first_port + i}" for i, name in enumerate(names)}


def base_config() -> dict[str, Any]:
    """A small valid config: one template "web", one static group default/web."""
    return {
        "cluster": {
            "id": "c1",
            "secrets": {"provider": "object-storage", "encryption_key": {"provider": "env", "source": "KEY"}},
        },
        "shard": {
            "id": "s1",
            "infra": {"provider": "sim", "region": "r1", "zone": "z1"},
            "bind": addrs(),
            "advertise": addrs(),
            "subnet_pools": {"default": ["net-a"], "other": ["net-b"]},
        },
        "templates": {
            "web": {
                "kind": "web",
                "arch": "amd64",
                "subnet_pool": "default",
                "vars": {"tier": "web"},
                "userdata": {"content": "#!/bin/sh\necho {{ .Instance.ID }}\n"},
            }
        },
        "groups": {"default": {"web": {"template": "web", "size": 2}}},
    }


def as_text(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=2)


def load(doc: dict[str, Any]) -> ServerConfig:
    return load_config_text(as_text(doc), "test.jsonc")


def problems(doc: dict[str, Any]) -> list[str]:
    """Every problem of ``doc`` as the "path: message" lines a user sees."""
    return [str(p) for p in validate_config_text(as_text(doc), "test.jsonc")]
