"""bench/run_all.py running benchmark scripts as child processes: figures recorded, failures and
timeouts reported, the other benchmarks still run. (The report's pure parts are tested in
tests/unit/test_bench_report.py.)"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

from nstance.testing.procs import popen_as_terminal_job
from nstance.testing.waiting import eventually_sync

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


def test_runner_records_figures_failures_and_continues(tmp_path: Path) -> None:
    bench = tmp_path / "bench"
    bench.mkdir()
    (bench / "_helper.py").write_text("raise SystemExit('helpers are not benchmarks')\n")
    (bench / "a_good.py").write_text(
        textwrap.dedent('''\
            """Benchmark: prints one figure.

            More detail that is not the first paragraph.
            """
            import json, sys
            print("progress", file=sys.stderr)
            print("not a figure")
            print(json.dumps({"name": "good", "value": 2.0, "unit": "s", "target": 3.0, "met": True}))
        ''')
    )
    (bench / "b_bad.py").write_text(
        "import json, sys\n"
        'print(json.dumps({"name": "partial", "value": 1}), flush=True)\n'
        'print("boom: something broke", file=sys.stderr)\n'
        "sys.exit(3)\n"
    )
    (bench / "c_other.py").write_text('print(\'{"name": "other", "value": 5}\')\n')
    results, report = tmp_path / "results.json", tmp_path / "performance.md"
    argv = ["--bench-dir", str(bench), "--results", str(results), "--report", str(report)]

    assert run_all.main([*argv, "--only", "a_good", "b_bad.py"]) == 1
    data = json.loads(results.read_text(encoding="utf-8"))
    by_script = {e["script"]: e for e in data["benchmarks"]}
    assert set(by_script) == {"a_good.py", "b_bad.py"}
    good, bad = by_script["a_good.py"], by_script["b_bad.py"]
    assert good["status"] == "ok"
    assert good["description"] == "Prints one figure."
    assert "stderr_tail" not in good
    assert bad["status"] == "failed"
    assert bad["returncode"] == 3
    assert bad["stderr_tail"] == ["boom: something broke"]
    assert [(f["name"], f["script"]) for f in data["results"]] == [
        ("good", "a_good.py"),
        ("partial", "b_bad.py"),
    ]
    assert all(f["script_wall_s"] >= 0 for f in data["results"])
    assert data["machine"]["cpu_count"] >= 1
    assert "grpcio" in data["machine"]["libraries"]
    assert "**failed** (exit status 3)" in report.read_text(encoding="utf-8")

    # Re-running one benchmark keeps the others' entries and figures.
    assert run_all.main([*argv, "--only", "c_other"]) == 0
    data = json.loads(results.read_text(encoding="utf-8"))
    assert [e["script"] for e in data["benchmarks"]] == ["a_good.py", "b_bad.py", "c_other.py"]
    assert [f["name"] for f in data["results"]] == ["good", "partial", "other"]


def test_runner_kills_a_benchmark_past_its_timeout(tmp_path: Path) -> None:
    script = tmp_path / "slow.py"
    script.write_text("import signal\nsignal.pause()\n")  # runs until killed
    entry, figures = run_all.run_benchmark(script, timeout=0.5, cwd=tmp_path)
    assert entry["status"] == "failed"
    assert entry["timed_out"] is True
    assert entry["wall_s"] < 30
    assert figures == []


def test_a_stop_while_the_output_pumps_start_terminates_the_benchmark(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A stop raises wherever the runner's main thread is. Under load one came while the threads that
    # copy the benchmark's output were starting, and the benchmark was left running on its own.
    pid_file = tmp_path / "bench.pid"
    script = tmp_path / "slow.py"
    script.write_text(
        f"import os, signal\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\nsignal.pause()\n"
    )
    start = run_all.threading.Thread.start

    def stopped_while_starting(thread: run_all.threading.Thread) -> None:
        eventually_sync(lambda: pid_file.exists() and pid_file.read_text() != "", within=60, what="start")
        raise KeyboardInterrupt  # as the handler of a Ctrl-C arriving here does

    monkeypatch.setattr(run_all.threading.Thread, "start", stopped_while_starting)
    with pytest.raises(KeyboardInterrupt):
        run_all.run_benchmark(script, cwd=tmp_path)
    monkeypatch.setattr(run_all.threading.Thread, "start", start)
    pid = int(pid_file.read_text())

    def gone() -> bool:
        try:
            return str(script) not in Path(f"/proc/{pid}/cmdline").read_text()
        except OSError:
            return True

    try:
        assert gone()  # the runner waited for it before the stop went on
    finally:
        if not gone():
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm", "hangup"])
def test_a_stopped_runner_terminates_the_benchmark_and_says_so(tmp_path: Path, how: str) -> None:
    # SIGTERM used to kill the runner alone and leave the running benchmark (in a process group of
    # its own) behind; Ctrl-C printed a KeyboardInterrupt traceback.
    bench = tmp_path / "bench"
    bench.mkdir()
    pid_file = tmp_path / "bench.pid"
    (bench / "slow.py").write_text(
        f"import os, signal\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\nsignal.pause()\n"
    )
    runner = popen_as_terminal_job(  # whose Ctrl-C is never ignored
        [
            sys.executable,
            str(REPO / "bench" / "run_all.py"),
            *("--bench-dir", str(bench)),
            *("--results", str(tmp_path / "results.json"), "--report", str(tmp_path / "report.md")),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # a process group of its own, like a terminal's foreground job
    )

    def benchmark_gone() -> bool:
        try:
            pid = int(pid_file.read_text())
            return str(bench / "slow.py") not in Path(f"/proc/{pid}/cmdline").read_text()
        except (OSError, ValueError):
            return True

    try:
        eventually_sync(lambda: pid_file.exists() and pid_file.read_text() != "", within=60, what="start")
        if how == "ctrl-c":
            os.killpg(runner.pid, signal.SIGINT)  # the terminal's job: the benchmark has its own group
        elif how == "hangup":
            os.killpg(runner.pid, signal.SIGHUP)  # the terminal closed (it used to orphan the benchmark)
        else:
            runner.send_signal(signal.SIGTERM)
        output, _ = runner.communicate(timeout=60)
        eventually_sync(benchmark_gone, within=30, what="the benchmark to be terminated")
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait()
        if not benchmark_gone():  # left behind by a runner that failed this test
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
    name = {"ctrl-c": "SIGINT", "sigterm": "SIGTERM", "hangup": "SIGHUP"}[how]
    assert runner.returncode == 128 + signal.Signals[name], output
    assert "Traceback" not in output, output
    assert f"[run_all] stopped by {name}" in output.splitlines()[-1], output
