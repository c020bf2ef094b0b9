"""Every command of the four programs, run the ways a newcomer gets it wrong, answers without a traceback;
and every option of the four has help, the operator's readable at 80 columns, and each has --version.

The commands are enumerated from the typer/click definitions (a new command is covered without editing
this file). Each is run with: no AWS credentials, unreachable endpoints (S3 and shard servers), a
missing bucket (a missing directory for file storage, a bucket moto does not have for s3) and a flag
that does not exist. A run fails the test when it raises (a traceback), prints the last-resort
``unexpected error`` line, or, for a bad flag, exits 0.

nstance-admin runs in-process (click's runner re-raises nothing: an exception is a failure); the three
daemons run as processes, since some of them rightly keep waiting (an unreachable endpoint is retried):
those are stopped with SIGTERM after a while and must then exit cleanly.
"""

from __future__ import annotations

import base64
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import typer
from moto import mock_aws
from typer.testing import CliRunner

from nstance import __version__
from nstance.admin.cli import app as admin_app
from nstance.agent.cli import app as agent_app
from nstance.core.cli import UNEXPECTED
from nstance.operator.cli import app as operator_app
from nstance.server.cli import app as server_app
from nstance.testing.procs import free_port

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_CONFIG = ROOT / "examples" / "local" / "config.jsonc"
KEY_B64 = base64.b64encode(bytes(range(32))).decode()
DAEMON_PARALLEL = 4  # daemons started at once
DAEMON_SETTLE = 10.0  # seconds a daemon that has started logging may keep running before SIGTERM
DAEMON_SILENT_LIMIT = 120.0  # a daemon that printed nothing at all is stopped after this


@dataclass(frozen=True)
class Leaf:
    """One runnable command: its words after the program name, and its click definition."""

    words: tuple[str, ...]
    command: Any

    @property
    def name(self) -> str:
        return " ".join(self.words) or "(main)"


def leaves(app: typer.Typer) -> list[Leaf]:
    """Every leaf command of ``app``, from its click definition."""
    out: list[Leaf] = []

    def walk(command: Any, words: tuple[str, ...]) -> None:
        subcommands = getattr(command, "commands", None)  # a group (typer carries its own click)
        if subcommands is not None:
            for name, sub in sorted(subcommands.items()):
                walk(sub, (*words, name))
        else:
            out.append(Leaf(words, command))

    walk(typer.main.get_command(app), ())
    return out


def _value(param: Any) -> str:
    """A well-formed value for a required parameter, so the command gets as far as storage or the wire."""
    name = (param.name or "").lower()
    if getattr(param.type_descriptor, "annotation", None) is int:
        return "1"
    if name in ("file", "files", "config"):
        return str(EXAMPLE_CONFIG)
    if name == "serial":
        return "01"
    return "test"


def argv_for(leaf: Leaf) -> list[str]:
    """The command's words and a value for each required argument and option.

    A command that runs until interrupted (``watch``) has ``--once``: it is given, so it draws one round.
    """
    argv = list(leaf.words)
    if any(param.name == "once" for param in leaf.command.params):
        argv.append("--once")
    for param in leaf.command.params:
        if not param.required:
            continue
        if param.param_type_name == "argument":
            argv.append(_value(param))
        else:
            argv += [param.opts[0], _value(param)]
    return argv


