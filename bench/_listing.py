"""The Operator API's listings of a large shard, as an operator and ``nstance-admin`` call them.

``list_through_api`` runs in a worker thread of the benchmark (a blocking gRPC client on its own mTLS
channel, so the server's event loop is not the client's): one ListGroups, then ListInstances page by
page (``PAGE_SIZE``, what ``nstance-admin instance list`` asks for) until the last page, each call
timed, then a WatchInstances stream held open for a second (what an operator opens when it starts).
``read_in_one_query`` is the baseline: the same tenant's instances read by the repository in one
query on the server's own SQLite file, which is what a listing costs without pages, protobuf or a
network. ``listing_figures`` turns both into benchmark lines; ``page_growth_figure`` compares the
median page between the smallest and the largest shard (a page must cost its own rows, not every row
before it).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

from google.protobuf.empty_pb2 import Empty

from nstance.admin.client import LIST_PAGE_SIZE, load_identity, open_channel
from nstance.db import repo
from nstance.db.engine import Database
from nstance.rpc import operator_pb2, operator_pb2_grpc

PAGE_SIZE = LIST_PAGE_SIZE
CALL_TIMEOUT_S = 120.0
#: A paged listing through the API may cost this many times reading the rows in one query.
TARGET_LIST_RATIO = 3.0
#: The median page at the largest shard over the median page at the smallest.
TARGET_PAGE_GROWTH = 1.5
WATCH_HOLD_S = 1.0


def list_through_api(target: str, identity_dir: Path) -> dict[str, Any]:
    """ListGroups, then every instance in pages: the seconds each took and what came back."""
    channel = open_channel(target, load_identity(identity_dir))
    try:
        stub = operator_pb2_grpc.OperatorServiceStub(channel)
        start = time.perf_counter()
        groups = stub.ListGroups(Empty(), timeout=CALL_TIMEOUT_S).groups
        list_groups_s = time.perf_counter() - start
        pages: list[float] = []
        listed = 0
        token = ""
        start = time.perf_counter()
        while True:
            request = operator_pb2.ListInstancesRequest(page_size=PAGE_SIZE, page_token=token)
            called = time.perf_counter()
            answer = stub.ListInstances(request, timeout=CALL_TIMEOUT_S)
            pages.append(time.perf_counter() - called)
            listed += len(answer.instances)
            token = answer.next_page_token
            if not token:
                break
        list_instances_s = time.perf_counter() - start
        # A new watcher of instances is told of every drain awaiting its acknowledgement; finding
        # them looks at every instance. The stream stays open a second while the lag probe runs.
        stream = stub.WatchInstances(Empty(), timeout=CALL_TIMEOUT_S)
        start = time.perf_counter()
        stream.initial_metadata()
        watch_headers_s = time.perf_counter() - start
        time.sleep(WATCH_HOLD_S)
        stream.cancel()
        return {
            "watch_instances_headers_s": watch_headers_s,
            "list_groups_s": list_groups_s,
            "groups": len(groups),
            "provider_ids": sum(len(g.provider_ids) for g in groups),
            "list_instances_s": list_instances_s,
            "listed": listed,
            "pages": len(pages),
            "page_p50_s": statistics.median(pages),
            "page_max_s": max(pages),
        }
    finally:
        channel.close()


def read_in_one_query(db: Database, tenant: str) -> tuple[float, int]:
    """(seconds, rows) for the tenant's active instances read in one repository query."""
    start = time.perf_counter()
    with db.read_connection() as conn:
        rows = repo.list_active_instances(conn, tenant=tenant)
    return time.perf_counter() - start, len(rows)


def _against_one_query(name: str, seconds: float, one_query: float, n: int) -> dict[str, Any]:
    """A figure of ``seconds`` with the one-query read of the same ``n`` rows as its baseline."""
    return {
        "name": name,
        "value": round(seconds, 3),
        "unit": "s",
        "baseline": round(one_query, 3),
        "baseline_name": f"repo.list_active_instances of the same {n} rows in one query",
        "ratio": round(seconds / one_query, 3),
    }


def listing_figures(
    n: int, run: dict[str, Any], common: dict[str, Any], *, lag_target: float
) -> list[dict[str, Any]]:
    """The listing's benchmark lines for a shard of ``n`` records (``run`` from ``list_through_api``
    plus ``one_query_s`` and ``listing_max_loop_lag_s``/``idle_max_loop_lag_s``); the loop lag is
    held to ``lag_target`` seconds, the takeover's own bound."""
    one_query = run["one_query_s"]
    lag = run["listing_max_loop_lag_s"]
    return [
        {
            **_against_one_query(
                f"takeover_scale_{n}_list_instances_s", run["list_instances_s"], one_query, n
            ),
            "target": TARGET_LIST_RATIO,
            "target_text": f"≤ {TARGET_LIST_RATIO:g}× one query (pages of {PAGE_SIZE} over mTLS)",
            "met": run["list_instances_s"] <= TARGET_LIST_RATIO * one_query
            and run["listed"] == run["one_query_rows"],
            "listed": run["listed"],
            "pages": run["pages"],
            "page_p50_s": round(run["page_p50_s"], 4),
            "page_max_s": round(run["page_max_s"], 4),
            **common,
        },
        {
            **_against_one_query(f"takeover_scale_{n}_list_groups_s", run["list_groups_s"], one_query, n),
            "groups": run["groups"],
            "provider_ids": run["provider_ids"],
            **common,
        },
        {
            "name": f"takeover_scale_{n}_listing_max_loop_lag_s",
            "value": round(lag, 4),
            "unit": "s",
            "baseline": round(run["idle_max_loop_lag_s"], 4),
            "baseline_name": "largest lag of the same server idle as a standby for 10 s before",
            "ratio": round(lag / max(run["idle_max_loop_lag_s"], 1e-4), 3),
            "target": lag_target,
            "target_text": f"≤ {lag_target * 1000:g} ms during ListGroups, ListInstances, WatchInstances",
            "met": lag <= lag_target,
            **common,
        },
    ]


def page_growth_figure(page_p50: dict[int, float]) -> dict[str, Any]:
    """The median ListInstances page at the largest shard over the one at the smallest."""
    low, high = min(page_p50), max(page_p50)
    ratio = page_p50[high] / page_p50[low]
    return {
        "name": f"takeover_scale_list_page_growth_{low}_to_{high}",
        "value": round(page_p50[high], 4),
        "unit": "s",
        "baseline": round(page_p50[low], 4),
        "baseline_name": f"the median ListInstances page of {PAGE_SIZE} at {low} records (same run)",
        "ratio": round(ratio, 3),
        "target": TARGET_PAGE_GROWTH,
        "target_text": f"ratio ≤ {TARGET_PAGE_GROWTH:g}: a page costs its own rows",
        "met": ratio <= TARGET_PAGE_GROWTH,
    }
