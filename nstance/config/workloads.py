"""Schema of what instances are made from: defaults, templates, files, userdata and groups.

``TemplateConfig`` is the instance template (kind = puidv7 prefix, arch, files, args, userdata,
default size/instance type/subnet pool, vars); ``GroupConfig`` is an entry of ``groups`` (static)
or of ``groups.jsonc`` (dynamic). Rules that need only one of these models live here; rules that
cross sections (template and pool references) live in ``nstance.config.checks``. No I/O.
"""

from __future__ import annotations

import posixpath
from typing import Any, Literal, Self

from pydantic import Field, model_validator

from nstance.config.fields import Duration, Kind, NonEmptyStr, Rules, StrictModel

FileKind = Literal["secret", "storage", "certificate", "env", "json", "string"]
UserdataEncoding = Literal["plain", "base64", "gzip", "base64+gzip"]


class UserdataConfig(StrictModel):
    """Userdata handed to new VMs: inline text or a URL the server fetches, then rendered."""

    source: Literal["inline", "url"] = "inline"
    """`inline`: `content` is the userdata. `url`: `content` is a URL the server fetches at every create."""
    encoding: UserdataEncoding = "plain"
    """How the content (or the fetched bytes) is encoded: `plain`, `base64`, `gzip` (only with `url`) or
    `base64+gzip`. It is decoded, then rendered as a template."""
    content: NonEmptyStr
    """The userdata (a template that sees `Nonce`, `Cluster.CACert`, `Instance.ID`,
    `Server.RegistrationAddr` and the rest of docs/files.md), or its URL."""

    @model_validator(mode="after")
    def _rules(self) -> Self:
        rules = Rules()
        if self.encoding == "gzip" and self.source != "url":
            rules.add(
                "encoding",
                '"gzip" is only allowed with source "url" (inline content is text; use "base64+gzip")',
            )
        rules.check()
        return self


class FileKeyConfig(StrictModel):
    """Which public key a certificate file is issued for (one the agent generated)."""

    source: Literal["agent"]
    """`agent`: the agent generates the key pair when asked; the private key never leaves the VM."""
    name: NonEmptyStr
    """Key name; a trailing `.pub` is dropped (`kubelet.pub` names the key pair `kubelet`)."""


class FileConfig(StrictModel):
    """A file the server delivers to the agent.

    ``secret``/``storage`` take ``source`` (secret name / object key); ``certificate`` takes
    ``template`` (a ``certificates`` entry) and ``key``; ``env`` takes an object of strings, ``json``
    any object, ``string`` a string as ``template``.
    """

    kind: FileKind
    """What the file is made from: `secret`, `storage`, `certificate`, `env`, `json` or `string`
    (docs/files.md)."""
    source: str = ""
    """`secret`: the secret's name; `storage`: an object key in the shard's storage (templated). Required
    for those kinds, refused for the others."""
    template: Any = None
    """`certificate`: the name of a `certificates` entry; `env`: an object of strings; `json`: an object;
    `string`: a string. Refused for `secret` and `storage`."""
    key: FileKeyConfig | None = None
    """`certificate` only, and required there: the agent key the certificate is issued for."""

    @model_validator(mode="after")
    def _rules(self) -> Self:
        rules = Rules()
        kind = self.kind
        if kind in ("secret", "storage"):
            if not self.source:
                rules.add("source", f'is required for kind "{kind}"')
            if self.template is not None:
                rules.add("template", f'is not used by kind "{kind}"; remove it')
        elif self.source:
            rules.add("source", f'is not used by kind "{kind}"; remove it')
        if kind == "certificate":
            if not isinstance(self.template, str) or not self.template:
                rules.add("template", 'must name a "certificates" entry for kind "certificate"')
            if self.key is None:
                rules.add(
                    "key", 'is required for kind "certificate" (e.g. {"source": "agent", "name": "x.pub"})'
                )
        elif self.key is not None:
            rules.add("key", f'is not used by kind "{kind}"; remove it')
        if kind == "env" and not (
            isinstance(self.template, dict) and all(isinstance(v, str) for v in self.template.values())
        ):
            rules.add("template", 'must be an object of strings for kind "env"')
        if kind == "json" and not isinstance(self.template, dict):
            rules.add("template", 'must be an object for kind "json"')
        if kind == "string" and not isinstance(self.template, str):
            rules.add("template", 'must be a string for kind "string"')
        rules.check()
        return self


