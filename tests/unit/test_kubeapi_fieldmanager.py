"""Unit tests of the emulator's field ownership and server-side apply (``kubeapi.fieldmanager``).

The behaviour against a real kube-apiserver is pinned by the contract suite; these cover the pure
algorithm's corners without a server: the fieldsV1 encoding, list types and removal of dropped fields.
"""

from __future__ import annotations

from typing import Any

import pytest

from nstance.testing.kubeapi import fieldmanager as fm

SCHEMA = fm.object_schema(
    {
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "properties": {
                    "ports": {
                        "type": "array",
                        "x-kubernetes-list-type": "map",
                        "x-kubernetes-list-map-keys": ["name", "protocol"],
                        "items": {"type": "object"},
                    },
                    "tags": {"type": "array", "x-kubernetes-list-type": "set"},
                    "args": {"type": "array"},
                    "labels": {"type": "object", "x-kubernetes-map-type": "atomic"},
                },
            }
        },
    }
)


def applied(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Thing", "metadata": {"name": "t"}, "spec": spec}


def do_apply(live: dict[str, Any] | None, body: dict[str, Any], manager: str, force: bool = False) -> Any:
    merged, managed = fm.apply(
        live, body, manager=manager, schema=SCHEMA, force=force, api_version="v1", now="2026-01-01T00:00:00Z"
    )
    merged["metadata"]["managedFields"] = managed
    return merged


def test_field_sets_follow_the_list_types() -> None:
    obj = applied(
        ports=[{"name": "http", "protocol": "TCP", "port": 80}],
        tags=["a", "b"],
        args=["x"],
        labels={"k": "v"},
        empty={},
    )
    obj["metadata"].update(uid="u", resourceVersion="1", labels={"app": "x"}, finalizers=["f"])
    assert fm.encode(fm.fields_of(obj, SCHEMA)) == {
        "f:metadata": {"f:finalizers": {'v:"f"': {}}, "f:labels": {"f:app": {}}},
        "f:spec": {
            "f:args": {},
            "f:empty": {},
            "f:labels": {},
            "f:ports": {
                'k:{"name":"http","protocol":"TCP"}': {".": {}, "f:name": {}, "f:port": {}, "f:protocol": {}}
            },
            "f:tags": {'v:"a"': {}, 'v:"b"': {}},
        },
    }


def test_encode_and_decode_are_inverse() -> None:
    paths = fm.fields_of(applied(ports=[{"name": "a", "protocol": "UDP"}], tags=["x"], size=1), SCHEMA)
    assert fm.decode(fm.encode(paths)) == paths


def test_apply_merges_sets_and_keyed_lists_and_replaces_atomic_ones() -> None:
    live = do_apply(None, applied(ports=[{"name": "a", "protocol": "TCP"}], tags=["x"], args=["1"]), "one")
    merged = do_apply(live, applied(ports=[{"name": "b", "protocol": "TCP"}], tags=["y"]), "two")
    assert merged["spec"]["ports"] == [{"name": "a", "protocol": "TCP"}, {"name": "b", "protocol": "TCP"}]
    assert merged["spec"]["tags"] == ["x", "y"]
    assert merged["spec"]["args"] == ["1"]
    with pytest.raises(fm.ApplyConflict) as caught:
        do_apply(merged, applied(args=["2"]), "two")
    assert [(c.manager, fm.readable(c.path)) for c in caught.value.conflicts] == [("one", ".spec.args")]


def test_dropping_a_field_removes_it_only_when_nobody_else_owns_it() -> None:
    live = do_apply(None, applied(size=1, mode="fast", ports=[{"name": "a", "protocol": "TCP"}]), "one")
    shared = do_apply(live, applied(mode="fast"), "two")
    after = do_apply(shared, applied(), "one")
    assert after["spec"] == {"mode": "fast"}


def test_a_forced_apply_takes_the_field_and_conflicts_name_update_managers_with_their_version() -> None:
    live = do_apply(None, applied(size=1), "one")
    updated = dict(live, spec={"size": 2})
    updated["metadata"] = dict(
        live["metadata"],
        managedFields=fm.record_update(
            live, updated, manager="editor", schema=SCHEMA, api_version="unit/v1", now="t"
        ),
    )
    assert [m["manager"] for m in updated["metadata"]["managedFields"]] == ["editor"]  # "one" lost its field
    with pytest.raises(fm.ApplyConflict) as caught:
        do_apply(updated, applied(size=3), "one")
    assert caught.value.conflicts[0].describe() == 'conflict with "editor" using unit/v1'
    forced = do_apply(updated, applied(size=3), "one", force=True)
    assert forced["spec"] == {"size": 3}
    assert [m["manager"] for m in forced["metadata"]["managedFields"]] == ["one"]


def test_a_no_op_apply_keeps_the_entry_time() -> None:
    live = do_apply(None, applied(size=1), "one")
    _merged, managed = fm.apply(
        live, applied(size=1), manager="one", schema=SCHEMA, force=False, api_version="v1", now="later"
    )
    assert managed == live["metadata"]["managedFields"]
