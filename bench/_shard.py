"""Shared helpers for the shard-server benchmarks (``scale_out.py``, ``decision_latency.py``).

Responsible for: a scratch directory (under ``/dev/shm`` when it exists, so object-storage fsyncs and
SQLite writes cost memory speed and the figures measure the server's own work, not the disk; set
``NSTANCE_BENCH_SCRATCH`` to a directory on a real disk to measure with its fsyncs), a
``LocalCluster`` with its CA and nonce key, and an in-process ``ServerApp`` run on the current event
loop until it leads its shard. Logging is set to WARNING so log formatting does not distort timing.

Must not: change server behaviour (it only configures and starts the real ``ServerApp``), measure
anything itself, or leave files or tasks behind (the directory and the server are cleaned up on exit).
Running this file directly does nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nstance.providers.sim import SimProvider
from nstance.server.app import ServerApp, ServerOptions, tune_gc
from nstance.server.shard.shard import Shard
from nstance.server.state.fencing import FencedProvider
from nstance.server.state.metrics import InstrumentedProvider
from nstance.testing.shardproc import (
    ENCRYPTION_KEY_B64,
    LocalCluster,
    free_port,
    server_addrs,
    shard_config,
)

SHARD = "zone-a"
#: Frequent polling so a fresh lock is won within about a second. The lease is upstream's default 15 s,
#: not 1 s: while a 1000-instance burst runs, the server's event loop is blocked for seconds at a time
#: (SQLite writes on the loop thread), and with a 1 s timeout (0.5 s validity) the leader repeatedly
#: lost its lease mid-burst and never finished; that finding is reported, not hidden by the figures.
ELECTION = {"frequent_interval": "200ms", "infrequent_interval": "1s", "leader_timeout": "15s"}
#: GC at its production default (2 min), so no GC cycle (a provider re-list) runs during a measurement.
GC = {"interval": "2m", "registration_timeout": "1h"}
SHM = Path("/dev/shm")
#: Set to a directory to put the scratch files there instead (a real disk, to see what fsyncs cost).
SCRATCH_ENV = "NSTANCE_BENCH_SCRATCH"
#: How long a stopping server may take (its own shutdown_timeout is 5 s) before it is cancelled.
STOP_TIMEOUT_S = 60.0

log = logging.getLogger("bench")


def quiet_logging() -> None:
    """Only warnings and errors, on stderr (stdout carries the JSON lines)."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger().setLevel(logging.WARNING)


@contextlib.contextmanager
def scratch_dir(prefix: str) -> Iterator[Path]:
    """A temporary directory under ``$NSTANCE_BENCH_SCRATCH`` if set, else on ``/dev/shm`` if that exists,
    else in the default temp dir; removed after."""
    base = os.environ.get(SCRATCH_ENV) or (str(SHM) if SHM.is_dir() else None)
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=base))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def where_tmp() -> str:
    """Where ``scratch_dir`` puts its files (for the JSON notes)."""
    chosen = os.environ.get(SCRATCH_ENV)
    if chosen:
        return f"{chosen} (${SCRATCH_ENV})"
    return "/dev/shm (tmpfs)" if SHM.is_dir() else tempfile.gettempdir()


@dataclass
class Running:
    """An in-process server that leads its shard."""

    app: ServerApp
    shard: Shard
    sim: SimProvider
    cluster: LocalCluster
    addrs: dict[str, str]
    tmp: Path


def bench_config(
    addrs: Mapping[str, str],
    *,
    provider_options: Mapping[str, Any],
    groups: Mapping[str, Mapping[str, Any]],
    max_concurrent_creates: int,
    gc: Mapping[str, str] = GC,
) -> dict[str, Any]:
    """A ``config.jsonc`` document: sim provider, fast election, GC at its default, no create spacing."""
    return shard_config(
        shard=SHARD,
        addrs=addrs,
        provider="sim",
        provider_options=provider_options,
        groups=groups,
        election=ELECTION,
        shard_extra={
            "max_concurrent_creates": max_concurrent_creates,
            "create_rate_limit": "0s",
            "garbage_collection": dict(gc),
        },
    )


