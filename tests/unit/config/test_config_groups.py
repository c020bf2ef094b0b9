"""Static/dynamic group merge, restricted editing through the API, deletion and group ETags."""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta
from typing import Any

import pytest
from config_samples import base_config, load

from nstance.config import (
    GroupConfig,
    GroupUpdate,
    ServerConfig,
    all_group_keys,
    apply_delete,
    apply_upsert,
    dump_groups_text,
    group_etag,
    load_groups_text,
    merged_group,
)
from nstance.config.errors import ConfigError
from nstance.core.errors import FailedPrecondition, InvalidArgument, NotFound


def rich_config(**shard: Any) -> ServerConfig:
    doc = base_config()
    doc["shard"].update(shard)
    doc["defaults"] = {
        "args": {"Net": {"a": 1, "b": 1}, "List": [1], "Flat": "d"},
        "vars": {"env": "prod", "tier": "default"},
        "userdata": {"content": "#!/bin/sh\ndefault\n"},
    }
    doc["templates"]["web"].update(
        {
            "args": {"Net": {"b": 2}, "Flat": "t"},
            "instance_type": "t.small",
            "size": 4,
            "files": {"app.env": {"kind": "env", "template": {"A": "{{ .Vars.env }}"}}},
        }
    )
    doc["templates"]["api"] = {"kind": "api", "arch": "arm64", "vars": {"tier": "api"}}
    doc["groups"]["default"]["web"] = {
        "template": "web",
        "size": 2,
        "args": {"Net": {"c": 3}, "List": [2]},
        "vars": {"tier": "group"},
        "drain_timeout": "0s",
    }
    doc["groups"]["default"]["plain"] = {"template": "web", "subnet_pool": "other"}
    doc["load_balancers"] = {
        "lb": {"provider": "aws", "target_groups": [{"arn": "arn:tg/web", "target_port": 80}]}
    }
    return load(doc)


# ---- merge -----------------------------------------------------------------------------------


def test_merge_of_a_static_group() -> None:
    merged = merged_group(rich_config(), {}, "default", "web")
    assert merged.args == {"Net": {"a": 1, "b": 2, "c": 3}, "List": [2], "Flat": "t"}
    assert merged.vars == {"env": "prod", "tier": "group"}
    assert (merged.size, merged.instance_type, merged.subnet_pool) == (2, "t.small", "default")
    assert (merged.kind, merged.arch, merged.template) == ("web", "amd64", "web")
    assert merged.userdata is not None
    assert "echo" in merged.userdata.content
    assert set(merged.files) == {"app.env"}
    assert merged.drain_timeout == timedelta(0)
    assert merged.is_static
    assert not merged.has_dynamic


def test_group_inherits_template_size_and_shard_drain_timeout() -> None:
    merged = merged_group(rich_config(), {}, "default", "plain")
    assert merged.size == 4
    assert merged.subnet_pool == "other"
    assert merged.drain_timeout == timedelta(minutes=5)


def test_userdata_falls_back_to_defaults() -> None:
    config = rich_config()
    dynamic = {"t1": {"svc": GroupConfig(template="api", subnet_pool="other")}}
    merged = merged_group(config, dynamic, "t1", "svc")
    assert merged.userdata is not None
    assert merged.userdata.content == "#!/bin/sh\ndefault\n"
    assert merged.vars == {"env": "prod", "tier": "api"}
    assert merged.is_static is False
    assert merged.has_dynamic is True


def test_dynamic_entry_over_a_static_group_overrides_only_unrestricted_fields() -> None:
    dyn = GroupConfig(
        template="api",
        size=7,
        instance_type="t.large",
        subnet_pool="other",
        vars={"tier": "dyn", "extra": "1"},
        args={"Flat": "dyn"},
        drain_timeout=timedelta(minutes=9),
        load_balancers=["lb"],
    )
    merged = merged_group(rich_config(), {"default": {"web": dyn}}, "default", "web")
    assert (merged.size, merged.instance_type) == (7, "t.large")
    assert merged.vars == {"env": "prod", "tier": "dyn", "extra": "1"}
    assert merged.template == "web"
    assert merged.subnet_pool == "default"
    assert merged.args["Flat"] == "t"
    assert merged.drain_timeout == timedelta(0)
    assert merged.load_balancers == ()
    assert merged.is_static
    assert merged.has_dynamic


def test_merged_values_do_not_alias_the_config() -> None:
    config = rich_config()
    merged = merged_group(config, {}, "default", "web")
    merged.args["Net"]["a"] = 99
    merged.vars["env"] = "x"
    assert config.defaults.args["Net"]["a"] == 1
    assert config.defaults.vars["env"] == "prod"


