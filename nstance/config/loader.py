"""Load and validate server config (``config.jsonc``) and dynamic groups (``groups.jsonc``).

Text is parsed as JSONC, then each top-level section (and each entry of the map sections such as
``templates`` and ``groups``) is validated on its own so that one mistake does not hide another,
then the cross-section rules run on whatever validated. All problems are
raised together in one ``ConfigError``. ``nat`` and ``tunnels`` are refused as not supported yet.

The only I/O is reading the file path handed to ``load_config_file``/``load_groups_file``.
"""

from __future__ import annotations

import os
from typing import Any

from pydantic import TypeAdapter, ValidationError

from nstance.config.checks import Sections, cross_section_problems
from nstance.config.errors import ConfigError, Problem, join_path
from nstance.config.fields import GroupName, TenantName
from nstance.config.goshapes import group_entry
from nstance.config.jsonc import parse_jsonc
from nstance.config.schema import EMPTY_ONLY_SECTIONS, UNSUPPORTED_SECTIONS, DynamicGroups, ServerConfig
from nstance.config.shard import google_project
from nstance.config.translate import problems_from_validation
from nstance.config.workloads import DynamicGroupConfig
from nstance.core.gojson import go_marshal_indent

_SECTIONS: dict[str, TypeAdapter[Any]] = {
    name: TypeAdapter(info.annotation)
    for name, info in ServerConfig.model_fields.items()
    if info.annotation is not None
}
_REQUIRED = frozenset(name for name, info in ServerConfig.model_fields.items() if info.is_required())
_GROUPS: TypeAdapter[dict[str, dict[str, DynamicGroupConfig]]] = TypeAdapter(
    dict[TenantName, dict[GroupName, DynamicGroupConfig]]
)


def _names(value: object) -> frozenset[str] | None:
    return frozenset(value) if isinstance(value, dict) else None


def _entries(raw: dict[Any, Any], nested: bool) -> list[dict[Any, Any]]:
    """Split a map section into one-entry documents (two levels deep for ``groups``)."""
    parts: list[dict[Any, Any]] = []
    for key, item in raw.items():
        if nested and isinstance(item, dict) and item:
            parts.extend({key: {sub: value}} for sub, value in item.items())
        else:
            parts.append({key: item})
    return parts


def _validate_section(name: str, raw: object) -> tuple[Any, list[Problem]]:
    """Validate one section; map sections entry by entry, keeping the entries that are valid.

    Returns the (possibly partial) value, or None when nothing usable is left, plus the problems.
    """
    adapter = _SECTIONS[name]
    if not isinstance(raw, dict) or name in ("cluster", "shard", "defaults"):
        try:
            return adapter.validate_python(raw), []
        except ValidationError as exc:
            return None, problems_from_validation(exc, name)
    value: dict[str, Any] = {}
    problems: list[Problem] = []
    for part in _entries(raw, nested=name == "groups"):
        try:
            valid = adapter.validate_python(part)
        except ValidationError as exc:
            problems.extend(problems_from_validation(exc, name))
            continue
        for key, item in valid.items():
            if isinstance(item, dict) and isinstance(value.get(key), dict):
                value[key].update(item)
            else:
                value[key] = item
    return value, problems


#: The secret store of a shard provider when ``cluster.secrets`` is absent (upstream v2's defaults).
DEFAULT_SECRETS_PROVIDERS: dict[str, str] = {
    "aws": "aws-parameter-store",
    "google": "google-secret-manager",
    "gcp": "google-secret-manager",
}


def _default_secrets(raw: dict[str, Any]) -> dict[str, Any]:
    """Fill in ``cluster.secrets`` from the shard's provider when it is absent, as upstream v2 does.

    On a ``google`` shard, a Secret Manager store without ``project_id`` takes the provider's project
    (``shard.infra.options.project_id`` or ``.project``; upstream requires the field written out).
    """
    cluster, shard = raw.get("cluster"), raw.get("shard")
    if not isinstance(cluster, dict) or not isinstance(shard, dict):
        return raw
    infra = shard.get("infra")
    provider = infra.get("provider") if isinstance(infra, dict) else None
    secrets = cluster.get("secrets")
    if secrets is None:
        default = DEFAULT_SECRETS_PROVIDERS.get(provider) if isinstance(provider, str) else None
        if default is None:
            return raw
        secrets = {"provider": default}
    if (
        isinstance(secrets, dict)
        and secrets.get("provider") in ("google-secret-manager", "gcp-secret-manager")
        and not secrets.get("project_id")
        and provider in ("google", "gcp")
    ):
        options = infra.get("options") if isinstance(infra, dict) else None
        project = google_project(options) if isinstance(options, dict) else ""
        if project:
            secrets = {**secrets, "project_id": project}
    if secrets is cluster.get("secrets"):
        return raw
    return {**raw, "cluster": {**cluster, "secrets": secrets}}


