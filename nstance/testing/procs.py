"""Test and benchmark helpers shared by the child-process wrappers (``ServerProcess``,
``OperatorProcess``): start a program with its output in a log file, GET its HTTP probe, wait until the
probe answers 200 (failing at once, with the log, when the child exits), read the log's tail, stop it;
``free_port`` for the loopback ports those children listen on; ``processes_mentioning`` to prove
that none of them was left behind; and ``popen_as_terminal_job``, for a child that a test stops with Ctrl-C.

Only process and HTTP plumbing lives here; which program runs, with which flags and probe path, is the
wrapper's business. Nothing in the product imports this module, and it must not import the programs
(``nstance.server``, ``nstance.operator``) it starts.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

#: Ports handed to listeners come from below Linux's default ephemeral range (32768-60999): a port
#: the kernel picked for ``bind(0)`` is an ephemeral one, and an outgoing connection of any process
#: can take it between the check and the child's own bind ("Address already in use").
LISTEN_PORTS = (20000, 32000)
_handed_out: set[int] = set()
_rng = random.Random()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that was free a moment ago, never handed out twice by this process."""
    for _ in range(500):
        port = _rng.randrange(*LISTEN_PORTS)
        if port in _handed_out:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free port on {host} in {LISTEN_PORTS[0]}-{LISTEN_PORTS[1] - 1}")


#: The signals a terminal's foreground job always starts with at their default actions.
TERMINAL_SIGNALS = (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP)


def popen_as_terminal_job(argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
    """``subprocess.Popen`` for a child that a test will stop as a terminal does (SIGINT to its
    process group for Ctrl-C, SIGHUP when the terminal is closed): it starts with SIGINT, SIGQUIT and
    SIGHUP at their default actions.

    A terminal's foreground job always starts with them at their defaults. A test suite started as a
    background job of a non-interactive shell (``cmd &`` in a script) inherits SIGINT and SIGQUIT
    ignored, under ``nohup`` SIGHUP too, and an ignored signal stays ignored in every child: Python
    then raises no KeyboardInterrupt and bash cannot trap it, so the stop under test would never be
    tried.

    A child inherits an ignored signal as ignored and a handled one at its default, so the ignored ones
    are set to their defaults in this process for the moment of the spawn, and put back. No code runs
    in the child between fork and exec: a ``preexec_fn`` would, which makes the spawn a plain fork
    with the fork handlers of every library in this process, and with grpc's threads busy the child
    died of SIGABRT before it ran (a CI run, 2026-11-28).
    """
    ignored = [sig for sig in TERMINAL_SIGNALS if signal.getsignal(sig) is signal.SIG_IGN]
    for sig in ignored:
        signal.signal(sig, signal.SIG_DFL)
    try:
        return subprocess.Popen(list(argv), **kwargs)
    finally:
        for sig in ignored:
            signal.signal(sig, signal.SIG_IGN)


def spawn_logged(
    argv: Sequence[str], env: Mapping[str, str], log_path: Path, *, own_session: bool = False
) -> subprocess.Popen[bytes]:
    """Start ``argv`` with stdout and stderr appended to ``log_path`` (its folder is created); with
    ``own_session`` in a session of its own, out of reach of the terminal's Ctrl-C and hang-up."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log_file:
        return subprocess.Popen(
            list(argv), env=dict(env), stdout=log_file, stderr=log_file, start_new_session=own_session
        )


def http_probe(addr: str, path: str, *, timeout: float = 2.0) -> tuple[int, str]:
    """GET ``http://{addr}{path}``: (status, body); (0, error) when nothing answers."""
    try:
        with urllib.request.urlopen(f"http://{addr}{path}", timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except (urllib.error.URLError, OSError) as exc:
        return 0, str(exc)


def wait_for_ok(
    probe: Callable[[], tuple[int, str]],
    proc: subprocess.Popen[bytes] | None,
    *,
    what: str,
    state: str,
    log: Callable[[], str],
    timeout: float,
    interval: float,
) -> str:
    """Call ``probe`` until it answers 200 and return its body.

    Raises RuntimeError (``"{what} exited with N; log: …"``) as soon as ``proc`` has exited, and
    TimeoutError (``"{what} not {state} after …s (last: …); log: …"``) when ``timeout`` passes first.
    """
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}; log:\n{log()}")
        code, body = probe()
        if code == 200:
            return body
        last = f"{code} {body}"
        time.sleep(interval)
    raise TimeoutError(f"{what} not {state} after {timeout}s (last: {last}); log:\n{log()}")


def log_text(log_path: Path | None) -> str:
    """The whole log ("" when there is none yet)."""
    if log_path is None or not log_path.exists():
        return ""
    return log_path.read_text(errors="replace")


def log_tail(log_path: Path | None, chars: int) -> str:
    """The last ``chars`` characters of the log ("" when there is none yet)."""
    return log_text(log_path)[-chars:]


def processes_mentioning(text: str) -> list[int]:
    """Pids of live processes (zombies excluded) whose command line contains ``text`` (Linux ``/proc``).

    For tests that must leave nothing behind: pass a directory every child was started with.
    """
    out = []
    own = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == own:
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue  # gone meanwhile
        if text in cmdline and state != "Z":
            out.append(int(entry.name))
    return sorted(out)


def stop_process(
    proc: subprocess.Popen[bytes] | None, sig: int = signal.SIGTERM, timeout: float = 20.0
) -> int:
    """Send ``sig`` (unless it already exited) and wait for the exit status; SIGKILL after ``timeout``."""
    if proc is None:
        return 0
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait(5)