def test_unknown_group_and_broken_dynamic_template() -> None:
    config = rich_config()
    with pytest.raises(NotFound, match='group "nope" of tenant "default" is not defined'):
        merged_group(config, {}, "default", "nope")
    dynamic = {"default": {"gone": GroupConfig(template="removed", subnet_pool="default")}}
    with pytest.raises(FailedPrecondition, match='template "removed" is not defined in the server config'):
        merged_group(config, dynamic, "default", "gone")


def test_all_group_keys_is_the_sorted_union() -> None:
    dynamic = {"a": {"x": GroupConfig(template="web")}, "default": {"web": GroupConfig(template="web")}}
    assert all_group_keys(rich_config(), dynamic) == [("a", "x"), ("default", "plain"), ("default", "web")]


# ---- upsert: static groups -------------------------------------------------------------------


def test_static_group_template_cannot_change() -> None:
    with pytest.raises(FailedPrecondition) as info:
        apply_upsert(rich_config(), {}, "default", "web", GroupUpdate(template="api"))
    assert str(info.value) == (
        'group "web" is static: field "template" cannot be changed (static value "web", requested "api")'
    )


@pytest.mark.parametrize(
    ("update", "message"),
    [
        (
            GroupUpdate(subnet_pool="other"),
            'group "web" is static: field "subnet_pool" cannot be changed '
            '(static value "default", requested "other")',
        ),
        (
            GroupUpdate(args={"Flat": "x"}),
            'group "web" is static: field "args" cannot be changed (args are set in the server config)',
        ),
        (
            GroupUpdate(drain_timeout=timedelta(minutes=1)),
            'group "web" is static: field "drain_timeout" cannot be changed '
            '(static value "0s", requested "1m0s")',
        ),
        (
            GroupUpdate(load_balancers=["lb"]),
            'group "web" is static: field "load_balancers" cannot be changed '
            "(static value [], requested ['lb'])",
        ),
    ],
)
def test_static_group_restricted_fields(update: GroupUpdate, message: str) -> None:
    with pytest.raises(FailedPrecondition) as info:
        apply_upsert(rich_config(), {}, "default", "web", update)
    assert str(info.value) == message


def test_static_group_accepts_unchanged_restricted_values() -> None:
    update = GroupUpdate(template="web", subnet_pool="default", drain_timeout=timedelta(0), size=3)
    result = apply_upsert(rich_config(), {}, "default", "web", update)
    assert result["default"]["web"].size == 3


def test_static_group_size_instance_type_and_vars_can_be_overridden() -> None:
    config = rich_config()
    dynamic: dict[str, dict[str, GroupConfig]] = {}
    update = GroupUpdate(size=5, instance_type="t.xl", vars={"node": "a"})
    result = apply_upsert(config, dynamic, "default", "web", update)
    assert dynamic == {}
    entry = result["default"]["web"]
    assert (entry.template, entry.size, entry.instance_type, entry.vars) == ("", 5, "t.xl", {"node": "a"})
    assert entry.subnet_pool is None
    assert entry.args == {}
    assert entry.drain_timeout is None
    merged = merged_group(config, result, "default", "web")
    assert (merged.size, merged.instance_type, merged.vars["node"]) == (5, "t.xl", "a")
    again = apply_upsert(config, result, "default", "web", GroupUpdate(size=1))
    assert (again["default"]["web"].size, again["default"]["web"].instance_type) == (1, "t.xl")
    assert result["default"]["web"].size == 5


# ---- upsert: dynamic groups ------------------------------------------------------------------


def test_new_dynamic_group_needs_an_existing_template() -> None:
    config = rich_config()
    with pytest.raises(InvalidArgument, match='group "new": field "template" is required for a new group'):
        apply_upsert(config, {}, "t1", "new", GroupUpdate(size=1))
    with pytest.raises(
        InvalidArgument, match='group "new": template "nope" is not defined in the server config'
    ):
        apply_upsert(config, {}, "t1", "new", GroupUpdate(template="nope"))


def test_new_dynamic_group_takes_the_template_subnet_pool() -> None:
    result = apply_upsert(rich_config(), {}, "t1", "new", GroupUpdate(template="web", size=2))
    entry = result["t1"]["new"]
    assert (entry.template, entry.subnet_pool, entry.size) == ("web", "default", 2)


def test_new_dynamic_group_without_any_subnet_pool_is_refused() -> None:
    with pytest.raises(InvalidArgument) as info:
        apply_upsert(rich_config(), {}, "t1", "new", GroupUpdate(template="api"))
    assert str(info.value) == (
        'group "new": field "subnet_pool" is required because template "api" does not set one'
    )
    result = apply_upsert(rich_config(), {}, "t1", "new", GroupUpdate(template="api", subnet_pool="other"))
    assert result["t1"]["new"].subnet_pool == "other"