def file_name_problem(name: str) -> str | None:
    """Why ``name`` is not usable as a delivered file name (relative, clean path), or None."""
    if not name:
        return "file name must not be empty"
    if name.startswith("/") or "\\" in name:
        return "file name must be a relative path using '/' separators"
    if posixpath.normpath(name) != name or name.split("/")[0] == "..":
        return "file name must be a clean relative path (no '.', '..' or '//' segments)"
    return None


class TemplateConfig(StrictModel):
    """An instance template: what a group's instances are created from."""

    kind: Kind
    """Three lowercase letters: the prefix of instance IDs (`knc06h...`)."""
    arch: Literal["amd64", "arm64"]
    """`amd64` or `arm64`. Instance types are checked against it where the provider can tell."""
    files: dict[str, FileConfig] = Field(default_factory=dict)
    """File name (a clean relative path under the agent's receive directory) to the file the server
    delivers."""
    args: dict[str, Any] = Field(default_factory=dict)
    """Provider create arguments (docs/provider-*.md), deep-merged over `defaults.args`; string values are
    templates."""
    userdata: UserdataConfig | None = None
    """Userdata of new VMs. Unset: `defaults.userdata`."""
    size: int = Field(default=1, ge=0)
    """Size of groups that set none."""
    instance_type: str | None = None
    """Instance type of groups that set none."""
    subnet_pool: str | None = None
    """Subnet pool of groups that set none; must be a pool of `shard.subnet_pools`."""
    vars: dict[str, str] = Field(default_factory=dict)
    """Template variables (`Vars.<name>`), merged over `defaults.vars`."""

    @model_validator(mode="after")
    def _rules(self) -> Self:
        rules = Rules()
        for name in self.files:
            problem = file_name_problem(name)
            if problem is not None:
                rules.add(("files", name), problem)
        rules.check()
        return self


class GroupConfig(StrictModel):
    """A group: ``size`` instances of ``template`` (unset fields inherit from the template).

    Through the Operator API, a static group (one defined here) may change only ``size``,
    ``instance_type`` and ``vars``; the other fields are fixed by this file.
    """

    template: NonEmptyStr
    """The template the group's instances are created from; must be an entry of `templates`."""
    size: int | None = Field(default=None, ge=0)
    """Desired number of instances. Unset: the template's `size`."""
    instance_type: str | None = None
    """Unset: the template's `instance_type`."""
    subnet_pool: str | None = None
    """Unset: the template's `subnet_pool`. A pool of `shard.subnet_pools`; with neither set the provider
    places the VMs (EC2: the default VPC; GCE: the default network, or `args.Network`; Proxmox: the
    `Bridge` arg)."""
    vars: dict[str, str] = Field(default_factory=dict)
    """Merged over the template's vars (the group wins)."""
    args: dict[str, Any] = Field(default_factory=dict)
    """Deep-merged over the template's args."""
    drain_timeout: Duration | None = None
    """How long a drain may take before the instance is deleted anyway. Unset:
    `shard.default_drain_timeout`; `0s`: no drain."""
    load_balancers: list[str] = Field(default_factory=list)
    """Names of `load_balancers` entries the group's instances are registered with once their agent
    reports."""


class DynamicGroupConfig(GroupConfig):
    """An entry of ``groups.jsonc``: a dynamic group, or the overrides of a static group.

    ``template`` may be left out when the entry overrides a static group (upstream's ``group
    scale`` writes ``{"size": 5}`` alone); a group that exists only here needs one.
    """

    template: str = ""
    """The template of a dynamic-only group; ignored (and usually absent) for a static group."""


class DefaultsConfig(StrictModel):
    """Values every template starts from: args (deep-merged), vars, and fallback userdata."""

    args: dict[str, Any] = Field(default_factory=dict)
    """Provider create arguments every template starts from."""
    vars: dict[str, str] = Field(default_factory=dict)
    """Template variables every template starts from."""
    userdata: UserdataConfig | None = None
    """Userdata of templates that set none."""
