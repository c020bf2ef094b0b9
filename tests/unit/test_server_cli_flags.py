"""nstance-server takes upstream's command lines as they are (internal/server/cmd/root.go, v1 and v2).

A systemd unit written for the Go server must start this one: every flag of upstream's root command
is accepted, Go's ``--flag=VALUE`` bools work in each spelling ``strconv.ParseBool`` takes, and v2's
flags for features not implemented here are logged as ignored. ``serve`` is replaced, so nothing runs.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

from nstance.server import cli
from nstance.server.app import ServerOptions

#: Every flag of upstream v2's root command, with its value (v1's are a subset).
UPSTREAM_V2 = [
    "--id", "i-0123456789abcdef0",
    "--shard", "us-west-2a",
    "--storage", "file",
    "--bucket", "BUCKET",
    "--prefix", "shard/{shard}/",
    "--cachedir", "CACHE",
    "--advertise-host", "10.0.1.23",
    "--proxy-socket", "/run/nstance/nstance-server.sock",
    "--tunnel-socket", "/run/nstance/nstance-tunnel.sock",
    "--server-files-dir", "/run/nstance/files",
]  # fmt: skip


class Ran:
    """What the command would have run: the options and the debug setting."""

    def __init__(self) -> None:
        self.opts: ServerOptions | None = None
        self.debug: bool | None = None


@pytest.fixture
def ran(monkeypatch: pytest.MonkeyPatch) -> Ran:
    seen = Ran()

    async def serve(opts: ServerOptions) -> int:
        seen.opts = opts
        return 0

    def setup_logging(verbose: bool = False) -> None:
        seen.debug = verbose

    monkeypatch.setattr(cli, "serve", serve)
    monkeypatch.setattr(cli, "setup_logging", setup_logging)
    for name in ("NSTANCE_DEBUG", "NSTANCE_SERVER_ID", "NSTANCE_SHARD", "NSTANCE_HEALTH_ADDR"):
        monkeypatch.delenv(name, raising=False)
    return seen


def main(monkeypatch: pytest.MonkeyPatch, argv: list[str], tmp_path: Path) -> int:
    """Run the console script with ``argv`` (BUCKET and CACHE made real directories); its exit status."""
    (tmp_path / "bucket").mkdir(exist_ok=True)
    args = [{"BUCKET": str(tmp_path / "bucket"), "CACHE": str(tmp_path / "cache")}.get(a, a) for a in argv]
    monkeypatch.setattr(sys, "argv", ["nstance-server", *args])
    with pytest.raises(SystemExit) as stopped:
        cli.main()
    code = stopped.value.code
    return code if isinstance(code, int) else 1


def test_upstream_v2s_full_flag_set_starts_the_server(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, ran: Ran, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="nstance.server")

    assert main(monkeypatch, [*UPSTREAM_V2, "--debug=false"], tmp_path) == 0

    assert ran.opts is not None
    assert (ran.opts.server_id, ran.opts.shard, ran.opts.storage) == (
        "i-0123456789abcdef0",
        "us-west-2a",
        "file",
    )
    assert (ran.opts.prefix, ran.opts.advertise_host) == ("shard/{shard}/", "10.0.1.23")
    assert ran.opts.cachedir == tmp_path / "cache"
    assert ran.opts.health_addr is None, "no --health-addr: the config's shard.bind.health_addr"
    assert ran.debug is False
    ignored = [r.getMessage() for r in caplog.records if "ignored" in r.getMessage()]
    assert ignored == [
        "--proxy-socket /run/nstance/nstance-server.sock: ignored (upstream v2's wake proxy's control "
        "socket is not implemented here)",
        "--tunnel-socket /run/nstance/nstance-tunnel.sock: ignored (upstream v2's tunnel supervisor's "
        "control socket is not implemented here)",
        "--server-files-dir /run/nstance/files: ignored (upstream v2's server-local files is not "
        "implemented here)",
    ]


def test_a_v1_command_line_logs_nothing_as_ignored(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, ran: Ran, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="nstance.server")
    assert main(monkeypatch, [*UPSTREAM_V2[:14], "-v"], tmp_path) == 0
    assert ran.debug is True
    assert not [r for r in caplog.records if "ignored" in r.getMessage()]


@pytest.mark.parametrize(
    ("flag", "debug"),
    [
        ("--debug", True),
        ("-v", True),
        ("--debug=true", True),
        ("--debug=1", True),
        ("--debug=t", True),
        ("--debug=T", True),
        ("--debug=TRUE", True),
        ("--debug=True", True),
        ("-v=true", True),
        ("--verbose=1", True),
        ("--debug=false", False),
        ("--debug=0", False),
        ("--debug=f", False),
        ("--debug=F", False),
        ("--debug=FALSE", False),
        ("--debug=False", False),
        ("-v=false", False),
    ],
)
def test_bool_flags_take_gos_values(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, ran: Ran, flag: str, debug: bool
) -> None:
    assert main(monkeypatch, [*UPSTREAM_V2[:12], flag], tmp_path) == 0
    assert ran.debug is debug


def test_debug_false_overrides_the_variable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, ran: Ran
) -> None:
    monkeypatch.setenv("NSTANCE_DEBUG", "true")
    assert main(monkeypatch, [*UPSTREAM_V2[:12], "--debug=false"], tmp_path) == 0
    assert ran.debug is False


def test_version_takes_a_value_too(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, ran: Ran, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(monkeypatch, ["--version=true"], tmp_path) == 0
    assert capsys.readouterr().out.startswith("nstance-server ")
    assert main(monkeypatch, [*UPSTREAM_V2[:12], "--version=false"], tmp_path) == 0
    assert ran.opts is not None, "--version=false runs the server"


def test_a_bool_value_go_refuses_is_one_line_and_exit_2(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, ran: Ran, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(monkeypatch, [*UPSTREAM_V2[:12], "--debug=maybe"], tmp_path) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert err == 'nstance-server: invalid argument "maybe" for --debug: use true or false (or 1, 0, t, f)\n'
    assert ran.opts is None


def test_values_after_a_double_dash_are_left_alone() -> None:
    assert cli.with_go_bool_values(["--id", "a", "--", "--debug=maybe"]) == [
        "--id",
        "a",
        "--",
        "--debug=maybe",
    ]
    assert cli.with_go_bool_values(["--id=--debug=maybe"]) == ["--id=--debug=maybe"]


def test_dash_h_is_help(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(monkeypatch, ["-h"], tmp_path) == 0
    assert "--proxy-socket" in capsys.readouterr().out
