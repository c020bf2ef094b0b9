"""Unit tests of the Kubernetes API emulator's pure parts: store semantics, selectors, patches and schemas.

No sockets: the store is driven directly, as the HTTP layer does.
"""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

import pytest

from nstance.testing.kubeapi import errors, patches, schema, selectors
from nstance.testing.kubeapi.resources import ResourceType
from nstance.testing.kubeapi.store import JSON_PATCH, MERGE_PATCH, Store, WatchEvent

CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "things.unit.nstance.dev"},
    "spec": {
        "group": "unit.nstance.dev",
        "scope": "Namespaced",
        "names": {"plural": "things", "kind": "Thing"},
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                            "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                        },
                    }
                },
            },
            {"name": "v1beta1", "served": True, "storage": False},
        ],
    },
}


def fixed_clock() -> datetime:
    return datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


@pytest.fixture
def store() -> Store:
    return Store(clock=fixed_clock, history_limit=1000)


def rtype(store: Store, group: str, version: str, plural: str) -> ResourceType:
    found = store.registry.lookup(group, version, plural)
    assert found is not None, plural
    return found


def cm(store: Store) -> ResourceType:
    return rtype(store, "", "v1", "configmaps")


def things(store: Store) -> ResourceType:
    crds = rtype(store, "apiextensions.k8s.io", "v1", "customresourcedefinitions")
    if store.find(crds, None, CRD["metadata"]["name"]) is None:
        store.create(crds, None, copy.deepcopy(CRD))
    return rtype(store, "unit.nstance.dev", "v1", "things")


def obj(name: str, **extra: Any) -> dict[str, Any]:
    meta = {"name": name}
    meta.update(extra.pop("meta", {}))
    return {"metadata": meta, **extra}


def thing(name: str, **extra: Any) -> dict[str, Any]:
    """A ``things`` custom resource: unlike a built-in, it must say its apiVersion and kind."""
    return {"apiVersion": "unit.nstance.dev/v1", "kind": "Thing", **obj(name, **extra)}


def owner_ref(owner: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
    }


# ------------------------------------------------------------------------------------------ metadata


def test_create_sets_server_fields_and_rejects_bad_names(store: Store) -> None:
    created = store.create(cm(store), "default", obj("a", data={"k": "v"}))
    meta = created["metadata"]
    assert meta["creationTimestamp"] == "2026-01-02T03:04:05Z"
    assert meta["generation"] == 1
    assert meta["namespace"] == "default"
    assert int(meta["resourceVersion"]) == store.resource_version
    with pytest.raises(errors.APIError) as bad:
        store.create(cm(store), "default", obj("Not_Valid"))
    assert bad.value.code == 422
    assert bad.value.details["causes"][0]["field"] == "metadata.name"
    with pytest.raises(errors.APIError) as nameless:
        store.create(cm(store), "default", {"metadata": {}})
    assert "name or generateName is required" in nameless.value.message


