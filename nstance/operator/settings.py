"""Runtime settings of nstance-operator: what the command line and the environment decide.

Responsible for turning raw flag and environment values (strings, as typed) into one frozen
``OperatorSettings``: the namespace, the names of the ConfigMaps and Secrets the operator reads and
writes, where the operator config comes from, the health and webhook listeners, Lease election
parameters, the loop timings and the log level and format. Every value is checked here; a bad one
raises ``SettingsError`` whose message names the flag (and its environment variable) and says what is
accepted, so the CLI can print one line and exit 2.

Upstream's flags (those of its ``main.go`` and controller-runtime's ``zap`` options, which its Helm
chart passes) are mapped to ours: ``--zap-log-level``, ``--zap-encoder`` and ``--zap-devel`` to the log
level and format; ``--metrics-bind-address`` (unless ``0`` or the health address) to a second
listener serving ``/metrics``. Those with no equivalent here (``--zap-stacktrace-level``,
``--zap-time-encoding``) are checked as upstream checks them and listed in ``OperatorSettings.ignored``,
one line each, for the CLI to log.

Must not: talk to Kubernetes or the shards, read the operator config file, or start anything.
"""

from __future__ import annotations

import logging
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from nstance.core.durations import parse_duration
from nstance.core.errors import InvalidArgument
from nstance.operator.context import Timings
from nstance.operator.crds import names

SERVICE_ACCOUNT_NAMESPACE: Final = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
DEFAULT_WEBHOOK_CERT_DIR: Final = Path("/tmp/k8s-webhook-server/serving-certs")
DEFAULT_HEALTH_ADDR: Final = ":8081"
DEFAULT_WEBHOOK_ADDR: Final = "0.0.0.0:9443"
LOG_FORMATS: Final = ("json", "text")

# controller-runtime's zap flags (pkg/log/zap, which upstream's main.go binds): accepted values.
ZAP_LOG_LEVELS: Final = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,  # not controller-runtime's, but upstream's chart lists it among logLevel's
    "error": logging.ERROR,
    "panic": logging.CRITICAL,
}
ZAP_ENCODERS: Final = {"json": "json", "console": "text"}
ZAP_STACKTRACE_LEVELS: Final = ("info", "error", "panic")
ZAP_TIME_ENCODINGS: Final = ("epoch", "millis", "nano", "iso8601", "rfc3339", "rfc3339nano")
METRICS_DISABLED: Final = "0"
"""``--metrics-bind-address`` value that turns upstream's separate metrics listener off (its default)."""

# Environment variables (upstream names where upstream has them, reference §5.1).
ENV_NAMESPACE: Final = "NSTANCE_NAMESPACE"
ENV_CONFIG_CONFIGMAP: Final = "NSTANCE_CONFIG_CONFIGMAP"
ENV_CA_CONFIGMAP: Final = "NSTANCE_CA_CONFIGMAP"
ENV_CERT_SECRET: Final = "NSTANCE_CERT_SECRET"
ENV_KEY_SECRET: Final = "NSTANCE_KEY_SECRET"
ENV_NONCE_SECRET: Final = "NSTANCE_NONCE_SECRET"
ENV_WEBHOOK_CERT_DIR: Final = "NSTANCE_WEBHOOK_CERT_DIR"
ENV_WEBHOOK_ENABLED: Final = "NSTANCE_WEBHOOK_ENABLED"
ENV_WEBHOOK_PORT: Final = "NSTANCE_WEBHOOK_PORT"
ENV_POD_NAME: Final = "POD_NAME"


class SettingsError(InvalidArgument):
    """A flag or environment value is unusable; the message names it and says what is accepted."""


@dataclass(frozen=True)
class Address:
    """A listener address: ``host`` ("" = every interface) and ``port``."""

    host: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


@dataclass(frozen=True)
class LeaderElection:
    """Lease-based election of the one active operator replica."""

    enabled: bool = True
    lease_name: str = names.LEADER_ELECTION_LEASE
    lease_duration: float = 15.0
    """Seconds a standby waits without seeing the Lease renewed before it takes over."""
    renew_interval: float = 5.0
    """Seconds between renewals by the leader (and between polls by a standby)."""
    renew_deadline: float = 10.0
    """Seconds after its last successful renewal at which a leader that cannot renew stops acting."""
    holder_identity: str = ""


