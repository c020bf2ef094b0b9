"""``.Provider.Kind`` is ``shard.infra.provider`` as config.jsonc writes it, as upstream passes it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nstance.core.clock import ManualClock
from nstance.objectstore.memory import MemoryObjectStore
from nstance.server.state.configstate import ConfigState
from nstance.testing.shardproc import ADDR_NAMES, shard_config

ADDRS = {name: f"10.0.0.5:{8990 + i}" for i, name in enumerate(ADDR_NAMES)}


@pytest.mark.parametrize(
    ("written", "options", "normalised"),
    [
        ("gcp", {"project_id": "p"}, "google"),
        ("google", {"project_id": "p"}, "google"),
        ("tmux", {}, "local"),
        ("mock", {}, "sim"),
        ("sim", {}, "sim"),
    ],
)
def test_the_string_as_written_not_the_normalised_name(
    tmp_path: Path, written: str, options: dict[str, str], normalised: str
) -> None:
    store = MemoryObjectStore()
    config = shard_config(addrs=ADDRS, provider=written, provider_options=options)
    store.put("config.jsonc", json.dumps(config).encode())
    state = ConfigState(store, tmp_path, clock=ManualClock())
    state.load(True)
    snapshot = state.snapshot()
    assert snapshot is not None
    assert snapshot.config.shard.infra.provider == normalised
    assert snapshot.config.shard.infra.provider_as_written == written
