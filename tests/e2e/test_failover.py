"""Shard-leader failover with three real ``nstance-server`` processes on one bucket (issue #7).

Three servers of one shard share one object store - a ``file://`` directory, or an S3 bucket on a real
``moto_server`` - and one simulated cloud (the ``sim`` provider's shared state file). While a group is
scaled up and down over the Operator API, the current leader is SIGKILLed three times and restarted as
a standby each time. What a user (and an auditor) must see:

* after each kill another server leads within ``leader_timeout + frequent_interval + grace`` (plus
  slack for this shared machine), measured from the SIGKILL to the new leader's "now leading" log line;
* no double-acting leader: every mutating provider call (the sim's call log says who made it and
  when) was issued while its server's log said it led, and took effect before any other server's
  term began (``nstance.testing.failover.find_double_acting``);
* the group converges: the sim runs exactly the desired number of VMs and every one of them has a
  live instance record in the bucket (no leak, no duplicate);
* no process is left behind.

The audit itself is checked first, on made-up histories and on two real servers that both act (leader
election disabled on both, against the documentation's advice), so a check that can never fail would
be noticed.
"""

from __future__ import annotations

import contextlib
import math
import random
import time
from pathlib import Path

import pytest

from nstance.rpc import operator_pb2
from nstance.testing.failover import (
    FAST_ELECTION,
    Call,
    FailoverShard,
    Term,
    find_double_acting,
    leadership_terms,
    log_overlaps,
)
from nstance.testing.motoserver import MotoServer
from nstance.testing.procs import processes_mentioning
from nstance.testing.waiting import eventually_sync

pytestmark = pytest.mark.timeout(240)

FREQUENT = 0.3  # FAST_ELECTION: frequent_interval 300 ms, leader_timeout 2 s
LEADER_TIMEOUT = 2.0
GRACE = min(1.0, FREQUENT / 2)  # the elector's default grace gap
SLACK = 1.0  # a loaded two-core machine running three servers (and moto_server)
FAILOVER_BOUND = LEADER_TIMEOUT + FREQUENT + GRACE + SLACK
SIZES_BEFORE_KILLS = (5, 1, 4)  # UpsertGroup asks for this size just before each kill
FINAL_SIZE = 3


# ---- the audit on made-up histories ------------------------------------------------------------


def _call(pid: int, started: float, t: float | None = None) -> Call:
    return Call(
        t=started if t is None else t, started=started, method="create_instance", server=f"p{pid}", pid=pid
    )


def _term(pid: int, start: float, end: float = math.inf, ended_by: str = "log") -> Term:
    return Term(server=f"p{pid}", pid=pid, start=start, end=end, ended_by=ended_by)


def test_audit_accepts_leaders_that_act_one_after_another() -> None:
    terms = [_term(1, 0.0, 10.0, "exit"), _term(2, 12.0)]
    calls = [_call(1, 1.0), _call(1, 9.9), _call(2, 12.5), _call(2, 30.0)]
    assert find_double_acting(calls, terms) == []


def test_audit_flags_a_call_issued_outside_every_term_of_its_server() -> None:
    terms = [_term(1, 0.0, 10.0), _term(2, 12.0)]
    problems = find_double_acting([_call(1, 10.5), _call(3, 13.0)], terms)
    assert len(problems) == 2
    assert "outside every term" in problems[0]
    assert "it led: never" in problems[1]


def test_audit_flags_an_old_leader_acting_after_the_new_one_started_even_if_its_log_lags() -> None:
    # p1's log says it led until 15 (it was stalled); p2 started leading at 12. A call p1 issued at
    # 11 that took effect at 11.5 is fine; one that took effect at 12.5 overlaps p2's leadership.
    terms = [_term(1, 0.0, 15.0), _term(2, 12.0)]
    assert find_double_acting([_call(1, 11.0, t=11.5)], terms) == []
    problems = find_double_acting([_call(1, 11.0, t=12.5)], terms)
    assert len(problems) == 1
    assert "took effect after another leader started" in problems[0]
    overlaps = log_overlaps(terms)
    assert len(overlaps) == 1
    assert "by 3.000s in the logs" in overlaps[0]