@dataclass(frozen=True)
class WebhookSettings:
    """The validating webhook server kopf runs (NstanceMachinePool updates)."""

    enabled: bool = True
    listen: Address = Address("0.0.0.0", names.WEBHOOK_PORT)
    cert_file: Path | None = None
    key_file: Path | None = None
    self_signed: bool = False
    managed: str | None = None
    """Name of a ValidatingWebhookConfiguration kopf creates and keeps current (url + caBundle)."""
    host: str | None = None
    """Host name or address the API server uses to reach the webhook (self-signed / managed mode)."""


@dataclass(frozen=True)
class OperatorSettings:
    """Everything fixed for the life of one operator process."""

    namespace: str
    config_file: Path | None = None
    config_configmap: str = names.CONFIG_CONFIGMAP
    config_key: str = names.CONFIG_KEY
    config_poll_interval: float = 10.0
    kubeconfig: str | None = None
    ca_configmap: str = names.CA_CONFIGMAP
    ca_key: str = names.CA_KEY
    cert_secret: str = names.CERT_SECRET
    key_secret: str = names.KEY_SECRET
    nonce_secret: str = names.NONCE_SECRET
    health: Address = Address("", names.HEALTH_PORT)
    #: ``--metrics-bind-address`` when it names another address than ``health``: ``/metrics`` is also
    #: served there (upstream's chart exposes port 8080 for it); None: only on the health address.
    metrics: Address | None = None
    leader: LeaderElection = field(default_factory=LeaderElection)
    webhook: WebhookSettings = field(default_factory=WebhookSettings)
    timings: Timings = field(default_factory=Timings)
    log_format: str = "json"
    log_level: int = logging.INFO
    ignored: tuple[str, ...] = ()
    """One line for each upstream flag that was accepted but has no effect here, to be logged."""


# --- parsing helpers -------------------------------------------------------------------------------


def parse_address(text: str, flag: str, *, default_host: str = "", any_port: bool = False) -> Address:
    """``HOST:PORT``, ``:PORT`` or ``[IPV6]:PORT``; raise SettingsError naming ``flag``.

    With ``any_port``, port 0 is accepted and means "a free port chosen at start"."""
    raw = text.strip()
    host, sep, port = raw.rpartition(":")
    if not sep:
        raise SettingsError(f"{flag} {text!r}: expected HOST:PORT or :PORT (e.g. :8081)")
    if host.startswith("[") or host.endswith("]"):
        if not (host.startswith("[") and host.endswith("]")):
            raise SettingsError(f"{flag} {text!r}: unbalanced brackets around the IPv6 address")
        host = host[1:-1]
    elif ":" in host:
        raise SettingsError(f"{flag} {text!r}: write an IPv6 address in brackets, e.g. [::]:8081")
    lowest = 0 if any_port else 1
    if not port.isdigit() or not lowest <= int(port) < 65536:
        raise SettingsError(f"{flag} {text!r}: port {port!r} is not a number between {lowest} and 65535")
    return Address(host or default_host, int(port))


def parse_seconds(text: str, flag: str, *, allow_zero: bool = False) -> float:
    """A Go-style duration (``30s``, ``5m``, ``1h30m``, ``250ms``) in seconds."""
    try:
        value = parse_duration(text).total_seconds()
    except InvalidArgument as exc:
        raise SettingsError(f"{flag}: {exc}") from None
    if value < 0 or (value == 0 and not allow_zero):
        raise SettingsError(f"{flag} {text!r}: must be a positive duration such as 30s")
    return value


def _k8s_name(value: str, flag: str) -> str:
    """A DNS-1123 subdomain name as Kubernetes requires for ConfigMaps, Secrets and Leases."""
    if not value or len(value) > 253:
        raise SettingsError(f"{flag} {value!r}: must be 1 to 253 characters")
    allowed = set("abcdefghijklmnopqrstuvwxyz0123456789-.")
    if set(value) - allowed or not value[0].isalnum() or not value[-1].isalnum():
        raise SettingsError(
            f"{flag} {value!r}: must be a Kubernetes object name (lowercase letters, digits, '-' and '.', "
            "starting and ending with a letter or digit)"
        )
    return value


def _namespace_name(value: str, flag: str) -> str:
    """An RFC 1123 label, as Kubernetes requires for namespaces."""
    allowed = set("abcdefghijklmnopqrstuvwxyz0123456789-")
    if not value or len(value) > 63 or set(value) - allowed or value[0] == "-" or value[-1] == "-":
        raise SettingsError(
            f"{flag} {value!r}: must be a Kubernetes namespace name (at most 63 lowercase letters, digits "
            "and '-', starting and ending with a letter or digit)"
        )
    return value