def test_dynamic_subnet_pool_must_exist_and_be_allowed() -> None:
    with pytest.raises(InvalidArgument, match=r'subnet pool "nope" is not defined in shard\.subnet_pools'):
        apply_upsert(rich_config(), {}, "t1", "new", GroupUpdate(template="web", subnet_pool="nope"))
    config = rich_config(dynamic_subnet_pools=["other"])
    with pytest.raises(InvalidArgument) as info:
        apply_upsert(config, {}, "t1", "new", GroupUpdate(template="web"))
    assert str(info.value) == (
        'group "new": subnet pool "default" is not allowed for dynamic groups '
        "(shard.dynamic_subnet_pools: other)"
    )
    assert apply_upsert(config, {}, "t1", "new", GroupUpdate(template="web", subnet_pool="other"))


def test_an_empty_dynamic_subnet_pools_list_allows_every_pool_as_upstream_reads_it() -> None:
    config = rich_config(dynamic_subnet_pools=[])
    updated = apply_upsert(config, {}, "t1", "new", GroupUpdate(template="web"))
    assert updated["t1"]["new"].subnet_pool == "default"


def test_upsert_merges_vars_key_by_key_and_an_empty_value_removes_one() -> None:
    """Upstream merges UpsertGroup's vars into the group's: a size-only call (its ``group scale``, an
    operator spec without vars) keeps the vars set before instead of clearing them."""
    config = rich_config()
    first = apply_upsert(config, {}, "t1", "svc", GroupUpdate(template="web", vars={"a": "1", "b": "2"}))
    scaled = apply_upsert(config, first, "t1", "svc", GroupUpdate(size=3, vars={}))
    assert scaled["t1"]["svc"].vars == {"a": "1", "b": "2"}
    changed = apply_upsert(config, scaled, "t1", "svc", GroupUpdate(vars={"b": "", "c": "3"}))
    assert changed["t1"]["svc"].vars == {"a": "1", "c": "3"}
    assert first["t1"]["svc"].vars == {"a": "1", "b": "2"}  # documents are never changed in place


def test_dynamic_group_is_fully_editable_and_updates_merge() -> None:
    config = rich_config()
    first = apply_upsert(
        config,
        {},
        "t1",
        "svc",
        GroupUpdate(template="web", size=1, instance_type="a", args={"Flat": "g"}, load_balancers=["lb"]),
    )
    second = apply_upsert(config, first, "t1", "svc", GroupUpdate(template="api", subnet_pool="other"))
    entry = second["t1"]["svc"]
    assert (entry.template, entry.subnet_pool, entry.size, entry.instance_type) == ("api", "other", 1, "a")
    assert entry.args == {"Flat": "g"}
    assert entry.load_balancers == ["lb"]
    third = apply_upsert(config, second, "t1", "svc", GroupUpdate(drain_timeout=timedelta(seconds=5)))
    assert merged_group(config, third, "t1", "svc").drain_timeout == timedelta(seconds=5)


def test_upsert_validates_names_size_and_load_balancers() -> None:
    config = rich_config()
    with pytest.raises(InvalidArgument, match="tenant 'Bad': may contain only lowercase"):
        apply_upsert(config, {}, "Bad", "x", GroupUpdate(template="web"))
    with pytest.raises(InvalidArgument, match="group 'a--b': must not contain '--'"):
        apply_upsert(config, {}, "t1", "a--b", GroupUpdate(template="web"))
    with pytest.raises(InvalidArgument, match='field "size" must not be negative'):
        apply_upsert(config, {}, "t1", "x", GroupUpdate(template="web", size=-1))
    with pytest.raises(InvalidArgument, match='load balancer "nope" is not defined'):
        apply_upsert(config, {}, "t1", "x", GroupUpdate(template="web", load_balancers=["nope"]))
    with pytest.raises(InvalidArgument, match=r'group "x": vars\.k: must be a string'):
        apply_upsert(config, {}, "t1", "x", GroupUpdate(template="web", vars={"k": 1}))  # type: ignore[dict-item]


def test_proxmox_dynamic_group_needs_complete_args() -> None:
    doc = base_config()
    doc["shard"]["infra"]["provider"] = "proxmox"
    doc["groups"] = {}
    config = load(doc)
    with pytest.raises(InvalidArgument, match='provider "proxmox" needs "StoragePool"'):
        apply_upsert(config, {}, "t1", "x", GroupUpdate(template="web"))
    ok = apply_upsert(
        config, {}, "t1", "x", GroupUpdate(template="web", args={"StoragePool": "s", "TemplateVMID": 9})
    )
    assert ok["t1"]["x"].args == {"StoragePool": "s", "TemplateVMID": 9}


# ---- delete ----------------------------------------------------------------------------------