def _clean_env(tmp: Path) -> dict[str, str]:
    """An environment without the host's AWS or Kubernetes settings."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AWS_", "NSTANCE_", "KUBERNETES_")) and k != "KUBECONFIG"
    }
    env.update(
        {
            "AWS_CONFIG_FILE": str(tmp / "no-aws-config"),
            "AWS_SHARED_CREDENTIALS_FILE": str(tmp / "no-aws-credentials"),
            "AWS_EC2_METADATA_DISABLED": "true",
            "KUBECONFIG": str(tmp / "no-kubeconfig"),
            "NSTANCE_ENCRYPTION_KEY": KEY_B64,
            "HOME": str(tmp),
        }
    )
    return env


def scenarios(tmp: Path) -> dict[str, dict[str, str]]:
    """Environment overlays, one per way of getting it wrong."""
    closed = free_port()  # nothing listens here
    kubeconfig = tmp / "kubeconfig-unreachable"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: c, cluster: {{server: 'https://127.0.0.1:{closed}'}}}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\nusers: [{name: u, user: {token: t}}]\n"
    )
    fake_creds = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": "us-east-1",
    }
    return {
        "missing credentials": {
            "NSTANCE_STORAGE": "s3",
            "NSTANCE_BUCKET": "nstance-test",
            "AWS_REGION": "us-east-1",
        },
        "unreachable endpoints": {
            **fake_creds,
            "NSTANCE_STORAGE": "s3",
            "NSTANCE_BUCKET": "nstance-test",
            "AWS_ENDPOINT_URL": f"http://127.0.0.1:{closed}",
            "NSTANCE_ADMIN_SERVERS": f"test=127.0.0.1:{closed}",
            "NSTANCE_SERVER_REGISTRATION_ADDR": f"127.0.0.1:{closed}",
            "NSTANCE_SERVER_AGENT_ADDR": f"127.0.0.1:{closed}",
            "NSTANCE_INSTANCE_ID": "app06h1me03z9srk7h6t0f09cb1f4",  # a valid id: the endpoint is the problem
            "KUBECONFIG": str(kubeconfig),
        },
        "missing bucket directory": {"NSTANCE_STORAGE": "file", "NSTANCE_BUCKET": str(tmp / "no-such-dir")},
        "missing s3 bucket": {**fake_creds, "NSTANCE_STORAGE": "s3", "NSTANCE_BUCKET": "no-such-bucket"},
        "bad flag": {},
    }


def _problem(output: str) -> str | None:
    if "Traceback (most recent call last)" in output:
        return "printed a traceback"
    if f": {UNEXPECTED}:" in output:
        return "hit the last-resort error line"
    return None


@pytest.fixture
def tmp_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, dict[str, str]]:
    env = _clean_env(tmp_path)
    for key in list(os.environ):
        if key not in env:
            monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(tmp_path)
    return tmp_path, env


def _operator_identity(runner: CliRunner, tmp: Path) -> Path:
    """A real operator identity, so shard commands get as far as dialling the (unreachable) server."""
    storage = ["--storage-provider", "file", "--storage-bucket", str(tmp / "identity-bucket")]
    directory = tmp / "identity"
    for argv in (
        ["cluster", "init", "--cluster-id", "test", *storage],
        ["cluster", "register-operator", "--cluster-id", "test", "--output-dir", str(directory), *storage],
    ):
        result = runner.invoke(admin_app, argv)
        assert result.exit_code == 0, result.output
    return directory


@pytest.mark.timeout(600)  # about 100 command runs; ~1 minute on an idle machine
def test_every_admin_command_fails_in_words(tmp_env: tuple[Path, dict[str, str]]) -> None:
    tmp, _ = tmp_env
    commands = leaves(admin_app)
    assert len(commands) >= 20  # group, instance, cluster, config, cert, secrets commands
    runner = CliRunner()
    identity = _operator_identity(runner, tmp)
    failures: list[str] = []
    for scenario, overlay in scenarios(tmp).items():
        overlay = {**overlay, "NSTANCE_ADMIN_IDENTITY_DIR": str(identity)}
        for leaf in commands:
            argv = argv_for(leaf)
            if any(param.name == "output_dir" for param in leaf.command.params):
                argv += ["--output-dir", str(tmp / "identities" / f"{scenario.replace(' ', '-')}")]
            if scenario == "bad flag":
                argv.append("--no-such-flag")
            if scenario == "missing s3 bucket":
                with mock_aws():
                    result = runner.invoke(admin_app, argv, env=overlay)
            else:
                result = runner.invoke(admin_app, argv, env=overlay)
            shutil.rmtree(tmp / "no-such-dir", ignore_errors=True)  # each command meets it missing
            where = f"[{scenario}] nstance-admin {' '.join(argv)}"
            if result.exception is not None and not isinstance(result.exception, SystemExit):
                failures.append(f"{where}: raised {type(result.exception).__name__}: {result.exception}")
                continue
            if os.environ.get("SHOW_CLI_OUTPUT"):
                print(f"{where} -> {result.exit_code}: {result.output.strip()[-300:]}")
            problem = _problem(result.output)
            if problem:
                failures.append(f"{where}: {problem}")
            if scenario == "bad flag" and result.exit_code == 0:
                failures.append(f"{where}: accepted an unknown flag")
    assert not failures, "\n".join(failures)


def _daemon_runs(tmp: Path) -> list[tuple[str, list[str], dict[str, str]]]:
    """(label, argv, env) for each daemon command in each scenario that applies to it."""
    runs: list[tuple[str, list[str], dict[str, str]]] = []
    base = _clean_env(tmp)
    for program, app in (("server", server_app), ("agent", agent_app), ("operator", operator_app)):
        for leaf in leaves(app):
            for scenario, overlay in scenarios(tmp).items():
                if scenario == "missing s3 bucket":
                    continue  # needs a live S3 emulator; the admin test covers NoSuchBucket in-process
                argv = [sys.executable, "-m", f"nstance.{program}", *argv_for(leaf)]
                if program == "server":
                    argv += ["--id", "s1", "--shard", "test", "--cachedir", str(tmp / f"cache-{len(runs)}")]
                    argv += ["--health-addr", f"127.0.0.1:{free_port()}"]
                if program == "operator":
                    argv += ["--health-addr", f"127.0.0.1:{free_port()}", "--disable-webhooks"]
                if scenario == "bad flag":
                    argv.append("--no-such-flag")
                runs.append((f"[{scenario}] nstance-{program} {leaf.name}", argv, {**base, **overlay}))
    return runs


@dataclass
class _Run:
    label: str
    argv: list[str]
    env: dict[str, str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    first_output: float | None = None
    stopped: bool = False


def _step(run: _Run, now: float) -> bool:
    """Advance one running daemon; True once it has exited (by itself or after SIGTERM)."""
    assert run.proc is not None
    if run.proc.poll() is not None:
        return True
    if run.first_output is None and run.log.stat().st_size > 0:
        run.first_output = now
    settled = run.first_output is not None and now - run.first_output > DAEMON_SETTLE
    if settled or now - run.started > DAEMON_SILENT_LIMIT:
        run.stopped = True
        run.proc.send_signal(signal.SIGTERM)
        run.proc.wait(timeout=60)
        return True
    return False


@pytest.mark.timeout(900)  # a dozen daemon processes, four at a time
def test_every_daemon_fails_in_words(tmp_path: Path) -> None:
    """A daemon either exits with its one line, or keeps running (retrying, logging) and stops on SIGTERM."""
    waiting = [
        _Run(label, argv, env, tmp_path / f"run-{index}.log")
        for index, (label, argv, env) in enumerate(_daemon_runs(tmp_path))
    ]
    running: list[_Run] = []
    finished: list[_Run] = []
    while waiting or running:
        while waiting and len(running) < DAEMON_PARALLEL:
            run = waiting.pop(0)
            with run.log.open("wb") as out:
                run.proc = subprocess.Popen(run.argv, env=run.env, cwd=tmp_path, stdout=out, stderr=out)
            run.started = time.monotonic()
            running.append(run)
        time.sleep(0.2)
        now = time.monotonic()
        for run in [r for r in running if _step(r, now)]:
            running.remove(run)
            finished.append(run)
    failures: list[str] = []
    for run in finished:
        assert run.proc is not None
        code = run.proc.returncode
        text = run.log.read_text(errors="replace")
        if os.environ.get("SHOW_CLI_OUTPUT"):
            print(f"{run.label} -> {code}{' (stopped)' if run.stopped else ''}: {text.strip()[-400:]}")
        problem = _problem(text)
        if problem:
            failures.append(f"{run.label}: {problem}\n{text[-1500:]}")
        if run.stopped and code not in (0, -signal.SIGTERM):
            failures.append(f"{run.label}: exit {code} after SIGTERM\n{text[-1500:]}")
        if "bad flag" in run.label and code == 0:
            failures.append(f"{run.label}: accepted an unknown flag")
    assert not failures, "\n".join(failures)


# --- help and --version --------------------------------------------------------------------------

PROGRAMS = {
    "nstance-admin": admin_app,
    "nstance-agent": agent_app,
    "nstance-operator": operator_app,
    "nstance-server": server_app,
}


@pytest.mark.parametrize("program", sorted(PROGRAMS))
def test_every_option_is_described(program: str) -> None:
    undescribed = [
        f"{leaf.name} {param.opts[0]}"
        for leaf in leaves(PROGRAMS[program])
        for param in leaf.command.params
        if param.param_type_name == "option" and not (getattr(param, "help", None) or "").strip()
    ]
    assert not undescribed, f"{program}: options without help: {undescribed}"


@pytest.mark.parametrize("program", sorted(PROGRAMS))
def test_version(program: str) -> None:
    result = CliRunner().invoke(PROGRAMS[program], ["--version"])
    assert result.exit_code == 0
    assert result.output.strip() == f"{program} {__version__}"


def test_operator_help_is_readable_at_80_columns() -> None:
    result = CliRunner().invoke(operator_app, ["--help"], env={"COLUMNS": "80"}, terminal_width=80)
    assert result.exit_code == 0
    lines = result.output.splitlines()
    assert max(len(line) for line in lines) <= 80, [line for line in lines if len(line) > 80]
    assert "…" not in result.output  # no option name or text cut short
    command = typer.main.get_command(operator_app)
    for param in command.params:
        if param.param_type_name == "option":
            assert param.opts[0] in result.output, param.opts[0]
