"""Hold off CPython's cyclic garbage collector while a bulk pass holds many short-lived objects.

CPython's collector stops every thread for as long as it takes to walk the generation it collects,
and a pass over a whole shard (the provider's listing of 100,000 VMs next to the cache's 100,000
rows) fills the younger generations with objects that are alive, but only until the pass ends: a
collection in the middle walks them all and finds nothing to free. At 100,000 records one such
walk stopped the event loop for 120-150 ms. Reference counting frees those objects when the pass
drops them; only reference cycles need the collector, and they can wait a few seconds.

``paused()`` turns automatic collection off for the duration of a ``with`` block and back on at its
end (if it was on). Blocks nest. So that a block that runs long (a slow provider, thousands of
deletions) never holds collection off for long, collection comes back after ``MAX_PAUSE_S`` seconds
even if the block has not ended; only the event-loop thread uses it (it is not locked).

Put the bulk data in locals of a coroutine awaited *inside* the block: they are gone when it
returns, before collection resumes, so the first collection afterwards has nothing large to walk.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import Iterator

#: Longest time (seconds) one outermost ``paused()`` holds automatic collection off.
MAX_PAUSE_S = 30.0


class _State:
    depth = 0  # open paused() blocks
    resume = False  # whether collection was on when the outermost block began
    timer: asyncio.TimerHandle | None = None


def _resume() -> None:
    """Turn collection back on if the outermost block found it on (idempotent)."""
    if _State.timer is not None:
        _State.timer.cancel()
        _State.timer = None
    if _State.resume:
        _State.resume = False
        gc.enable()


@contextlib.contextmanager
def paused(max_pause_s: float = MAX_PAUSE_S) -> Iterator[None]:
    """No automatic collection inside the block (for at most ``max_pause_s`` seconds in all)."""
    if _State.depth == 0:
        _State.resume = gc.isenabled()
        gc.disable()
        with contextlib.suppress(RuntimeError):  # no running loop: no time limit needed or possible
            _State.timer = asyncio.get_running_loop().call_later(max_pause_s, _resume)
    _State.depth += 1
    try:
        yield
    finally:
        _State.depth -= 1
        if _State.depth == 0:
            _resume()