def parse_zap_log_level(text: str) -> int:
    """controller-runtime's ``--zap-log-level`` as a ``logging`` level.

    A name (any case), or an integer above 0 (a debug verbosity, V(n) in Go): DEBUG, the finest level
    Python's logging has."""
    level = ZAP_LOG_LEVELS.get(text.lower())
    if level is not None:
        return level
    if re.fullmatch(r"[+-]?[0-9]+", text) and int(text) > 0:
        return logging.DEBUG
    raise SettingsError(
        f"--zap-log-level {text!r}: choose one of {', '.join(ZAP_LOG_LEVELS)} or an integer above 0"
    )


def _zap_choice(text: str, flag: str, accepted: tuple[str, ...]) -> str:
    value = text.lower()
    if value not in accepted:
        raise SettingsError(f"{flag} {text!r}: choose one of {', '.join(accepted)}")
    return value


def _logging(
    *,
    log_format: str | None,
    verbose: bool,
    zap_log_level: str | None,
    zap_encoder: str | None,
    zap_devel: bool,
) -> tuple[str, int]:
    """``(log format, log level)``: our flags first, then upstream's zap flags, then the defaults.

    ``--zap-devel`` means what controller-runtime's development mode means: debug level and the
    human-readable encoder, unless a level or format is given."""
    if log_format is None:
        if zap_encoder is not None:
            log_format = ZAP_ENCODERS[_zap_choice(zap_encoder, "--zap-encoder", tuple(ZAP_ENCODERS))]
        else:
            log_format = "text" if zap_devel else "json"
    elif zap_encoder is not None:
        _zap_choice(zap_encoder, "--zap-encoder", tuple(ZAP_ENCODERS))
    if log_format not in LOG_FORMATS:
        raise SettingsError(f"--log-format {log_format!r}: choose one of {', '.join(LOG_FORMATS)}")
    level = parse_zap_log_level(zap_log_level) if zap_log_level is not None else None
    if verbose:
        level = logging.DEBUG
    elif level is None:
        level = logging.DEBUG if zap_devel else logging.INFO
    return log_format, level


def metrics_address(metrics_bind_address: str | None, health: Address) -> Address | None:
    """Where ``/metrics`` is served besides the health address: ``--metrics-bind-address`` unless it is
    unset, ``0`` (upstream's "off") or the health address itself."""
    if metrics_bind_address is None or metrics_bind_address.strip() == METRICS_DISABLED:
        return None
    metrics = parse_address(metrics_bind_address, "--metrics-bind-address", any_port=True)
    return None if metrics == health else metrics


def _ignored_upstream_flags(
    *,
    zap_stacktrace_level: str | None,
    zap_time_encoding: str | None,
) -> tuple[str, ...]:
    """A line for each upstream flag given that changes nothing here (its value checked first)."""
    lines: list[str] = []
    if zap_stacktrace_level is not None:
        _zap_choice(zap_stacktrace_level, "--zap-stacktrace-level", ZAP_STACKTRACE_LEVELS)
        lines.append(
            f"--zap-stacktrace-level={zap_stacktrace_level} is ignored: a traceback is logged with each "
            "unexpected error, whatever its level"
        )
    if zap_time_encoding is not None:
        _zap_choice(zap_time_encoding, "--zap-time-encoding", ZAP_TIME_ENCODINGS)
        lines.append(
            f"--zap-time-encoding={zap_time_encoding} is ignored: the log time format is fixed (ISO 8601 "
            "UTC in JSON logs)"
        )
    return tuple(lines)


def file_problem(path: Path) -> str | None:
    """Why ``path`` cannot be read as a file (missing, or a directory), or None."""
    if path.is_file():
        return None
    return "is a directory, not a file" if path.is_dir() else "no such file"


def default_namespace(path: Path = SERVICE_ACCOUNT_NAMESPACE) -> str:
    """The pod's namespace (from its service account mount), else ``default``."""
    try:
        value = path.read_text().strip()
    except OSError:
        return "default"
    return value or "default"


def default_holder_identity() -> str:
    """``<pod name or host name>_<8 random hex digits>``: unique even when two pods share a name."""
    base = os.environ.get(ENV_POD_NAME) or socket.gethostname() or "nstance-operator"
    return f"{base}_{os.urandom(4).hex()}"


def _env_or(value: str | None, env: str, default: str, environ: Mapping[str, str]) -> str:
    return value or environ.get(env) or default


