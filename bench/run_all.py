"""Run every benchmark, keep the figures in bench/results.json and regenerate docs/performance.md.

Runs each ``bench/*.py`` script (not the ``_*.py`` helpers, not this file) in its own process, one
after another, with the interpreter running this file and the repository root as working directory,
exactly as ``python bench/NAME.py`` is documented. Their stdout and stderr are passed through as they
arrive, so stdout keeps its one-JSON-object-per-line form; every stdout line that is a JSON object with
a ``name`` is a figure. A benchmark that exits non-zero or runs past ``--timeout`` is recorded as failed
with the tail of its stderr, and the run goes on; the exit status is 1 when any benchmark failed.

``bench/results.json`` holds the machine (CPU model and count, memory, OS and kernel, Python, the
versions of the libraries the figures depend on), the date and git commit, one entry per benchmark
(status, wall time, when and at which commit it ran) and every figure as printed plus ``script`` and
``script_wall_s``. It is rewritten after each benchmark, so an interrupted run keeps what it measured.
``--only NAME...`` re-runs some benchmarks and replaces their entries, keeping the others'.
``docs/performance.md`` is generated from that file at the end of a run, or alone with ``--report-only``;
``docs/benchmarks.md`` is the hand-written explanation of what each benchmark measures.

Must not: change what a benchmark measures or how it is started, or leave a benchmark's processes
behind (each runs in its own process group, which is terminated on timeout, on interrupt, and when the
benchmark exits while processes it started are still running). Ctrl-C, SIGTERM or SIGHUP (a closed
terminal) stops the run with one line and exit status 130, 143 or 129; the results file keeps the
benchmarks that had finished.
"""

from __future__ import annotations

import argparse
import ast
import datetime as dt
import importlib.metadata
import json
import math
import os
import platform
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from nstance.core.cli import Stopped, raise_on_stop_signals, stop_signal

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
RESULTS = BENCH_DIR / "results.json"
REPORT = REPO / "docs" / "performance.md"
SCHEMA = 1
DEFAULT_TIMEOUT_S = 1800.0
STDERR_TAIL_LINES = 40
#: Libraries whose version moves the figures (gRPC, crypto, SQLite access, config parsing, operator).
LIBRARIES = (
    "grpcio",
    "protobuf",
    "cryptography",
    "PyJWT",
    "SQLAlchemy",
    "alembic",
    "pydantic",
    "pyjson5",
    "kopf",
    "kubernetes_asyncio",
    "aiohttp",
    "boto3",
)
DASH = "—"


# --- running ------------------------------------------------------------------------------------


def discover(bench_dir: Path = BENCH_DIR) -> list[Path]:
    """The benchmark scripts in ``bench_dir``, sorted by name: ``*.py`` except ``_*.py`` and this file."""
    own = Path(__file__).name
    return sorted(p for p in bench_dir.glob("*.py") if not p.name.startswith("_") and p.name != own)


def select(scripts: list[Path], only: Sequence[str] | None) -> list[Path]:
    """The scripts named in ``only`` (``pki``, ``pki.py`` or ``bench/pki.py``), in discovery order."""
    if not only:
        return scripts
    by_stem = {p.stem: p for p in scripts}
    wanted: set[str] = set()
    unknown: list[str] = []
    for name in only:
        stem = Path(name).name.removesuffix(".py")
        if stem in by_stem:
            wanted.add(stem)
        else:
            unknown.append(name)
    if unknown:
        raise SystemExit(
            f"unknown benchmark(s): {', '.join(unknown)}; available: {', '.join(sorted(by_stem))}"
        )
    return [p for p in scripts if p.stem in wanted]


def describe(script: Path) -> str:
    """The first paragraph of the script's module docstring on one line, without ``Benchmark:``."""
    try:
        doc = ast.get_docstring(ast.parse(script.read_text(encoding="utf-8")))
    except (OSError, SyntaxError, ValueError):
        doc = None
    if not doc:
        return ""
    first = " ".join(doc.strip().split("\n\n", 1)[0].split())
    first = first.removeprefix("Benchmark:").strip()
    return first[:1].upper() + first[1:]