def test_leadership_terms_come_from_the_log_and_a_kill_ends_an_open_one() -> None:
    entries = [
        {"time": "2026-01-01T00:00:01.000+00:00", "msg": "cluster election: now leading"},
        {"time": "2026-01-01T00:00:02.000+00:00", "msg": "shard election: now leading"},
        {"time": "2026-01-01T00:00:03.500+00:00", "msg": "shard election: no longer leading"},
        {"time": "2026-01-01T00:00:04.000+00:00", "msg": "shard election: now leading"},
    ]
    base = 1767225600.0  # 2026-01-01T00:00:00Z
    killed = leadership_terms(entries, server="s1", pid=7, ended_at=base + 9)
    assert [(t.start - base, t.end - base, t.ended_by) for t in killed] == [(2, 3.5, "log"), (4, 9, "exit")]
    running = leadership_terms(entries, server="s1", pid=7, ended_at=None)
    assert running[-1].ended_by == "open"
    assert math.isinf(running[-1].end)


# ---- real servers ------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_audit_catches_two_real_servers_acting_at_once(tmp_path: Path) -> None:
    """The negative control: with election disabled on both (one server only, says the doc), both act."""
    root = tmp_path / "shard"
    disabled = {"leader_election": {"enabled": False}}
    with FailoverShard(root, servers=2, sim_options={"latency": "20ms"}, shard_extra=disabled) as shard:
        shard.start_all()
        eventually_sync(lambda: len(shard.leaders()) == 2, within=30, what="both servers to lead", every=0.1)
        for server, size in zip(shard.ids, (2, 3), strict=True):
            request = operator_pb2.UpsertGroupRequest(key="web", config=operator_pb2.GroupConfig(size=size))
            shard.stub(server).UpsertGroup(request, timeout=10)
        eventually_sync(
            lambda: len({c.pid for c in shard.calls()}) == 2,
            within=30,
            what="calls from both servers",
            every=0.1,
        )
        shard.close()
        double_acting, overlaps = shard.audit()
    assert not processes_mentioning(str(root))
    assert double_acting, "two servers created VMs at once and the audit did not notice"
    assert all("took effect after another leader started" in p for p in double_acting)
    assert len(overlaps) == 1  # and both logs say they led


@pytest.mark.slow
@pytest.mark.parametrize("storage", ["file", "s3"])
def test_leaders_killed_during_scaling_fail_over_in_time_without_double_acting(
    tmp_path: Path, storage: str
) -> None:
    rng = random.Random(7)
    root = tmp_path / "shard"
    with contextlib.ExitStack() as stack:
        moto = stack.enter_context(MotoServer()) if storage == "s3" else None
        shard = stack.enter_context(
            FailoverShard(
                root, storage=storage, moto=moto, election=FAST_ELECTION, sim_options={"latency": "200ms"}
            )
        )
        shard.start_all()
        shard.wait_leader(30)
        observed = []
        for size in SIZES_BEFORE_KILLS:
            time.sleep(rng.uniform(0, FREQUENT))  # a random point of the leader's renewal cycle
            leader = shard.upsert("web", size)
            time.sleep(0.1)  # its creates or deletes are in flight (200 ms each) when it dies
            kill = shard.kill(leader)
            shard.wait_leader(FAILOVER_BOUND + 10, exclude={leader})
            observed.append(time.time() - kill.at)
            shard.start(leader)  # back as a standby, so the next kill again leaves two
            shard.wait_healthy(leader)
        shard.upsert("web", FINAL_SIZE)
        eventually_sync(
            shard.converged("web", FINAL_SIZE), within=60, what=f"{FINAL_SIZE} instances", every=0.1
        )
        shard.close()
        kills = [shard.settle_kill(k) for k in shard.kills]
        double_acting, overlaps = shard.audit()
        calls, live, leaks = shard.calls(), shard.live_vms(), shard.leaks()
        pids = [i.pid for i in shard.incarnations]
    assert not processes_mentioning(str(root)), "a server process was left behind"

    from_logs = [round(k.to_lead_s or -1, 2) for k in kills]
    polled = [round(s, 2) for s in observed]
    report = f"failover {from_logs} (polled {polled}), bound {FAILOVER_BOUND:.2f}s; log overlaps: {overlaps}"
    print(f"{storage}: {report}; {len(calls)} mutating calls audited")  # shown with -s / -rP
    for kill in kills:
        assert kill.to_lead_s is not None, report
        assert kill.new_leader != kill.server, report
        assert kill.to_lead_s <= FAILOVER_BOUND, report
        # the new leader did the work the dead one left (creates or deletes), and only after leading
        assert kill.first_call_at is not None, report
    assert double_acting == [], "\n".join(double_acting) + "\n" + report
    assert len({c.pid for c in calls}) >= len(SIZES_BEFORE_KILLS)  # the audit saw several leaders act
    assert {c.pid for c in calls} <= set(pids)
    assert len(live) == FINAL_SIZE
    assert leaks == []