def _webhook_files(
    cert: Path | None, key: Path | None, cert_dir: Path | None
) -> tuple[Path | None, Path | None]:
    if (cert is None) != (key is None):
        raise SettingsError("--webhook-cert and --webhook-key must be given together")
    if cert is not None and key is not None:
        for path, flag in ((cert, "--webhook-cert"), (key, "--webhook-key")):
            problem = file_problem(path)
            if problem:
                raise SettingsError(f"{flag} {path}: {problem}")
        return cert, key
    directory = cert_dir or DEFAULT_WEBHOOK_CERT_DIR
    default_cert, default_key = directory / "tls.crt", directory / "tls.key"
    if default_cert.is_file() and default_key.is_file():
        return default_cert, default_key
    return None, None


def build_settings(
    *,
    config_file: Path | None = None,
    kubeconfig: str | None = None,
    namespace: str | None = None,
    config_configmap: str | None = None,
    ca_configmap: str | None = None,
    cert_secret: str | None = None,
    key_secret: str | None = None,
    nonce_secret: str | None = None,
    config_poll_interval: str = "10s",
    health_addr: str = DEFAULT_HEALTH_ADDR,
    leader_elect: bool = True,
    leader_elect_lease: str = names.LEADER_ELECTION_LEASE,
    leader_elect_lease_duration: str = "15s",
    leader_elect_renew_interval: str = "5s",
    leader_elect_renew_deadline: str = "10s",
    holder_identity: str | None = None,
    disable_webhooks: bool = False,
    webhook_addr: str = DEFAULT_WEBHOOK_ADDR,
    webhook_cert: Path | None = None,
    webhook_key: Path | None = None,
    webhook_cert_dir: Path | None = None,
    webhook_self_signed: bool = False,
    webhook_managed: str | None = None,
    webhook_host: str | None = None,
    resync_interval: str = "30s",
    unreachable_retry: str = "10s",
    error_retry: str = "30s",
    backoff_base: str = "1s",
    backoff_cap: str = "30s",
    drain_poll: str = "2s",
    drain_fallback: str = "5m",
    log_format: str | None = None,
    verbose: bool = False,
    metrics_bind_address: str | None = None,
    zap_log_level: str | None = None,
    zap_encoder: str | None = None,
    zap_devel: bool = False,
    zap_stacktrace_level: str | None = None,
    zap_time_encoding: str | None = None,
    environ: Mapping[str, str] | None = None,
    service_account_namespace: Path = SERVICE_ACCOUNT_NAMESPACE,
) -> OperatorSettings:
    """Check every raw value and assemble ``OperatorSettings``; raise SettingsError naming the flag."""
    env: Mapping[str, str] = os.environ if environ is None else environ
    ns = namespace or env.get(ENV_NAMESPACE) or default_namespace(service_account_namespace)
    ns = _namespace_name(ns, f"namespace (--namespace / {ENV_NAMESPACE})")

    problem = file_problem(config_file) if config_file is not None else None
    if problem:
        raise SettingsError(f"--config {config_file}: {problem}")

    object_names = {
        "config_configmap": (config_configmap, ENV_CONFIG_CONFIGMAP, names.CONFIG_CONFIGMAP),
        "ca_configmap": (ca_configmap, ENV_CA_CONFIGMAP, names.CA_CONFIGMAP),
        "cert_secret": (cert_secret, ENV_CERT_SECRET, names.CERT_SECRET),
        "key_secret": (key_secret, ENV_KEY_SECRET, names.KEY_SECRET),
        "nonce_secret": (nonce_secret, ENV_NONCE_SECRET, names.NONCE_SECRET),
    }
    resolved: dict[str, str] = {}
    for attr, (given, env_name, default) in object_names.items():
        value = _env_or(given, env_name, default, env)
        resolved[attr] = _k8s_name(value, f"{env_name} / --{attr.replace('_', '-')}")

    lease_duration = parse_seconds(leader_elect_lease_duration, "--leader-elect-lease-duration")
    renew_interval = parse_seconds(leader_elect_renew_interval, "--leader-elect-renew-interval")
    renew_deadline = parse_seconds(leader_elect_renew_deadline, "--leader-elect-renew-deadline")
    if not renew_interval < renew_deadline < lease_duration:
        raise SettingsError(
            "--leader-elect-renew-interval < --leader-elect-renew-deadline < --leader-elect-lease-duration "
            f"is required (got {leader_elect_renew_interval}, {leader_elect_renew_deadline}, "
            f"{leader_elect_lease_duration})"
        )
    leader = LeaderElection(
        enabled=leader_elect,
        lease_name=_k8s_name(leader_elect_lease, "--leader-elect-lease"),
        lease_duration=lease_duration,
        renew_interval=renew_interval,
        renew_deadline=renew_deadline,
        holder_identity=holder_identity or default_holder_identity(),
    )

    enabled_env = env.get(ENV_WEBHOOK_ENABLED, "").strip().lower()
    if enabled_env in ("false", "0", "no", "off"):
        disable_webhooks = True
    elif enabled_env not in ("", "true", "1", "yes", "on"):
        raise SettingsError(f"{ENV_WEBHOOK_ENABLED}={enabled_env!r}: expected true or false")
    if webhook_addr == DEFAULT_WEBHOOK_ADDR and env.get(ENV_WEBHOOK_PORT):
        webhook_addr = f"0.0.0.0:{env[ENV_WEBHOOK_PORT]}"
    cert_dir = webhook_cert_dir or (
        Path(env[ENV_WEBHOOK_CERT_DIR]) if env.get(ENV_WEBHOOK_CERT_DIR) else None
    )
    cert_file: Path | None = None
    key_file: Path | None = None
    if not webhook_self_signed:
        cert_file, key_file = _webhook_files(webhook_cert, webhook_key, cert_dir)
    elif webhook_cert is not None or webhook_key is not None:
        raise SettingsError(
            "--webhook-self-signed excludes --webhook-cert/--webhook-key; give one or the other"
        )
    if webhook_managed is not None:
        _k8s_name(webhook_managed, "--webhook-managed")
        if "." not in webhook_managed:
            # kopf names each webhook "<id>.<this value>"; Kubernetes wants at least three labels.
            raise SettingsError(
                f"--webhook-managed {webhook_managed!r}: the webhooks are named '<id>.{webhook_managed}' "
                "and Kubernetes requires webhook names of at least three dot-separated parts: use a "
                "domain such as 'webhooks.example.com'"
            )
    if not disable_webhooks and not webhook_self_signed and cert_file is None:
        raise SettingsError(
            "the webhook server needs a certificate: pass --webhook-cert and --webhook-key (PEM files), put "
            f"tls.crt and tls.key in {cert_dir or DEFAULT_WEBHOOK_CERT_DIR}, use --webhook-self-signed, or "
            "--disable-webhooks"
        )
    webhook = WebhookSettings(
        enabled=not disable_webhooks,
        listen=parse_address(webhook_addr, "--webhook-addr", default_host="0.0.0.0", any_port=True),
        cert_file=cert_file,
        key_file=key_file,
        self_signed=webhook_self_signed,
        managed=webhook_managed,
        host=webhook_host or None,
    )

    backoff_base_s = parse_seconds(backoff_base, "--backoff-base")
    backoff_cap_s = parse_seconds(backoff_cap, "--backoff-cap")
    if backoff_cap_s < backoff_base_s:
        raise SettingsError(
            f"--backoff-cap {backoff_cap} must not be shorter than --backoff-base {backoff_base}"
        )
    timings = Timings(
        resync=parse_seconds(resync_interval, "--resync-interval"),
        unreachable_retry=parse_seconds(unreachable_retry, "--unreachable-retry"),
        error_retry=parse_seconds(error_retry, "--error-retry"),
        backoff_base=backoff_base_s,
        backoff_cap=backoff_cap_s,
        drain_poll=parse_seconds(drain_poll, "--drain-poll"),
        drain_fallback=parse_seconds(drain_fallback, "--drain-fallback"),
    )

    log_format, log_level = _logging(
        log_format=log_format,
        verbose=verbose,
        zap_log_level=zap_log_level,
        zap_encoder=zap_encoder,
        zap_devel=zap_devel,
    )
    health = parse_address(health_addr, "--health-addr")
    metrics = metrics_address(metrics_bind_address, health)
    ignored = _ignored_upstream_flags(
        zap_stacktrace_level=zap_stacktrace_level,
        zap_time_encoding=zap_time_encoding,
    )

    return OperatorSettings(
        namespace=ns,
        config_file=config_file,
        config_configmap=resolved["config_configmap"],
        config_poll_interval=parse_seconds(config_poll_interval, "--config-poll-interval"),
        kubeconfig=kubeconfig or None,
        ca_configmap=resolved["ca_configmap"],
        cert_secret=resolved["cert_secret"],
        key_secret=resolved["key_secret"],
        nonce_secret=resolved["nonce_secret"],
        health=health,
        metrics=metrics,
        leader=leader,
        webhook=webhook,
        timings=timings,
        log_format=log_format,
        log_level=log_level,
        ignored=ignored,
    )
