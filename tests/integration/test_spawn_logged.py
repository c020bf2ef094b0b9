"""``nstance.testing.procs.spawn_logged``: where the child's output goes, and whose Ctrl-C reaches it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from nstance.testing.procs import spawn_logged, stop_process
from nstance.testing.waiting import eventually_sync

#: A child that says it started and then waits for a signal (stop_process's SIGTERM ends it).
_PRINT_AND_WAIT = "import signal; print('started', flush=True); signal.pause()"


def test_a_child_in_a_session_of_its_own_is_out_of_the_terminals_reach(tmp_path: Path) -> None:
    # make run-k8s starts the real control plane this way, so that a Ctrl-C (SIGINT to the terminal's
    # whole foreground process group) reaches only the script, which stops the API server last.
    children: list[subprocess.Popen[bytes]] = []
    try:
        ours = spawn_logged([sys.executable, "-c", _PRINT_AND_WAIT], os.environ, tmp_path / "ours.log")
        children.append(ours)
        own = spawn_logged(
            [sys.executable, "-c", _PRINT_AND_WAIT], os.environ, tmp_path / "own.log", own_session=True
        )
        children.append(own)
        eventually_sync(
            lambda: all(
                (tmp_path / f"{name}.log").read_text().startswith("started") for name in ("ours", "own")
            ),
            what="both children's first line in their logs",
        )
        assert os.getpgid(ours.pid) == os.getpgid(0)  # the default: a Ctrl-C of ours reaches it
        assert os.getsid(ours.pid) == os.getsid(0)
        assert os.getpgid(own.pid) == own.pid != os.getpgid(0)  # a group and a session of its own
        assert os.getsid(own.pid) == own.pid != os.getsid(0)
    finally:
        for child in children:
            stop_process(child)
