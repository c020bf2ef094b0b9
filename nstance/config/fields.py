"""Building blocks of the config schema: the strict base model and reusable field types.

Provides Go-style duration fields (strings such as ``"90s"`` parsed by ``nstance.core.durations``
into ``timedelta`` and written back in Go's format), identifier and name fields checked with
``nstance.core.ids``, ports, provider names, and ``Rules``: how a model-level validator reports
several problems at once, each with its own relative path. Error texts are plain sentences; the
translator in ``nstance.config.translate`` turns them into ``Problem`` objects.

No I/O and no knowledge of where a model sits in the document.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    ValidationInfo,
    model_validator,
)
from pydantic_core import PydanticCustomError

from nstance.core.durations import format_duration, parse_duration
from nstance.core.errors import InvalidArgument
from nstance.core.ids import identifier_problem, kind_problem

RULE_ERROR = "nstance_rule"
RULES_ERROR = "nstance_rules"


class StrictModel(BaseModel):
    """Base of every config model: unknown keys are errors, no type coercion, immutable.

    A key whose value is ``null`` counts as absent, as in Go's ``encoding/json`` (Terraform's
    ``jsonencode`` writes ``"encryption_key": null`` and ``"instance_type": null``).
    """

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _null_is_absent(cls, data: object) -> object:
        if isinstance(data, dict):
            return {key: value for key, value in data.items() if value is not None}
        return data


def rule(message: str) -> PydanticCustomError:
    """An error whose message is shown to the user as written."""
    return PydanticCustomError(RULE_ERROR, "{message}", {"message": message})


@dataclass(frozen=True, slots=True)
class Ref:
    """A path relative to the model being validated, rendered as a full JSON path in messages."""

    parts: tuple[str | int, ...]


PathParts = tuple[str | int, ...]


@dataclass(slots=True)
class Rules:
    """Collects rule violations found by one model validator and raises them together.

    Each violation names a field path relative to the model and a message made of text and
    ``Ref`` segments (so "must differ from shard.bind.registration_addr" can name a sibling).
    """

    found: list[tuple[PathParts, tuple[str | Ref, ...]]] = field(default_factory=list)

    def add(self, where: str | int | PathParts, *message: str | Ref) -> None:
        parts: PathParts = where if isinstance(where, tuple) else (where,)
        self.found.append((parts, message))

    def check(self) -> None:
        if self.found:
            summary = "; ".join(
                ".".join(map(str, parts)) + ": " + "".join(str(s) for s in msg) for parts, msg in self.found
            )
            raise PydanticCustomError(
                RULES_ERROR, "{summary}", {"summary": summary, "violations": tuple(self.found)}
            )


# ---- durations -------------------------------------------------------------------------------


def _parse_duration_field(value: object) -> timedelta:
    if isinstance(value, timedelta):
        parsed = value
    elif isinstance(value, str):
        try:
            parsed = parse_duration(value)
        except InvalidArgument as exc:
            raise rule(str(exc)) from None
    else:
        raise rule('must be a duration string such as "90s", "5m" or "1h30m"')
    if parsed < timedelta(0):
        raise rule("must not be negative")
    return parsed


def _positive(value: timedelta) -> timedelta:
    if value <= timedelta(0):
        raise rule("must be greater than 0")
    return value


Duration = Annotated[
    timedelta,
    BeforeValidator(_parse_duration_field),
    PlainSerializer(format_duration, return_type=str, when_used="json"),
]
"""A non-negative Go-style duration."""

PositiveDuration = Annotated[Duration, AfterValidator(_positive)]
"""A Go-style duration that must be greater than zero."""


def zero_means_default(model: type[BaseModel], value: timedelta, info: ValidationInfo) -> timedelta:
    """A field validator's body: ``0s`` becomes the field's default, as upstream reads several of its
    durations (a config that loads there must load here)."""
    if value == timedelta(0) and info.field_name is not None:
        default = model.model_fields[info.field_name].default
        if isinstance(default, timedelta):
            return default
    return value


def seconds(value: float) -> timedelta:
    """Shorthand for defaults."""
    return timedelta(seconds=value)


# ---- names -----------------------------------------------------------------------------------


def _identifier(what: str) -> AfterValidator:
    def check(value: str) -> str:
        problem = identifier_problem(value)
        if problem is not None:
            raise rule(f"{what} {problem}".strip())
        return value

    return AfterValidator(check)


Identifier = Annotated[str, _identifier("")]
TenantName = Annotated[str, _identifier("tenant name")]
GroupName = Annotated[str, _identifier("group name")]
PoolName = Annotated[str, _identifier("subnet pool name")]


def _kind(value: str) -> str:
    problem = kind_problem(value)
    if problem is not None:
        raise rule(problem)
    return value


Kind = Annotated[str, AfterValidator(_kind)]

_TEMPLATE_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _image_name(value: str) -> str:
    if not _TEMPLATE_IDENT.fullmatch(value):
        raise rule(
            "image name must be a template identifier (letters, digits and '_', not starting with a "
            "digit) so it can be used as Image.<name>"
        )
    return value


ImageName = Annotated[str, AfterValidator(_image_name)]

NonEmptyStr = Annotated[str, Field(min_length=1)]


def _port(value: int) -> int:
    if not 1 <= value <= 65535:
        raise rule("must be a port number between 1 and 65535")
    return value


Port = Annotated[int, AfterValidator(_port)]

# ---- providers -------------------------------------------------------------------------------

ProviderKind = Literal["aws", "google", "proxmox", "local", "sim"]
PROVIDER_KINDS: tuple[str, ...] = ("aws", "google", "proxmox", "local", "sim")


#: Upstream's development providers and the providers that take their place here.
DEV_PROVIDER_STAND_INS: dict[str, str] = {"tmux": "local", "mock": "sim"}

_log = logging.getLogger("nstance.config")


def _provider_alias(value: object) -> object:
    if value == "gcp":
        return "google"
    if isinstance(value, str) and value in DEV_PROVIDER_STAND_INS:
        stand_in = DEV_PROVIDER_STAND_INS[value]
        _log.warning(
            'notice: shard.infra.provider "%s" (upstream\'s development provider) runs as "%s" here%s',
            value,
            stand_in,
            " (each instance is an agent process on this machine)"
            if stand_in == "local"
            else " (simulated instances)",
        )
        return stand_in
    return value


Provider = Annotated[ProviderKind, BeforeValidator(_provider_alias)]
"""Shard infrastructure provider; ``gcp`` is accepted as an alias of ``google``, upstream's
development providers ``tmux`` and ``mock`` as ``local`` and ``sim`` (with a notice)."""
