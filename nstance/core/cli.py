"""Plumbing the four programs' command lines share: ``--version`` and the last-resort error line.

``print_version`` makes the eager ``--version`` callback that prints ``PROGRAM VERSION``. ``run_app``
runs a typer app so that no user ever meets a traceback: an exception nobody expected is reported as
one ``PROGRAM: unexpected error: TYPE: message`` line with exit status 1 (the traceback follows only when
``NSTANCE_DEBUG`` is set). Expected failures are still each command's job (one line naming the flag);
this is the net under them, and tests treat its line as a failure.

``stop_signals`` names the signals on which the three daemons stop in order: SIGTERM, SIGINT and
SIGHUP (the terminal that started them was closed), unless SIGHUP was ignored when the process started
(``nohup``). ``raise_on_stop_signals`` makes SIGTERM and SIGHUP raise ``Stopped`` in the main thread, as
SIGINT raises KeyboardInterrupt, for the batch commands (the simulation, the benchmark runner) that
clean up on the way out; ``stop_signal`` tells which signal stopped them (``stop_exception`` goes the
other way).
"""

from __future__ import annotations

import os
import signal
import sys
import traceback
from collections.abc import Callable

import typer

from nstance import __version__

VERSION_HELP = "Print the version and exit."
UNEXPECTED = "unexpected error"
DEBUG_ENV = "NSTANCE_DEBUG"


def print_version(program: str) -> Callable[[bool], None]:
    """An eager typer option callback printing ``{program} {version}`` and exiting 0 when set."""

    def callback(value: bool) -> None:
        if value:
            typer.echo(f"{program} {__version__}")
            raise typer.Exit(0)

    return callback


def stop_signals() -> tuple[signal.Signals, ...]:
    """SIGTERM, SIGINT and SIGHUP: a daemon stops the same orderly way on each. SIGHUP comes when the
    terminal that started it is closed (a ``make run`` window shut): by default it killed the server
    at once, so its local instances outlived it. None of the programs reloads on SIGHUP (config is
    followed from storage and the API). A SIGHUP ignored at start (``nohup``) is left out, so it stays
    ignored. Call before installing handlers."""
    if signal.getsignal(signal.SIGHUP) is signal.SIG_IGN:
        return (signal.SIGTERM, signal.SIGINT)
    return (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class Stopped(BaseException):
    """SIGTERM or SIGHUP arrived (raised by the handler ``raise_on_stop_signals`` installs); ``signum``
    says which."""

    def __init__(self, signum: int = signal.SIGTERM) -> None:
        super().__init__(signum)
        self.signum = signal.Signals(signum)


def _raise_stopped(signum: int, _frame: object) -> None:
    raise Stopped(signum)


def raise_on_stop_signals() -> None:
    """From now on SIGTERM and SIGHUP raise ``Stopped`` where the main thread is, so ``finally`` blocks
    and ``atexit`` run; a process forked later inherits the handlers (reset them there if it must not).
    A signal this process was started ignoring stays ignored (``nohup``), as Python leaves an ignored
    SIGINT."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, _raise_stopped)


def stop_signal(exc: KeyboardInterrupt | Stopped) -> signal.Signals:
    """The signal behind ``exc``: its own for ``Stopped``, SIGINT for KeyboardInterrupt."""
    return exc.signum if isinstance(exc, Stopped) else signal.SIGINT


def stop_exception(signum: int) -> KeyboardInterrupt | Stopped:
    """The exception that stands for ``signum``: KeyboardInterrupt for SIGINT, ``Stopped`` otherwise."""
    return KeyboardInterrupt() if signum == signal.SIGINT else Stopped(signum)


def _debug_requested() -> bool:
    return os.environ.get(DEBUG_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def run_app(app: typer.Typer, program: str) -> None:
    """Run ``app``; turn an unexpected exception into one line on stderr and exit status 1."""
    try:
        app()
    except (KeyboardInterrupt, BrokenPipeError):
        sys.exit(130)
    except Exception as exc:  # noqa: BLE001 - the last-resort net; expected errors are handled earlier
        if _debug_requested():
            traceback.print_exception(exc)
        detail = str(exc).splitlines()[0] if str(exc) else ""
        print(f"{program}: {UNEXPECTED}: {type(exc).__name__}: {detail}", file=sys.stderr)
        sys.exit(1)
