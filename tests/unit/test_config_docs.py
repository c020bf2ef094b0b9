"""docs/configuration.md is generated from the config schema and documents every key of it.

What a user notices: the configuration reference never lags behind the code. The committed page is
what ``scripts/gen_config_docs.py`` writes today, every field of every config model (found here by our
own walk of ``ServerConfig``, independent of the generator's) has a row with its JSON path, defaults of
durations read as Go-style strings, and a field added without a description fails the generator.
"""

from __future__ import annotations

import importlib.util
import re
import sys
import typing
from pathlib import Path
from types import ModuleType, UnionType
from typing import Any

import pytest
from pydantic import BaseModel

from nstance.config.schema import ServerConfig

REPO_ROOT = Path(__file__).resolve().parents[2]
GEN_SCRIPT = REPO_ROOT / "scripts" / "gen_config_docs.py"
DOC = REPO_ROOT / "docs" / "configuration.md"


def _load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("nstance_gen_config_docs", GEN_SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while being defined
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def gen() -> ModuleType:
    return _load_generator()


def _models_in(tp: Any) -> list[type[BaseModel]]:
    """Every model class inside a type (through Optional, Annotated, list and dict)."""
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return [tp]
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return _models_in(typing.get_args(tp)[0])
    if origin in (list, dict, typing.Union, UnionType):
        return [m for arg in typing.get_args(tp) for m in _models_in(arg)]
    return []


def _schema_chains(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    """Field-name chains from the root (``("shard", "garbage_collection", "interval")``) of every field."""
    chains: set[tuple[str, ...]] = set()
    for name, info in model.model_fields.items():
        chain = (*prefix, name)
        chains.add(chain)
        for nested in _models_in(info.annotation):
            chains |= _schema_chains(nested, chain)
    return chains


def _documented_paths(text: str) -> list[str]:
    """The JSON paths in the first column of every table row."""
    return re.findall(r"^\| `([^`]+)` \|", text, flags=re.MULTILINE)


def _chain(path: str) -> tuple[str, ...]:
    """A documented path without its map-key placeholders and list markers."""
    parts = path.replace("[]", "").split(".")
    return tuple(part for part in parts if not (part.startswith("<") and part.endswith(">")))


def test_committed_page_is_what_the_generator_writes(gen: ModuleType) -> None:
    problem = gen.check()
    assert problem is None, f"{problem}: run `python scripts/gen_config_docs.py`"
    assert gen.main(["--check"]) == 0


def test_every_field_of_the_schema_has_a_row() -> None:
    documented = {_chain(path) for path in _documented_paths(DOC.read_text(encoding="utf-8"))}
    missing = sorted(".".join(chain) for chain in _schema_chains(ServerConfig) - documented)
    assert not missing, f"fields without a row in docs/configuration.md: {missing}"


def test_rows_name_real_paths_with_placeholders() -> None:
    paths = set(_documented_paths(DOC.read_text(encoding="utf-8")))
    for expected in (
        "shard.garbage_collection.registration_timeout",
        "cluster.secrets.old_encryption_keys[].source",
        "groups.<tenant>.<group>.drain_timeout",
        "templates.<template>.files.<file>.key.name",
        "load_balancers.<name>.target_groups[].arn",
        "images.<name>.filters[].values",
    ):
        assert expected in paths, expected


def test_defaults_and_rules_read_as_a_user_writes_them() -> None:
    rows = {
        path: line
        for line in DOC.read_text(encoding="utf-8").splitlines()
        for path in re.findall(r"^\| `([^`]+)` \|", line)
    }
    assert '`"5m"`' in rows["shard.garbage_collection.registration_timeout"]
    assert '`"6h"`' in rows["shard.image_refresh_interval"]
    assert '`"1m"`' in rows["shard.health_check_interval"]
    assert "greater than `0s`" in rows["shard.image_refresh_interval"]
    assert "at least 1" in rows["shard.max_concurrent_creates"]
    assert "| required |" in rows["cluster.id"]
    assert "identifier" in rows["cluster.id"]
    assert "`aws`, `google`, `proxmox`, `local`, `sim`" in rows["shard.infra.provider"]


def test_durations_are_written_go_style(gen: ModuleType) -> None:
    from datetime import timedelta

    assert gen.go_duration(timedelta(0)) == "0s"
    assert gen.go_duration(timedelta(minutes=2)) == "2m"
    assert gen.go_duration(timedelta(hours=6)) == "6h"
    assert gen.go_duration(timedelta(hours=1, minutes=30)) == "1h30m"
    assert gen.go_duration(timedelta(minutes=1, seconds=30)) == "1m30s"
    assert gen.go_duration(timedelta(milliseconds=250)) == "250ms"
    assert gen.go_duration(timedelta(seconds=10)) == "10s"


def test_a_field_without_a_description_stops_the_generator(gen: ModuleType) -> None:
    class Undocumented(BaseModel):
        """A section."""

        documented: int = 1
        """Has a description."""
        bare: int = 2

    with pytest.raises(gen.SchemaDocError, match="bare"):
        gen.walk(Undocumented, "example")