def parse_figure(line: str) -> dict[str, Any] | None:
    """The figure on a stdout line: a JSON object with a ``name``; None for anything else."""
    text = line.strip()
    if not text.startswith("{"):
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if isinstance(value, dict) and isinstance(value.get("name"), str):
        return value
    return None


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def _load_1m() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def _signal_group(pgid: int, sig: int) -> bool:
    """Send ``sig`` (0: only check) to the process group ``pgid``; False when the group is gone."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    return True


def _stop_group(proc: subprocess.Popen[str], grace_s: float = 5.0) -> None:
    """Terminate every process in the benchmark's group: SIGTERM, then SIGKILL after ``grace_s``."""
    pgid = proc.pid  # the benchmark leads its own session and process group
    if not _signal_group(pgid, signal.SIGTERM):
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        proc.poll()  # reap the leader, or the group stays visible through its zombie
        if not _signal_group(pgid, 0):
            return
        time.sleep(0.05)
    _signal_group(pgid, signal.SIGKILL)


def _close_output(proc: subprocess.Popen[str], pumps: list[threading.Thread]) -> None:
    """Let the started pumps read the benchmark's output to its end, then close both pipes."""
    for pump in pumps:
        pump.join(10)
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


def run_benchmark(
    script: Path,
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
    cwd: Path = REPO,
    commit: dict[str, Any] | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run one benchmark script to the end: (its entry for results.json, the figures it printed)."""
    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    started_at, load = now_iso(), _load_1m()
    start = time.perf_counter()
    figures: list[dict[str, Any]] = []
    tail: deque[str] = deque(maxlen=STDERR_TAIL_LINES)
    lock = threading.Lock()

    def pump_stdout(stream: TextIO) -> None:
        for line in stream:
            with lock:
                out.write(line)
                out.flush()
            figure = parse_figure(line)
            if figure is not None:
                figures.append(figure)

    def pump_stderr(stream: TextIO) -> None:
        for line in stream:
            with lock:
                err.write(line)
                err.flush()
            tail.append(line.rstrip("\n"))

    timed_out = False
    pumps: list[threading.Thread] = []
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        encoding="utf-8",
        errors="replace",
        start_new_session=True,
    )
    # From the spawn on, a stop (Ctrl-C, SIGTERM, SIGHUP raise wherever this thread is) takes the
    # benchmark's group with it: one that came while the pumps were starting left the benchmark running.
    try:
        assert proc.stdout is not None
        assert proc.stderr is not None
        for target, stream in ((pump_stdout, proc.stdout), (pump_stderr, proc.stderr)):
            pump = threading.Thread(target=target, args=(stream,), daemon=True)
            pump.start()
            pumps.append(pump)  # started: joined before its stream is closed
        try:
            returncode = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            _stop_group(proc)
            returncode = proc.wait()
    except BaseException:
        _stop_group(proc)
        proc.wait()
        _close_output(proc, pumps)
        raise
    wall = time.perf_counter() - start
    if _signal_group(proc.pid, 0):
        err.write(f"[run_all] {script.name} left processes running; terminating them\n")
        _stop_group(proc)
    _close_output(proc, pumps)

    ok = returncode == 0 and not timed_out
    entry: dict[str, Any] = {
        "script": script.name,
        "command": f"python bench/{script.name}",
        "description": describe(script),
        "status": "ok" if ok else "failed",
        "returncode": returncode,
        "timed_out": timed_out,
        "wall_s": round(wall, 2),
        "started_at": started_at,
        "commit": commit,
        "load_avg_1m_at_start": load,
        "figures": len(figures),
    }
    if not ok:
        entry["stderr_tail"] = list(tail)
    records = []
    for figure in figures:
        record = dict(figure)
        record.setdefault("script", script.name)
        record.setdefault("script_wall_s", round(wall, 2))
        records.append(record)
    return entry, records


# --- the machine and the commit -----------------------------------------------------------------


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def cpu_model() -> str:
    cpuinfo = _read("/proc/cpuinfo") or ""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("model name", "Model", "Hardware", "cpu model") and value.strip():
            return value.strip()
    return platform.processor() or platform.machine() or "unknown"


def memory_bytes() -> int | None:
    for line in (_read("/proc/meminfo") or "").splitlines():
        if line.startswith("MemTotal:"):
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                return int(parts[1]) * 1024
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def os_name() -> str:
    for line in (_read("/etc/os-release") or "").splitlines():
        if line.startswith("PRETTY_NAME="):
            return line.partition("=")[2].strip().strip('"')
    return platform.system()


def cpu_quota() -> float | None:
    """CPUs allowed by the cgroup (``cpu.max``), when a quota is set."""
    text = _read("/sys/fs/cgroup/cpu.max")
    if not text:
        return None
    quota, _, period = text.strip().partition(" ")
    if quota == "max" or not quota.isdigit() or not period.isdigit() or int(period) == 0:
        return None
    return round(int(quota) / int(period), 2)


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    libraries: dict[str, str | None] = {}
    for name in LIBRARIES:
        try:
            libraries[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            libraries[name] = None
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": usable,
        "cpu_quota": cpu_quota(),
        "memory_bytes": memory_bytes(),
        "os": os_name(),
        "system": platform.system(),
        "kernel": platform.release(),
        "arch": platform.machine(),
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "libraries": libraries,
    }


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", *args], cwd=REPO, capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def git_commit() -> dict[str, Any] | None:
    """HEAD's sha and whether tracked files differ from it (None outside a git checkout)."""
    sha = _git("rev-parse", "HEAD")
    if not sha:
        return None
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {"sha": sha, "dirty": bool(status) if status is not None else None}


# --- results.json -------------------------------------------------------------------------------


def load_results(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    if not isinstance(data, dict):
        raise SystemExit(f"{path}: not a results file (expected a JSON object)")
    return data


def merge(
    previous: dict[str, Any] | None,
    run: dict[str, Any],
    entries: list[dict[str, Any]],
    figures: list[dict[str, Any]],
    order: list[str],
) -> dict[str, Any]:
    """results.json after this run: ``entries``/``figures`` replace the same scripts' from ``previous``.

    ``run`` carries the run's machine, date, commit and timing. Benchmarks this run did not touch keep
    their previous entries and figures (with their own ``started_at``, ``commit`` and ``run``, the
    start of the run they came from). ``runs`` lists every run some benchmark still comes from, oldest
    first. ``order`` is the script order of the report.
    """
    previous = previous or {}
    ran = {e["script"] for e in entries}
    kept_entries = [dict(e) for e in previous.get("benchmarks", []) if e.get("script") not in ran]
    kept_figures = [f for f in previous.get("results", []) if f.get("script") not in ran]
    previous_runs = list(previous.get("runs") or [])
    if not previous_runs and previous.get("started_at"):  # a file written before runs were listed
        previous_runs = [run_summary(previous)]
        for entry in kept_entries:
            entry.setdefault("run", previous["started_at"])
    rank = {name: i for i, name in enumerate(order)}

    def position(item: dict[str, Any]) -> tuple[int, str]:
        script = str(item.get("script", ""))
        return rank.get(script, len(rank)), script

    all_entries = sorted(kept_entries + entries, key=position)
    # Figures keep their printed order within a script (sorted() is stable).
    all_figures = sorted(kept_figures + figures, key=position)
    used = {e.get("run") for e in kept_entries}
    this = run_summary(run)
    runs = [
        r for r in previous_runs if r.get("started_at") in used and r.get("started_at") != this["started_at"]
    ]
    return {
        "schema": SCHEMA,
        "generated_by": "bench/run_all.py",
        **run,
        "runs": [*runs, this],
        "benchmarks": all_entries,
        "results": all_figures,
    }


def run_summary(data: dict[str, Any]) -> dict[str, Any]:
    """When a run started and ended, what it ran, at which commit."""
    return {k: data.get(k) for k in ("started_at", "finished_at", "wall_s", "ran", "only", "commit")}


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` to ``path`` atomically (``path`` + ``.tmp``, then rename)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


# --- docs/performance.md ------------------------------------------------------------------------


def fmt_number(value: object) -> str:
    """A figure for a table cell: thousands separators, about four significant digits, no exponent."""
    if value is None:
        return DASH
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        magnitude = abs(value)
        if magnitude == 0:
            return "0"
        if magnitude >= 1000:
            return f"{value:,.0f}"
        decimals = max(0, 3 - math.floor(math.log10(magnitude)))
        return f"{value:.{decimals}f}"
    return str(value)


def fmt_duration(seconds: object) -> str:
    if not isinstance(seconds, int | float):
        return DASH
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest} s"


def fmt_date(iso: object) -> str:
    if not isinstance(iso, str):
        return DASH
    try:
        when = dt.datetime.fromisoformat(iso)
    except ValueError:
        return iso
    return when.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")


def fmt_commit(commit: object) -> str:
    if not isinstance(commit, dict) or not commit.get("sha"):
        return "unknown"
    text = f"`{str(commit['sha'])[:12]}`"
    if commit.get("dirty"):
        text += " with uncommitted changes"
    return text


def cell(text: object) -> str:
    """Make ``text`` safe inside a Markdown table cell."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def met_of(figure: dict[str, Any]) -> bool | None:
    """Whether the figure met its target: ``met``, or the older ``meets_target``."""
    met = figure.get("met", figure.get("meets_target"))
    return met if isinstance(met, bool) else None


def target_cell(figure: dict[str, Any]) -> str:
    text = figure.get("target_text")
    if isinstance(text, str) and text:
        return text
    target = figure.get("target")
    return fmt_number(target) if target is not None else DASH


def met_cell(figure: dict[str, Any]) -> str:
    met = met_of(figure)
    if met is None:
        return DASH
    return "yes" if met else "**no**"


def baseline_cell(figure: dict[str, Any]) -> str:
    baseline = figure.get("baseline")
    if baseline is not None:
        name = figure.get("baseline_name")
        return f"{fmt_number(baseline)} ({name})" if name else fmt_number(baseline)
    budget = figure.get("budget")
    if budget is not None:
        return f"budget {fmt_number(budget)}"
    return DASH


def machine_rows(data: dict[str, Any]) -> list[tuple[str, str]]:
    m = data.get("machine") or {}
    cpus = f"{m.get('cpu_count', '?')} CPUs"
    if m.get("cpus_usable") not in (None, m.get("cpu_count")):
        cpus += f", {m['cpus_usable']} usable"
    if m.get("cpu_quota") is not None:
        cpus += f", cgroup quota {m['cpu_quota']}"
    memory = m.get("memory_bytes")
    libraries = m.get("libraries") or {}
    libs = ", ".join(f"{name} {version}" for name, version in libraries.items() if version) or DASH
    system = " ".join(str(x) for x in (m.get("system"), m.get("kernel"), m.get("arch")) if x)
    return [
        ("Date", fmt_date(data.get("finished_at") or data.get("date"))),
        ("Commit", fmt_commit(data.get("commit"))),
        ("CPU", f"{m.get('cpu_model', 'unknown')}, {cpus}"),
        ("Memory", f"{memory / 2**30:.1f} GiB" if isinstance(memory, int) else DASH),
        ("OS", f"{m.get('os', DASH)} ({system})" if system else str(m.get("os", DASH))),
        ("Python", f"{m.get('python_implementation', '')} {m.get('python', DASH)}".strip()),
        ("Libraries", libs),
    ]


def render_report(data: dict[str, Any]) -> str:
    """docs/performance.md for the results in ``data`` (the content of bench/results.json)."""
    entries: list[dict[str, Any]] = list(data.get("benchmarks", []))
    figures: list[dict[str, Any]] = list(data.get("results", []))
    by_script: dict[str, list[dict[str, Any]]] = {}
    for figure in figures:
        by_script.setdefault(str(figure.get("script", "")), []).append(figure)
    known = {e.get("script") for e in entries}
    for script in by_script:  # figures whose benchmark entry is missing still get a section
        if script not in known:
            entries.append({"script": script, "status": "unknown"})

    lines = [
        "<!-- Generated by bench/run_all.py from bench/results.json: do not edit by hand. -->",
        "",
        "# Performance figures",
        "",
        "This file is generated: `make bench` runs every benchmark in `bench/` and rewrites",
        "`bench/results.json` and this page. To regenerate the page from the existing results run",
        "`.venv/bin/python bench/run_all.py --report-only`; to re-run some benchmarks and keep the",
        "others' figures, `.venv/bin/python bench/run_all.py --only NAME...`. What each benchmark",
        "measures, its baseline, and how the figures moved as the code changed is explained in",
        "[benchmarks.md](benchmarks.md).",
        "",
        "The machines are shared and noisy: compare ratios (the figure over a baseline measured in the",
        "same run) between runs rather than absolute values. Targets come from the issues and from",
        f"`../shared/reference/perf-reliability-anchors.md`; a figure without one shows {DASH}.",
        "",
        "## Run",
        "",
        "| | |",
        "|---|---|",
    ]
    lines += [f"| {name} | {cell(value)} |" for name, value in machine_rows(data)]
    runs = data.get("runs") or [run_summary(data)]
    described = []
    for r in runs:
        ran = r.get("ran") or []
        what = f"{len(ran)} benchmark(s)" if not r.get("only") else ", ".join(f"`{s}`" for s in ran)
        described.append(
            f"{fmt_duration(r.get('wall_s'))} for {what}, started {fmt_date(r.get('started_at'))}"
        )
    lines.append(f"| Wall time | {'; '.join(described)} |")
    lines += ["", "## Summary", ""]
    with_target = [f for f in figures if met_of(f) is not None]
    failed = [e for e in entries if e.get("status") == "failed"]
    targets = (
        f"{sum(1 for f in with_target if met_of(f))} of the {len(with_target)} with a target met"
        if with_target
        else "none has a target"
    )
    lines.append(
        f"{len(figures)} figures from {len(entries)} benchmarks ({targets}); "
        f"{len(failed)} benchmark(s) failed."
    )
    lines += [
        "",
        "| Benchmark | Status | Wall time | Figures | Targets met |",
        "|---|---|---|---|---|",
    ]
    for entry in entries:
        script = str(entry.get("script", ""))
        mine = by_script.get(script, [])
        targeted = [f for f in mine if met_of(f) is not None]
        met = f"{sum(1 for f in targeted if met_of(f))} of {len(targeted)}" if targeted else DASH
        status = str(entry.get("status", "unknown"))
        if status == "failed":
            status = "**failed**"
        lines.append(
            f"| `{cell(script)}` | {status} | {fmt_duration(entry.get('wall_s'))} | {len(mine)} | {met} |"
        )

    run_started = data.get("started_at")
    for entry in entries:
        script = str(entry.get("script", ""))
        lines += ["", f"## `{script}`", ""]
        if entry.get("description"):
            lines += [str(entry["description"]), ""]
        state = entry.get("status")
        how = f"`.venv/bin/python bench/{script}`"
        if state == "ok":
            how += f": ran in {fmt_duration(entry.get('wall_s'))}"
        elif state == "failed":
            why = "timed out" if entry.get("timed_out") else f"exit status {entry.get('returncode')}"
            how += f": **failed** ({why}) after {fmt_duration(entry.get('wall_s'))}"
        started = entry.get("started_at")
        if isinstance(started, str) and isinstance(run_started, str) and started < run_started:
            how += f"; measured in an earlier run, {fmt_date(started)} at {fmt_commit(entry.get('commit'))}"
        lines += [how + ".", ""]
        mine = by_script.get(script, [])
        if mine:
            lines += [
                "| Figure | Value | Unit | Baseline (or budget) | Ratio | Target | Met |",
                "|---|---|---|---|---|---|---|",
            ]
            for f in mine:
                row = (
                    f"`{f.get('name')}`",
                    fmt_number(f.get("value")),
                    f.get("unit") or DASH,
                    baseline_cell(f),
                    fmt_number(f.get("ratio")),
                    target_cell(f),
                    met_cell(f),
                )
                lines.append("| " + " | ".join(cell(c) for c in row) + " |")
        else:
            lines.append("No figures were printed.")
        tail = entry.get("stderr_tail")
        if state == "failed" and tail:
            lines += ["", "Last lines of its stderr:", "", "```text", *map(str, tail), "```"]
    return "\n".join(lines) + "\n"


def write_report(data: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(render_report(data), encoding="utf-8")
    os.replace(tmp, path)


# --- command line -------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--only", nargs="+", metavar="NAME", help="run only these (e.g. pki scale_out)")
    mode.add_argument(
        "--report-only", action="store_true", help="regenerate the report from the results file, run nothing"
    )
    mode.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    parser.add_argument("--results", type=Path, default=RESULTS, help="default: bench/results.json")
    parser.add_argument("--report", type=Path, default=REPORT, help="default: docs/performance.md")
    parser.add_argument(
        "--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds per benchmark (default 1800)"
    )
    parser.add_argument("--bench-dir", type=Path, default=BENCH_DIR, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    scripts = discover(args.bench_dir)
    if args.list:
        for script in scripts:
            print(f"{script.stem:20} {describe(script)}")
        return 0
    if args.report_only:
        data = load_results(args.results)
        if data is None:
            parser.error(f"{args.results} does not exist; run the benchmarks first (make bench)")
        write_report(data, args.report)
        print(f"[run_all] wrote {args.report}", file=sys.stderr)
        return 0

    chosen = select(scripts, args.only)
    order = [p.name for p in scripts]
    commit = git_commit()
    started_at = now_iso()
    run: dict[str, Any] = {
        "date": started_at[:10],
        "started_at": started_at,
        "finished_at": None,
        "commit": commit,
        "machine": machine(),
        "ran": [p.name for p in chosen],
        "only": list(args.only) if args.only else None,
        "wall_s": None,
    }
    previous = load_results(args.results) if args.only else None
    entries: list[dict[str, Any]] = []
    figures: list[dict[str, Any]] = []
    start = time.perf_counter()
    for i, script in enumerate(chosen, 1):
        print(f"[run_all] ({i}/{len(chosen)}) {script.name}", file=sys.stderr, flush=True)
        entry, printed = run_benchmark(script, timeout=args.timeout, commit=commit)
        entry["run"] = started_at
        entries.append(entry)
        figures.extend(printed)
        print(
            f"[run_all] {script.name}: {entry['status']}, {len(printed)} figure(s), "
            f"{fmt_duration(entry['wall_s'])}",
            file=sys.stderr,
            flush=True,
        )
        run["wall_s"] = round(time.perf_counter() - start, 2)
        run["finished_at"] = now_iso()
        write_json(args.results, merge(previous, run, entries, figures, order))
    data = merge(previous, run, entries, figures, order)
    write_json(args.results, data)
    write_report(data, args.report)
    failed = [e["script"] for e in entries if e["status"] != "ok"]
    print(
        f"[run_all] {len(chosen)} benchmark(s) in {fmt_duration(run['wall_s'])}; "
        f"wrote {args.results} and {args.report}" + (f"; FAILED: {', '.join(failed)}" if failed else ""),
        file=sys.stderr,
    )
    return 1 if failed else 0


def cli(argv: Sequence[str] | None = None) -> int:
    """``main``, stopped by Ctrl-C, SIGTERM or SIGHUP with one line (the running benchmark's group is
    terminated by ``run_benchmark`` on the way out) and exit status 130, 143 or 129."""
    raise_on_stop_signals()
    try:
        return main(argv)
    except (KeyboardInterrupt, Stopped) as exc:
        signum = stop_signal(exc)
        print(
            f"[run_all] stopped by {signum.name}: the results file keeps the benchmarks that finished; "
            "--report-only writes the report from it",
            file=sys.stderr,
        )
        return 128 + signum


if __name__ == "__main__":
    raise SystemExit(cli())
