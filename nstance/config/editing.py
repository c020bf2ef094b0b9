"""Restricted editing of groups through the API: upsert and delete of dynamic group entries.

Rules (spec "Groups & Instances", upstream ``UpsertGroup``):

* a group defined in the server config (static) may only have ``size``, ``instance_type`` and
  ``vars`` overridden; changing ``template``, ``subnet_pool``, ``args``, ``drain_timeout`` or
  ``load_balancers`` is refused (sending the static value unchanged is accepted);
* a new dynamic group needs a template that exists; its subnet pool defaults to the template's
  (error if neither sets one), must exist in ``shard.subnet_pools`` and, when
  ``shard.dynamic_subnet_pools`` is set, be listed there;
* an update merges the fields it sets into the existing dynamic entry.

Pure functions: they return a new ``DynamicGroups`` mapping and never modify their inputs. Writing
``groups.jsonc`` (with ETag compare-and-swap) is the server's job.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from pydantic import ValidationError

from nstance.config.checks import proxmox_args_problem
from nstance.config.limits import check_upsert
from nstance.config.merge import deep_merge
from nstance.config.schema import DynamicGroups, ServerConfig
from nstance.config.translate import problems_from_validation
from nstance.config.workloads import DynamicGroupConfig, GroupConfig
from nstance.core.durations import format_duration
from nstance.core.errors import FailedPrecondition, InvalidArgument
from nstance.core.ids import validate_identifier


@dataclass(frozen=True, slots=True)
class GroupUpdate:
    """Fields an API caller wants to set; None (or "" for strings, empty for args) means unchanged.

    ``vars`` are merged key by key into the group's own vars, as upstream's server merges them: a
    caller that sends only a size (upstream's ``group scale``, an operator whose spec has no vars)
    keeps the vars set before. A key given with an empty value is removed (upstream stores the empty
    string, which a template reads the same as a missing key), so a caller can still take a var away.
    """

    template: str | None = None
    size: int | None = None
    instance_type: str | None = None
    subnet_pool: str | None = None
    vars: Mapping[str, str] | None = None
    args: Mapping[str, Any] | None = None
    drain_timeout: timedelta | None = None
    load_balancers: Sequence[str] | None = None


def _static_refusal(group: str, field: str, static: str, requested: str) -> FailedPrecondition:
    return FailedPrecondition(
        f'group "{group}" is static: field "{field}" cannot be changed '
        f"(static value {static}, requested {requested})"
    )


def _check_static(config: ServerConfig, static: GroupConfig, group: str, update: GroupUpdate) -> None:
    if update.template and update.template != static.template:
        raise _static_refusal(group, "template", f'"{static.template}"', f'"{update.template}"')
    template = config.templates.get(static.template)
    pool = static.subnet_pool or (template.subnet_pool if template else None) or ""
    if update.subnet_pool and update.subnet_pool != pool:
        raise _static_refusal(group, "subnet_pool", f'"{pool}"', f'"{update.subnet_pool}"')
    if update.args and dict(update.args) != static.args:
        raise FailedPrecondition(
            f'group "{group}" is static: field "args" cannot be changed (args are set in the server config)'
        )
    if update.drain_timeout is not None and update.drain_timeout != static.drain_timeout:
        current = (
            "shard default" if static.drain_timeout is None else f'"{format_duration(static.drain_timeout)}"'
        )
        raise _static_refusal(group, "drain_timeout", current, f'"{format_duration(update.drain_timeout)}"')
    if update.load_balancers and list(update.load_balancers) != static.load_balancers:
        raise _static_refusal(
            group, "load_balancers", str(static.load_balancers), str(list(update.load_balancers))
        )


def _pool_for_new(config: ServerConfig, group: str, template: str, requested: str | None) -> str:
    pool = requested or config.templates[template].subnet_pool
    if not pool:
        raise InvalidArgument(
            f'group "{group}": field "subnet_pool" is required because template "{template}" does not set one'
        )
    if pool not in config.shard.subnet_pools:
        raise InvalidArgument(f'group "{group}": subnet pool "{pool}" is not defined in shard.subnet_pools')
    allowed = config.shard.dynamic_subnet_pools
    if allowed and pool not in allowed:  # unset or empty: every pool, as upstream reads it
        raise InvalidArgument(
            f'group "{group}": subnet pool "{pool}" is not allowed for dynamic groups '
            f"(shard.dynamic_subnet_pools: {', '.join(allowed) or 'none'})"
        )
    return pool


def merged_vars(current: Mapping[str, str], given: Mapping[str, str]) -> dict[str, str]:
    """``current`` with ``given`` applied key by key; an empty value removes its key."""
    out = dict(current)
    for key, value in given.items():
        if value:
            out[key] = value
        else:
            out.pop(key, None)
    return out


def _dynamic_fields(
    config: ServerConfig, existing: DynamicGroupConfig | None, group: str, update: GroupUpdate
) -> dict[str, Any]:
    template = update.template or (existing.template if existing else "")
    if not template:
        raise InvalidArgument(f'group "{group}": field "template" is required for a new group')
    if template not in config.templates:
        raise InvalidArgument(f'group "{group}": template "{template}" is not defined in the server config')
    pool = _pool_for_new(
        config, group, template, update.subnet_pool or (existing.subnet_pool if existing else None)
    )
    for lb in update.load_balancers or ():
        if lb not in config.load_balancers:
            raise InvalidArgument(
                f'group "{group}": load balancer "{lb}" is not defined in the server config'
            )
    fields: dict[str, Any] = {"template": template, "subnet_pool": pool}
    if update.args:
        fields["args"] = dict(update.args)
    if update.drain_timeout is not None:
        fields["drain_timeout"] = update.drain_timeout
    if update.load_balancers is not None:
        fields["load_balancers"] = list(update.load_balancers)
    return fields


def _build(group: str, base: DynamicGroupConfig | None, fields: dict[str, Any]) -> DynamicGroupConfig:
    data = base.model_dump() if base is not None else {}
    data.update(fields)
    try:
        return DynamicGroupConfig.model_validate(data)
    except ValidationError as exc:
        detail = "; ".join(str(p) for p in problems_from_validation(exc))
        raise InvalidArgument(f'group "{group}": {detail}') from None


def apply_upsert(
    config: ServerConfig, dynamic: DynamicGroups, tenant: str, group: str, update: GroupUpdate
) -> DynamicGroups:
    """Return ``dynamic`` with ``tenant/group`` created or updated by ``update``, or raise why not.

    Raises InvalidArgument for bad input (names, unknown template/pool/load balancer, a size or vars
    beyond ``shard.limits``), ResourceExhausted for a group or vars beyond a tenant's share, and
    FailedPrecondition when a restricted field of a static group would change.
    """
    validate_identifier(tenant, "tenant")
    validate_identifier(group, "group")
    if update.size is not None and update.size < 0:
        raise InvalidArgument(f'group "{group}": field "size" must not be negative (got {update.size})')
    static = config.groups.get(tenant, {}).get(group)
    existing = dynamic.get(tenant, {}).get(group)
    fields: dict[str, Any] = {}
    if update.size is not None:
        fields["size"] = update.size
    if update.instance_type:
        fields["instance_type"] = update.instance_type
    if update.vars:
        fields["vars"] = merged_vars(existing.vars if existing is not None else {}, update.vars)
    if static is not None:
        _check_static(config, static, group, update)
    else:
        fields.update(_dynamic_fields(config, existing, group, update))
    entry = _build(group, existing, fields)
    if static is None and config.shard.infra.provider == "proxmox":
        template = config.templates[entry.template]
        problem = proxmox_args_problem(deep_merge(config.defaults.args, template.args, entry.args))
        if problem is not None:
            raise InvalidArgument(f'group "{group}": {problem}')
    updated = _with_tenant(dynamic, tenant)
    updated.setdefault(tenant, {})[group] = entry
    check_upsert(config.shard.limits, config.groups, dynamic, updated, tenant, group)
    return updated


def _with_tenant(dynamic: DynamicGroups, tenant: str) -> DynamicGroups:
    """A copy of ``dynamic`` whose ``tenant`` mapping is a fresh copy; the other tenants are shared.

    The mappings are never modified in place (every edit goes through this copy), so sharing the
    untouched tenants is safe and keeps an edit's cost to the size of its own tenant.
    """
    updated = dict(dynamic)
    if tenant in updated:
        updated[tenant] = dict(updated[tenant])
    return updated


def apply_delete(dynamic: DynamicGroups, tenant: str, group: str) -> DynamicGroups:
    """Return ``dynamic`` without the entry for ``tenant/group``; unchanged if there is none.

    Deleting the dynamic entry of a static group removes only its overrides; the group stays. An
    entry that is already gone (a retried call, another server's delete) is not an error: DeleteGroup
    is idempotent, as upstream's is.
    """
    if group not in dynamic.get(tenant, {}):
        return dynamic
    updated = _with_tenant(dynamic, tenant)
    del updated[tenant][group]
    if not updated[tenant]:
        del updated[tenant]
    return updated
