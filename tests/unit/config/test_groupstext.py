"""``GroupsText``: the incremental serialiser writes exactly what ``dump_groups_text`` writes."""

from __future__ import annotations

import json
import random
from datetime import timedelta
from pathlib import Path

import pytest
from config_samples import base_config, load

from nstance.config import (
    GroupUpdate,
    apply_delete,
    apply_upsert,
    dump_groups_text,
    groupstext,
    load_groups_text,
)
from nstance.config.groupstext import GroupsText
from nstance.config.loader import load_groups_file
from nstance.config.schema import DynamicGroups

UPSTREAM = Path(__file__).resolve().parents[2] / "fixtures" / "upstream" / "groups.jsonc"

AWKWARD = {
    "b": {
        "g-1": {
            "template": "web",
            "size": 0,
            "vars": {"x<&>": 'é\u2028\n\t"q"', "empty": ""},
            "args": {"f": 1.5e-7, "big": 1e21, "n": None, "l": [1, {}, [], "s"], "m": {"z": 1, "a": {}}},
            "drain_timeout": "1h30m",
            "load_balancers": ["lb"],
        },
        "g-0": {"size": 3},
    },
    "a": {},
    "c": {"x": {"template": "web", "instance_type": "t.small"}},
}


def test_documents_are_written_as_dump_groups_text_writes_them() -> None:
    text = GroupsText()
    for dynamic in ({}, load_groups_text(json.dumps(AWKWARD)), load_groups_file(UPSTREAM), {}):
        assert text.dump(dynamic) == dump_groups_text(dynamic)
        assert text.dump(dynamic) == dump_groups_text(dynamic)  # from its memo


def test_a_sequence_of_edits_keeps_the_text_identical() -> None:
    # Upserts and deletes in several tenants, as the server applies them (each edit copies only
    # its tenant): after every edit the incremental text is the full serialisation.
    doc = base_config()
    doc["shard"]["limits"] = {"max_groups_per_tenant": 10_000}
    config = load(doc)
    rng = random.Random(15)
    text = GroupsText()
    dynamic: DynamicGroups = {}
    for step in range(300):
        tenant, group = f"t{rng.randrange(3)}", f"g{rng.randrange(40)}"
        if rng.random() < 0.2 and group in dynamic.get(tenant, {}):
            dynamic = apply_delete(dynamic, tenant, group)
        else:
            update = GroupUpdate(
                template="web",
                size=rng.randrange(5),
                vars={"step": str(step)} if rng.random() < 0.3 else None,
                drain_timeout=timedelta(seconds=rng.randrange(100)) if rng.random() < 0.2 else None,
            )
            dynamic = apply_upsert(config, dynamic, tenant, group, update)
        assert text.dump(dynamic) == dump_groups_text(dynamic), f"after step {step}"


def test_only_the_changed_entries_are_encoded(monkeypatch: pytest.MonkeyPatch) -> None:
    config = load(base_config())
    dynamic: DynamicGroups = {}
    for i in range(50):
        dynamic = apply_upsert(config, dynamic, "t1", f"g{i}", GroupUpdate(template="web", size=1))
    dynamic = apply_upsert(config, dynamic, "t2", "other", GroupUpdate(template="web", size=1))
    text = GroupsText()
    text.dump(dynamic)
    encoded: list[str] = []
    inner = groupstext._entry_text

    def spy(name: str, data: object) -> str:
        encoded.append(name)
        return inner(name, data)

    monkeypatch.setattr(groupstext, "_entry_text", spy)
    resized = apply_upsert(config, dynamic, "t1", "g7", GroupUpdate(size=5))
    assert text.dump(resized) == dump_groups_text(resized)
    assert encoded == ["g7"]
    encoded.clear()
    added = apply_upsert(config, resized, "t1", "new", GroupUpdate(template="web", size=1))
    assert text.dump(added) == dump_groups_text(added)
    assert encoded == ["new"]


def test_with_the_edited_keys_the_text_stays_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    # The writer passes (base, keys): the other entries of the tenant are not compared, and the
    # text is still the full serialisation - for a resize, an added and a deleted group.
    config = load(base_config())
    dynamic: DynamicGroups = {}
    for i in range(30):
        dynamic = apply_upsert(config, dynamic, "t1", f"g{i:02d}", GroupUpdate(template="web", size=1))
    text = GroupsText()
    text.dump(dynamic)
    resized = apply_upsert(config, dynamic, "t1", "g07", GroupUpdate(size=4))
    assert text.dump(resized, (dynamic, {("t1", "g07")})) == dump_groups_text(resized)
    added = apply_upsert(config, resized, "t1", "g07a", GroupUpdate(template="web", size=1))
    assert text.dump(added, (resized, {("t1", "g07a")})) == dump_groups_text(added)
    gone = apply_delete(added, "t1", "g03")
    assert text.dump(gone, (added, {("t1", "g03")})) == dump_groups_text(gone)
    refused = dict(gone)  # a refused edit: the key is named but its entry is the same object
    assert text.dump(refused, (gone, {("t1", "g10")})) == dump_groups_text(refused)
    # A hint about another base is ignored: the entries are compared as without one.
    other = apply_upsert(config, gone, "t1", "g20", GroupUpdate(size=9))
    assert text.dump(other, (dynamic, {("t1", "g01")})) == dump_groups_text(other)


@pytest.mark.parametrize("chunk", [1, 3, 7, 128])
def test_edits_across_the_joined_pieces_keep_the_text_exact(
    monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    # A tenant's text is joined in pieces of JOIN_CHUNK entries; an edit joins only its pieces again.
    # Resizes (with and without the writer's hint) at the first, last and boundary entries of pieces,
    # then adds and deletes (which join every piece again), keep the text exact.
    monkeypatch.setattr(groupstext, "JOIN_CHUNK", chunk)
    config = load(base_config())
    dynamic: DynamicGroups = {}
    for i in range(40):
        dynamic = apply_upsert(config, dynamic, "t1", f"g{i:02d}", GroupUpdate(template="web", size=1))
    text = GroupsText()
    assert text.dump(dynamic) == dump_groups_text(dynamic)
    rng = random.Random(chunk)
    for step, i in enumerate([0, 39, 2, 3, 6, 7, 20, 21, 0, *rng.sample(range(40), 10)]):
        before = dynamic
        dynamic = apply_upsert(config, dynamic, "t1", f"g{i:02d}", GroupUpdate(size=step + 2))
        hint = (before, {("t1", f"g{i:02d}")}) if step % 2 else None
        assert text.dump(dynamic, hint) == dump_groups_text(dynamic), f"after resizing g{i:02d}"
    dynamic = apply_upsert(config, dynamic, "t1", "g05a", GroupUpdate(template="web", size=1))
    assert text.dump(dynamic) == dump_groups_text(dynamic)
    dynamic = apply_delete(dynamic, "t1", "g00")
    assert text.dump(dynamic) == dump_groups_text(dynamic)
    dynamic = apply_upsert(config, dynamic, "t1", "g39", GroupUpdate(size=50))
    assert text.dump(dynamic) == dump_groups_text(dynamic)
