"""Upper bounds on what a shard accepts (``shard.limits``) and the pure checks that apply them.

Without bounds a typo or an attacker holding an operator certificate can ask for a group of a
million VMs or push megabytes of vars into every write of ``groups.jsonc``. The same limits apply to
both ways in: the Operator API (``check_upsert``, ``check_vars``: InvalidArgument for a value out of
range, ResourceExhausted for one group too many) and the documents (``config_limit_problems`` for
``config.jsonc``, ``groups_limit_problems`` for ``groups.jsonc``: Problems naming the JSON path), so
a value refused by the API cannot come in through a file and the other way round.

Only the dynamic groups count towards ``max_vars_bytes_per_tenant`` (the static ones live in
``config.jsonc``, whose size its author controls); every group counts towards
``max_groups_per_tenant``. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import Field

from nstance.config.errors import Problem, join_path
from nstance.config.fields import PositiveDuration, StrictModel, seconds
from nstance.config.workloads import GroupConfig, TemplateConfig
from nstance.core.errors import InvalidArgument, ResourceExhausted

Groups = Mapping[str, Mapping[str, GroupConfig]]


class LimitsConfig(StrictModel):
    """Upper bounds on group sizes, group counts, vars, API messages and client connections."""

    max_group_size: int = Field(default=10_000, ge=0)
    """Largest `size` a group (or a template's default size) may have, through the API or in a file."""
    max_groups_per_tenant: int = Field(default=2_000, ge=1)
    """Most groups (static and dynamic together) one tenant may have; one more is refused with
    RESOURCE_EXHAUSTED."""
    max_vars: int = Field(default=100, ge=0)
    """Most entries one `vars` map (defaults, a template, a group, an on-demand instance) may hold."""
    max_var_bytes: int = Field(default=16 * 1024, ge=1)
    """Largest var, name plus value in UTF-8 bytes (AWS caps a VM's whole user data at 16 KiB)."""
    max_vars_bytes_per_tenant: int = Field(default=1024 * 1024, ge=1)
    """Most bytes of vars (names plus values) all dynamic groups of one tenant may hold together; every
    group edit rewrites `groups.jsonc`, so this bounds its size per tenant."""
    max_message_bytes: int = Field(default=4 * 1024 * 1024, ge=64 * 1024)
    """Largest gRPC message any API of the server receives or sends (upstream: 4 MiB)."""
    max_connections: int = Field(default=12_288, ge=64)
    """Most client connections the server holds on all its ports together; lowered at start to what the
    process's open-file limit leaves after `reserved_file_descriptors`."""
    max_agent_connections: int = Field(default=10_000, ge=1)
    """Most connections on the agent port (one per running agent)."""
    max_operator_connections: int = Field(default=1_000, ge=1)
    """Most connections on the operator port (operators, `nstance-admin`)."""
    max_registration_connections: int = Field(default=1_000, ge=1)
    """Most connections on the registration port (the one that needs no client certificate); more are
    closed as soon as they are accepted."""
    max_registration_connections_per_address: int = Field(default=64, ge=1)
    """Most connections one client address (an IPv6 client's /64) may hold on the registration port;
    more are closed as soon as they are accepted, so one address cannot take the whole port."""
    max_operator_connections_per_address: int = Field(default=64, ge=1)
    """Most connections one client address (an IPv6 client's /64) may hold on the operator port, before
    its TLS handshake."""
    reserved_file_descriptors: int = Field(default=256, ge=32)
    """Open files kept free of client connections for object storage, SQLite, the elections and logs."""
    handshake_timeout: PositiveDuration = seconds(10)
    """A connection that has not finished its TLS and HTTP/2 handshake by then is closed."""
    registration_idle_timeout: PositiveDuration = seconds(60)
    """A registration-port connection without a call for this long is closed."""


def _var_bytes(vars: Mapping[str, str]) -> int:
    return sum(len(k.encode()) + len(v.encode()) for k, v in vars.items())


def vars_problems(path: str, vars: Mapping[str, str], limits: LimitsConfig) -> list[Problem]:
    """Problems with one vars map (count, and each var's size), reported at ``path``."""
    out: list[Problem] = []
    if len(vars) > limits.max_vars:
        out.append(
            Problem(path, f"has {len(vars)} entries; at most {limits.max_vars} (shard.limits.max_vars)")
        )
    for name, value in vars.items():
        size = len(name.encode()) + len(value.encode())
        if size > limits.max_var_bytes:
            out.append(
                Problem(
                    join_path(path, name),
                    f"is {size} bytes; at most {limits.max_var_bytes} (shard.limits.max_var_bytes)",
                )
            )
    return out


def _size_problem(path: str, size: int | None, limits: LimitsConfig) -> list[Problem]:
    if size is None or size <= limits.max_group_size:
        return []
    return [Problem(path, f"{size} is more than {limits.max_group_size} (shard.limits.max_group_size)")]


def _group_problems(base: str, group: GroupConfig, limits: LimitsConfig) -> list[Problem]:
    return [
        *_size_problem(join_path(base, "size"), group.size, limits),
        *vars_problems(join_path(base, "vars"), group.vars, limits),
    ]


def _tenant_count_problem(path: str, tenant: str, count: int, limits: LimitsConfig) -> list[Problem]:
    if count <= limits.max_groups_per_tenant:
        return []
    return [
        Problem(
            path,
            f'tenant "{tenant}" has {count} groups; at most {limits.max_groups_per_tenant} '
            "(shard.limits.max_groups_per_tenant)",
        )
    ]


def config_limit_problems(
    limits: LimitsConfig,
    default_vars: Mapping[str, str] | None,
    templates: Mapping[str, TemplateConfig] | None,
    groups: Groups | None,
) -> list[Problem]:
    """Problems of ``config.jsonc`` (paths from the document root)."""
    out: list[Problem] = []
    if default_vars is not None:
        out.extend(vars_problems("defaults.vars", default_vars, limits))
    for name, template in (templates or {}).items():
        base = join_path("templates", name)
        out.extend(_size_problem(join_path(base, "size"), template.size, limits))
        out.extend(vars_problems(join_path(base, "vars"), template.vars, limits))
    for tenant, tenant_groups in (groups or {}).items():
        out.extend(_tenant_count_problem(join_path("groups", tenant), tenant, len(tenant_groups), limits))
        for name, group in tenant_groups.items():
            out.extend(_group_problems(join_path("groups", tenant, name), group, limits))
    return out


def _tenant_problems(limits: LimitsConfig, tenant: str, count: int, vars_bytes: int) -> list[Problem]:
    """The problems of one tenant's totals in ``groups.jsonc``: its group count and its vars bytes."""
    out = _tenant_count_problem(join_path("", tenant), tenant, count, limits)
    if vars_bytes > limits.max_vars_bytes_per_tenant:
        out.append(
            Problem(
                join_path("", tenant),
                f"the vars of the dynamic groups hold {vars_bytes} bytes; at most "
                f"{limits.max_vars_bytes_per_tenant} (shard.limits.max_vars_bytes_per_tenant)",
            )
        )
    return out


def _group_count(static: Mapping[str, GroupConfig], dynamic: Mapping[str, GroupConfig]) -> int:
    """How many distinct groups a tenant has (static and dynamic together)."""
    return len(dynamic) + sum(1 for name in static if name not in dynamic)


def _vars_total(groups: Mapping[str, GroupConfig]) -> int:
    return sum(_var_bytes(group.vars) for group in groups.values() if group.vars)


def groups_limit_problems(limits: LimitsConfig, static: Groups, dynamic: Groups) -> list[Problem]:
    """Problems of ``groups.jsonc`` (paths from its root: ``tenant.group.field``)."""
    out: list[Problem] = []
    for tenant, tenant_groups in dynamic.items():
        count = _group_count(static.get(tenant, {}), tenant_groups)
        out.extend(_tenant_problems(limits, tenant, count, _vars_total(tenant_groups)))
        for name, group in tenant_groups.items():
            out.extend(_group_problems(join_path(tenant, name), group, limits))
    return out


def check_vars(what: str, vars: Mapping[str, str], limits: LimitsConfig) -> None:
    """InvalidArgument naming the first problem of an API caller's ``vars``."""
    for problem in vars_problems("vars", vars, limits):
        raise InvalidArgument(f"{what}: {problem}")


def check_upsert(
    limits: LimitsConfig, static: Groups, before: Groups, after: Groups, tenant: str, group: str
) -> None:
    """Refuse an edit of ``tenant/group`` (its dynamic entry only) that adds a problem.

    Problems the document already had (a limit lowered after the fact) do not block edits - scaling
    such a group down must stay possible. A new group or vars beyond a tenant's totals is
    ResourceExhausted; a size or vars out of range InvalidArgument. Only the tenant's totals and the
    edited group are checked (every other entry is the same before and after, and so are its
    problems), so the cost does not grow with the number of groups beyond two counting passes (one
    when the edit leaves the group's vars the size they were).
    """
    static_groups = static.get(tenant, {})
    old_groups, new_groups = before.get(tenant, {}), after.get(tenant, {})
    old_entry, new_entry = old_groups.get(group), new_groups.get(group)
    delta = _var_bytes(new_entry.vars if new_entry else {}) - _var_bytes(old_entry.vars if old_entry else {})
    # Vars of the same size leave the tenant's total as it was, and so cannot add a problem: the
    # total (a pass over every group) is summed only when the edit changes it.
    old_vars = _vars_total(old_groups) if delta else 0
    new_vars = old_vars + delta
    old_count = _group_count(static_groups, old_groups)
    new_count = _group_count(static_groups, new_groups)
    path = join_path(tenant, group)
    old = set(_tenant_problems(limits, tenant, old_count, old_vars))
    if old_entry is not None:
        old.update(_group_problems(path, old_entry, limits))
    found = _tenant_problems(limits, tenant, new_count, new_vars)
    if new_entry is not None:
        found.extend(_group_problems(path, new_entry, limits))
    for problem in found:
        if problem in old:
            continue
        if problem.path == join_path("", tenant):
            raise ResourceExhausted(problem.message)
        name, _, field = problem.path.removeprefix(f"{tenant}.").partition(".")
        raise InvalidArgument(f'group "{name}": field "{field}" {problem.message}')
