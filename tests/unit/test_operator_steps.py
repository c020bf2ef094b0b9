"""The ordered-steps runner and the controllers' work queue (nstance.core.steps, controllers.queue)."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

import pytest

from nstance.core.backoff import Backoff
from nstance.core.steps import Done, Requeue, StepState, run_steps
from nstance.operator.controllers.common import merge_diff
from nstance.operator.controllers.queue import Key, WorkQueue
from nstance.testing.waiting import eventually

log = logging.getLogger("test.steps")


@dataclass
class Trace(StepState):
    ran: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Record:
    name: str
    soft: float | None = None

    async def __call__(self, state: Trace) -> None:
        state.ran.append(self.name)
        if self.soft is not None:
            state.requeue_within(self.soft)


@dataclass(frozen=True)
class Stop:
    name: str
    error: Exception

    async def __call__(self, state: Trace) -> None:
        state.ran.append(self.name)
        raise self.error


async def test_steps_run_in_order_and_report_no_requeue() -> None:
    state = Trace()
    result = await run_steps((Record("a"), Record("b"), Record("c")), state, log)
    assert state.ran == ["a", "b", "c"]
    assert result.requeue_after is None
    assert result.stopped_by is None
    assert [name for name, _ in result.durations] == ["a", "b", "c"]


async def test_requeue_stops_the_run_and_asks_for_the_earliest_delay() -> None:
    state = Trace()
    steps = (Record("a", soft=2.0), Stop("b", Requeue(5.0, "shard down")), Record("c"))
    result = await run_steps(steps, state, log)
    assert state.ran == ["a", "b"]
    assert result.stopped_by == "b"
    assert result.reason == "shard down"
    assert result.requeue_after == 2.0


async def test_done_stops_without_requeue_but_keeps_a_soft_one() -> None:
    state = Trace()
    result = await run_steps(
        (Record("a", soft=7.0), Stop("b", Done("nothing to do")), Record("c")), state, log
    )
    assert state.ran == ["a", "b"]
    assert result.stopped_by == "b"
    assert result.requeue_after == 7.0


async def test_soft_requeues_keep_the_earliest() -> None:
    result = await run_steps(
        (Record("a", soft=9.0), Record("b", soft=3.0), Record("c", soft=4.0)), Trace(), log
    )
    assert result.requeue_after == 3.0


async def test_negative_delays_mean_now() -> None:
    assert Requeue(-1, "x").after == 0.0


async def test_an_unexpected_error_propagates_naming_the_step() -> None:
    with pytest.raises(RuntimeError) as raised:
        await run_steps((Record("a"), Stop("explode", RuntimeError("boom"))), Trace(), log)
    assert "in step explode" in raised.value.__notes__


async def test_the_runner_logs_durations_at_debug_and_the_stopper_at_info(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="test.steps")
    await run_steps((Record("first"), Stop("second", Requeue(1, "waiting"))), Trace(), log)
    debug = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    info = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert any(m.startswith("step first took") for m in debug)
    assert any("step second stopped the run" in m and "waiting" in m for m in info)


# --- work queue -------------------------------------------------------------------------------------


class Reconciler:
    """A reconcile function that records calls and can be held, failed or asked to requeue."""

    def __init__(self) -> None:
        self.calls: list[Key] = []
        self.running: set[Key] = set()
        self.overlap = False
        self.gate = asyncio.Event()
        self.gate.set()
        self.called = asyncio.Event()
        self.fail: int = 0
        self.requeue: float | None = None

    async def __call__(self, key: Key) -> float | None:
        if key in self.running:
            self.overlap = True
        self.running.add(key)
        self.calls.append(key)
        self.called.set()
        try:
            await self.gate.wait()
            if self.fail:
                self.fail -= 1
                raise RuntimeError("shard exploded")
            return self.requeue
        finally:
            self.running.discard(key)

    async def wait_calls(self, count: int) -> None:
        await eventually(lambda: len(self.calls) >= count, within=5, what=f"{count} calls", wake=self.called)


KEY = ("ns", "a")


async def test_a_burst_of_marks_coalesces_into_one_reconcile() -> None:
    reconciler = Reconciler()
    queue = WorkQueue("test", reconciler, workers=3)
    for _ in range(10):
        queue.enqueue(KEY)
    queue.start()
    try:
        await reconciler.wait_calls(1)
        await queue.wait_idle()
        assert reconciler.calls == [KEY]
    finally:
        await queue.stop()


async def test_a_key_is_never_reconciled_twice_at_once_and_a_mark_during_a_run_is_not_lost() -> None:
    reconciler = Reconciler()
    queue = WorkQueue("test", reconciler, workers=3)
    queue.start()
    try:
        reconciler.gate.clear()
        queue.enqueue(KEY)
        await reconciler.wait_calls(1)
        queue.enqueue(KEY)  # arrives while the first run is still going
        queue.enqueue(KEY)
        reconciler.gate.set()
        await reconciler.wait_calls(2)
        await queue.wait_idle()
        assert reconciler.calls == [KEY, KEY]
        assert not reconciler.overlap
    finally:
        await queue.stop()


async def test_a_requeue_runs_the_key_again_later() -> None:
    reconciler = Reconciler()
    reconciler.requeue = 0.01
    queue = WorkQueue("test", reconciler, workers=1)
    queue.start()
    try:
        queue.enqueue(KEY)
        await reconciler.wait_calls(3)
    finally:
        await queue.stop()


async def test_a_failing_reconcile_is_retried_with_backoff(caplog: pytest.LogCaptureFixture) -> None:
    reconciler = Reconciler()
    reconciler.fail = 2
    queue = WorkQueue("test", reconciler, workers=1, backoff=Backoff(base=0.01, cap=0.02, jitter=0))
    queue.start()
    try:
        queue.enqueue(KEY)
        await reconciler.wait_calls(3)
        await queue.wait_idle()
        assert reconciler.fail == 0
        assert any(
            "reconcile failed (RuntimeError: shard exploded)" in r.getMessage() for r in caplog.records
        )
    finally:
        await queue.stop()


async def test_the_earliest_delayed_mark_wins_and_a_mark_now_replaces_it() -> None:
    reconciler = Reconciler()
    queue = WorkQueue("test", reconciler, workers=1)
    queue.start()
    try:
        queue.enqueue(KEY, after=60)
        queue.enqueue(KEY, after=0.01)
        await reconciler.wait_calls(1)
        await queue.wait_idle()
        assert queue.pending == 0  # the 60 s timer was replaced, not kept
        queue.enqueue(KEY, after=60)
        assert queue.pending == 1
        queue.enqueue(KEY)
        await reconciler.wait_calls(2)
        await queue.wait_idle()
        assert queue.pending == 0
    finally:
        await queue.stop()


async def test_a_mark_during_a_run_drops_the_delay_that_run_asks_for() -> None:
    release = asyncio.Event()
    calls: list[Key] = []

    async def reconcile(key: Key) -> float | None:
        calls.append(key)
        if len(calls) == 1:
            await release.wait()
            return 60.0  # superseded: the object changed while this run was going
        return None

    queue = WorkQueue("test", reconcile, workers=1)
    queue.start()
    try:
        queue.enqueue(KEY)
        await eventually(lambda: len(calls) == 1, within=5, what="the first run")
        queue.enqueue(KEY)
        release.set()
        await eventually(lambda: len(calls) == 2, within=5, what="the run the mark asked for")
        await queue.wait_idle()
        assert queue.pending == 0  # no 60 s run left behind
    finally:
        await queue.stop()


async def test_observe_marks_only_when_the_trigger_changes() -> None:
    reconciler = Reconciler()
    queue = WorkQueue("test", reconciler, workers=1)
    queue.start()
    try:
        queue.observe(KEY, ("uid", 1))
        await reconciler.wait_calls(1)
        await queue.wait_idle()
        queue.observe(KEY, ("uid", 1))  # a status write: same generation
        await queue.wait_idle()
        assert len(reconciler.calls) == 1
        queue.observe(KEY, ("uid", 2))
        await reconciler.wait_calls(2)
        queue.forget(KEY)
        queue.observe(KEY, ("uid", 2))  # recreated under the same name: seen as new
        await reconciler.wait_calls(3)
    finally:
        await queue.stop()


# --- change-only writes -------------------------------------------------------------------------------


def test_merge_diff_is_empty_when_nothing_changes() -> None:
    current = {"size": 3, "vars": {"a": "1"}, "other": "kept"}
    assert merge_diff(current, {"size": 3, "vars": {"a": "1"}}) == {}


def test_merge_diff_sets_changes_and_removes_none_and_stale_nested_keys() -> None:
    current = {"size": 3, "template": "app", "vars": {"a": "1", "b": "2"}, "other": "kept"}
    desired = {"size": 4, "template": None, "vars": {"a": "1", "c": "3"}}
    assert merge_diff(current, desired) == {"size": 4, "template": None, "vars": {"b": None, "c": "3"}}


def test_merge_diff_writes_new_nested_mappings_without_nones() -> None:
    assert merge_diff({}, {"config": {"template": "app", "subnetPool": None}}) == {
        "config": {"template": "app"}
    }
