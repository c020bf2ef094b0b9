"""ListInstances in pages: the token, the page size, and answers that must fit in one message.

The servicer is driven directly on a shard stand-in that pages its list as the SQLite query does
(oldest first, after a (created_at, id) key); the real server and ``nstance-admin`` paging through it
are in tests/integration/test_operator_api.py.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest

from nstance.core.errors import InvalidArgument, ResourceExhausted
from nstance.pki.peer import PeerIdentity
from nstance.rpc import operator_pb2
from nstance.server.identity import interceptors
from nstance.server.services import paging
from nstance.server.services.operator import OperatorServicer
from nstance.server.shard.api import InstanceView, ShardAPI

T0 = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)


class Listing:
    """The part of ``ShardAPI`` ListInstances uses, over a fixed list of instances."""

    def __init__(self, views: list[InstanceView]) -> None:
        self.views = sorted(views, key=lambda v: (v.created_at, v.instance_id))

    async def list_instances(
        self,
        tenant: str,
        group: str = "",
        *,
        after: tuple[datetime, str] | None = None,
        limit: int | None = None,
    ) -> list[InstanceView]:
        found = [
            v
            for v in self.views
            if v.tenant == tenant
            and (not group or v.group == group)
            and (after is None or (v.created_at, v.instance_id) > after)
        ]
        return found if limit is None else found[:limit]


def views(count: int, *, same_time: int = 1) -> list[InstanceView]:
    """``count`` instances; every ``same_time`` of them share one ``created_at`` (ties order by id)."""
    return [
        InstanceView(
            instance_id=f"app{i:026d}",
            tenant="default",
            group=f"g{i % 3}",
            status="running",
            created_at=T0 + timedelta(seconds=i // same_time),
            last_seen=None,
            provider_id=f"sim-{i:012d}",
        )
        for i in range(count)
    ]


@pytest.fixture(autouse=True)
def operator_peer() -> Iterator[None]:
    peer = PeerIdentity(
        client_id="test",
        tenant="default",
        role="operator",
        serial="01",
        not_after=T0 + timedelta(days=1),
        certificate=cast(Any, None),
    )
    token = interceptors._PEER.set(peer)
    yield
    interceptors._PEER.reset(token)


async def list_all(servicer: OperatorServicer, page_size: int, group: str = "") -> list[list[str]]:
    pages: list[list[str]] = []
    token = ""
    while True:
        request = operator_pb2.ListInstancesRequest(group=group, page_size=page_size, page_token=token)
        answer = await servicer.ListInstances(request, cast(Any, None))
        pages.append([i.instance_id for i in answer.instances])
        token = answer.next_page_token
        if not token:
            return pages


def servicer(listing: Listing, max_message_bytes: int = 4 * 1024 * 1024) -> OperatorServicer:
    return OperatorServicer(cast(ShardAPI, listing), max_message_bytes=max_message_bytes)


async def test_pages_cover_every_instance_once_in_order_through_ties_of_created_at() -> None:
    listing = Listing(views(23, same_time=4))
    pages = await list_all(servicer(listing), page_size=5)
    assert [len(p) for p in pages] == [5, 5, 5, 5, 3]
    assert [iid for page in pages for iid in page] == [v.instance_id for v in listing.views]
    g1 = [v.instance_id for v in listing.views if v.group == "g1"]
    assert [iid for page in await list_all(servicer(listing), 2, group="g1") for iid in page] == g1


async def test_a_page_that_ends_the_list_exactly_has_no_token() -> None:
    assert [len(p) for p in await list_all(servicer(Listing(views(10))), page_size=5)] == [5, 5]
    assert await list_all(servicer(Listing([])), page_size=5) == [[]]


async def test_no_page_size_answers_everything_or_says_it_does_not_fit() -> None:
    listing = Listing(views(400))
    assert [len(p) for p in await list_all(servicer(listing), page_size=0)] == [400]
    small = servicer(listing, max_message_bytes=8 * 1024)  # about 110 instances
    with pytest.raises(ResourceExhausted, match=r"400 instances .*max_message_bytes.*page_size"):
        await list_all(small, page_size=0)
    pages = await list_all(small, page_size=5000)  # fewer than asked, each page within the limit
    assert all(0 < len(p) < 120 for p in pages)
    assert [iid for page in pages for iid in page] == [v.instance_id for v in listing.views]


async def test_page_size_is_capped_and_bad_requests_are_invalid_argument() -> None:
    listing = Listing(views(paging.MAX_PAGE_SIZE + 7))
    assert [len(p) for p in await list_all(servicer(listing), page_size=1_000_000)] == [
        paging.MAX_PAGE_SIZE,
        7,
    ]
    with pytest.raises(InvalidArgument, match="page_size"):
        await list_all(servicer(listing), page_size=-1)
    for token in ("not a token", base64.urlsafe_b64encode(b"[1, 2]").decode(), "e30", "WyJ4IiwgMV0"):
        request = operator_pb2.ListInstancesRequest(page_size=5, page_token=token)
        with pytest.raises(InvalidArgument, match="page_token"):
            await servicer(listing).ListInstances(request, cast(Any, None))


def test_a_token_names_the_last_instance_of_its_page() -> None:
    when = T0 + timedelta(microseconds=5)
    assert paging.decode_token(paging.encode_token(when, "app1")) == (when, "app1")
    naive = base64.urlsafe_b64encode(b'["2026-11-26T12:00:00","app1"]').decode()
    with pytest.raises(InvalidArgument):
        paging.decode_token(naive)  # a time without its zone is not one this server wrote