def test_apply_delete() -> None:
    dynamic = {"t1": {"a": GroupConfig(template="web"), "b": GroupConfig(template="web")}}
    once = apply_delete(dynamic, "t1", "a")
    assert set(once["t1"]) == {"b"}
    assert set(dynamic["t1"]) == {"a", "b"}
    assert apply_delete(once, "t1", "b") == {}
    assert apply_delete(once, "t1", "a") is once  # already gone: nothing to do, not an error


# ---- groups.jsonc ----------------------------------------------------------------------------


def test_groups_file_round_trip() -> None:
    assert load_groups_text("") == {}
    assert load_groups_text("// nothing yet\n{}") == {}
    result = apply_upsert(rich_config(), {}, "t1", "svc", GroupUpdate(template="web", size=2))
    result = apply_upsert(
        rich_config(), result, "t1", "svc", GroupUpdate(drain_timeout=timedelta(minutes=90))
    )
    text = dump_groups_text(result)
    # json.MarshalIndent(groups, "", "  ") of upstream's GroupConfig: the struct's fields in declaration
    # order, omitempty fields left out, no final newline.
    assert text == (
        '{\n  "t1": {\n    "svc": {\n      "template": "web",\n      "size": 2,\n'
        '      "subnet_pool": "default",\n      "drain_timeout": "1h30m0s"\n    }\n  }\n}'
    )
    assert load_groups_text(text) == result


@pytest.mark.parametrize(
    "text",
    [
        # upstream's `group scale main 5` on a static group: no template
        '{\n  "default": {\n    "main": {\n      "size": 5\n    }\n  }\n}',
        '{"default": {"main": {"size": 0, "instance_type": "t.xl", "vars": {"a": "b"}}}}',
        '{"default": {"main": {"template": "web", "size": 5}}}',
        '{"default": {"main": {"size": 5}}, "other": null}',
    ],
)
def test_static_group_overrides_as_go_writes_them_load_and_merge(text: str) -> None:
    dynamic = load_groups_text(text)
    entry = dynamic["default"]["main"]
    assert entry.size in (0, 5)
    assert dynamic.get("other", {}) == {}
    doc = base_config()
    doc["groups"]["default"]["main"] = {"template": "web"}
    config = load(doc)
    merged = merged_group(config, dynamic, "default", "main")
    assert (merged.template, merged.size, merged.is_static, merged.has_dynamic) == (
        "web",
        entry.size,
        True,
        True,
    )
    assert ("default", "main") in all_group_keys(config, dynamic)


def test_empty_and_null_groups_documents_mean_no_dynamic_groups() -> None:
    assert load_groups_text("null") == {}
    assert load_groups_text("{}") == {}
    assert load_groups_text('{"t1": {}}') == {"t1": {}}


def test_an_override_whose_static_group_was_removed_is_ignored() -> None:
    config = rich_config()
    dynamic = load_groups_text('{"default": {"gone": {"size": 5}}}')
    assert ("default", "gone") not in all_group_keys(config, dynamic)
    with pytest.raises(NotFound):
        merged_group(config, dynamic, "default", "gone")


def test_static_overrides_are_written_without_template_as_go_does() -> None:
    result = apply_upsert(rich_config(), {}, "default", "web", GroupUpdate(size=5))
    assert dump_groups_text(result) == '{\n  "default": {\n    "web": {\n      "size": 5\n    }\n  }\n}'
    result = apply_upsert(rich_config(), {}, "default", "web", GroupUpdate(size=0))
    assert json.loads(dump_groups_text(result)) == {"default": {"web": {"size": 0}}}


def test_groups_file_errors_name_paths() -> None:
    with pytest.raises(ConfigError) as info:
        load_groups_text('{"Bad": {}, "t1": {"g": {"size": 1, "colour": "red"}}}', "groups.jsonc")
    assert [str(p) for p in info.value.problems] == [
        "Bad: tenant name may contain only lowercase letters a-z, digits 0-9 and '-'",
        "t1.g.colour: unknown field",
    ]
    with pytest.raises(ConfigError, match="must be an object"):
        load_groups_text("[]")


# ---- etag ------------------------------------------------------------------------------------


def test_group_etag_is_md5_of_compact_sorted_json() -> None:
    etag = group_etag("web", "default", "web", 3, "t.small", "default", {"b": "2", "a": "1"}, True)
    document = (
        '{"instance_type":"t.small","is_static":true,"key":"web","size":3,"subnet_pool":"default",'
        '"template":"web","tenant":"default","vars":{"a":"1","b":"2"}}'
    )
    assert etag == hashlib.md5(document.encode()).hexdigest()
    assert etag == group_etag("web", "default", "web", 3, "t.small", "default", {"a": "1", "b": "2"}, True)
    assert etag != group_etag("web", "default", "web", 4, "t.small", "default", {"a": "1", "b": "2"}, True)
    assert etag != group_etag("web", "default", "web", 3, "t.small", "default", {"a": "1", "b": "2"}, False)
