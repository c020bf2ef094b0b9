"""Rules that cross sections of the server config, run after each section validated on its own.

Each section that failed validation is passed as None and the checks needing it are skipped, so
one mistake does not hide others; names of entries (templates, load balancers, pools, certificates)
are taken from the raw document so references can be checked even when an entry is invalid.

Checked here: group references (template, load balancers, subnet pool), template subnet pools and
certificate files, image and load balancer providers vs the shard's provider, a leader network only
where the provider can move one, certificate kinds, Proxmox args per group, ``shard.limits`` (group
sizes, groups per tenant, vars), and that every template (userdata, args, files, certificate fields)
compiles. Pure; returns Problems.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nstance.config.errors import Problem, join_path
from nstance.config.limits import config_limit_problems
from nstance.config.merge import deep_merge
from nstance.config.render import template_problem
from nstance.config.resources import SPECIAL_CERTIFICATES, CertConfig, ImageConfig, LoadBalancerConfig
from nstance.config.shard import ShardConfig
from nstance.config.userdata import decode_userdata
from nstance.config.workloads import DefaultsConfig, FileConfig, GroupConfig, TemplateConfig, UserdataConfig
from nstance.core.errors import InvalidArgument

Groups = Mapping[str, Mapping[str, GroupConfig]]


@dataclass(frozen=True, slots=True)
class Sections:
    """Validated sections (None when a section failed) plus entry names read from the raw document."""

    shard: ShardConfig | None
    images: Mapping[str, ImageConfig] | None
    load_balancers: Mapping[str, LoadBalancerConfig] | None
    certificates: Mapping[str, CertConfig] | None
    defaults: DefaultsConfig | None
    templates: Mapping[str, TemplateConfig] | None
    groups: Groups | None
    template_names: frozenset[str] | None
    load_balancer_names: frozenset[str] | None
    certificate_names: frozenset[str] | None
    pool_names: frozenset[str] | None


def _collect(value: Any, parts: list[str | int], base: str, out: list[Problem]) -> None:
    if isinstance(value, str):
        problem = template_problem(value)
        if problem is not None:
            out.append(Problem(join_path(base, *parts), problem))
    elif isinstance(value, dict):
        for key, item in value.items():
            parts.append(str(key))
            _collect(item, parts, base, out)
            parts.pop()
    elif isinstance(value, list):
        for i, item in enumerate(value):
            parts.append(i)
            _collect(item, parts, base, out)
            parts.pop()


def template_problems(path: str, value: Any) -> list[Problem]:
    """Problems for every string inside ``value`` that is a template that does not compile."""
    out: list[Problem] = []
    _collect(value, [], path, out)
    return out


def _userdata_problems(path: str, userdata: UserdataConfig | None) -> list[Problem]:
    if userdata is None or userdata.source != "inline":
        return []
    try:
        text = decode_userdata(userdata.content.encode(), userdata.encoding).decode("utf-8")
    except InvalidArgument as exc:
        return [Problem(join_path(path, "content"), str(exc).removeprefix("userdata: "))]
    except UnicodeDecodeError:
        return [Problem(join_path(path, "content"), "decoded content is not UTF-8 text")]
    problem = template_problem(text)
    return [] if problem is None else [Problem(path, problem)]


def _file_problems(path: str, file: FileConfig, certificate_names: frozenset[str] | None) -> list[Problem]:
    out = template_problems(join_path(path, "source"), file.source) if file.kind == "storage" else []
    if file.kind == "certificate":
        name = file.template
        if certificate_names is not None and isinstance(name, str) and name not in certificate_names:
            out.append(
                Problem(join_path(path, "template"), f'certificate "{name}" is not defined in certificates')
            )
    elif file.kind in ("env", "json", "string"):
        out.extend(template_problems(join_path(path, "template"), file.template))
    return out


def _pool_problem(path: str, pool: str | None, pools: frozenset[str] | None) -> list[Problem]:
    if pool and pools is not None and pool not in pools:
        return [Problem(path, f'subnet pool "{pool}" is not defined in shard.subnet_pools')]
    return []


def _template_checks(s: Sections) -> list[Problem]:
    out: list[Problem] = []
    if s.defaults is not None:
        out.extend(_userdata_problems("defaults.userdata", s.defaults.userdata))
        out.extend(template_problems("defaults.args", s.defaults.args))
    for name, template in (s.templates or {}).items():
        base = join_path("templates", name)
        out.extend(_pool_problem(join_path(base, "subnet_pool"), template.subnet_pool, s.pool_names))
        out.extend(_userdata_problems(join_path(base, "userdata"), template.userdata))
        out.extend(template_problems(join_path(base, "args"), template.args))
        for file_name, file in template.files.items():
            out.extend(_file_problems(join_path(base, "files", file_name), file, s.certificate_names))
    return out


def _group_checks(s: Sections) -> list[Problem]:
    out: list[Problem] = []
    for tenant, groups in (s.groups or {}).items():
        for name, group in groups.items():
            base = join_path("groups", tenant, name)
            if s.template_names is not None and group.template not in s.template_names:
                out.append(
                    Problem(join_path(base, "template"), f'template "{group.template}" is not defined')
                )
            for i, lb in enumerate(group.load_balancers):
                if s.load_balancer_names is not None and lb not in s.load_balancer_names:
                    out.append(
                        Problem(join_path(base, "load_balancers", i), f'load balancer "{lb}" is not defined')
                    )
            out.extend(_pool_problem(join_path(base, "subnet_pool"), group.subnet_pool, s.pool_names))
            out.extend(template_problems(join_path(base, "args"), group.args))
    return out


#: Providers that take ``images`` entries of each kind (``sim`` imitates every kind).
_IMAGE_PROVIDERS: Mapping[str, frozenset[str]] = {"aws": frozenset({"aws", "sim"}), "oci": frozenset({"sim"})}
#: Providers that register targets with load balancers of each kind.
_LB_PROVIDERS: Mapping[str, frozenset[str]] = {
    "aws": frozenset({"aws", "sim"}),
    "google": frozenset({"google", "sim"}),
    "tunnel": frozenset(),
}
#: Providers that can move a leader address (``shard.leader_network``).
LEADER_NETWORK_PROVIDERS: frozenset[str] = frozenset({"aws", "google", "sim"})


def _image_checks(s: Sections) -> list[Problem]:
    if s.shard is None or s.images is None:
        return []
    provider = s.shard.infra.provider
    out: list[Problem] = []
    for name, image in s.images.items():
        if provider in _IMAGE_PROVIDERS[image.provider]:
            continue
        hint = ""
        if provider == "google":
            hint = "; on google, set args.SourceImage to an image or image family path instead"
        elif image.provider == "oci":
            hint = "; no OCI provider exists yet"
        out.append(
            Problem(
                join_path("images", name, "provider"),
                f'"{image.provider}" images need shard.infra.provider "{image.provider}" '
                f'(it is "{provider}"){hint}',
            )
        )
    return out


def _load_balancer_checks(s: Sections) -> list[Problem]:
    if s.shard is None or s.load_balancers is None:
        return []
    provider = s.shard.infra.provider
    out: list[Problem] = []
    for name, lb in s.load_balancers.items():
        if provider in _LB_PROVIDERS[lb.provider]:
            continue
        if lb.provider == "tunnel":
            message = '"tunnel" load balancers are not supported by this server yet'
        else:
            message = (
                f'"{lb.provider}" load balancers need shard.infra.provider "{lb.provider}" '
                f'(it is "{provider}")'
            )
        out.append(Problem(join_path("load_balancers", name, "provider"), message))
    return out


def _leader_network_checks(s: Sections) -> list[Problem]:
    if s.shard is None or s.shard.leader_network is None:
        return []
    provider = s.shard.infra.provider
    if provider in LEADER_NETWORK_PROVIDERS:
        return []
    hint = " (keep a floating address with keepalived/VRRP between the servers instead)"
    return [
        Problem(
            "shard.leader_network",
            f'the "{provider}" provider cannot move a leader address; remove it{hint}',
        )
    ]


def _certificate_checks(s: Sections) -> list[Problem]:
    out: list[Problem] = []
    for name, cert in (s.certificates or {}).items():
        base = join_path("certificates", name)
        if cert.kind is None and name not in SPECIAL_CERTIFICATES:
            out.append(Problem(join_path(base, "kind"), "is required (client or server)"))
        fields = cert.model_dump(include={"cn", "organization", "dns", "ip", "uri"})
        out.extend(template_problems(base, fields))
    return out


def proxmox_args_problem(args: Mapping[str, Any]) -> str | None:
    """Why merged args cannot create a Proxmox VM (StoragePool, one of TemplateVMID/TemplateName)."""
    if "StoragePool" not in args:
        return 'provider "proxmox" needs "StoragePool" in the merged args (defaults, template and group)'
    present = [key for key in ("TemplateVMID", "TemplateName") if key in args]
    if len(present) != 1:
        found = "both" if present else "neither"
        return (
            'provider "proxmox" needs exactly one of "TemplateVMID" or "TemplateName" in the merged args '
            f"(found {found})"
        )
    return None


def _proxmox_checks(s: Sections) -> list[Problem]:
    if s.shard is None or s.shard.infra.provider != "proxmox":
        return []
    if s.defaults is None or s.templates is None or s.groups is None:
        return []
    out: list[Problem] = []
    for tenant, groups in s.groups.items():
        for name, group in groups.items():
            template = s.templates.get(group.template)
            if template is None:
                continue
            problem = proxmox_args_problem(deep_merge(s.defaults.args, template.args, group.args))
            if problem is not None:
                out.append(Problem(join_path("groups", tenant, name, "args"), problem))
    return out


def _limit_checks(s: Sections) -> list[Problem]:
    if s.shard is None:
        return []
    default_vars = s.defaults.vars if s.defaults is not None else None
    return config_limit_problems(s.shard.limits, default_vars, s.templates, s.groups)


def cross_section_problems(sections: Sections) -> list[Problem]:
    """Every cross-section problem found in ``sections``."""
    return [
        *_template_checks(sections),
        *_group_checks(sections),
        *_image_checks(sections),
        *_load_balancer_checks(sections),
        *_leader_network_checks(sections),
        *_certificate_checks(sections),
        *_proxmox_checks(sections),
        *_limit_checks(sections),
    ]
