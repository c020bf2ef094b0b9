"""Command line: ``python -m nstance.simulation --seeds N`` (``make sim SEEDS=N``).

Runs seeds ``start .. start+N-1`` (or one ``--seed``), prints one line per failing seed with the
command that reproduces it, progress on stderr (one line redrawn in place on a terminal, otherwise a
line at every tenth of the seeds), and a JSON summary last; exits 1 when any seed failed. Python's string
hashing must be fixed for a seed to replay exactly in another process, so without ``PYTHONHASHSEED=0``
the command re-executes itself with it.

Ctrl-C (SIGINT to the whole process group, as a terminal sends it) or SIGTERM to this process stops
the run: the workers are terminated (they ignore SIGINT and leave the stopping to this process), or
with one job the seed running finishes first; one line says how far the run got and which seeds had
failed, the scratch directory is removed, and the exit status is 130 or 143.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

from nstance.core.cli import Stopped, raise_on_stop_signals, stop_exception, stop_signal
from nstance.simulation.run import SeedResult, prepare_scratch, reproduce_command, run_seed


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if os.environ.get("PYTHONHASHSEED") != "0":
        env = dict(os.environ, PYTHONHASHSEED="0")
        os.execve(sys.executable, [sys.executable, "-m", "nstance.simulation", *args], env)
    parser = argparse.ArgumentParser(prog="python -m nstance.simulation", description=__doc__)
    parser.add_argument("--seeds", type=int, default=100, help="how many seeds to run (default 100)")
    parser.add_argument("--start", type=int, default=0, help="first seed (default 0)")
    parser.add_argument("--seed", type=int, default=None, help="run this one seed only")
    parser.add_argument("--trace", action="store_true", help="print the run's trace (faults, leadership)")
    parser.add_argument("--verbose", action="store_true", help="keep INFO server logs for failing seeds")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    opts = parser.parse_args(args)
    seeds = [opts.seed] if opts.seed is not None else list(range(opts.start, opts.start + opts.seeds))
    started = time.perf_counter()
    totals: Counter[str] = Counter()
    failed: list[int] = []
    slowest = 0.0
    slowest_seed = None
    progress = _Progress(len(seeds), terminal=sys.stderr.isatty())
    raise_on_stop_signals()
    try:
        for result in _results(seeds, opts.jobs, verbose=opts.verbose or opts.trace):
            seed = result.seed
            totals.update(result.stats)
            if result.wall > slowest:
                slowest, slowest_seed = result.wall, seed
            if opts.trace:
                print("\n".join(result.trace))
            if not result.ok:
                failed.append(seed)
                print(f"seed {seed} FAILED ({result.wall:.2f}s, digest {result.digest}):", flush=True)
                for problem in result.problems:
                    print(f"  - {problem}")
                if not opts.trace:
                    print("  trace (last 30 lines):")
                    for line in result.trace[-30:]:
                        print(f"    {line}")
                print("  server log (last 40 lines):")
                for line in result.log_tail[-40:]:
                    print(f"    {line}")
                print(f"  reproduce: {reproduce_command(seed)}", flush=True)
            elif opts.seed is not None:
                print(f"seed {seed} ok ({result.wall:.2f}s, digest {result.digest})")
            progress.step(len(failed), time.perf_counter() - started)
    except (KeyboardInterrupt, Stopped) as exc:
        progress.finish()
        signum = stop_signal(exc)
        done = progress.done
        print(
            f"sim: stopped by {signum.name} after {done} of {len(seeds)} seeds, "
            f"{len(failed)} failed{': ' + ' '.join(map(str, failed)) if failed else ''}",
            file=sys.stderr,
            flush=True,
        )
        return 128 + signum
    progress.finish()
    wall = time.perf_counter() - started
    summary = {
        "seeds": len(seeds),
        "failed": failed,
        "wall_s": round(wall, 2),
        "mean_s_per_seed": round(wall / max(1, len(seeds)), 3),
        "slowest_s": round(slowest, 3),
        "slowest_seed": slowest_seed,
        "injected": dict(sorted(totals.items())),
    }
    print(json.dumps(summary))
    return 1 if failed else 0


def progress_line(done: int, total: int, failed: int, elapsed: float) -> str:
    """``sim: 37/100 seeds, 0 failed, 12s elapsed, about 20s left``."""
    left = elapsed / done * (total - done) if done else 0.0
    return f"sim: {done}/{total} seeds, {failed} failed, {elapsed:.0f}s elapsed, about {left:.0f}s left"


class _Progress:
    """Progress on stderr: redrawn in place on a terminal, else a line per tenth of the run."""

    def __init__(self, total: int, *, terminal: bool) -> None:
        self._total = total
        self._terminal = terminal
        self._done = 0
        self._next_mark = 1

    @property
    def done(self) -> int:
        """Seeds finished so far."""
        return self._done

    def step(self, failed: int, elapsed: float) -> None:
        self._done += 1
        if self._total <= 1:
            return
        line = progress_line(self._done, self._total, failed, elapsed)
        if self._terminal:
            sys.stderr.write(f"\r{line}\033[K")
            sys.stderr.flush()
        elif self._done * 10 >= self._next_mark * self._total:
            self._next_mark = self._done * 10 // self._total + 1
            print(line, file=sys.stderr, flush=True)

    def finish(self) -> None:
        if self._terminal and self._total > 1:
            sys.stderr.write("\n")
            sys.stderr.flush()


class _BetweenSeeds:
    """Ctrl-C, SIGTERM or SIGHUP while seeds run in this process takes effect between two seeds: the
    simulation's event loop must not be interrupted halfway (its tasks and threads would be left
    running and printing). A second signal before then interrupts at once."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._saved: dict[int, Any] = {}  # what signal.signal returned: a handler, SIG_DFL or SIG_IGN

    def __enter__(self) -> _BetweenSeeds:
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(signum) is not signal.SIG_IGN:  # ignored when started: stays so
                self._saved[signum] = signal.signal(signum, self._remember)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._saved.items():
            signal.signal(signum, handler)

    def _remember(self, signum: int, _frame: object) -> None:
        if self.signum is not None:
            raise stop_exception(signum)
        self.signum = signum

    def check(self) -> None:
        """Raise the remembered signal's exception, if one came."""
        if self.signum is not None:
            raise stop_exception(self.signum)


def _worker_init() -> None:
    """A worker leaves stopping to the parent: Ctrl-C and a closed terminal's SIGHUP reach the whole
    process group, and the parent terminates the pool (SIGTERM, whose default action the worker gets
    back from the parent's handler)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _one(seed_and_verbose: tuple[int, bool]) -> SeedResult:
    seed, verbose = seed_and_verbose
    return run_seed(seed, verbose=verbose)


def _results(seeds: list[int], jobs: int, *, verbose: bool) -> Iterator[SeedResult]:
    """Each seed's result, in seed order; with ``jobs`` > 1 from forked workers (same hash seed)."""
    if jobs <= 1 or len(seeds) <= 1:
        with _BetweenSeeds() as stop:
            for seed in seeds:
                stop.check()
                yield run_seed(seed, verbose=verbose)
        return
    prepare_scratch()  # one directory for all workers, removed by this process at exit
    with multiprocessing.get_context("fork").Pool(jobs, initializer=_worker_init) as pool:
        yield from pool.imap(_one, [(seed, verbose) for seed in seeds])


if __name__ == "__main__":
    sys.exit(main())