def _validate(raw: object) -> tuple[ServerConfig | None, list[Problem]]:
    if not isinstance(raw, dict):
        return None, [Problem("", "the document must be a JSON object")]
    raw = {key: value for key, value in raw.items() if value is not None}  # null is absent, as in Go
    raw = _default_secrets(raw)
    if isinstance(raw.get("groups"), dict):
        raw["groups"] = {tenant: {} if groups is None else groups for tenant, groups in raw["groups"].items()}
    problems: list[Problem] = []
    for key in raw:
        if key in UNSUPPORTED_SECTIONS:
            what = UNSUPPORTED_SECTIONS[key]
            problems.append(Problem(key, f'not supported yet ({what}); remove the "{key}" section'))
        elif key in EMPTY_ONLY_SECTIONS:
            if raw[key] not in (None, {}) and raw[key] != {"files": {}}:
                what = EMPTY_ONLY_SECTIONS[key]
                problems.append(Problem(key, f'not supported yet ({what}); leave the "{key}" section empty'))
        elif key not in _SECTIONS:
            problems.append(Problem(join_path("", key), "unknown field"))
    values: dict[str, Any] = {}
    for name in _SECTIONS:
        if name in raw:
            values[name], found = _validate_section(name, raw[name])
            problems.extend(found)
        elif name in _REQUIRED:
            problems.append(Problem(name, "is required"))
        else:
            values[name] = ServerConfig.model_fields[name].get_default(call_default_factory=True)
    shard_raw = raw.get("shard")
    pools_raw = shard_raw.get("subnet_pools") if isinstance(shard_raw, dict) else None
    sections = Sections(
        shard=values.get("shard"),
        images=values.get("images"),
        load_balancers=values.get("load_balancers"),
        certificates=values.get("certificates"),
        defaults=values.get("defaults"),
        templates=values.get("templates"),
        groups=values.get("groups"),
        template_names=_names(raw.get("templates")),
        load_balancer_names=_names(raw.get("load_balancers", {})),
        certificate_names=_names(raw.get("certificates", {})),
        pool_names=_names(pools_raw),
    )
    problems.extend(cross_section_problems(sections))
    if problems:
        return None, problems
    return ServerConfig.model_construct(**values), []


def validate_config_text(text: str, source: str = "<config>") -> list[Problem]:
    """Every problem in a config document (empty list when it is valid); never raises ConfigError."""
    try:
        raw = parse_jsonc(text, source)
    except ConfigError as exc:
        return exc.problems
    return _validate(raw)[1]


def load_config_text(text: str, source: str = "<config>") -> ServerConfig:
    """Parse and validate a ``config.jsonc`` document; raise ConfigError listing every problem."""
    config, problems = _validate(parse_jsonc(text, source))
    if config is None:
        raise ConfigError(source, problems)
    return config


def _read(path: str | os.PathLike[str]) -> str:
    source = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except OSError as exc:
        raise ConfigError(source, [Problem("", f"cannot read the file: {exc.strerror or exc}")]) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(source, [Problem("", f"the file is not UTF-8 text (byte {exc.start})")]) from None


def load_config_file(path: str | os.PathLike[str]) -> ServerConfig:
    """Read and validate a ``config.jsonc`` file; problems are reported against its path."""
    return load_config_text(_read(path), os.fspath(path))


def validate_config_file(path: str | os.PathLike[str]) -> list[Problem]:
    """Every problem in a ``config.jsonc`` file, including an unreadable file; never raises ConfigError."""
    try:
        text = _read(path)
    except ConfigError as exc:
        return exc.problems
    return validate_config_text(text, os.fspath(path))


def load_groups_text(text: str, source: str = "<groups>") -> DynamicGroups:
    """Parse a ``groups.jsonc`` document (``{tenant: {group: entry}}``); empty text or ``null`` means none.

    Every shape upstream's Go server writes loads: entries without ``template`` (overrides of a
    static group), ``"size": 0``, and ``null`` where Go writes it for an empty map.
    """
    if not text.strip():
        return {}
    raw = parse_jsonc(text, source)
    if raw is None:
        return {}
    if isinstance(raw, dict):
        raw = {tenant: ({} if groups is None else groups) for tenant, groups in raw.items()}
    try:
        return _GROUPS.validate_python(raw)
    except ValidationError as exc:
        raise ConfigError(source, problems_from_validation(exc)) from None


def load_groups_file(path: str | os.PathLike[str]) -> DynamicGroups:
    """Read a ``groups.jsonc`` file."""
    return load_groups_text(_read(path), os.fspath(path))


def dump_groups_text(dynamic: DynamicGroups) -> str:
    """Serialise dynamic groups for ``groups.jsonc`` byte for byte as upstream's Go server does.

    ``json.MarshalIndent`` with two spaces: tenants, groups and map keys sorted, an entry's fields in
    the order of upstream's ``GroupConfig`` struct, unset fields omitted (Go's ``omitempty``),
    durations as Go's ``Duration.String`` (``5m0s``), no newline at the end. Go reads it back.
    """
    dumped = _GROUPS.dump_python(dynamic, mode="json", exclude_defaults=True)
    document = {
        tenant: {name: group_entry(entry) for name, entry in groups.items()}
        for tenant, groups in dumped.items()
    }
    return go_marshal_indent(document).decode("utf-8")
