"""Reading ``shard.infra.options``: the checks every provider's factory shares.

Each provider names the options it knows; a key it does not know, or a value of the wrong kind, is
refused with InvalidArgument naming its path (``shard.infra.options.<key>``) and what it must be.
Durations are Go-style strings (``"90s"``, ``"5m"``) or numbers of seconds. Pure: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from nstance.core.durations import parse_duration
from nstance.core.errors import InvalidArgument

PREFIX = "shard.infra.options"


def check_known(options: Mapping[str, Any], allowed: Iterable[str], provider: str) -> None:
    """Refuse the first option (in sorted order) that ``provider`` does not know, listing the allowed ones."""
    known = tuple(allowed)
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise InvalidArgument(
            f"{PREFIX}.{unknown[0]}: unknown option for the {provider} provider; allowed: {', '.join(known)}"
        )


def text(options: Mapping[str, Any], key: str, default: str = "") -> str:
    """A non-empty string option, or ``default`` when it is absent (or null)."""
    value = options.get(key)
    if value is None:
        return default
    if not isinstance(value, str) or not value:
        raise InvalidArgument(f"{PREFIX}.{key}: must be a non-empty string (got {value!r})")
    return value


def flag(options: Mapping[str, Any], key: str, default: bool = False) -> bool:
    """A true/false option."""
    value = options.get(key, default)
    if not isinstance(value, bool):
        raise InvalidArgument(f"{PREFIX}.{key}: must be true or false (got {value!r})")
    return value


def whole(options: Mapping[str, Any], key: str, default: int, low: int, high: int | None = None) -> int:
    """A whole-number option from ``low`` to ``high`` (no upper bound when ``high`` is None)."""
    value = options.get(key, default)
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < low
        or (high is not None and value > high)
    ):
        bounds = f"from {low} to {high}" if high is not None else f"of at least {low}"
        raise InvalidArgument(f"{PREFIX}.{key}: must be a whole number {bounds} (got {value!r})")
    return value


def seconds(options: Mapping[str, Any], key: str, default: float, *, allow_zero: bool = False) -> float:
    """A duration option in seconds: more than zero (or zero too, with ``allow_zero``)."""
    value = options.get(key)
    if value is None:
        return default
    if isinstance(value, str):
        try:
            result = parse_duration(value).total_seconds()
        except InvalidArgument as exc:
            raise InvalidArgument(f"{PREFIX}.{key}: {exc}") from exc
    elif isinstance(value, int | float) and not isinstance(value, bool):
        result = float(value)
    else:
        raise InvalidArgument(
            f'{PREFIX}.{key}: must be a duration such as "90s" or a number of seconds (got {value!r})'
        )
    if not math.isfinite(result) or result < 0 or (result == 0 and not allow_zero):
        need = "must not be negative" if allow_zero else "must be more than zero"
        raise InvalidArgument(f"{PREFIX}.{key}: {need} (got {value!r})")
    return result


def path(options: Mapping[str, Any], key: str, base_dir: Path, default: str | None = None) -> Path | None:
    """A file or directory option; a relative path is taken from ``base_dir`` (the config's directory)."""
    value = text(options, key, default or "")
    if not value:
        return None
    found = Path(value)
    return found if found.is_absolute() else base_dir / found
