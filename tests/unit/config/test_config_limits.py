"""``shard.limits``: the same bounds refuse a huge group or oversized vars through the API and in files."""

from __future__ import annotations

from typing import Any

import pytest
from config_samples import base_config, load, problems

from nstance.config import GroupUpdate, apply_upsert
from nstance.config.errors import ConfigError
from nstance.config.limits import LimitsConfig, check_vars, groups_limit_problems
from nstance.config.loader import load_groups_text
from nstance.config.schema import DynamicGroups, ServerConfig
from nstance.core.errors import InvalidArgument, ResourceExhausted


def config(**limits: Any) -> ServerConfig:
    doc = base_config()
    if limits:
        doc["shard"]["limits"] = limits
    return load(doc)


def test_defaults_a_real_fleet_accepts() -> None:
    limits = config().shard.limits
    assert limits == LimitsConfig()
    assert (limits.max_group_size, limits.max_groups_per_tenant) == (10_000, 2_000)
    assert (limits.max_vars, limits.max_var_bytes) == (100, 16 * 1024)
    assert limits.max_message_bytes == 4 * 1024 * 1024


def test_a_group_size_beyond_the_limit_in_config_jsonc_names_its_path() -> None:
    doc = base_config()
    doc["groups"]["default"]["web"]["size"] = 2_147_483_648
    doc["templates"]["web"]["size"] = 20_000
    found = problems(doc)
    assert "groups.default.web.size: 2147483648 is more than 10000 (shard.limits.max_group_size)" in found
    assert "templates.web.size: 20000 is more than 10000 (shard.limits.max_group_size)" in found


def test_vars_beyond_the_limits_in_config_jsonc_name_their_path() -> None:
    doc = base_config()
    doc["shard"]["limits"] = {"max_vars": 2, "max_var_bytes": 10}
    doc["defaults"] = {"vars": {"a": "1", "b": "2", "c": "3"}}
    doc["groups"]["default"]["web"]["vars"] = {"big": "x" * 20}
    found = problems(doc)
    assert "defaults.vars: has 3 entries; at most 2 (shard.limits.max_vars)" in found
    assert "groups.default.web.vars.big: is 23 bytes; at most 10 (shard.limits.max_var_bytes)" in found


def test_groups_jsonc_beyond_the_limits_is_refused_with_paths() -> None:
    cfg = config(max_groups_per_tenant=2)
    dynamic = load_groups_text(
        '{"default": {"a": {"template": "web", "size": 2147483648}, "b": {"template": "web"}}}', "g"
    )
    found = [str(p) for p in groups_limit_problems(cfg.shard.limits, cfg.groups, dynamic)]
    assert 'default: tenant "default" has 3 groups; at most 2 (shard.limits.max_groups_per_tenant)' in found
    assert "default.a.size: 2147483648 is more than 10000 (shard.limits.max_group_size)" in found


def test_the_api_refuses_a_million_instances_and_oversized_vars() -> None:
    cfg = config()
    with pytest.raises(InvalidArgument, match=r'group "web": field "size" 1000000 is more than 10000'):
        apply_upsert(cfg, {}, "default", "web", GroupUpdate(size=1_000_000))
    with pytest.raises(InvalidArgument, match=r"shard\.limits\.max_var_bytes"):
        apply_upsert(cfg, {}, "default", "web", GroupUpdate(vars={"blob": "x" * 1_000_000}))
    many = {f"v{i}": "x" for i in range(101)}
    with pytest.raises(InvalidArgument, match=r"has 101 entries; at most 100"):
        apply_upsert(cfg, {}, "default", "new", GroupUpdate(template="web", vars=many))
    with pytest.raises(InvalidArgument, match=r"CreateInstance: vars\.blob: is"):
        check_vars("CreateInstance", {"blob": "x" * 20_000}, cfg.shard.limits)
    assert apply_upsert(cfg, {}, "default", "web", GroupUpdate(size=10_000))["default"]["web"].size == 10_000


def test_one_group_too_many_for_a_tenant_is_resource_exhausted() -> None:
    cfg = config(max_groups_per_tenant=2)  # the static default/web is one of them
    dynamic: DynamicGroups = apply_upsert(cfg, {}, "default", "a", GroupUpdate(template="web", size=0))
    with pytest.raises(ResourceExhausted, match=r'tenant "default" has 3 groups; at most 2'):
        apply_upsert(cfg, dynamic, "default", "b", GroupUpdate(template="web", size=0))
    apply_upsert(cfg, dynamic, "other", "b", GroupUpdate(template="web", size=0))  # per tenant


def test_tenant_vars_total_is_resource_exhausted() -> None:
    cfg = config(max_vars_bytes_per_tenant=100)
    dynamic = apply_upsert(cfg, {}, "default", "a", GroupUpdate(template="web", vars={"v": "x" * 60}))
    with pytest.raises(ResourceExhausted, match=r"max_vars_bytes_per_tenant"):
        apply_upsert(cfg, dynamic, "default", "b", GroupUpdate(template="web", vars={"v": "x" * 60}))


def test_a_group_already_beyond_a_lowered_limit_can_still_be_scaled_down() -> None:
    dynamic = apply_upsert(config(), {}, "default", "a", GroupUpdate(template="web", size=5_000))
    lowered = config(max_group_size=100)
    assert groups_limit_problems(lowered.shard.limits, lowered.groups, dynamic)  # the file would be refused
    relabelled = apply_upsert(lowered, dynamic, "default", "a", GroupUpdate(vars={"note": "shrinking"}))
    assert relabelled["default"]["a"].size == 5_000  # an edit that adds no problem goes through
    smaller = apply_upsert(lowered, relabelled, "default", "a", GroupUpdate(size=50))
    assert smaller["default"]["a"].size == 50
    with pytest.raises(InvalidArgument):
        apply_upsert(lowered, dynamic, "default", "a", GroupUpdate(size=5_001))


def test_config_with_invalid_limits_is_refused() -> None:
    doc = base_config()
    doc["shard"]["limits"] = {"max_message_bytes": 10, "max_group_size": -1}
    with pytest.raises(ConfigError) as err:
        load(doc)
    paths = {p.path for p in err.value.problems}
    assert {"shard.limits.max_message_bytes", "shard.limits.max_group_size"} <= paths
