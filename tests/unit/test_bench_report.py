"""bench/run_all.py: docs/performance.md from a results file, merging re-runs, and the runner itself.

No real benchmark runs here: the report tests use a small synthetic results.json, and the runner test
uses throw-away scripts in a temporary bench directory.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


def _load_run_all() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_run_all", REPO / "bench" / "run_all.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


run_all = _load_run_all()


def synthetic_results() -> dict[str, Any]:
    commit = {"sha": "0123456789abcdef0123456789abcdef01234567", "dirty": False}
    old_commit = {"sha": "fedcba9876543210fedcba9876543210fedcba98", "dirty": True}
    latest, earlier = "2026-11-24T08:00:00+00:00", "2026-11-23T10:00:00+00:00"
    return {
        "schema": 1,
        "date": "2026-11-24",
        "started_at": "2026-11-24T08:00:00+00:00",
        "finished_at": "2026-11-24T08:09:30+00:00",
        "commit": commit,
        "machine": {
            "cpu_model": "Test CPU 9000",
            "cpu_count": 2,
            "cpus_usable": 2,
            "cpu_quota": None,
            "memory_bytes": 8 * 2**30,
            "os": "Debian GNU/Linux 12 (bookworm)",
            "system": "Linux",
            "kernel": "6.1.0",
            "arch": "x86_64",
            "python": "3.11.7",
            "python_implementation": "CPython",
            "libraries": {"grpcio": "1.85.1", "kopf": None},
        },
        "ran": ["fast.py", "broken.py"],
        "wall_s": 570.0,
        "runs": [
            {
                "started_at": earlier,
                "wall_s": 200.0,
                "ran": ["old.py"],
                "only": ["old"],
                "commit": old_commit,
            },
            {"started_at": latest, "wall_s": 570.0, "ran": ["fast.py", "broken.py"], "only": None},
        ],
        "benchmarks": [
            {
                "script": "fast.py",
                "description": "Something quick, vs something quicker.",
                "status": "ok",
                "returncode": 0,
                "timed_out": False,
                "wall_s": 12.5,
                "started_at": "2026-11-24T08:00:00+00:00",
                "commit": commit,
                "run": latest,
            },
            {
                "script": "broken.py",
                "description": "A benchmark that falls over.",
                "status": "failed",
                "returncode": 1,
                "timed_out": False,
                "wall_s": 63.2,
                "started_at": "2026-11-24T08:01:00+00:00",
                "commit": commit,
                "run": latest,
                "stderr_tail": ["Traceback (most recent call last):", "AssertionError: 3 problems"],
            },
            {
                "script": "old.py",
                "description": "Measured in an earlier run.",
                "status": "ok",
                "returncode": 0,
                "timed_out": False,
                "wall_s": 200.0,
                "started_at": "2026-11-23T10:00:00+00:00",
                "commit": old_commit,
                "run": earlier,
            },
        ],
        "results": [
            {
                "name": "fast_with_target",
                "value": 1.0512,
                "unit": "s",
                "baseline": 0.955,
                "baseline_name": "lower bound",
                "ratio": 1.1007,
                "target": 1.2,
                "target_text": "ratio ≤ 1.20",
                "met": True,
                "script": "fast.py",
                "script_wall_s": 12.5,
            },
            {
                "name": "fast_without_target",
                "value": 4654.3,
                "unit": "ops/s",
                "baseline": 7231.4,
                "baseline_name": "raw | primitive",
                "ratio": 0.6436,
                "script": "fast.py",
                "script_wall_s": 12.5,
            },
            {
                "name": "old_budget_missed",
                "value": 130.0,
                "unit": "requests/min",
                "budget": 1200.0,
                "ratio": 0.1083,
                "target": 0.1,
                "meets_target": False,
                "script": "old.py",
                "script_wall_s": 200.0,
            },
        ],
    }


def table_rows(markdown: str, header_start: str) -> tuple[list[str], list[list[str]]]:
    """(header, body rows) of the tables whose header starts with ``header_start``, cells split on
    unescaped pipes; every such table must have the same header and a separator row."""
    header: list[str] = []
    rows: list[list[str]] = []
    lines = markdown.splitlines()
    for i, line in enumerate(lines):
        if not line.startswith(header_start):
            continue
        header = header or split_row(line)
        assert split_row(line) == header
        assert split_row(lines[i + 1]) == ["---"] * len(header)
        for body in lines[i + 2 :]:
            if not body.startswith("|"):
                break
            rows.append(split_row(body))
    return header, rows


def split_row(line: str) -> list[str]:
    cells = line.strip().strip("|").replace("\\|", "\0").split("|")
    return [c.strip().replace("\0", "|") for c in cells]


def figure_row(markdown: str, name: str) -> list[str]:
    rows = [r for r in table_rows(markdown, "| Figure |")[1] if r[0] == f"`{name}`"]
    assert len(rows) == 1, f"expected one row for {name}, got {rows}"
    return rows[0]


def test_report_says_it_is_generated_and_how_to_regenerate_it() -> None:
    report = run_all.render_report(synthetic_results())
    assert report.startswith("<!-- Generated by bench/run_all.py")
    assert "make bench" in report
    assert "bench/run_all.py --report-only" in report
    assert "[benchmarks.md](benchmarks.md)" in report


def test_report_describes_the_machine_date_and_commit() -> None:
    report = run_all.render_report(synthetic_results())
    assert "| Date | 2026-11-24 08:09 UTC |" in report
    assert "| Commit | `0123456789ab` |" in report
    assert "Test CPU 9000, 2 CPUs" in report
    assert "| Memory | 8.0 GiB |" in report
    assert "Debian GNU/Linux 12 (bookworm) (Linux 6.1.0 x86_64)" in report
    assert "CPython 3.11.7" in report
    assert "grpcio 1.85.1" in report
    assert "kopf" not in report  # not installed: left out rather than shown as None
    assert (
        "| Wall time | 3 min 20 s for `old.py`, started 2026-11-23 10:00 UTC; "
        "9 min 30 s for 2 benchmark(s), started 2026-11-24 08:00 UTC |"
    ) in report


def test_one_row_per_figure_grouped_by_benchmark_with_its_description() -> None:
    report = run_all.render_report(synthetic_results())
    fast = report.index("## `fast.py`")
    assert report.index("Something quick, vs something quicker.") > fast
    assert fast < report.index("`fast_with_target`") < report.index("## `broken.py`")
    header, rows = table_rows(report, "| Figure |")
    assert header == ["Figure", "Value", "Unit", "Baseline (or budget)", "Ratio", "Target", "Met"]
    assert [row[0] for row in rows] == ["`fast_with_target`", "`fast_without_target`", "`old_budget_missed`"]
    assert all(len(row) == len(header) for row in rows)


def test_figure_with_a_target_shows_target_and_met() -> None:
    row = figure_row(run_all.render_report(synthetic_results()), "fast_with_target")
    assert row == ["`fast_with_target`", "1.051", "s", "0.9550 (lower bound)", "1.101", "ratio ≤ 1.20", "yes"]


def test_figure_without_a_target_shows_dashes() -> None:
    row = figure_row(run_all.render_report(synthetic_results()), "fast_without_target")
    # The pipe inside the baseline name is escaped, so the row keeps its seven cells.
    assert row == ["`fast_without_target`", "4,654", "ops/s", "7,231 (raw | primitive)", "0.6436", "—", "—"]


def test_budget_and_missed_target_from_the_older_meets_target_field() -> None:
    row = figure_row(run_all.render_report(synthetic_results()), "old_budget_missed")
    assert row[3] == "budget 1,200"
    assert row[5] == "0.1000"
    assert row[6] == "**no**"


def test_failed_benchmark_is_reported_with_its_stderr_tail() -> None:
    report = run_all.render_report(synthetic_results())
    summary = {r[0]: r for r in table_rows(report, "| Benchmark |")[1]}
    assert summary["`broken.py`"][1:] == ["**failed**", "1 min 3 s", "0", "—"]
    assert summary["`fast.py`"][1:] == ["ok", "12.5 s", "2", "1 of 1"]
    assert summary["`old.py`"][1:] == ["ok", "3 min 20 s", "1", "0 of 1"]
    section = report[report.index("## `broken.py`") : report.index("## `old.py`")]
    assert "**failed** (exit status 1) after 1 min 3 s" in section
    assert "No figures were printed." in section
    assert "```text\nTraceback (most recent call last):\nAssertionError: 3 problems\n```" in section
    assert "3 figures from 3 benchmarks (1 of the 2 with a target met); 1 benchmark(s) failed." in report


def test_benchmark_from_an_earlier_run_says_when_and_at_which_commit() -> None:
    report = run_all.render_report(synthetic_results())
    section = report[report.index("## `old.py`") :]
    assert "measured in an earlier run, 2026-11-23 10:00 UTC at `fedcba987654` with uncommitted" in section
    assert "earlier run" not in report[report.index("## `fast.py`") : report.index("## `old.py`")]


def test_report_only_writes_the_report_from_the_results_file(tmp_path: Path) -> None:
    results, report = tmp_path / "results.json", tmp_path / "performance.md"
    results.write_text(json.dumps(synthetic_results()), encoding="utf-8")
    assert run_all.main(["--report-only", "--results", str(results), "--report", str(report)]) == 0
    assert report.read_text(encoding="utf-8") == run_all.render_report(synthetic_results())


def test_report_only_without_results_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exc:
        run_all.main(["--report-only", "--results", str(tmp_path / "none.json")])
    assert exc.value.code == 2


def test_merge_replaces_only_the_benchmarks_that_ran_again() -> None:
    previous = synthetic_results()
    now = "2026-11-25T00:00:00+00:00"
    entry = {"script": "fast.py", "status": "ok", "wall_s": 1.0, "started_at": now, "run": now}
    figure = {"name": "fast_again", "value": 1.0, "unit": "s", "script": "fast.py"}
    run = {"started_at": now, "ran": ["fast.py"], "only": ["fast"], "wall_s": 1.0}
    order = ["broken.py", "fast.py", "old.py"]
    merged = run_all.merge(previous, run, [entry], [figure], order)
    assert [e["script"] for e in merged["benchmarks"]] == ["broken.py", "fast.py", "old.py"]
    assert [f["name"] for f in merged["results"]] == ["fast_again", "old_budget_missed"]
    assert merged["started_at"] == now
    # broken.py still comes from the 08:00 run and old.py from the one before.
    assert [r["started_at"] for r in merged["runs"]] == [r["started_at"] for r in previous["runs"]] + [now]

    # Once nothing comes from a run any more, it is no longer listed.
    again = {**entry, "script": "broken.py"}
    merged = run_all.merge(merged, run, [entry, again], [figure], order)
    assert [r["started_at"] for r in merged["runs"]] == ["2026-11-23T10:00:00+00:00", now]


def test_merge_into_a_file_without_runs_lists_its_run() -> None:
    previous = synthetic_results()
    del previous["runs"]
    for e in previous["benchmarks"]:
        del e["run"]
    now = "2026-11-25T00:00:00+00:00"
    entry = {"script": "fast.py", "status": "ok", "wall_s": 1.0, "started_at": now, "run": now}
    merged = run_all.merge(previous, {"started_at": now, "ran": ["fast.py"]}, [entry], [], ["fast.py"])
    assert [r["started_at"] for r in merged["runs"]] == [previous["started_at"], now]
    assert {e["script"]: e["run"] for e in merged["benchmarks"]}["old.py"] == previous["started_at"]


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (None, "—"),
        (True, "yes"),
        (1234567, "1,234,567"),
        (0.0, "0"),
        (5124.3, "5,124"),
        (78.3, "78.30"),
        (0.017915581, "0.01792"),
        (0.00066, "0.0006600"),
        ("n/a", "n/a"),
    ],
)
def test_number_format(value: object, text: str) -> None:
    assert run_all.fmt_number(value) == text


def test_figures_are_json_objects_with_a_name() -> None:
    assert run_all.parse_figure('{"name": "x", "value": 1}\n') == {"name": "x", "value": 1}
    assert run_all.parse_figure("[  0.1s] progress\n") is None
    assert run_all.parse_figure('{"value": 1}') is None
    assert run_all.parse_figure("{not json") is None


def test_unknown_benchmark_name_is_refused() -> None:
    with pytest.raises(SystemExit, match="unknown benchmark"):
        run_all.select(run_all.discover(), ["no_such_bench"])


def test_every_real_benchmark_has_a_description() -> None:
    scripts = run_all.discover()
    assert scripts, "no benchmarks found in bench/"
    assert all(not p.name.startswith("_") and p.name != "run_all.py" for p in scripts)
    for script in scripts:
        assert run_all.describe(script), f"{script.name} has no module docstring"
