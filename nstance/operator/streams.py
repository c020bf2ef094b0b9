"""Per-shard server streams that stay open: reconnect with backoff, follow the configured shard set.

Responsible for two small mechanisms the sync manager and the drain coordinator share:

* ``follow_shards`` keeps exactly one worker task per configured shard. It re-reads
  ``ShardAccess.configured()`` whenever ``ShardAccess.wait_changed()`` returns (and at least every
  ``recheck`` seconds as a safety net): workers of removed shards are cancelled (then ``on_removed``
  runs), new shards get a worker, and a shard whose stub object changed (a new address) gets a fresh
  worker. A worker that ends on its own is restarted after a pause.
* ``keep_stream`` is such a worker for one server-streaming RPC: optionally run ``before_open`` (the
  sync manager's full ListGroups), open the call on the shard's current stub, wait until it is
  established (then ``on_connected``), hand every message to
  ``on_message``, and when the stream fails or the server ends it, report the shard unreachable, call
  ``on_lost`` and reconnect after an exponential backoff with jitter. The backoff starts again from the
  base once a stream delivered a message or stayed open for ``backoff.cap`` seconds.

``ShardStreams`` binds both to one component's operator context (its shard set, clock, resync interval
and a reconnect backoff from ``ctx.timings``), so the sync manager and the drain coordinator name only
their RPC and handlers.

Neither ever raises for shard trouble; a failing ``on_message`` is logged and the stream goes on, so one
bad message cannot stop a shard's stream. This module knows nothing about groups, drains or Kubernetes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from typing import Any, Protocol, TypeVar

import grpc

from nstance.core.backoff import Backoff
from nstance.core.clock import Clock
from nstance.operator.context import OperatorContext, ShardAccess, ShardNotConfigured

log = logging.getLogger(__name__)

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)

RESTART_PAUSE = 1.0
"""Seconds before a worker that ended (it should not) is started again."""


class StreamCall(Protocol[T_co]):
    """What a grpc.aio server-streaming call offers: iteration over messages and cancellation."""

    def __aiter__(self) -> AsyncIterator[T_co]: ...

    def cancel(self) -> bool: ...


def describe_rpc_error(exc: BaseException) -> str:
    """A short text for a failed call: ``CODE: details`` for gRPC errors, the exception otherwise."""
    if isinstance(exc, grpc.aio.AioRpcError):
        code = exc.code()
        name = getattr(code, "name", str(code))
        return f"{name}: {exc.details() or 'no details'}"
    return f"{type(exc).__name__}: {exc}"


def rpc_code(exc: BaseException) -> Any:
    """The gRPC status code of a failed call, or None when ``exc`` is not a gRPC error."""
    return exc.code() if isinstance(exc, grpc.aio.AioRpcError) else None


async def keep_stream(
    shard: str,
    *,
    name: str,
    shards: ShardAccess,
    open_call: Callable[[Any], StreamCall[T]],
    on_message: Callable[[str, T], Awaitable[None]],
    on_lost: Callable[[str, str], Awaitable[None]],
    backoff: Backoff,
    clock: Clock,
    before_open: Callable[[str], Awaitable[None]] | None = None,
    on_connected: Callable[[str], Awaitable[None]] | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> None:
    """Keep the stream ``name`` of ``shard`` open until cancelled (see the module docstring).

    ``open_call(stub)`` starts the call on an ``OperatorServiceStub``. ``on_connected(shard)`` runs once
    the call is established, before the first message is handled (grpc.aio: when the server's response
    headers arrived; servers usually send them with the first message, so for a quiet stream this may
    only happen at its first message). ``on_lost(shard, error)`` is told why each attempt ended; errors
    it raises are logged.
    """
    attempt = 0
    while True:
        started = clock.monotonic()
        delivered = False
        call: StreamCall[T] | None = None
        try:
            if before_open is not None:
                await before_open(shard)
            call = open_call(shards.stub(shard))
            wait_for_connection = getattr(call, "wait_for_connection", None)
            if wait_for_connection is not None:
                await wait_for_connection()  # the server's response headers arrived
                shards.report(shard, True)
            if on_connected is not None:
                await on_connected(shard)
            async for message in call:
                if not delivered:
                    delivered = True
                    shards.report(shard, True)
                try:
                    await on_message(shard, message)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("shard %s: %s: cannot handle a message; skipping it", shard, name)
            error = "the server ended the stream"
        except asyncio.CancelledError:
            raise
        except ShardNotConfigured:
            log.info("shard %s is no longer configured; %s stops", shard, name)
            return
        except Exception as exc:  # noqa: BLE001 - any transport or server failure: reconnect
            error = describe_rpc_error(exc)
        finally:
            if call is not None:
                call.cancel()
        shards.report(shard, False, f"{name}: {error}")
        try:
            await on_lost(shard, error)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("shard %s: %s: handling the lost stream failed", shard, name)
        if delivered or clock.monotonic() - started >= backoff.cap:
            attempt = 0
        delay = backoff.delay(attempt)
        attempt += 1
        log.warning("shard %s: %s lost (%s); reconnecting in %.1fs", shard, name, error, delay)
        await sleep(delay)


async def follow_shards(
    shards: ShardAccess,
    worker: Callable[[str], Coroutine[Any, Any, None]],
    *,
    name: str,
    on_removed: Callable[[str], Awaitable[None]] | None = None,
    recheck: float = 30.0,
) -> None:
    """Run ``worker(shard)`` once per configured shard until cancelled (see the module docstring)."""
    tasks: dict[str, asyncio.Task[None]] = {}
    stubs: dict[str, object] = {}
    restart_at: dict[str, float] = {}
    loop = asyncio.get_running_loop()

    async def stop(shard: str) -> None:
        task = tasks.pop(shard, None)
        stubs.pop(shard, None)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    try:
        while True:
            wanted = _configured(shards, fallback=list(tasks))
            for shard in [s for s in tasks if s not in wanted]:
                log.info("shard %s removed from the config; stopping its %s", shard, name)
                await stop(shard)
                restart_at.pop(shard, None)
                if on_removed is not None:
                    try:
                        await on_removed(shard)
                    except Exception:
                        log.exception("shard %s: cleaning up after its removal failed", shard)
            for shard in wanted:
                try:
                    stub: object = shards.stub(shard)
                except ShardNotConfigured:
                    continue
                task = tasks.get(shard)
                if task is not None and stubs.get(shard) is not stub:
                    log.info("shard %s changed its connection; restarting its %s", shard, name)
                    await stop(shard)
                    task = None
                if task is not None and task.done():
                    if not task.cancelled() and task.exception() is not None:
                        log.error("shard %s: %s ended with an error", shard, name, exc_info=task.exception())
                    tasks.pop(shard)
                    restart_at.setdefault(shard, loop.time() + RESTART_PAUSE)
                    task = None
                if task is None and loop.time() >= restart_at.get(shard, 0.0):
                    restart_at.pop(shard, None)
                    tasks[shard] = asyncio.create_task(worker(shard), name=f"{name}:{shard}")
                    stubs[shard] = stub
            changed = asyncio.ensure_future(shards.wait_changed())
            pending: set[asyncio.Future[Any]] = {changed, *tasks.values()}
            timeout = recheck
            if restart_at:
                timeout = max(0.0, min(timeout, min(restart_at.values()) - loop.time()))
            try:
                await asyncio.wait(pending, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            finally:
                if not changed.done():
                    changed.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await changed
            if changed.done() and not changed.cancelled() and changed.exception() is not None:
                log.error("waiting for shard changes failed", exc_info=changed.exception())
                await asyncio.sleep(RESTART_PAUSE)
    finally:
        for shard in list(tasks):
            await stop(shard)


async def _ignore_lost(_shard: str, _error: str) -> None:
    return None


class ShardStreams:
    """``keep_stream`` and ``follow_shards`` for one component, bound to the operator context."""

    def __init__(self, ctx: OperatorContext) -> None:
        self._ctx = ctx
        self.backoff = Backoff(base=ctx.timings.backoff_base, cap=ctx.timings.backoff_cap)
        """Reconnect backoff of the streams (the component may use it for its own retries too)."""

    def follow(
        self,
        worker: Callable[[str], Coroutine[Any, Any, None]],
        *,
        name: str,
        on_removed: Callable[[str], Awaitable[None]] | None = None,
    ) -> Coroutine[Any, Any, None]:
        """``follow_shards`` on the context's shards, rechecked every ``timings.resync`` seconds."""
        return follow_shards(
            self._ctx.shards, worker, name=name, on_removed=on_removed, recheck=self._ctx.timings.resync
        )

    async def keep(
        self,
        shard: str,
        *,
        name: str,
        open_call: Callable[[Any], StreamCall[T]],
        on_message: Callable[[str, T], Awaitable[None]],
        on_lost: Callable[[str, str], Awaitable[None]] = _ignore_lost,
        before_open: Callable[[str], Awaitable[None]] | None = None,
        on_connected: Callable[[str], Awaitable[None]] | None = None,
    ) -> None:
        """``keep_stream`` for ``shard`` with the context's shards and clock and this backoff."""
        await keep_stream(
            shard,
            name=name,
            shards=self._ctx.shards,
            open_call=open_call,
            on_message=on_message,
            on_lost=on_lost,
            backoff=self.backoff,
            clock=self._ctx.clock,
            before_open=before_open,
            on_connected=on_connected,
        )


def _configured(shards: ShardAccess, *, fallback: Sequence[str]) -> Sequence[str]:
    try:
        return list(shards.configured())
    except Exception:
        log.exception("cannot read the configured shards; keeping the current ones")
        return fallback
