"""The operator's read cache: version order, tombstones, stale marks, priming and label selection.

``CachedKube`` against the API emulator is in tests/integration/test_kubecache_api.py.
"""

from __future__ import annotations

import pytest

from nstance.operator.kube import Object
from nstance.operator.kubecache import KindCache, label_equalities
from nstance.operator.sync_kinds import NSTANCE_SHARD_GROUPS

NS = "default"


def obj(name: str, rv: int, *, namespace: str = NS, labels: dict[str, str] | None = None) -> Object:
    meta: Object = {"name": name, "namespace": namespace, "resourceVersion": str(rv)}
    if labels:
        meta["labels"] = labels
    return {"metadata": meta}


def version(o: Object | None) -> str:
    assert o is not None
    return str(o["metadata"]["resourceVersion"])


def test_newer_version_wins_and_older_is_ignored() -> None:
    kind = KindCache(NSTANCE_SHARD_GROUPS)
    kind.put(obj("a", 5))
    kind.put(obj("a", 3))
    assert version(kind.get(NS, "a")) == "5"
    kind.put(obj("a", 7))
    assert version(kind.get(NS, "a")) == "7"


def test_tombstone_keeps_a_late_older_version_out() -> None:
    kind = KindCache(NSTANCE_SHARD_GROUPS)
    kind.put(obj("a", 5))
    kind.drop(obj("a", 8))
    kind.put(obj("a", 6))  # a write answered before the deletion, seen after it
    assert kind.get(NS, "a") is None
    kind.put(obj("a", 9))  # created again
    assert version(kind.get(NS, "a")) == "9"


def test_stale_object_misses_get_but_stays_listed() -> None:
    kind = KindCache(NSTANCE_SHARD_GROUPS)
    kind.prime(NS, [obj("a", 5, labels={"g": "x"}), obj("b", 6, labels={"g": "y"})])
    kind.mark_stale((NS, "a"))
    assert kind.get(NS, "a") is None
    assert [o["metadata"]["name"] for o in kind.select(NS, {"g": "x"})] == ["a"]
    kind.put(obj("a", 5))  # the same version read again from the server
    assert version(kind.get(NS, "a")) == "5"


def test_select_filters_namespace_and_labels_and_returns_copies() -> None:
    kind = KindCache(NSTANCE_SHARD_GROUPS)
    kind.prime(None, [obj("a", 1, labels={"g": "x"}), obj("b", 2, namespace="other", labels={"g": "x"})])
    assert kind.primed(NS)
    assert kind.primed("other")
    assert [o["metadata"]["name"] for o in kind.select(NS, {"g": "x"})] == ["a"]
    assert len(kind.select(None, {"g": "x"})) == 2
    assert kind.select(None, {"g": "z"}) == []
    copy = kind.select(NS, {})[0]
    copy["metadata"]["name"] = "changed"
    assert kind.get(NS, "a") is not None


def test_view_hands_out_the_held_objects_in_name_order_without_copying() -> None:
    kind = KindCache(NSTANCE_SHARD_GROUPS)
    kind.prime(None, [obj("b", 2), obj("a", 1), obj("c", 3, namespace="other")])
    view = kind.view(NS)
    assert [o["metadata"]["name"] for o in view] == ["a", "b"]
    assert [o["metadata"]["name"] for o in kind.view(None)] == ["a", "b", "c"]
    assert view[0] is kind.view(NS)[0]  # the same object each time: no copy per read
    kind.put(obj("a", 4))  # a newer version replaces the held object; the old view keeps the old one
    assert version(view[0]) == "1"
    assert version(kind.view(NS)[0]) == "4"


def test_select_follows_label_changes_deletions_and_recreation() -> None:
    kind = KindCache(NSTANCE_SHARD_GROUPS)
    kind.prime(NS, [obj("a", 1, labels={"g": "x", "s": "1"}), obj("b", 2, labels={"g": "x", "s": "2"})])

    def names(labels: dict[str, str]) -> list[str]:
        return [o["metadata"]["name"] for o in kind.select(NS, labels)]

    assert names({"g": "x"}) == ["a", "b"]
    assert names({"g": "x", "s": "2"}) == ["b"]
    kind.put(obj("a", 3, labels={"g": "y"}))  # relabelled: leaves x, joins y
    assert names({"g": "x"}) == ["b"]
    assert names({"g": "y"}) == ["a"]
    assert names({"s": "1"}) == []
    kind.put(obj("a", 2, labels={"g": "x"}))  # an older version arriving late changes nothing
    assert names({"g": "y"}) == ["a"]
    kind.drop(obj("b", 4))
    assert names({"g": "x"}) == []
    assert [o["metadata"]["name"] for o in kind.view(NS)] == ["a"]
    kind.put(obj("b", 5, labels={"g": "y"}))  # created again under another label
    assert names({"g": "y"}) == ["a", "b"]
    assert [o["metadata"]["name"] for o in kind.view(NS)] == ["a", "b"]


def test_labels_that_are_not_strings_never_match_and_do_not_break_the_cache() -> None:
    kind = KindCache(NSTANCE_SHARD_GROUPS)
    odd = obj("a", 1)
    odd["metadata"]["labels"] = {"g": {"not": "a string"}, "n": 3}
    kind.put(odd)
    kind.put(obj("b", 2, labels={"g": "x"}))
    assert [o["metadata"]["name"] for o in kind.select(NS, {"g": "x"})] == ["b"]
    assert kind.select(NS, {"n": "3"}) == []
    kind.put(obj("a", 3, labels={"g": "x"}))
    assert [o["metadata"]["name"] for o in kind.select(NS, {"g": "x"})] == ["a", "b"]


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("", {}),
        ("a=b", {"a": "b"}),
        ("a==b, c=d", {"a": "b", "c": "d"}),
        ("a!=b", None),
        ("a in (b)", None),
        ("a", None),
    ],
)
def test_label_equalities(selector: str, expected: dict[str, str] | None) -> None:
    assert label_equalities(selector) == expected


def test_what_goes_in_and_comes_out_is_a_deep_copy_of_equal_json() -> None:
    kind = KindCache(NSTANCE_SHARD_GROUPS)
    given = obj("a", 1, labels={"g": "x"})
    given["status"] = {
        "providerIDs": ["nstance://s1/a"],
        "ready": True,
        "replicas": 1,
        "ratio": 0.5,
        "none": None,
    }
    kind.put(given)
    given["status"]["providerIDs"].append("changed by the caller after the put")
    got = kind.get(NS, "a")
    assert got is not None
    assert got["status"] == {
        "providerIDs": ["nstance://s1/a"],
        "ready": True,
        "replicas": 1,
        "ratio": 0.5,
        "none": None,
    }
    got["status"]["providerIDs"].clear()
    got["metadata"]["labels"]["g"] = "changed by a reader"
    selected = kind.select(NS, {"g": "x"})
    assert [o["status"]["providerIDs"] for o in selected] == [["nstance://s1/a"]]
    assert kind.view(NS)[0]["metadata"]["labels"] == {"g": "x"}
