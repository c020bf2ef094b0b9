"""Command line of nstance-operator: flags and environment, logging, signals and exit codes.

Flags are parsed by typer and checked by ``settings.build_settings``; a bad flag or environment value
prints one line naming it and exits 2, as does an operator config file that does not parse (the key
path is in the message). Go's flag syntax, which upstream's Helm chart uses (``--leader-elect=true``,
``-metrics-bind-address :8080``), is accepted too (``goflags``), and so are upstream's flags; one with
no effect here is logged as ignored at start. Everything else — unreachable shards, a missing nonce, a
lost Lease — is handled by the runtime without exiting. SIGTERM/SIGINT/SIGHUP stop the runtime
gracefully (exit 0).

This module holds no operator logic.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from pathlib import Path
from typing import Annotated

import typer

from nstance.core.cli import VERSION_HELP, print_version, run_app, stop_signals
from nstance.core.logformat import TEXT_FORMAT, JsonFormatter
from nstance.operator.config import ConfigError, load_config_file
from nstance.operator.crds import names
from nstance.operator.goflags import GoFlagError, go_style_argv
from nstance.operator.runtime import OperatorRuntime
from nstance.operator.settings import (
    DEFAULT_HEALTH_ADDR,
    DEFAULT_WEBHOOK_ADDR,
    ENV_CA_CONFIGMAP,
    ENV_CERT_SECRET,
    ENV_CONFIG_CONFIGMAP,
    ENV_KEY_SECRET,
    ENV_NAMESPACE,
    ENV_NONCE_SECRET,
    OperatorSettings,
    SettingsError,
    build_settings,
)

log = logging.getLogger("nstance.operator")

app = typer.Typer(
    add_completion=False,
    # Plain click help: one option per line, readable at 80 columns (rich's boxed table truncates names).
    rich_markup_mode=None,
    help=(
        "Nstance operator: Cluster API infrastructure provider spreading replicas across shard servers. "
        "See docs/operator.md."
    ),
)


def setup_logging(log_format: str, level: int) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("aiohttp.access", "kubernetes_asyncio"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


async def run_until_stopped(settings: OperatorSettings) -> int:
    """Run the runtime until SIGTERM/SIGINT/SIGHUP; 0 on a clean stop."""
    loop = asyncio.get_running_loop()
    runtime = OperatorRuntime(settings)
    signals = stop_signals()

    def install() -> None:
        # kopf installs its own handlers each time it starts; ours must win so a signal stops the
        # whole process (kopf is stopped by the runtime), not only kopf.
        for sig in signals:
            loop.add_signal_handler(sig, runtime.request_stop)

    install()
    runtime.on_kopf_started = install
    await runtime.run()
    return 0


@app.command()
def main_command(
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            help="Operator config file (cluster_id, tenant, shards), polled for changes. Default: read the "
            f"ConfigMap ${ENV_CONFIG_CONFIGMAP} (default {names.CONFIG_CONFIGMAP}) key {names.CONFIG_KEY} "
            "through the API.",
        ),
    ] = None,
    kubeconfig: Annotated[
        str | None,
        typer.Option(
            "--kubeconfig",
            envvar="KUBECONFIG",
            help="kubeconfig file (or files separated by ':'); default: the service account in a pod, "
            "else ~/.kube/config.",
        ),
    ] = None,
    namespace: Annotated[
        str | None,
        typer.Option(
            "--namespace",
            envvar=ENV_NAMESPACE,
            help="Namespace of the operator's objects; default: the pod's namespace, else 'default'.",
        ),
    ] = None,
    config_configmap: Annotated[
        str | None,
        typer.Option(
            "--config-configmap",
            envvar=ENV_CONFIG_CONFIGMAP,
            help=f"ConfigMap holding the operator config (default {names.CONFIG_CONFIGMAP}).",
        ),
    ] = None,
    ca_configmap: Annotated[
        str | None,
        typer.Option(
            "--ca-configmap",
            envvar=ENV_CA_CONFIGMAP,
            help=f"ConfigMap with the cluster CA certificate (default {names.CA_CONFIGMAP}).",
        ),
    ] = None,
    cert_secret: Annotated[
        str | None,
        typer.Option(
            "--cert-secret",
            envvar=ENV_CERT_SECRET,
            help=f"Secret the operator keeps its client certificate in (default {names.CERT_SECRET}).",
        ),
    ] = None,
    key_secret: Annotated[
        str | None,
        typer.Option(
            "--key-secret",
            envvar=ENV_KEY_SECRET,
            help=f"Secret the operator keeps its private key in (default {names.KEY_SECRET}).",
        ),
    ] = None,
    nonce_secret: Annotated[
        str | None,
        typer.Option(
            "--nonce-secret",
            envvar=ENV_NONCE_SECRET,
            help=f"Secret with the registration nonce JWT (default {names.NONCE_SECRET}).",
        ),
    ] = None,
    config_poll_interval: Annotated[
        str, typer.Option("--config-poll-interval", help="How often --config is re-read.")
    ] = "10s",
    health_addr: Annotated[
        str,
        typer.Option("--health-addr", "--health-probe-bind-address", help="/healthz, /readyz and /metrics."),
    ] = DEFAULT_HEALTH_ADDR,
    metrics_bind_address: Annotated[
        str | None,
        typer.Option(
            "--metrics-bind-address",
            help="Upstream's flag, ignored (logged): /metrics is served on --health-addr.",
        ),
    ] = None,
    leader_elect: Annotated[
        bool,
        typer.Option(
            "--leader-elect/--no-leader-elect",
            help="Lease election among replicas (also --leader-elect=true|false).",
        ),
    ] = True,
    leader_elect_lease: Annotated[
        str, typer.Option("--leader-elect-lease", help="Name of the election Lease.")
    ] = names.LEADER_ELECTION_LEASE,
    leader_elect_lease_duration: Annotated[
        str,
        typer.Option("--leader-elect-lease-duration", help="How long a standby waits for a silent leader."),
    ] = "15s",
    leader_elect_renew_interval: Annotated[
        str, typer.Option("--leader-elect-renew-interval", help="How often the leader renews the Lease.")
    ] = "5s",
    leader_elect_renew_deadline: Annotated[
        str,
        typer.Option(
            "--leader-elect-renew-deadline", help="A leader that cannot renew this long stops acting."
        ),
    ] = "10s",
    disable_webhooks: Annotated[
        bool, typer.Option("--disable-webhooks", help="Run no webhook server.")
    ] = False,
    webhook_addr: Annotated[
        str, typer.Option("--webhook-addr", help="HOST:PORT the webhook server listens on.")
    ] = DEFAULT_WEBHOOK_ADDR,
    webhook_cert: Annotated[
        Path | None, typer.Option("--webhook-cert", help="Serving certificate (PEM).")
    ] = None,
    webhook_key: Annotated[Path | None, typer.Option("--webhook-key", help="Its private key (PEM).")] = None,
    webhook_self_signed: Annotated[
        bool, typer.Option("--webhook-self-signed", help="Serve with a generated self-signed certificate.")
    ] = False,
    webhook_managed: Annotated[
        str | None,
        typer.Option(
            "--webhook-managed", help="Create/patch this ValidatingWebhookConfiguration with url + caBundle."
        ),
    ] = None,
    webhook_host: Annotated[
        str | None, typer.Option("--webhook-host", help="Host in the webhook URL the API server calls.")
    ] = None,
    resync_interval: Annotated[
        str, typer.Option("--resync-interval", help="How often every shard's groups are re-read.")
    ] = "30s",
    unreachable_retry: Annotated[
        str, typer.Option("--unreachable-retry", help="Retry delay when a shard is unreachable.")
    ] = "10s",
    error_retry: Annotated[
        str, typer.Option("--error-retry", help="Retry delay after a shard refused a change.")
    ] = "30s",
    backoff_base: Annotated[
        str, typer.Option("--backoff-base", help="First reconnect delay of the watch streams.")
    ] = "1s",
    backoff_cap: Annotated[
        str, typer.Option("--backoff-cap", help="Longest reconnect delay of the watch streams.")
    ] = "30s",
    drain_poll: Annotated[
        str, typer.Option("--drain-poll", help="How often a node drain checks its pods.")
    ] = "2s",
    drain_fallback: Annotated[
        str, typer.Option("--drain-fallback", help="Drain deadline when the shard gives none.")
    ] = "5m",
    log_format: Annotated[str | None, typer.Option("--log-format", help="json (default) or text.")] = None,
    verbose: Annotated[bool, typer.Option("--debug", "--verbose", "-v", help="Debug logging.")] = False,
    zap_log_level: Annotated[
        str | None,
        typer.Option("--zap-log-level", help="Upstream's log level: debug, info, warn, error, panic or N>0."),
    ] = None,
    zap_encoder: Annotated[
        str | None, typer.Option("--zap-encoder", help="Upstream's log encoding: json or console (text).")
    ] = None,
    zap_devel: Annotated[
        bool, typer.Option("--zap-devel", help="Upstream's development logging: debug level, text.")
    ] = False,
    zap_stacktrace_level: Annotated[
        str | None, typer.Option("--zap-stacktrace-level", help="Upstream's flag, ignored (logged).")
    ] = None,
    zap_time_encoding: Annotated[
        str | None, typer.Option("--zap-time-encoding", help="Upstream's flag, ignored (logged).")
    ] = None,
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=print_version("nstance-operator"), is_eager=True, help=VERSION_HELP
        ),
    ] = False,
) -> None:
    """Run the operator."""
    try:
        settings = build_settings(
            config_file=config,
            kubeconfig=kubeconfig,
            namespace=namespace,
            config_configmap=config_configmap,
            ca_configmap=ca_configmap,
            cert_secret=cert_secret,
            key_secret=key_secret,
            nonce_secret=nonce_secret,
            config_poll_interval=config_poll_interval,
            health_addr=health_addr,
            leader_elect=leader_elect,
            leader_elect_lease=leader_elect_lease,
            leader_elect_lease_duration=leader_elect_lease_duration,
            leader_elect_renew_interval=leader_elect_renew_interval,
            leader_elect_renew_deadline=leader_elect_renew_deadline,
            disable_webhooks=disable_webhooks,
            webhook_addr=webhook_addr,
            webhook_cert=webhook_cert,
            webhook_key=webhook_key,
            webhook_self_signed=webhook_self_signed,
            webhook_managed=webhook_managed,
            webhook_host=webhook_host,
            resync_interval=resync_interval,
            unreachable_retry=unreachable_retry,
            error_retry=error_retry,
            backoff_base=backoff_base,
            backoff_cap=backoff_cap,
            drain_poll=drain_poll,
            drain_fallback=drain_fallback,
            log_format=log_format,
            verbose=verbose,
            metrics_bind_address=metrics_bind_address,
            zap_log_level=zap_log_level,
            zap_encoder=zap_encoder,
            zap_devel=zap_devel,
            zap_stacktrace_level=zap_stacktrace_level,
            zap_time_encoding=zap_time_encoding,
        )
        if settings.config_file is not None:
            load_config_file(settings.config_file)
    except (SettingsError, ConfigError) as exc:
        typer.echo(f"nstance-operator: {exc}", err=True)
        raise typer.Exit(2) from None
    setup_logging(settings.log_format, settings.log_level)
    for line in settings.ignored:
        log.warning("%s", line)
    try:
        code = asyncio.run(run_until_stopped(settings))
    except SettingsError as exc:
        typer.echo(f"nstance-operator: {exc}", err=True)
        code = 2
    except KeyboardInterrupt:
        code = 0
    raise typer.Exit(code)


def main() -> None:
    """Console-script entry point: Go's flag syntax rewritten for typer, then the command."""
    declared = [p for p in typer.main.get_command(app).params if isinstance(p, typer.core.TyperOption)]
    try:
        sys.argv[1:] = go_style_argv(sys.argv[1:], declared)
    except GoFlagError as exc:
        print(f"nstance-operator: {exc}", file=sys.stderr)
        sys.exit(2)
    run_app(app, "nstance-operator")