def sim_of(shard: Shard) -> SimProvider:
    """The sim provider under a shard's fenced, instrumented provider (the benchmark drives it)."""
    provider = shard.ctx.provider
    if isinstance(provider, FencedProvider):  # the context fences every provider call
        provider = provider.inner
    assert isinstance(provider, InstrumentedProvider)
    sim = provider.inner
    assert isinstance(sim, SimProvider)
    return sim


@contextlib.asynccontextmanager
async def running_app(
    tmp: Path,
    config: Mapping[str, Any],
    *,
    cluster: LocalCluster,
    create_bucket: tuple[float, float] | None = None,
    dynamic_groups: bytes | None = None,
    lead_timeout: float = 60.0,
) -> AsyncIterator[ServerApp]:
    """Write ``config`` (and optionally ``groups.jsonc``), run a ServerApp until it leads, stop it after.

    Any provider; ``running_server`` is this with the sim provider's handle. ``cluster`` must already be
    initialised (``cluster.init()``).
    """
    tune_gc()  # as the daemon does (nstance.server.app.serve)
    cluster.write_config(SHARD, config)
    if dynamic_groups is not None:
        cluster.shard_store(SHARD).put("groups.jsonc", dynamic_groups)
    app = ServerApp(
        ServerOptions(
            server_id="bench-1",
            shard=SHARD,
            storage="file",
            bucket=str(cluster.bucket),
            cachedir=tmp / "cache",
            health_addr=f"127.0.0.1:{free_port()}",
            environ={"NSTANCE_ENCRYPTION_KEY": ENCRYPTION_KEY_B64},
            create_bucket=create_bucket,
        )
    )
    stop = asyncio.Event()
    task = asyncio.create_task(app.run(stop), name="bench-server")
    try:
        deadline = time.monotonic() + lead_timeout
        while app.shard is None or not app.shard.leading:
            if task.done():
                task.result()  # raises the server's error
                raise RuntimeError("the server stopped before it led its shard")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the server did not lead its shard within {lead_timeout:.0f}s")
            await asyncio.sleep(0.005)
        yield app
    finally:
        stop.set()
        done, _ = await asyncio.wait({task}, timeout=STOP_TIMEOUT_S)
        if not done:
            log.error("the server did not stop within %.0fs of being asked to; cancelling it", STOP_TIMEOUT_S)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        elif not task.cancelled() and task.exception() is not None:
            log.error("the server stopped with an error: %r", task.exception())


@contextlib.asynccontextmanager
async def running_server(
    tmp: Path,
    config: Mapping[str, Any],
    *,
    cluster: LocalCluster,
    addrs: dict[str, str],
    create_bucket: tuple[float, float] | None = None,
    dynamic_groups: bytes | None = None,
    lead_timeout: float = 60.0,
) -> AsyncIterator[Running]:
    """``running_app`` on the sim provider, as ``Running`` (the benchmark drives the sim)."""
    async with running_app(
        tmp,
        config,
        cluster=cluster,
        create_bucket=create_bucket,
        dynamic_groups=dynamic_groups,
        lead_timeout=lead_timeout,
    ) as app:
        assert app.shard is not None
        yield Running(app=app, shard=app.shard, sim=sim_of(app.shard), cluster=cluster, addrs=addrs, tmp=tmp)


def new_cluster(tmp: Path) -> tuple[LocalCluster, dict[str, str]]:
    """An initialised cluster in ``tmp/bucket`` and five free loopback addresses for one server."""
    cluster = LocalCluster(tmp / "bucket")
    cluster.init()
    return cluster, server_addrs()


async def wait_until(predicate: Callable[[], bool], limit_s: float, what: str, poll: float = 0.005) -> None:
    """Poll ``predicate()`` every ``poll`` s until true; TimeoutError naming ``what`` after ``limit_s``."""
    deadline = time.monotonic() + limit_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {limit_s:.0f}s waiting for {what}")
        await asyncio.sleep(poll)
