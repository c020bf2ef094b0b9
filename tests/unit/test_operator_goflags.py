"""nstance-operator started as upstream's Helm chart starts upstream's operator.

What a user sees: our image put into upstream's chart (deploy/helm/templates/deployment.yaml, 6650841b
and newer) starts instead of exiting 2 on ``--leader-elect=true``; Go's flag syntax (single dash,
``=value`` on boolean flags) means what it means to Go; upstream's flags map to ours (log level and
format) or are logged once as ignored (a separate metrics address); a bad value is one line and exit 2.

The Go vectors below were produced by a scratch Go 1.26 program parsing the same argument lists with
the standard ``flag`` package (``fs.Bool("leader-elect", false, "")``, ``fs.Bool("zap-devel", true,
"")``, ``fs.String("metrics-bind-address", "0", "")``) and ``strconv.ParseBool``.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer

from nstance.operator import cli
from nstance.operator.goflags import GoFlagError, go_style_argv, parse_go_bool
from nstance.operator.settings import OperatorSettings, SettingsError, build_settings

# upstream deploy/helm/templates/deployment.yaml args, rendered with its values.yaml defaults
# (leaderElection.enabled true, metricsAddr ":8080", healthProbeAddr ":8081", logLevel info).
UPSTREAM_CONFIG = "/etc/nstance/operator/config.yaml"
UPSTREAM_CHART_ARGS = (
    "--leader-elect=true",
    "--metrics-bind-address=:8080",
    "--health-probe-bind-address=:8081",
    "--zap-log-level=info",
    f"--config={UPSTREAM_CONFIG}",
)
# ...and its env (values.yaml defaults).
UPSTREAM_CHART_ENV = {
    "NSTANCE_NAMESPACE": "nstance",
    "NSTANCE_NONCE_SECRET": "nstance-registration",
    "NSTANCE_KEY_SECRET": "nstance-operator-key",
    "NSTANCE_CERT_SECRET": "nstance-operator-cert",
    "NSTANCE_CAPI_SERVICEACCOUNT": "nstance-capi-workload",
}
CONFIG = (
    "cluster_id: prod\ntenant: team-a\nshards:\n  a: {registration_addr: 'h:8992', operator_addr: 'h:8993'}\n"
)


def declared() -> list[typer.core.TyperOption]:
    command = typer.main.get_command(cli.app)
    return [p for p in command.params if isinstance(p, typer.core.TyperOption)]


def rewrite(*argv: str) -> list[str]:
    return go_style_argv(argv, declared())


# --- Go's syntax -----------------------------------------------------------------------------------


def test_boolean_values_are_those_of_strconv_parsebool() -> None:
    for text in ("1", "t", "T", "TRUE", "true", "True"):
        assert parse_go_bool(text, "--x") is True
    for text in ("0", "f", "F", "FALSE", "false", "False"):
        assert parse_go_bool(text, "--x") is False
    for text in ("tRUE", "yes", "on", " true", "01", ""):  # Go: ParseBool error
        with pytest.raises(GoFlagError, match="invalid boolean value"):
            parse_go_bool(text, "--x")


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        # Go: leader=true metrics=":8080"
        (
            ("--leader-elect=true", "--metrics-bind-address=:8080"),
            ["--leader-elect", "--metrics-bind-address=:8080"],
        ),
        # Go: leader=false metrics=":9090"
        (
            ("-leader-elect=false", "-metrics-bind-address", ":9090"),
            ["--no-leader-elect", "--metrics-bind-address", ":9090"],
        ),
        # Go: leader=true
        (("-leader-elect",), ["--leader-elect"]),
        # Go: leader=false (the last one wins)
        (("--leader-elect=TRUE", "--leader-elect=0"), ["--leader-elect", "--no-leader-elect"]),
        # Go: metrics="-leader-elect" (a value is taken as it is)
        (("--metrics-bind-address", "-leader-elect"), ["--metrics-bind-address", "-leader-elect"]),
        # a flag without a --no- form: =false removes it, and the last occurrence wins
        (("-disable-webhooks", "-disable-webhooks=F"), []),
        (("--disable-webhooks=false", "--disable-webhooks=1"), ["--disable-webhooks"]),
        (("-v", "--debug=0", "--kubeconfig", ""), ["--kubeconfig", ""]),
        (("-h",), ["--help"]),
        (("--", "-leader-elect=1"), ["--", "-leader-elect=1"]),
        # unknown names are left for click to report
        (("-no-such-flag=1",), ["-no-such-flag=1"]),
    ],
)
def test_go_flag_syntax_is_rewritten_for_click(argv: tuple[str, ...], expected: list[str]) -> None:
    assert rewrite(*argv) == expected


def test_a_boolean_flag_with_a_bad_value_is_refused_naming_it() -> None:
    # Go: invalid boolean value "maybe" for -leader-elect: parse error
    with pytest.raises(GoFlagError, match="invalid boolean value 'maybe' for --leader-elect"):
        rewrite("--leader-elect=maybe")
    # Go: invalid boolean value "" for -leader-elect: parse error
    with pytest.raises(GoFlagError, match="invalid boolean value '' for --leader-elect"):
        rewrite("--leader-elect=")


# --- upstream's flags mapped to ours -------------------------------------------------------------------


def settings_of(**kwargs: object) -> OperatorSettings:
    return build_settings(disable_webhooks=True, environ={}, holder_identity="me", **kwargs)  # type: ignore[arg-type]


def test_upstream_log_flags_set_the_level_and_format() -> None:
    assert (settings_of().log_level, settings_of().log_format) == (logging.INFO, "json")
    assert settings_of(zap_log_level="info").log_level == logging.INFO
    assert settings_of(zap_log_level="Error").log_level == logging.ERROR
    assert settings_of(zap_log_level="3").log_level == logging.DEBUG  # V(3): finer than debug
    assert settings_of(zap_encoder="console").log_format == "text"
    assert settings_of(zap_encoder="JSON").log_format == "json"
    devel = settings_of(zap_devel=True)
    assert (devel.log_level, devel.log_format) == (logging.DEBUG, "text")
    # our own flags and explicit zap values win over development mode's defaults
    assert settings_of(zap_devel=True, zap_log_level="info").log_level == logging.INFO
    assert settings_of(zap_devel=True, log_format="json").log_format == "json"
    assert settings_of(zap_log_level="error", verbose=True).log_level == logging.DEBUG


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"zap_log_level": "loud"}, "--zap-log-level 'loud': choose one of debug, info, warn, error, panic"),
        ({"zap_log_level": "0"}, "--zap-log-level '0'"),
        ({"zap_encoder": "xml"}, "--zap-encoder 'xml': choose one of json, console"),
        ({"zap_stacktrace_level": "debug"}, "--zap-stacktrace-level 'debug': choose one of info, error"),
        ({"zap_time_encoding": "unix"}, "--zap-time-encoding 'unix': choose one of epoch"),
        ({"metrics_bind_address": "8080"}, "--metrics-bind-address '8080': expected HOST:PORT"),
    ],
)
def test_bad_upstream_flag_values_name_the_flag(kwargs: dict[str, str], expected: str) -> None:
    with pytest.raises(SettingsError) as info:
        settings_of(**kwargs)
    assert expected in str(info.value)


def test_flags_without_an_equivalent_are_listed_as_ignored() -> None:
    assert settings_of().ignored == ()
    assert settings_of(metrics_bind_address=":8080").ignored == ()  # a listener of its own (below)
    lines = settings_of(zap_stacktrace_level="error", zap_time_encoding="rfc3339").ignored
    assert [line.split(" ")[0] for line in lines] == [
        "--zap-stacktrace-level=error",
        "--zap-time-encoding=rfc3339",
    ]


def test_metrics_bind_address_is_a_second_metrics_listener_unless_off_or_the_health_address() -> None:
    # upstream's chart exposes port 8080 ("metrics") and passes --metrics-bind-address=:8080
    assert settings_of().metrics is None
    assert settings_of(metrics_bind_address="0").metrics is None  # upstream's default: no metrics listener
    assert settings_of(metrics_bind_address=":8081").metrics is None  # served on the health address anyway
    assert str(settings_of(metrics_bind_address=":8080").metrics) == ":8080"


# --- the whole command line, as the chart runs it ------------------------------------------------------


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[OperatorSettings]]:
    """``cli.main`` runs up to the runtime, which is replaced by one recording the settings."""
    seen: list[OperatorSettings] = []

    async def record(settings: OperatorSettings) -> int:
        seen.append(settings)
        return 0

    monkeypatch.setattr(cli, "run_until_stopped", record)
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield seen
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def run_main(monkeypatch: pytest.MonkeyPatch, *argv: str) -> int:
    monkeypatch.setattr(sys, "argv", ["nstance-operator", *argv])
    with pytest.raises(SystemExit) as info:
        cli.main()
    return int(info.value.code or 0)


def chart_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name, value in UPSTREAM_CHART_ENV.items():
        monkeypatch.setenv(name, value)
    # Like upstream's operator (controller-runtime), ours finds the webhook serving certificate in a
    # directory the chart leaves to the installer; here a stand-in for /tmp/k8s-webhook-server/serving-certs.
    certs = tmp_path / "serving-certs"
    certs.mkdir()
    (certs / "tls.crt").write_text("cert")
    (certs / "tls.key").write_text("key")
    monkeypatch.setenv("NSTANCE_WEBHOOK_CERT_DIR", str(certs))


def test_the_upstream_charts_arguments_start_the_operator(
    started: list[OperatorSettings],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    chart_environment(monkeypatch, tmp_path)
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG)
    # The chart's arguments exactly, but for the config file's path (a ConfigMap mount in the pod).
    argv = [arg.replace(UPSTREAM_CONFIG, str(config)) for arg in UPSTREAM_CHART_ARGS]

    assert run_main(monkeypatch, *argv) == 0

    (settings,) = started
    assert settings.leader.enabled
    assert (str(settings.health), settings.config_file) == (":8081", config)
    assert (settings.log_level, settings.log_format) == (logging.INFO, "json")
    assert (settings.namespace, settings.nonce_secret) == ("nstance", "nstance-registration")
    assert (settings.key_secret, settings.cert_secret) == ("nstance-operator-key", "nstance-operator-cert")
    assert settings.webhook.enabled
    assert str(settings.metrics) == ":8080"
    logged = capsys.readouterr().err
    assert logged.count("is ignored") == 0


def test_single_dash_and_false_values_mean_what_they_mean_to_go(
    started: list[OperatorSettings], monkeypatch: pytest.MonkeyPatch
) -> None:
    argv = [
        "-leader-elect=false",
        "-disable-webhooks",
        "-zap-encoder=console",
        "-health-probe-bind-address",
        ":9000",
    ]
    assert run_main(monkeypatch, *argv) == 0
    (settings,) = started
    assert not settings.leader.enabled
    assert not settings.webhook.enabled
    assert (settings.log_format, settings.health.port) == ("text", 9000)


def test_a_bad_boolean_value_is_one_line_and_exit_2(
    started: list[OperatorSettings], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_main(monkeypatch, "--leader-elect=yes", "--disable-webhooks") == 2
    err = capsys.readouterr().err
    assert err.startswith("nstance-operator: invalid boolean value 'yes' for --leader-elect: use one of 1, t")
    assert err.count("\n") == 1
    assert run_main(monkeypatch, "--disable-webhooks", "--zap-log-level=loud") == 2
    assert "nstance-operator: --zap-log-level 'loud'" in capsys.readouterr().err
    assert started == []
