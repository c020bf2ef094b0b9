"""``popen_as_terminal_job``: a child starts with a terminal job's signals, and nothing runs in it
before exec.

CI failed a test once because a child the test started with a ``preexec_fn`` died of SIGABRT before it
ran: a ``preexec_fn`` turns the spawn into a plain fork that runs every library's fork handlers, and
grpc's threads were busy. A driver outside the repo (6 threads calling a grpc server in the same
process, 300 spawns) saw 8 of 300 children abort with a ``preexec_fn`` and none of 600 with this helper.
"""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from nstance.testing import procs


def _ignored_in(status: str) -> int:
    """The SigIgn mask of a ``/proc/<pid>/status`` text."""
    line = next(line for line in status.splitlines() if line.startswith("SigIgn:"))
    return int(line.split()[1], 16)


@pytest.fixture
def terminal_signals_ignored() -> Iterator[None]:
    """This process as a background job under ``nohup``: SIGINT, SIGQUIT and SIGHUP ignored."""
    saved = {sig: signal.getsignal(sig) for sig in procs.TERMINAL_SIGNALS}
    for sig in procs.TERMINAL_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


@pytest.mark.usefixtures("terminal_signals_ignored")
def test_the_child_starts_with_the_terminal_signals_at_their_defaults() -> None:
    child = procs.popen_as_terminal_job(["cat", "/proc/self/status"], stdout=subprocess.PIPE, text=True)
    out, _ = child.communicate(timeout=30)
    mask = _ignored_in(out)
    assert all(not mask & (1 << (sig - 1)) for sig in procs.TERMINAL_SIGNALS), hex(mask)
    # and this process ignores them again afterwards
    assert all(signal.getsignal(sig) is signal.SIG_IGN for sig in procs.TERMINAL_SIGNALS)


@pytest.mark.usefixtures("terminal_signals_ignored")
def test_no_code_runs_in_the_child_before_exec(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}
    real = subprocess.Popen

    def recording(*args: Any, **kwargs: Any) -> subprocess.Popen[Any]:
        seen.update(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", recording)
    procs.popen_as_terminal_job(["true"]).wait(timeout=30)
    assert seen.get("preexec_fn") is None
