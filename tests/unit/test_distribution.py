"""Replica distribution over a pool's shards (nstance.core.distribution)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nstance.core.distribution import distribute_replicas


def test_remainder_goes_to_the_first_listed_shards() -> None:
    assert distribute_replicas(5, ["a", "b"]) == {"a": 3, "b": 2}
    assert distribute_replicas(7, ["a", "b", "c"]) == {"a": 3, "b": 2, "c": 2}


def test_listed_order_wins_over_name_order() -> None:
    # Upstream sorts shard names; the spec says "in the order listed", so "b" takes the odd replica.
    assert distribute_replicas(5, ["b", "a"]) == {"b": 3, "a": 2}
    assert list(distribute_replicas(5, ["b", "a"])) == ["b", "a"]


def test_zero_and_fewer_replicas_than_shards() -> None:
    assert distribute_replicas(0, ["a", "b"]) == {"a": 0, "b": 0}
    assert distribute_replicas(1, ["a", "b", "c"]) == {"a": 1, "b": 0, "c": 0}


def test_negative_total_is_refused() -> None:
    with pytest.raises(ValueError, match="must not be negative"):
        distribute_replicas(-1, ["a"])


def test_duplicate_shards_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="'a'"):
        distribute_replicas(3, ["a", "b", "a"])


def test_no_shards_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one shard"):
        distribute_replicas(3, [])


@given(
    total=st.integers(min_value=0, max_value=10_000),
    shards=st.lists(st.text(min_size=1, max_size=4), min_size=1, max_size=12, unique=True),
)
def test_sizes_sum_to_total_and_differ_by_at_most_one(total: int, shards: list[str]) -> None:
    sizes = distribute_replicas(total, shards)
    assert sum(sizes.values()) == total
    assert max(sizes.values()) - min(sizes.values()) <= 1
    # Non-increasing in listed order: the larger shares are at the front.
    values = [sizes[s] for s in shards]
    assert values == sorted(values, reverse=True)
