"""Benchmark: load + validate a 500-group config and hash every group, vs parsing the JSON alone.

Measured: ``load_config_text`` (JSONC parse, schema validation, cross-section rules, template
compile checks) on an in-memory config with 500 static groups spread over 5 tenants and 4 templates
(each group with its own vars and args), then ``merged_group`` + ``runtime_hash`` + ``infra_hash``
for every group: what a server does on every config load or refresh. Baseline, measured in the same
run on the same document serialised as plain JSON: ``json.loads``, the cost of parsing alone. The two
run in alternating batches and the median batch is reported, because machines here are noisy.

Prints one JSON object per line and finishes in a few seconds. It reads and writes no files.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from typing import Any

from nstance.config import infra_hash, load_config_text, merged_group, runtime_hash

GROUPS = 500
TENANTS = 5
TEMPLATES = ("web", "api", "job", "dbx")
TIME_BUDGET_S = 4.0
MAX_BATCHES = 15


def _addrs(first_port: int) -> dict[str, str]:
    names = ("health_addr", "election_addr", "registration_addr", "operator_addr", "agent_addr")
    return {name: f"127.0.0.1:{first_port + i}" for i, name in enumerate(names)}


def build_document(groups: int = GROUPS) -> dict[str, Any]:
    """A valid config with ``groups`` static groups, as a plain dict."""
    templates = {
        name: {
            "kind": name,
            "arch": "amd64" if i % 2 == 0 else "arm64",
            "instance_type": f"m7.{i + 1}xlarge",
            "subnet_pool": f"pool-{i % 2}",
            "vars": {"role": name, "tier": str(i)},
            "args": {"SecurityGroupIds": [f"sg-{i:04d}"], "Tags": {"template": name}},
            "userdata": {
                "content": "#!/bin/sh\necho {{ .Instance.ID }} {{ .Vars.role }}\nexport N='{{ .Nonce }}'\n"
            },
            "files": {
                "node.env": {
                    "kind": "env",
                    "template": {"ROLE": "{{ .Vars.role }}", "TIER": "{{ .Vars.tier }}"},
                },
                "token": {"kind": "secret", "source": f"{name}-token"},
            },
        }
        for i, name in enumerate(TEMPLATES)
    }
    tenants: dict[str, dict[str, Any]] = {f"tenant-{t}": {} for t in range(TENANTS)}
    for g in range(groups):
        tenants[f"tenant-{g % TENANTS}"][f"group-{g}"] = {
            "template": TEMPLATES[g % len(TEMPLATES)],
            "size": g % 7,
            "vars": {"pool": f"p{g}", "index": str(g)},
            "args": {
                "Tags": {"group": f"group-{g}", "owner": "{{ .Instance.ID }}"},
                "EbsOptimized": g % 2 == 0,
            },
        }
    return {
        "cluster": {
            "id": "bench",
            "secrets": {"provider": "object-storage", "encryption_key": {"provider": "env", "source": "KEY"}},
        },
        "shard": {
            "id": "bench-a",
            "infra": {"provider": "sim", "region": "r1", "zone": "r1a"},
            "bind": _addrs(8990),
            "advertise": _addrs(8990),
            "subnet_pools": {"pool-0": ["net-0", "net-1"], "pool-1": ["net-2"]},
        },
        "defaults": {"args": {"Tags": {"cluster": "bench"}}, "vars": {"cluster": "bench"}},
        "templates": templates,
        "groups": tenants,
    }


def load_and_hash(text: str) -> int:
    """The measured operation; returns the number of groups hashed."""
    config = load_config_text(text, "bench.jsonc")
    count = 0
    for tenant, groups in config.groups.items():
        for group in groups:
            merged = merged_group(config, {}, tenant, group)
            runtime_hash(merged)
            infra_hash(merged)
            count += 1
    return count


def _per_call(fn: Callable[[], object], n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n


def main() -> int:
    document = build_document()
    plain = json.dumps(document)
    jsonc = "// generated benchmark config\n" + json.dumps(document, indent=2)
    if load_and_hash(jsonc) != GROUPS:
        raise SystemExit("benchmark config did not produce the expected groups")
    baseline_n = max(1, int(0.05 / max(_per_call(lambda: json.loads(plain), 3), 1e-9)))
    values: list[float] = []
    baselines: list[float] = []
    deadline = time.perf_counter() + TIME_BUDGET_S
    while len(values) < MAX_BATCHES and (len(values) < 3 or time.perf_counter() < deadline):
        values.append(_per_call(lambda: load_and_hash(jsonc), 1))
        baselines.append(_per_call(lambda: json.loads(plain), baseline_n))
    value = statistics.median(values)
    baseline = statistics.median(baselines)
    result = {
        "name": "config_load_validate_hash_500_groups",
        "value": value,
        "unit": "s",
        "baseline": baseline,
        "baseline_name": "json.loads same document",
        "ratio": value / baseline,
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