def test_resource_versions_increase_and_noop_updates_keep_them(store: Store) -> None:
    first = store.create(cm(store), "default", obj("a", data={"k": "v"}))
    same = store.patch(cm(store), "default", "a", MERGE_PATCH, {"data": {"k": "v"}})
    assert same["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
    changed = store.patch(cm(store), "default", "a", MERGE_PATCH, {"data": {"k": "w"}})
    assert int(changed["metadata"]["resourceVersion"]) > int(first["metadata"]["resourceVersion"])
    # Without a status subresource any non-metadata change counts as a new generation.
    assert changed["metadata"]["generation"] == 2


def test_update_keeps_server_owned_metadata(store: Store) -> None:
    created = store.create(cm(store), "default", obj("a"))
    body = obj(
        "a",
        data={"x": "1"},
        meta={
            "uid": created["metadata"]["uid"],
            "creationTimestamp": "1999-01-01T00:00:00Z",
            "generation": 99,
        },
    )
    updated = store.update(cm(store), "default", "a", body)
    assert updated["metadata"]["creationTimestamp"] == created["metadata"]["creationTimestamp"]
    assert updated["metadata"]["generation"] == 2
    with pytest.raises(errors.APIError) as renamed:
        store.update(cm(store), "default", "a", obj("b"))
    assert renamed.value.code == 400
    assert "does not match the name on the URL" in renamed.value.message
    with pytest.raises(errors.APIError) as other_uid:
        store.update(cm(store), "default", "a", obj("a", meta={"uid": "not-the-uid"}))
    assert other_uid.value.code == 422


def test_secret_string_data_is_folded_into_data(store: Store) -> None:
    secret = store.create(rtype(store, "", "v1", "secrets"), "default", obj("s", stringData={"k": "hi"}))
    assert secret["data"] == {"k": "aGk="}
    assert secret["type"] == "Opaque"
    assert "stringData" not in secret


def test_commit_update_refuses_a_write_based_on_an_old_version(store: Store) -> None:
    store.create(cm(store), "default", obj("a"))
    old, new = store.prepare_patch(cm(store), "default", "a", MERGE_PATCH, {"data": {"a": "1"}})
    store.patch(cm(store), "default", "a", MERGE_PATCH, {"data": {"b": "2"}})
    with pytest.raises(errors.APIError) as conflict:
        store.commit_update(cm(store), old, new)
    assert conflict.value.reason == "Conflict"


def test_objects_are_served_in_every_version_of_a_crd(store: Store) -> None:
    v1 = things(store)
    beta = rtype(store, "unit.nstance.dev", "v1beta1", "things")
    store.create(v1, "default", thing("t", spec={"a": 1}))
    assert store.get(beta, "default", "t")["apiVersion"] == "unit.nstance.dev/v1beta1"
    assert store.registry.group_versions()["unit.nstance.dev"] == ["v1", "v1beta1"]


# ------------------------------------------------------------------------------------------ watch history


def test_listeners_and_history_see_every_change(store: Store) -> None:
    seen: list[WatchEvent] = []
    unsubscribe = store.subscribe(seen.append)
    start = store.resource_version
    store.create(cm(store), "default", obj("a"))
    store.patch(cm(store), "default", "a", MERGE_PATCH, {"data": {"x": "1"}})
    store.delete(cm(store), "default", "a")
    unsubscribe()
    store.create(cm(store), "default", obj("b"))
    assert [e.type for e in seen] == ["ADDED", "MODIFIED", "DELETED"]
    assert seen[1].old is not None
    assert "data" not in seen[1].old
    assert [e.type for e in store.events_since(start)] == ["ADDED", "MODIFIED", "DELETED", "ADDED"]


def test_events_keep_each_version_as_it_was_after_later_writes(store: Store) -> None:
    """Events hold the stored versions themselves (no copies), so no later write may change them."""
    things_type = things(store)
    start = store.resource_version
    store.create(things_type, "default", thing("t", spec={"n": 1, "deep": {"k": ["a"]}}))
    store.patch(things_type, "default", "t", MERGE_PATCH, {"spec": {"n": 2, "deep": {"k": ["b"]}}})
    store.patch(things_type, "default", "t", MERGE_PATCH, {"status": {"ok": True}}, subresource="status")
    store.update(things_type, "default", "t", {**store.get(things_type, "default", "t"), "spec": {"n": 3}})
    got = store.get(things_type, "default", "t")
    got["spec"]["n"] = 99  # a reader changing its copy changes nothing stored
    store.delete(things_type, "default", "t")
    events = store.events_since(start)
    assert [e.type for e in events] == ["ADDED", "MODIFIED", "MODIFIED", "MODIFIED", "DELETED"]
    assert [e.obj["spec"].get("n") for e in events] == [1, 2, 2, 3, 3]
    assert [e.obj["spec"].get("deep") for e in events[:2]] == [{"k": ["a"]}, {"k": ["b"]}]
    assert [(e.old or {}).get("spec", {}).get("n") for e in events[1:4]] == [1, 2, 2]
    assert "status" not in events[1].obj
    assert events[2].obj["status"] == {"ok": True}
    versions = [int(e.obj["metadata"]["resourceVersion"]) for e in events]
    assert versions == sorted(set(versions))


def test_history_overflow_expires_old_resource_versions() -> None:
    small = Store(history_limit=3)
    start = small.resource_version
    for index in range(5):
        small.create(cm(small), "default", obj(f"c{index}"))
    with pytest.raises(errors.APIError) as gone:
        small.events_since(start)
    assert gone.value.code == 410
    assert gone.value.reason == "Expired"
    assert len(small.events_since(small.resource_version - 3)) == 3


def test_a_failing_listener_does_not_break_writes(store: Store) -> None:
    def broken(_event: WatchEvent) -> None:
        raise RuntimeError("boom")

    store.subscribe(broken)
    assert store.create(cm(store), "default", obj("a"))["metadata"]["name"] == "a"


# ------------------------------------------------------------------------------------------ deletion / GC


def test_finalizers_hold_objects_and_refuse_new_finalizers(store: Store) -> None:
    store.create(cm(store), "default", obj("a", meta={"finalizers": ["x/y"]}))
    deleting = store.delete(cm(store), "default", "a")
    assert deleting["metadata"]["deletionTimestamp"] == "2026-01-02T03:04:05Z"
    with pytest.raises(errors.APIError) as refused:
        store.patch(cm(store), "default", "a", MERGE_PATCH, {"metadata": {"finalizers": ["x/y", "new/one"]}})
    assert refused.value.code == 422
    assert '"new/one"' in refused.value.message
    store.patch(cm(store), "default", "a", JSON_PATCH, [{"op": "remove", "path": "/metadata/finalizers"}])
    assert store.find(cm(store), "default", "a") is None


def test_background_gc_cascades_and_respects_other_owners(store: Store) -> None:
    root = store.create(cm(store), "default", obj("root"))
    other = store.create(cm(store), "default", obj("other"))
    mid = store.create(cm(store), "default", obj("mid", meta={"ownerReferences": [owner_ref(root)]}))
    store.create(cm(store), "default", obj("leaf", meta={"ownerReferences": [owner_ref(mid)]}))
    store.create(
        cm(store), "default", obj("shared", meta={"ownerReferences": [owner_ref(root), owner_ref(other)]})
    )
    store.delete(cm(store), "default", "root")
    remaining = {o["metadata"]["name"] for o in store.list_objects(cm(store), "default")["items"]}
    assert remaining == {"other", "shared"}


def test_orphan_and_foreground_propagation(store: Store) -> None:
    owner = store.create(cm(store), "default", obj("owner"))
    store.create(cm(store), "default", obj("dep", meta={"ownerReferences": [owner_ref(owner)]}))
    store.delete(cm(store), "default", "owner", propagation="Orphan")
    assert "ownerReferences" not in store.get(cm(store), "default", "dep")["metadata"]

    owner = store.create(cm(store), "default", obj("fg"))
    store.create(
        cm(store),
        "default",
        obj("blocker", meta={"ownerReferences": [owner_ref(owner)], "finalizers": ["hold/it"]}),
    )
    deleting = store.delete(cm(store), "default", "fg", propagation="Foreground")
    assert deleting["metadata"]["finalizers"] == ["foregroundDeletion"]
    assert store.get(cm(store), "default", "blocker")["metadata"]["deletionTimestamp"]
    store.patch(cm(store), "default", "blocker", MERGE_PATCH, {"metadata": {"finalizers": None}})
    assert store.find(cm(store), "default", "fg") is None
    with pytest.raises(errors.APIError):
        store.delete(cm(store), "default", "x", propagation="Sideways")


def test_namespace_termination_empties_then_removes_the_namespace(store: Store) -> None:
    namespaces = rtype(store, "", "v1", "namespaces")
    store.create(namespaces, None, obj("team"))
    store.create(cm(store), "team", obj("plain"))
    store.create(cm(store), "team", obj("held", meta={"finalizers": ["hold/it"]}))
    terminating = store.delete(namespaces, None, "team")
    assert terminating["status"]["phase"] == "Terminating"
    assert store.find(cm(store), "team", "plain") is None
    with pytest.raises(errors.APIError) as closed:
        store.create(cm(store), "team", obj("late"))
    assert closed.value.code == 403
    assert "being terminated" in closed.value.message
    store.patch(cm(store), "team", "held", MERGE_PATCH, {"metadata": {"finalizers": None}})
    assert store.find(namespaces, None, "team") is None
    with pytest.raises(errors.APIError) as missing:
        store.create(cm(store), "team", obj("again"))
    assert missing.value.code == 404


def test_deleting_a_crd_deletes_its_objects_then_stops_serving(store: Store) -> None:
    crds = rtype(store, "apiextensions.k8s.io", "v1", "customresourcedefinitions")
    kind = things(store)
    crd = store.get(crds, None, "things.unit.nstance.dev")
    assert {c["type"] for c in crd["status"]["conditions"]} == {"NamesAccepted", "Established"}
    assert crd["status"]["acceptedNames"]["singular"] == "thing"
    store.create(kind, "default", thing("t", meta={"finalizers": ["hold/it"]}))
    store.delete(crds, None, "things.unit.nstance.dev")
    assert store.registry.lookup("unit.nstance.dev", "v1", "things") is not None  # still finalizing
    with pytest.raises(errors.APIError) as refused:
        store.create(kind, "default", thing("new"))
    assert refused.value.code == 405
    store.patch(kind, "default", "t", MERGE_PATCH, {"metadata": {"finalizers": None}})
    assert store.registry.lookup("unit.nstance.dev", "v1", "things") is None
    assert store.find(crds, None, "things.unit.nstance.dev") is None


def test_invalid_crd_is_refused(store: Store) -> None:
    crds = rtype(store, "apiextensions.k8s.io", "v1", "customresourcedefinitions")
    bad = copy.deepcopy(CRD)
    bad["metadata"]["name"] = "wrong.name"
    bad["spec"]["versions"][1]["storage"] = True
    with pytest.raises(errors.APIError) as refused:
        store.create(crds, None, bad)
    fields = [c["field"] for c in refused.value.details["causes"]]
    assert fields == ["spec.versions", "metadata.name"]


# ------------------------------------------------------------------------------------------ evictions


def _ready_pod(store: Store, name: str, labels: dict[str, str]) -> None:
    pods = rtype(store, "", "v1", "pods")
    store.create(pods, "default", obj(name, meta={"labels": labels}, spec={"containers": []}))
    store.patch(
        pods,
        "default",
        name,
        MERGE_PATCH,
        {"status": {"conditions": [{"type": "Ready", "status": "True"}]}},
        "status",
    )


def test_pdb_percentages_and_blocker(store: Store) -> None:
    pdbs = rtype(store, "policy", "v1", "poddisruptionbudgets")
    for index in range(4):
        _ready_pod(store, f"web-{index}", {"app": "web"})
    store.create(
        pdbs, "default", obj("web", spec={"minAvailable": 2, "selector": {"matchLabels": {"app": "web"}}})
    )
    store.evict("default", "web-0", None)
    store.evict("default", "web-1", None)  # 4 ready pods, 2 must stay: two evictions are allowed
    with pytest.raises(errors.APIError) as blocked:
        store.evict("default", "web-2", None)
    assert blocked.value.code == 429
    assert "needs 2 healthy pods and has 2 currently" in blocked.value.details["causes"][0]["message"]
    store.patch(
        pdbs, "default", "web", MERGE_PATCH, {"spec": {"minAvailable": None, "maxUnavailable": "50%"}}
    )
    store.evict("default", "web-2", None)  # 2 pods, 50% (rounded up: 1) may be unavailable
    store.patch(
        pdbs, "default", "web", MERGE_PATCH, {"spec": {"maxUnavailable": None, "minAvailable": "100%"}}
    )
    with pytest.raises(errors.APIError):
        store.evict("default", "web-3", None)
    store.delete(pdbs, "default", "web")
    with pytest.raises(errors.APIError) as bad_pdb:
        store.create(pdbs, "default", obj("bad", spec={"minAvailable": 1, "maxUnavailable": 1}))
    assert bad_pdb.value.code == 422
    store.eviction_blocker = lambda pod: "no" if pod["metadata"]["name"] == "web-3" else None
    with pytest.raises(errors.APIError):
        store.evict("default", "web-3", None)
    with pytest.raises(errors.APIError) as missing:
        store.evict("default", "nope", None)
    assert missing.value.code == 404


# ------------------------------------------------------------------------------------------ selectors


@pytest.mark.parametrize(
    ("text", "labels", "expected"),
    [
        ("a=1", {"a": "1"}, True),
        ("a==1", {"a": "2"}, False),
        ("a!=1", {}, True),
        ("a in (1, 2),b", {"a": "2", "b": ""}, True),
        ("a notin (1)", {"a": "1"}, False),
        ("!a", {"b": "1"}, True),
        ("a", {}, False),
    ],
)
def test_label_selectors(text: str, labels: dict[str, str], expected: bool) -> None:
    parsed = selectors.parse_label_selector(text)
    assert selectors.matches_labels(parsed, {"metadata": {"labels": labels}}) is expected


@pytest.mark.parametrize("text", ["a in 1", "=x", "a=(b)", "a b"])
def test_bad_label_selectors_are_400(text: str) -> None:
    with pytest.raises(errors.APIError) as bad:
        selectors.parse_label_selector(text)
    assert bad.value.code == 400


def test_field_selectors_and_label_selector_objects() -> None:
    fields = selectors.parse_field_selector(
        "spec.nodeName=n1,metadata.name!=x", ("spec.nodeName", "metadata.name")
    )
    assert selectors.matches_fields(fields, {"metadata": {"name": "p"}, "spec": {"nodeName": "n1"}})
    assert not selectors.matches_fields(fields, {"metadata": {"name": "x"}, "spec": {"nodeName": "n1"}})
    with pytest.raises(errors.APIError):
        selectors.parse_field_selector("spec.other=1", ("metadata.name",))
    parsed = selectors.selector_from_object(
        {"matchLabels": {"a": "1"}, "matchExpressions": [{"key": "b", "operator": "DoesNotExist"}]}, "test"
    )
    assert selectors.matches_labels(parsed, {"metadata": {"labels": {"a": "1"}}})
    assert not selectors.matches_labels(parsed, {"metadata": {"labels": {"a": "1", "b": "2"}}})


# ------------------------------------------------------------------------------------------ patches


def test_merge_patch_rfc7386() -> None:
    target = {"a": {"b": 1, "c": [1, 2]}, "d": 1}
    assert patches.merge_patch(target, {"a": {"b": None, "c": [3]}, "e": {"f": None}}) == {
        "a": {"c": [3]},
        "d": 1,
        "e": {},
    }
    assert target == {"a": {"b": 1, "c": [1, 2]}, "d": 1}  # the input is not modified


def test_json_patch_rfc6902() -> None:
    doc = {"a/b": {"~x": 1}, "list": [1, 2]}
    result = patches.json_patch(
        doc,
        [
            {"op": "add", "path": "/a~1b/~0x", "value": 2},
            {"op": "add", "path": "/list/0", "value": 0},
            {"op": "add", "path": "/list/-", "value": 3},
            {"op": "test", "path": "/list", "value": [0, 1, 2, 3]},
        ],
    )
    assert result == {"a/b": {"~x": 2}, "list": [0, 1, 2, 3]}
    with pytest.raises(patches.PatchError) as failed:
        patches.json_patch(doc, [{"op": "test", "path": "/list/0", "value": True}])
    assert failed.value.test_failed
    with pytest.raises(patches.PatchError):
        patches.json_patch(doc, [{"op": "remove", "path": "/missing"}])
    with pytest.raises(patches.PatchError):
        patches.json_patch(doc, [{"op": "move", "from": "/a~1b", "path": "/a~1b/inner"}])
    with pytest.raises(patches.PatchError) as malformed:
        patches.json_patch(doc, {"op": "add"})
    assert malformed.value.malformed


def test_strategic_merge_drops_directives() -> None:
    merged = patches.strategic_merge_patch(
        {"spec": {"a": 1, "b": {"c": 1}}},
        {"$setElementOrder/x": [], "spec": {"b": {"$patch": "delete"}, "d": 2}},
    )
    assert merged == {"spec": {"a": 1, "d": 2}}


# ------------------------------------------------------------------------------------------ schema


SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "spec": {
            "type": "object",
            "required": ["items"],
            "properties": {
                "items": {
                    "type": "array",
                    "items": {"type": "object", "properties": {"n": {"type": "integer"}}},
                },
                "port": {"x-kubernetes-int-or-string": True},
                "mode": {"type": "string", "default": "auto"},
                "maybe": {"type": "string", "nullable": True},
                "gone": {"type": "string"},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                "ratio": {"type": "number", "exclusiveMinimum": True, "minimum": 0},
            },
        }
    },
}


def test_schema_defaults_prunes_and_keeps_nullables() -> None:
    result, problems = schema.apply_schema(
        {
            "metadata": {"name": "x"},
            "spec": {
                "items": [{"n": 1, "junk": 2}],
                "port": "http",
                "maybe": None,
                "gone": None,
                "labels": {"a": "b"},
            },
        },
        SCHEMA,
    )
    assert problems == []
    assert result["spec"] == {
        "items": [{"n": 1}],
        "port": "http",
        "maybe": None,
        "labels": {"a": "b"},
        "mode": "auto",
    }


def test_schema_errors_name_nested_fields() -> None:
    _result, problems = schema.apply_schema(
        {"spec": {"items": [{"n": "one"}], "port": 1.5, "labels": {"a": 1}, "ratio": 0}}, SCHEMA
    )
    assert [p.field for p in problems] == ["spec.items[0].n", "spec.port", "spec.labels[a]", "spec.ratio"]
    _result, missing = schema.apply_schema({"spec": {}}, SCHEMA)
    assert [(p.field, p.reason) for p in missing] == [("spec.items", "FieldValueRequired")]
