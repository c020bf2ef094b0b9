"""The benchmarks that drive a real server in-process still run, at a toy size.

A benchmark reaches into the server (its provider, its metrics, its election) the way no test does, so
a restructuring can break it without any test failing: `bench/takeover_scale.py` once stopped at an
assertion about how the shard wraps its provider, and only `make bench` would have shown it. These run
each such benchmark as `make bench` does (a child process, JSON lines on stdout) at the smallest size
that still takes the whole path, and check the figures come out. The figures themselves are not judged
here: at these sizes on a shared machine they mean nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


def _run(script: str, *args: str, timeout: float) -> list[dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=REPO,
    )
    assert done.returncode == 0, f"{script} failed:\n{done.stderr[-3000:]}"
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


@pytest.mark.timeout(240)
def test_the_takeover_benchmark_runs_a_takeover_end_to_end() -> None:
    figures = {
        f["name"]: f
        for f in _run("takeover_scale.py", "--sizes", "300", "400", "--baseline-runs", "1", timeout=200)
    }
    per_size = (
        "first_decision_s",
        "max_loop_lag_s",
        "lease_losses",
        "rss_mib_per_10k",
        "list_instances_s",
        "list_groups_s",
        "listing_max_loop_lag_s",
    )
    assert set(figures) == {f"takeover_scale_{n}_{name}" for n in (300, 400) for name in per_size} | {
        "takeover_scale_list_page_growth_300_to_400"
    }
    assert figures["takeover_scale_300_first_decision_s"]["value"] > 0
    assert figures["takeover_scale_300_lease_losses"]["value"] == 0
    listing = figures["takeover_scale_300_list_instances_s"]
    assert listing["listed"] == 301  # the 300 records and the probe group's new instance
    assert figures["takeover_scale_300_list_groups_s"]["provider_ids"] == 301


@pytest.mark.timeout(180)
def test_the_registration_benchmark_registers_every_agent() -> None:
    figures = _run("registration.py", "--instances", "60", "--workers", "4", timeout=150)
    assert [f["name"] for f in figures] == ["registration_60_agents_4_clients"]
    assert figures[0]["value"] > 0


@pytest.mark.timeout(300)
def test_the_soak_benchmark_churns_real_agents_and_samples_the_quiet_shard() -> None:
    lines = _run("soak.py", "--warmup", "1", "--cycles", "1", timeout=270)
    figures = {f["name"]: f for f in lines if "name" in f}
    assert set(figures) == {
        "soak_rss_kib",
        "soak_py_blocks",
        *(f"soak_{key}_end" for key in ("sockets", "tasks", "fds", "threads", "live_agents", "front_peers")),
        "soak_rows_end",
        "soak_records_end",
    }
    cycles = [line for line in lines if "cycle" in line]
    assert len(cycles) == 2
    assert figures["soak_rss_kib"]["vms"] == 4
    # Exact whatever the machine's speed: the cycle waits for them, and the quiet sample for the purge.
    assert [c["agents"] for c in cycles] == [2, 2]
    assert figures["soak_live_agents_end"]["value"] == 2
