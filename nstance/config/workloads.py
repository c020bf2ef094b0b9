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
    encoding: UserdataEncoding = "plain"
    content: NonEmptyStr

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
    name: NonEmptyStr


class FileConfig(StrictModel):
    """A file the server delivers to the agent.

    ``secret``/``storage`` take ``source`` (secret name / object key); ``certificate`` takes
    ``template`` (a ``certificates`` entry) and ``key``; ``env`` takes an object of strings, ``json``
    any object, ``string`` a string as ``template``.
    """

    kind: FileKind
    source: str = ""
    template: Any = None
    key: FileKeyConfig | None = None

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
    arch: Literal["amd64", "arm64"]
    files: dict[str, FileConfig] = Field(default_factory=dict)
    args: dict[str, Any] = Field(default_factory=dict)
    userdata: UserdataConfig | None = None
    size: int = Field(default=1, ge=0)
    instance_type: str | None = None
    subnet_pool: str | None = None
    vars: dict[str, str] = Field(default_factory=dict)

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
    """A group: ``size`` instances of ``template`` (None fields inherit from the template)."""

    template: NonEmptyStr
    size: int | None = Field(default=None, ge=0)
    instance_type: str | None = None
    subnet_pool: str | None = None
    vars: dict[str, str] = Field(default_factory=dict)
    args: dict[str, Any] = Field(default_factory=dict)
    drain_timeout: Duration | None = None
    load_balancers: list[str] = Field(default_factory=list)


class DefaultsConfig(StrictModel):
    """Values every template starts from: args (deep-merged), vars, and fallback userdata."""

    args: dict[str, Any] = Field(default_factory=dict)
    vars: dict[str, str] = Field(default_factory=dict)
    userdata: UserdataConfig | None = None
