"""Benchmark: shard-leader failover time with production election timings, leaders SIGKILLed while scaling.

Setup: three ``nstance-server`` processes of one shard on one bucket - ``file://`` under ``/dev/shm``
(default) or, with ``--s3``, an S3 bucket on a ``moto_server`` started here - sharing one simulated
cloud (the ``sim`` provider's state file, 500 ms per call) and its call log
(``nstance.testing.failover.FailoverShard``). The election runs with the production defaults of
``LeaderElectionConfig``: frequent 5 s, infrequent 30 s, leader_timeout 15 s (grace gap 1 s).

Each of ``--kills`` rounds (default 20): wait a random part of a frequent interval (so the kill falls
at a random point of the leader's renewal cycle), UpsertGroup a new size of group ``web`` on the leader
(between 2 and 8, always a change), SIGKILL the leader 50 ms later (its creates or deletes are in
flight), wait for another server to lead, then - after another random part of a frequent interval, so
that the standbys' read cycles are not locked to the leader's renewals - restart the killed one as a
standby and wait until it is healthy. (Without that second wait the restarted server always came up
at the same point of the new leader's cycle and the other standby won every race: the samples were
not independent.) Measured per kill, on this host's wall clock:

* ``to lead``: SIGKILL -> the new leader's ``shard election: now leading`` log line (the moment its
  fenced ``is_leader()`` turns true, after the grace gap);
* ``to first call``: SIGKILL -> the new leader's first mutating provider call (from the sim's call
  log; it has recovered its cache from the bucket and started reconciling).

At the end the group is scaled to 3 and must converge; then the double-leader audit
(``find_double_acting``) runs over every mutating call of the whole run, and the leak check over the
sim's VMs and the bucket's records.

Baseline: the election's analytic failover distribution. A dead leader's last write happened V before
the kill, V ~ U[0, F); follower i first saw it U_i after it was written, U_i ~ U[0, F/2) (followers
read twice per frequent interval); the first follower takes over ``takeover_after`` =
max(T - F, 0.6 T) after it first saw the write and acts a grace gap later:
``D = takeover_after + g + min(U_1, U_2) - V``, between 6 s and 13.5 s with the defaults (T = 15 s,
F = 5 s, g = 1 s). Targets (perf-reliability-anchors.md §6 goal 4): p99 <= 15 s, max <= 30 s.
Percentiles are nearest-rank, so with fewer than 100 kills the p99 is the largest sample (see
``samples``).

Prints one JSON object per line: ``failover_p50_s``, ``failover_p99_s``, ``failover_max_s``,
``failover_to_first_call_p50_s``, ``failover_to_first_call_max_s``, ``double_acting_leaders`` and
``failover_leaked_vms``, each with ``name, value, unit, baseline, baseline_name, ratio`` (value /
target where there is a target, else value / baseline), ``baseline_ratio``, ``target, target_text,
met`` and the raw durations. Takes about 20 s per kill (about 7 minutes for 20).

Run: ``.venv/bin/python bench/failover.py`` (``--kills N``, ``--s3``, ``--seed S``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import random
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from _shard import scratch_dir, where_tmp

from nstance.config.cluster import LeaderElectionConfig
from nstance.testing.failover import FailoverShard, Kill
from nstance.testing.motoserver import MotoServer
from nstance.testing.procs import processes_mentioning

KILLS = 20
SEED = 7
LATENCY_S = 0.5
STANDBYS = 2
SIZES = range(2, 9)
FINAL_SIZE = 3
KILL_AFTER_UPSERT_S = 0.05
TARGET_P99_S = 15.0
TARGET_MAX_S = 30.0
GRID = 20_000


def election_defaults() -> tuple[float, float, float, float]:
    """(frequent, infrequent, leader_timeout, grace) in seconds, as a server runs without settings."""
    config = LeaderElectionConfig()
    frequent = config.frequent_interval.total_seconds()
    grace = min(1.0, frequent / 2)  # nstance.server.leadership.election.Elector's default grace gap
    return frequent, config.infrequent_interval.total_seconds(), config.leader_timeout.total_seconds(), grace


#: Followers read the lockfile twice per frequent interval (nstance.server.leadership.election).
READ_FRACTION = 0.5


def takeover_after(timeout: float, frequent: float) -> float:
    """How long a follower waits for an unchanged lockfile (nstance.server.leadership.election.Elector)."""
    return max(timeout - frequent, 0.6 * timeout)


def model_cdf(x: float, standbys: int) -> float:
    """P(min(U_1..U_k) - V <= x) with U_i ~ U[0, READ_FRACTION), V ~ U[0, 1).

    That is the failover beyond ``takeover_after + grace``, in frequent intervals.
    """
    total = 0.0
    for step in range(GRID):  # midpoint rule over m, the minimum (density k (1 - m)^(k - 1))
        m = (step + 0.5) / GRID
        density = standbys * (1.0 - m) ** (standbys - 1)
        total += density * min(max(1.0 - (READ_FRACTION * m - x), 0.0), 1.0)  # P(V >= r m - x)
    return total / GRID


def model_quantile(q: float, standbys: int) -> float:
    lo, hi = -1.0, 1.0
    for _ in range(40):
        mid = (lo + hi) / 2
        if model_cdf(mid, standbys) < q:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def nearest_rank(values: Sequence[float], pct: float) -> float:
    ordered = sorted(values)
    return ordered[max(math.ceil(pct / 100 * len(ordered)) - 1, 0)]


def figure(
    name: str,
    value: float,
    *,
    unit: str = "s",
    baseline: float | None,
    baseline_name: str,
    target: float | None = None,
    target_text: str | None = None,
    met: Callable[[float], bool] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    denominator = target if target else baseline
    return {
        "name": name,
        "value": round(value, 3),
        "unit": unit,
        "baseline": None if baseline is None else round(baseline, 3),
        "baseline_name": baseline_name,
        "ratio": round(value / denominator, 3) if denominator else None,
        "baseline_ratio": round(value / baseline, 3) if baseline else None,
        "target": target,
        "target_text": target_text,
        "met": None if met is None else met(value),
        **extra,
    }


def progress(text: str) -> None:
    print(f"[failover] {text}", file=sys.stderr, flush=True)


def run(kills: int, s3: bool, seed: int) -> list[dict[str, Any]]:
    frequent, infrequent, timeout, grace = election_defaults()
    election = {
        "frequent_interval": f"{frequent:g}s",
        "infrequent_interval": f"{infrequent:g}s",
        "leader_timeout": f"{timeout:g}s",
    }
    rng = random.Random(seed)
    storage = "s3" if s3 else "file"
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(scratch_dir("nstance-bench-failover-"))
        moto = stack.enter_context(MotoServer()) if s3 else None
        shard = stack.enter_context(
            FailoverShard(
                tmp / "shard",
                storage=storage,
                moto=moto,
                election=election,
                sim_options={"latency": f"{LATENCY_S * 1000:g}ms"},
                shard_extra={"garbage_collection": {"interval": "30s", "registration_timeout": "1h"}},
            )
        )
        shard.start_all(timeout=120)
        leader = shard.wait_leader(timeout + 2 * frequent + 30)
        progress(f"{storage}: 3 servers up, {leader} leads after {time.monotonic() - started:.1f}s")
        size = 0
        for round_no in range(kills):
            time.sleep(rng.uniform(0, frequent))
            size = rng.choice([s for s in SIZES if s != size])
            leader = shard.upsert("web", size)
            time.sleep(KILL_AFTER_UPSERT_S)
            kill = shard.kill(leader)
            new_leader = shard.wait_leader(timeout + frequent + grace + 60, exclude={leader})
            progress(
                f"kill {round_no + 1}/{kills}: {leader} -> {new_leader} after {time.time() - kill.at:.2f}s"
            )
            time.sleep(rng.uniform(0, frequent))  # a random read phase for the restarted standby
            shard.start(leader)
            shard.wait_healthy(leader, timeout=120)
        shard.upsert("web", FINAL_SIZE)
        deadline = time.monotonic() + 120
        converged = shard.converged("web", FINAL_SIZE)
        while not converged():
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"the group did not converge to {FINAL_SIZE}: {len(shard.live_vms())} live VMs"
                )
            time.sleep(0.5)
        root = str(shard.root)
        shard.close()
        settled = [shard.settle_kill(k) for k in shard.kills]
        double_acting, overlaps = shard.audit()
        calls, leaks, live = shard.calls(), shard.leaks(), len(shard.live_vms())
    left = processes_mentioning(root)
    if left:
        raise RuntimeError(f"server processes left behind: {left}")
    return report(
        settled,
        double_acting=double_acting,
        overlaps=overlaps,
        calls=len(calls),
        leaks=leaks,
        live=live,
        storage=storage,
        election=election,
        grace=grace,
        wall_s=time.monotonic() - started,
    )


def report(
    kills: list[Kill],
    *,
    double_acting: list[str],
    overlaps: list[str],
    calls: int,
    leaks: list[str],
    live: int,
    storage: str,
    election: dict[str, str],
    grace: float,
    wall_s: float,
) -> list[dict[str, Any]]:
    frequent, _infrequent, timeout, _grace = election_defaults()
    to_lead = [k.to_lead_s for k in kills if k.to_lead_s is not None]
    to_call = [k.to_first_call_s for k in kills if k.to_first_call_s is not None]
    if len(to_lead) != len(kills):
        raise RuntimeError(
            f"only {len(to_lead)} of {len(kills)} kills were followed by a new leader in the logs"
        )
    base = takeover_after(timeout, frequent) + grace
    model = {
        "p50": base + frequent * model_quantile(0.50, STANDBYS),
        "p99": base + frequent * model_quantile(0.99, STANDBYS),
        "min": base - frequent,
        "max": base + READ_FRACTION * frequent,
    }
    common = {
        "samples": len(to_lead),
        "percentiles": "nearest-rank; with fewer than 100 samples p99 is the largest sample",
        "durations_s": [round(d, 3) for d in to_lead],
        "storage": storage,
        "election": election,
        "grace_s": grace,
        "standbys": STANDBYS,
        "model_s": {k: round(v, 3) for k, v in model.items()},
        "sim_latency_s": LATENCY_S,
        "tmp": where_tmp(),
        "wall_s": round(wall_s, 1),
    }
    model_text = (
        f"analytic takeover + g + min(U1,U2) - V, U ~ U[0,F/2), V ~ U[0,F) (takeover="
        f"{takeover_after(timeout, frequent):g}s, F={frequent:g}s, g={grace:g}s)"
    )
    lines = [
        figure(
            "failover_p50_s",
            nearest_rank(to_lead, 50),
            baseline=model["p50"],
            baseline_name=f"{model_text}: median",
            **common,
        ),
        figure(
            "failover_p99_s",
            nearest_rank(to_lead, 99),
            baseline=model["p99"],
            baseline_name=f"{model_text}: p99",
            target=TARGET_P99_S,
            target_text=f"p99 ≤ {TARGET_P99_S:g} s (anchors §6 goal 4)",
            met=lambda v: v <= TARGET_P99_S,
            **common,
        ),
        figure(
            "failover_max_s",
            max(to_lead),
            baseline=model["max"],
            baseline_name=f"{model_text}: upper bound takeover + g + F/2",
            target=TARGET_MAX_S,
            target_text=f"max ≤ {TARGET_MAX_S:g} s (anchors §6 goal 4)",
            met=lambda v: v <= TARGET_MAX_S,
            **common,
        ),
    ]
    if to_call:
        call_common = {**common, "samples": len(to_call), "durations_s": [round(d, 3) for d in to_call]}
        call_common["note"] = (
            "SIGKILL -> the new leader's first mutating provider call (recovery, then reconcile)"
        )
        lines.append(
            figure(
                "failover_to_first_call_p50_s",
                nearest_rank(to_call, 50),
                baseline=model["p50"],
                baseline_name=f"{model_text}: median (to lead)",
                **call_common,
            )
        )
        lines.append(
            figure(
                "failover_to_first_call_max_s",
                max(to_call),
                baseline=model["max"],
                baseline_name=f"{model_text}: upper bound (to lead)",
                **call_common,
            )
        )
    lines.append(
        figure(
            "double_acting_leaders",
            len(double_acting),
            unit="calls",
            baseline=None,
            baseline_name="none",
            target=0,
            target_text="0 mutating calls outside the one acting leader's term",
            met=lambda v: v == 0,
            kills=len(kills),
            mutating_calls=calls,
            violations=double_acting[:10],
            log_overlaps=len(overlaps),
            storage=storage,
        )
    )
    lines.append(
        figure(
            "failover_leaked_vms",
            len(leaks),
            unit="VMs",
            baseline=None,
            baseline_name="none",
            target=0,
            target_text=f"0 leaked or duplicated VMs; the group converged to {FINAL_SIZE}",
            met=lambda v: v == 0 and live == FINAL_SIZE,
            live_vms=live,
            desired=FINAL_SIZE,
            leaks=leaks[:10],
            storage=storage,
        )
    )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--kills", type=int, default=KILLS, help=f"leader SIGKILLs (default {KILLS})")
    parser.add_argument(
        "--s3", action="store_true", help="object storage on moto_server S3 instead of file://"
    )
    parser.add_argument("--seed", type=int, default=SEED, help="seeds the kill timing and the sizes")
    args = parser.parse_args()
    if args.kills < 1:
        parser.error("--kills must be at least 1")
    for line in run(args.kills, args.s3, args.seed):
        print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
