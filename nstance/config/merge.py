"""Merge defaults, template, static group and dynamic group into one effective group config.

Rules (upstream ``GetMergedConfig``, spec "Groups & Instances"):

* args: deep merge defaults → template → group (objects merge key by key, anything else replaces);
  a static group's args win over a dynamic entry's, which are ignored for static groups;
* vars: flat overwrite defaults → template → static group → dynamic group;
* size and instance_type: dynamic entry if set, else static group, else template;
* subnet_pool, drain_timeout, load_balancers: static group if the group is static, else the dynamic
  entry; subnet_pool falls back to the template's, drain_timeout to ``shard.default_drain_timeout``;
* userdata: template's, else ``defaults.userdata``; files, kind and arch come from the template.

Pure functions over validated config objects; nothing is read or written.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from nstance.config.schema import DynamicGroups, ServerConfig
from nstance.config.workloads import FileConfig, GroupConfig, UserdataConfig
from nstance.core.errors import FailedPrecondition, NotFound


def _copy(value: Any) -> Any:
    """Copy a JSON value (dicts and lists are copied, scalars are immutable)."""
    if isinstance(value, dict):
        return {key: _copy(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_copy(item) for item in value]
    return value


def deep_merge(*layers: Mapping[str, Any]) -> dict[str, Any]:
    """Merge JSON objects left to right: nested objects merge recursively, other values replace.

    The result shares nothing with the inputs, so callers may modify it.
    """
    out: dict[str, Any] = {}
    for layer in layers:
        for key, value in layer.items():
            current = out.get(key)
            if isinstance(value, dict) and isinstance(current, dict):
                out[key] = deep_merge(current, value)
            else:
                out[key] = _copy(value)
    return out


@dataclass(frozen=True, slots=True)
class MergedGroupConfig:
    """The effective configuration of one group, ready for hashing and provisioning."""

    tenant: str
    group: str
    template: str
    kind: str
    arch: str
    size: int
    instance_type: str
    subnet_pool: str
    vars: dict[str, str]
    args: dict[str, Any]
    userdata: UserdataConfig | None
    files: dict[str, FileConfig]
    drain_timeout: timedelta
    load_balancers: tuple[str, ...]
    is_static: bool
    has_dynamic: bool


def all_group_keys(config: ServerConfig, dynamic: DynamicGroups) -> list[tuple[str, str]]:
    """Every (tenant, group) that exists statically or dynamically, sorted.

    A ``groups.jsonc`` entry without a template whose static group is gone (removed from
    ``config.jsonc``) is an orphaned override: the group no longer exists.
    """
    keys = {(t, g) for t, groups in config.groups.items() for g in groups}
    keys.update((t, g) for t, groups in dynamic.items() for g, entry in groups.items() if entry.template)
    return sorted(keys)


def _lookup(groups: Mapping[str, Mapping[str, GroupConfig]], tenant: str, group: str) -> GroupConfig | None:
    return groups.get(tenant, {}).get(group)


def merged_group(config: ServerConfig, dynamic: DynamicGroups, tenant: str, group: str) -> MergedGroupConfig:
    """Effective config of ``tenant/group``; NotFound if it does not exist, FailedPrecondition if broken."""
    static = _lookup(config.groups, tenant, group)
    dyn = _lookup(dynamic, tenant, group)
    owner = static or dyn
    if owner is None or not owner.template:
        raise NotFound(f'group "{group}" of tenant "{tenant}" is not defined')
    template = config.templates.get(owner.template)
    if template is None:
        raise FailedPrecondition(
            f'group "{group}" of tenant "{tenant}": template "{owner.template}" '
            "is not defined in the server config"
        )
    defaults = config.defaults
    size = template.size
    instance_type = template.instance_type or ""
    for layer in (static, dyn):
        if layer is not None:
            size = layer.size if layer.size is not None else size
            instance_type = layer.instance_type or instance_type
    vars_: dict[str, str] = {**defaults.vars, **template.vars}
    for layer in (static, dyn):
        if layer is not None:
            vars_.update(layer.vars)
    drain = owner.drain_timeout
    return MergedGroupConfig(
        tenant=tenant,
        group=group,
        template=owner.template,
        kind=template.kind,
        arch=template.arch,
        size=size,
        instance_type=instance_type,
        subnet_pool=owner.subnet_pool or template.subnet_pool or "",
        vars=vars_,
        args=deep_merge(defaults.args, template.args, owner.args),
        userdata=template.userdata or defaults.userdata,
        files=dict(template.files),
        drain_timeout=drain if drain is not None else config.shard.default_drain_timeout,
        load_balancers=tuple(owner.load_balancers),
        is_static=static is not None,
        has_dynamic=dyn is not None,
    )
