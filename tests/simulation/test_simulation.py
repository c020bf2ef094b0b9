"""The deterministic simulation: seeds hold every invariant, replay exactly, and the checks have teeth.

Each seed runs real server code (election, reconciler, registration, health, drain, load balancers,
GC) against simulated time, cloud, storage, agents and an operator, with crashes, fault points,
partitions and storage/provider faults (``nstance.simulation``). The mutation tests break
one guarantee in the server on purpose and show that the simulation reports it, with the command
that reproduces the failing seed. CI runs a few hundred more seeds with ``make sim``.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from nstance.config import GroupUpdate
from nstance.db.models import Instance
from nstance.server.leadership.election import Elector
from nstance.server.reconcile import brake as brake_module
from nstance.server.reconcile import members as members_module
from nstance.server.reconcile.members import member_of
from nstance.server.shard.api import GroupView
from nstance.server.shard.shard import Shard
from nstance.server.state import context as context_module
from nstance.server.state.leadertime import LeaderClock
from nstance.simulation import __main__ as cli
from nstance.simulation.run import reproduce_command, run_seed
from nstance.simulation.world import World
from nstance.testing.requests import sample_create_request

pytestmark = pytest.mark.slow


def test_seeds_hold_every_invariant_under_faults() -> None:
    injected: Counter[str] = Counter()
    for seed in range(6):
        result = run_seed(seed)
        assert result.ok, (seed, result.problems, result.trace[-20:])
        injected.update(result.stats)
    # The faults really happened: a run that injects nothing proves nothing.
    for kind in ("crashes", "fault_point_crashes", "partitions", "agent_crashes", "blips", "upserts"):
        assert injected[kind] > 0, kind


def test_a_seed_replays_exactly() -> None:
    first, second = run_seed(3), run_seed(3)
    assert (first.digest, first.stats, first.trace) == (second.digest, second.stats, second.trace)
    assert run_seed(4).digest != first.digest


def test_two_leaders_acting_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A follower that takes over after 1 s instead of leader_timeout overlaps the old leader's term."""
    original = Elector.__init__

    def impatient(self: Elector, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        self._takeover_after = 1.0

    monkeypatch.setattr(Elector, "__init__", impatient)
    result = run_seed(0)
    assert any("while the leaders were" in p for p in result.problems), result.problems


def test_replacing_healthy_instances_after_a_failover_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without counting silence from the start of leadership, agents that could not report while no
    server led look silent to the new leader, which drains and replaces healthy instances."""

    def no_floor(row: Instance, **_: Any) -> Any:
        return member_of(row)

    monkeypatch.setattr(members_module, "member_of", no_floor)
    result = run_seed(2)
    assert any("for missed health reports, but its agent was alive" in p for p in result.problems)


# --- classes of fault, each with the guard that handles it and a mutation that removes the guard ----

#: Seeds the class tests run; every one of them must hold (the class, not a lucky seed, is tested).
CLASS_SEEDS = range(3)
#: Wider for a mutation: in some seeds the steps land on standbys or between reports, and show nothing.
MUTATION_SEEDS = range(6)
#: A leader stopped and continued after a takeover, or cut off from storage, keeps acting on stale state.
DEPOSED = ("pause", "partition")
#: Paused leaders only: a partitioned one cannot reach storage anyway, a paused one resumes and tries.
PAUSES = ("pause",)
#: Wall-clock steps of a server, with agent blips in between.
CLOCK_STEPS = ("wall-step", "blip")
#: Agent blips around failovers, leaderless spells, restarts with and without SQLite, and pauses.
BLIPS = ("blip", "blip", "partition", "crash", "pause", "provider-loss")


def _class_results(kinds: tuple[str, ...]) -> list[Any]:
    return [run_seed(seed, fault_kinds=kinds) for seed in CLASS_SEEDS]


def test_damaged_and_lost_storage_deletes_nothing_healthy_and_the_fleet_converges() -> None:
    """Seeds whose draw enables the storage nemeses: corrupt records, a deleted instance/ prefix, a
    corrupt SQLite cache - no VM healthy at the time is deleted without a reason, and sizes converge."""
    results = [run_seed(seed) for seed in (0, 1, 2)]
    assert all(r.ok for r in results), [(r.seed, r.problems[:3]) for r in results]
    assert sum(r.stats.get("storage_damage", 0) for r in results) >= 6


def test_a_deposed_server_changes_nothing() -> None:
    results = _class_results(DEPOSED)
    assert all(r.ok for r in results), [(r.seed, r.problems[:3]) for r in results]
    assert sum(r.stats["pauses"] for r in results) >= 10
    assert sum(r.stats["partitions"] for r in results) >= 5


def test_without_fencing_a_deposed_server_is_caught_writing(monkeypatch: pytest.MonkeyPatch) -> None:
    """The guard removed: no fence anywhere (handles and call sites), no cancellation of the term."""
    monkeypatch.setattr(context_module.ShardContext, "fence", lambda self: None)
    results = _class_results(PAUSES)
    assert any("while the leaders were" in p for r in results for p in r.problems), [
        r.problems for r in results
    ]


def test_wall_clock_steps_replace_nothing() -> None:
    # The same seeds as the mutation below: there the steps do replace healthy instances.
    results = [run_seed(seed, fault_kinds=CLOCK_STEPS) for seed in MUTATION_SEEDS]
    assert all(r.ok for r in results), [(r.seed, r.problems[:3]) for r in results]
    assert sum(r.stats["wall_steps"] for r in results) >= 10


def _no_brake(key: Any, members: Any, *args: Any, **kwargs: Any) -> brake_module.SilenceVerdict:
    """The mass-deletion brake lifted: every silent member may be replaced at once."""
    return brake_module.SilenceVerdict(list(members))


def test_without_the_leader_clock_a_wall_clock_step_replaces_healthy_instances(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The guard removed: the shard decides on the wall clock instead of the leader's monotonic frame.

    A step silences a whole group at once, which the mass-deletion brake would also hold back; the brake
    is lifted too, so this shows what the leader clock alone prevents.
    """

    class WallClock(LeaderClock):
        def now(self) -> Any:
            return self.source.now()

    original = context_module.ShardContext.__post_init__

    def unframed(self: context_module.ShardContext) -> None:
        original(self)
        self.clock = WallClock(self.leader_clock.source)

    monkeypatch.setattr(context_module.ShardContext, "__post_init__", unframed)
    monkeypatch.setattr(brake_module, "hold_silent", _no_brake)
    results = [run_seed(seed, fault_kinds=CLOCK_STEPS) for seed in MUTATION_SEEDS]
    problems = [p for r in results for p in r.problems]
    assert any("for missed health reports, but its agent was alive" in p for p in problems), problems


def test_blips_around_failovers_replace_nothing() -> None:
    results = _class_results(BLIPS)
    assert all(r.ok for r in results), [(r.seed, r.problems[:3]) for r in results]
    assert sum(r.stats["blips"] for r in results) >= 5


def test_without_the_silence_floor_blips_around_failovers_are_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The guard removed: silence counted from the last report whoever received it."""
    monkeypatch.setattr(members_module, "member_of", lambda row, **_: member_of(row))
    problems = [p for r in _class_results(BLIPS) for p in r.problems]
    assert any("for missed health reports, but its agent was alive" in p for p in problems), problems


def test_a_lost_group_update_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """An UpsertGroup acknowledged without being stored."""

    async def forgetful(self: Shard, tenant: str, group: str, update: GroupUpdate) -> GroupView:
        return self._group_view(tenant, group)

    monkeypatch.setattr(Shard, "upsert_group", forgetful)
    result = run_seed(5)
    assert any(p.startswith("lost update: group") for p in result.problems), result.problems


def test_leaked_and_duplicate_vms_are_caught() -> None:
    """VMs launched behind the server's back, one of them under an instance id already in use."""

    def tamper(world: World) -> None:
        live = next(vm for vm in world.cloud.vms.values() if vm.status.value == "running")
        stray = sample_create_request(cluster_id="sim", shard="zone-a", token="stray-1")
        twin = dataclasses.replace(stray, instance_id=live.instance_id, idempotency_token="stray-2")
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(world.cloud.create_instance(stray))
            loop.run_until_complete(world.cloud.create_instance(twin))
        finally:
            loop.close()

    result = run_seed(0, before_check=tamper)
    assert any(p.startswith("duplicate: 2 VMs run for instance") for p in result.problems), result.problems
    assert any(p.startswith("leak: VM") for p in result.problems), result.problems


def test_a_failing_seed_prints_the_command_that_reproduces_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PYTHONHASHSEED", "0")  # already fixed: the command line does not re-execute
    monkeypatch.setattr(members_module, "member_of", lambda row, **_: member_of(row))

    code = cli.main(["--seed", "2"])

    out = capsys.readouterr().out
    assert code == 1
    assert "seed 2 FAILED" in out
    assert f"reproduce: {reproduce_command(2)}" in out
    assert reproduce_command(2) == "PYTHONHASHSEED=0 .venv/bin/python -m nstance.simulation --seed 2 --trace"
    assert '"failed": [2]' in out


def test_the_command_line_replays_a_seed_exactly_in_another_process() -> None:
    import subprocess
    import sys

    def digest() -> str:
        out = subprocess.run(
            [sys.executable, "-m", "nstance.simulation", "--seed", "7"],
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        ).stdout
        line = next(line for line in out.splitlines() if line.startswith("seed 7 ok"))
        return line.rsplit("digest ", 1)[1].rstrip(")")

    assert digest() == digest()


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_run_leaves_no_scratch_directory_behind(tmp_path: Path, jobs: int) -> None:
    # Every run used to leave a directory with its template database under /dev/shm (hundreds of
    # them, 1 MB each, on a machine that runs the simulation often).
    import os
    import subprocess
    import sys

    from nstance.simulation.world import SCRATCH_ENV

    out = subprocess.run(
        [sys.executable, "-m", "nstance.simulation", "--start", "3", "--seeds", "2", "--jobs", str(jobs)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, SCRATCH_ENV: str(tmp_path)},
    )
    assert '"failed": []' in out.stdout, out.stdout + out.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("jobs", "how"),
    [(1, "ctrl-c"), (1, "sigterm"), (1, "hangup"), (2, "ctrl-c"), (2, "sigterm"), (2, "hangup")],
)
def test_a_stopped_run_says_how_far_it_got_and_cleans_up(tmp_path: Path, jobs: int, how: str) -> None:
    # Ctrl-C printed a KeyboardInterrupt traceback (with one job, from the middle of a seed's event
    # loop, with its tasks destroyed pending); SIGTERM left the workers printing BrokenPipeError
    # tracebacks and the scratch directory behind.
    import os
    import signal
    import subprocess
    import sys

    from nstance.simulation.world import SCRATCH_ENV
    from nstance.testing.procs import popen_as_terminal_job
    from nstance.testing.waiting import eventually_sync

    run = popen_as_terminal_job(  # whose Ctrl-C is never ignored
        [sys.executable, "-m", "nstance.simulation", "--start", "7", "--seeds", "400", "--jobs", str(jobs)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, SCRATCH_ENV: str(tmp_path)},
        start_new_session=True,  # its own process group, as a terminal's foreground job
    )
    try:
        eventually_sync(
            lambda: any(tmp_path.glob("*/seed-*")) or run.poll() is not None,
            within=60,
            what="the run to start a seed",
        )
        if how == "ctrl-c":
            os.killpg(run.pid, signal.SIGINT)  # what a terminal sends to every process of the job
        elif how == "hangup":
            os.killpg(run.pid, signal.SIGHUP)  # the terminal closed: to every process of the job too
        else:
            run.send_signal(signal.SIGTERM)  # to the parent only, as a supervisor sends it
        output, _ = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
    expected = {
        "ctrl-c": 128 + signal.SIGINT,
        "sigterm": 128 + signal.SIGTERM,
        "hangup": 128 + signal.SIGHUP,
    }[how]
    assert run.returncode == expected, output
    assert "Traceback" not in output, output
    name = {"ctrl-c": "SIGINT", "sigterm": "SIGTERM", "hangup": "SIGHUP"}[how]
    assert f"sim: stopped by {name} after " in output.splitlines()[-1], output
    assert list(tmp_path.iterdir()) == []
