"""Runtime and infra config hashes: upstream's bytes, what each one covers, and the legacy hashes.

The Go vectors (``tests/fixtures/upstream/go-json-vectors.json``) were produced by a scratch Go program
that decodes each config into structs with upstream's field lists and tags
(``internal/server/config/types.go``), merges a group as upstream's ``GetMergedConfig`` does and hashes
the ``json.Marshal`` output as ``hash.go`` does; the fixture's README says more.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from config_samples import base_config, load

from nstance.config import (
    canonical_json,
    infra_hash,
    legacy_infra_hash,
    legacy_runtime_hash,
    load_config_file,
    load_config_text,
    load_groups_file,
    load_groups_text,
    merged_group,
    runtime_hash,
)
from nstance.config.hashes import infra_json, runtime_json

HASH = re.compile(r"^sha256:[0-9a-f]{64}$")
UPSTREAM = Path(__file__).resolve().parents[2] / "fixtures" / "upstream"
VECTORS = json.loads((UPSTREAM / "go-json-vectors.json").read_text(encoding="utf-8"))


def _doc() -> dict[str, Any]:
    doc = base_config()
    doc["defaults"] = {"args": {"Tags": {"team": "a", "app": "b"}, "Disk": 20}, "vars": {"z": "1", "a": "2"}}
    doc["templates"]["web"]["files"] = {
        "app.env": {"kind": "env", "template": {"B": "{{ .Vars.a }}", "A": "x"}},
        "ca.txt": {"kind": "string", "template": "hello"},
    }
    doc["templates"]["web"]["instance_type"] = "t.small"
    return doc


def _reverse(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _reverse(value[key]) for key in reversed(list(value))}
    return value


def _hashes(doc: dict[str, Any]) -> tuple[str, str]:
    merged = merged_group(load(doc), {}, "default", "web")
    return runtime_hash(merged), infra_hash(merged)


def test_hash_format() -> None:
    runtime, infra = _hashes(_doc())
    assert HASH.match(runtime)
    assert HASH.match(infra)
    assert runtime != infra


def test_same_config_with_keys_reordered_gives_the_same_hashes() -> None:
    doc = _doc()
    reordered = _reverse(doc)
    assert json.dumps(reordered) != json.dumps(doc)
    assert _hashes(reordered) == _hashes(doc)
    assert _hashes(doc) == _hashes(_doc())


def test_changing_a_var_changes_only_the_runtime_hash() -> None:
    runtime, infra = _hashes(_doc())
    doc = _doc()
    doc["templates"]["web"]["vars"]["tier"] = "other"
    runtime2, infra2 = _hashes(doc)
    assert runtime2 != runtime
    assert infra2 == infra


def test_changing_a_file_changes_only_the_runtime_hash() -> None:
    runtime, infra = _hashes(_doc())
    doc = _doc()
    doc["templates"]["web"]["files"]["ca.txt"]["template"] = "bye"
    runtime2, infra2 = _hashes(doc)
    assert runtime2 != runtime
    assert infra2 == infra


def test_changing_instance_type_changes_only_the_infra_hash() -> None:
    runtime, infra = _hashes(_doc())
    doc = _doc()
    doc["groups"]["default"]["web"]["instance_type"] = "t.large"
    runtime2, infra2 = _hashes(doc)
    assert runtime2 == runtime
    assert infra2 != infra


def test_args_userdata_and_subnet_pool_are_infra() -> None:
    base = _hashes(_doc())
    for change in (
        lambda d: d["defaults"]["args"]["Tags"].update(team="c"),
        lambda d: d["templates"]["web"]["userdata"].update(content="#!/bin/sh\n"),
        lambda d: d["groups"]["default"]["web"].update(subnet_pool="other"),
    ):
        doc = _doc()
        change(doc)
        runtime, infra = _hashes(doc)
        assert runtime == base[0]
        assert infra != base[1]


def test_size_changes_neither_hash() -> None:
    doc = _doc()
    doc["groups"]["default"]["web"]["size"] = 9
    assert _hashes(doc) == _hashes(_doc())


def test_userdata_fields_written_out_are_hashed_as_go_hashes_them() -> None:
    # Go keeps the "" it read for an absent source/encoding and omits it; one written out is hashed,
    # even when it is the default. The legacy hash ignored defaults: it stays the same.
    doc = _doc()
    doc["templates"]["web"]["userdata"].update(source="inline", encoding="plain")
    merged, before = (merged_group(load(d), {}, "default", "web") for d in (doc, _doc()))
    assert b'"userdata":{"source":"inline","encoding":"plain","content":' in infra_json(merged)
    assert b'"userdata":{"content":' in infra_json(before)
    assert infra_hash(merged) != infra_hash(before)
    assert legacy_infra_hash(merged) == legacy_infra_hash(before)


def _case_name(case: dict[str, Any]) -> str:
    return str(case.get("name") or "+".join(case[k] for k in ("config_file", "groups_file") if k in case))


GO_GROUPS = [
    pytest.param(case, key, id=f"{_case_name(case)}:{key}")
    for case in VECTORS["hashes"]
    for key in case["groups"]
]


@pytest.mark.parametrize(("case", "key"), GO_GROUPS)
def test_hashes_are_the_bytes_and_digests_a_go_server_computes(case: dict[str, Any], key: str) -> None:
    if "config_file" in case:
        config = load_config_file(UPSTREAM / case["config_file"])
        dynamic = load_groups_file(UPSTREAM / case["groups_file"]) if "groups_file" in case else {}
    else:
        config = load_config_text(json.dumps(case["config"]), "vector.jsonc")
        dynamic = load_groups_text(json.dumps(case["dynamic"]))
    tenant, group = key.split("/")
    merged = merged_group(config, dynamic, tenant, group)
    want = case["groups"][key]
    assert runtime_json(merged).decode("utf-8") == want["runtime_json"]
    assert infra_json(merged).decode("utf-8") == want["infra_json"]
    assert (runtime_hash(merged), infra_hash(merged)) == (want["runtime"], want["infra"])


def test_upstream_tmux_example_hashes_as_a_go_server_and_as_earlier_versions_did() -> None:
    # The Go values are those of go-json-vectors.json; the legacy ones are what this project computed
    # before its hashes were upstream's (git history of nstance/config/hashes.py), and must not change:
    # instance records and agents of a fleet written by it carry them.
    config = load_config_file(UPSTREAM / "config-tmux.jsonc")
    merged = merged_group(config, {}, "default", "test")
    assert runtime_hash(merged) == "sha256:f0491b8685187d4515c289a3b92956bedf9932c8429aa6be724e82ca8b94d449"
    assert infra_hash(merged) == "sha256:dcbcbf9539498ed0c9bc61570da2abcc5031509437a169a7be765b8f686cceb7"
    legacy_runtime = "sha256:4e6c0c2b90cd94cb712e43691eebb5aeefea044bb333efdcbd031e64f4f09df2"
    assert legacy_runtime_hash(merged) == legacy_runtime
    assert (
        legacy_infra_hash(merged) == "sha256:3d40ac60784b38924034bec1a1ff4743b8e5b573ba43bf66f411708efce09bee"
    )


def test_legacy_hashes_follow_the_config_like_the_current_ones() -> None:
    merged = merged_group(load(_doc()), {}, "default", "web")
    doc = _doc()
    doc["templates"]["web"]["instance_type"] = "t.large"
    doc["templates"]["web"]["vars"]["tier"] = "other"
    changed = merged_group(load(doc), {}, "default", "web")
    assert legacy_infra_hash(changed) != legacy_infra_hash(merged)
    assert legacy_runtime_hash(changed) != legacy_runtime_hash(merged)
    assert legacy_infra_hash(merged) not in (infra_hash(merged), runtime_hash(merged))
    assert canonical_json({"b": 1, "a": ["é", 2]}) == '{"a":["é",2],"b":1}'.encode()
