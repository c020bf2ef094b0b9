"""Runtime and infra config hashes: format, stability across key order, and what each one covers."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from config_samples import base_config, load

from nstance.config import canonical_json, infra_hash, merged_group, runtime_hash

HASH = re.compile(r"^sha256:[0-9a-f]{64}$")


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


def test_default_values_written_out_do_not_change_hashes() -> None:
    doc = _doc()
    doc["templates"]["web"]["userdata"].update(source="inline", encoding="plain")
    assert _hashes(doc) == _hashes(_doc())


def test_hash_is_sha256_over_documented_canonical_json() -> None:
    merged = merged_group(load(_doc()), {}, "default", "web")
    files = {name: f.model_dump(mode="json", exclude_defaults=True) for name, f in merged.files.items()}
    expected = hashlib.sha256(canonical_json({"vars": merged.vars, "files": files})).hexdigest()
    assert runtime_hash(merged) == "sha256:" + expected
    assert canonical_json({"b": 1, "a": ["é", 2]}) == '{"a":["é",2],"b":1}'.encode()
