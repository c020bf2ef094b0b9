"""Where the event loop stalls: a sampling thread that records the loop thread's stack during stalls.

A benchmark that finds a long event-loop lag (``LagProbe``) knows how long, not why. ``StallSampler``
answers why. The loop bumps a heartbeat every ``beat`` seconds; a daemon thread checks it every
``tick`` seconds and, while the heartbeat is older than ``threshold``, takes a sample of the loop
thread's Python stack (``sys._current_frames``). When the heartbeat resumes the stall is closed with
its wall duration, the CPU time the loop thread spent in it (its own POSIX thread clock) and the stack
seen most often.

The CPU share separates the two kinds of stall: a stall whose CPU time is close to its duration is
work the loop did without yielding (ours to move or split); one with little CPU time is the loop
waiting for the GIL or for a core (contention, or a loaded machine). Diagnostics only: nothing in the
server imports this module.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field


@dataclass
class Stall:
    """One stall: when it started (monotonic), how long it lasted, the loop's CPU time in it, stacks."""

    started: float
    duration: float = 0.0
    cpu: float = 0.0  # loop-thread CPU seconds from detection (``threshold`` in) to the end
    watched: float = 0.0  # wall seconds over which ``cpu`` was measured
    stacks: collections.Counter[str] = field(default_factory=collections.Counter)
    gc_seconds: float = 0.0  # garbage collection (any thread) inside the stall
    others: collections.Counter[str] = field(default_factory=collections.Counter)  # busy threads' frames

    def top(self) -> str:
        return self.stacks.most_common(1)[0][0] if self.stacks else "(no sample)"


#: Functions a thread sits in while it waits for work: such a thread holds no GIL.
_IDLE = {"wait", "_wait_for_tstate_lock", "get", "select", "poll", "_worker", "acquire", "sleep"}


def _idle(frame: object) -> bool:
    return getattr(getattr(frame, "f_code", None), "co_name", "") in _IDLE


def _stack(frame: object, depth: int) -> str:
    lines = []
    for summary in traceback.extract_stack(frame)[-depth:]:  # type: ignore[arg-type]
        where = (
            summary.filename.split("/nstance/", 1)[-1]
            if "/nstance/" in summary.filename
            else summary.filename
        )
        lines.append(f"{where}:{summary.lineno} {summary.name}")
    return "\n      ".join(lines)


class StallSampler:
    """Samples the loop thread's stack whenever the loop is stalled longer than ``threshold``."""

    def __init__(self, *, threshold: float = 0.05, beat: float = 0.01, tick: float = 0.005, depth: int = 12):
        self.threshold, self.beat, self.tick, self.depth = threshold, beat, tick, depth
        self.stalls: list[Stall] = []
        self._last = time.monotonic()
        self._stop = threading.Event()
        self._loop_thread = 0
        self._clock = 0
        self._handle: asyncio.TimerHandle | None = None
        self._thread: threading.Thread | None = None
        self.collections: list[tuple[float, float, int]] = []  # (start, end, generation)
        self._gc_start = 0.0

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._gc_start = time.monotonic()
        else:
            self.collections.append((self._gc_start, time.monotonic(), info["generation"]))

    def start(self) -> None:
        """Start beating on the running loop and sampling from a thread (call on the loop)."""
        self._loop_thread = threading.get_ident()
        self._clock = time.pthread_getcpuclockid(self._loop_thread)
        self._beat()
        gc.callbacks.append(self._on_gc)
        self._thread = threading.Thread(target=self._sample, name="stall-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        if self._handle is not None:
            self._handle.cancel()
        if self._thread is not None:
            self._thread.join()

    def reset(self) -> None:
        self.stalls = []

    def _beat(self) -> None:
        self._last = time.monotonic()
        self._handle = asyncio.get_running_loop().call_later(self.beat, self._beat)

    def _sample(self) -> None:
        current: Stall | None = None
        cpu_start = detected = 0.0
        while not self._stop.wait(self.tick):
            now = time.monotonic()
            if now - self._last > self.threshold:
                if current is None:
                    current = Stall(started=self._last)
                    cpu_start, detected = time.clock_gettime(self._clock), now
                frames = sys._current_frames()
                frame = frames.get(self._loop_thread)
                if frame is not None:
                    current.stacks[_stack(frame, self.depth)] += 1
                for ident, other in frames.items():
                    if ident not in (self._loop_thread, threading.get_ident()) and not _idle(other):
                        current.others[_stack(other, 4)] += 1
            elif current is not None:
                current.duration = self._last - current.started
                current.cpu = time.clock_gettime(self._clock) - cpu_start
                current.watched = max(now - detected, 1e-9)
                self.stalls.append(current)
                current = None

    def report(self, limit: int = 10, since: float = 0.0) -> str:
        """The ``limit`` longest stalls that started after ``since``, with CPU share and top stack."""
        for stall in self.stalls:
            end = stall.started + stall.duration
            stall.gc_seconds = sum(
                max(0.0, min(b, end) - max(a, stall.started)) for a, b, _ in self.collections
            )
        chosen = sorted((s for s in self.stalls if s.started >= since), key=lambda s: -s.duration)[:limit]
        out = [f"{len(self.stalls)} stalls over {self.threshold * 1000:.0f} ms; longest {len(chosen)}:"]
        for generation in (0, 1, 2):
            spent = [b - a for a, b, g in self.collections if g == generation]
            out.append(
                f"  gc generation {generation}: {len(spent)} collections, {sum(spent) * 1000:.0f} ms in all, "
                f"longest {max(spent, default=0.0) * 1000:.1f} ms"
            )
        for s in chosen:
            share = s.cpu / s.watched if s.watched else 0.0
            out.append(
                f"  {s.duration * 1000:7.1f} ms at +{s.started - since:7.2f}s loop cpu {share:4.0%} "
                f"gc {s.gc_seconds * 1000:.0f} ms samples {sum(s.stacks.values())}\n      {s.top()}"
            )
            for other, count in s.others.most_common(3):
                out.append(f"    busy thread ({count} samples):\n      {other}")
        return "\n".join(out)
