"""The Node index against the in-repo Kubernetes API server: a Node older than the server's watch
history still gets a live watch from the list's version (no 410 loop). The index's event handling
itself is tested against a scripted fake in tests/unit/test_watchindex.py."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from nstance.operator.kube import CONFIGMAPS, NODES, Kube, load_configuration
from nstance.operator.nodes import NodeIndex
from nstance.testing.kubeapi import KubeAPIServer
from nstance.testing.waiting import eventually


@contextlib.asynccontextmanager
async def running(index: NodeIndex) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(index.run())
    try:
        yield task
        assert not task.done(), "run() must never end on its own"
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_nodes_older_than_the_watch_history_still_get_a_live_watch(tmp_path: Path) -> None:
    async with KubeAPIServer(history_limit=5) as api:
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        kube = Kube.from_configuration(await load_configuration(str(kubeconfig)))
        try:
            await kube.create(NODES, {"metadata": {"name": "old"}, "spec": {"providerID": "sim:///i-old"}})
            for n in range(10):  # later writes push the Node's version out of the server's history
                await kube.create(CONFIGMAPS, {"metadata": {"name": f"cm-{n}"}}, "default")
            _, list_version = await kube.list_with_version(NODES)
            # A long backoff: a watch that failed with 410 would not re-list within this test.
            nodes = NodeIndex(kube, backoff_base=30.0, backoff_cap=30.0)
            async with running(nodes):
                await nodes.wait_synced()
                assert nodes.find("i-old") is not None
                await kube.create(
                    NODES, {"metadata": {"name": "new"}, "spec": {"providerID": "sim:///i-new"}}
                )
                await eventually(
                    lambda: nodes.find("i-new") is not None, within=10, what="the Node created after the list"
                )
                assert nodes.get("new") is not None
            watches = [path for method, path in api.requests if "watch=true" in path and "/nodes" in path]
            assert len(watches) == 1
            assert f"resourceVersion={int(list_version)}" in watches[0]
            lists = [
                p
                for m, p in api.requests
                if m == "GET" and p.startswith("/api/v1/nodes") and "watch" not in p
            ]
            assert len(lists) == 2  # the test's own list and the index's
        finally:
            await kube.close()
