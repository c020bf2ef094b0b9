"""Agent configuration: turn ``NSTANCE_*`` environment variables (and ``--instance-dir``) into AgentConfig.

Responsible for names, defaults and validation of every setting (upstream §6b plus our additions).
Pure: it reads only the mapping it is given (never ``os.environ`` itself) and touches no files, so the
caller decides where values come from. A bad value raises ``ConfigError`` naming the variable.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from nstance.core.durations import parse_duration
from nstance.core.errors import InvalidArgument
from nstance.core.hostport import hostname_problem, split_host_port
from nstance.core.ids import validate_puid

DEFAULT_IDENTITY_DIR = Path("/opt/nstance-agent/identity")
DEFAULT_KEYS_DIR = Path("/opt/nstance-agent/keys")
DEFAULT_RECV_DIR = Path("/opt/nstance-agent/recv")
DEFAULT_REPORT_INTERVAL = 60.0
DEFAULT_SPOT_POLL_INTERVAL = 2.0
PROVIDERS = ("aws", "google", "proxmox", "local")
#: Providers whose platform never reclaims machines, so the spot poller stays off.
NO_SPOT_PROVIDERS = frozenset({"proxmox", "local"})


class ConfigError(InvalidArgument):
    """A setting is missing or malformed; ``variable`` names it."""

    def __init__(self, variable: str, message: str) -> None:
        super().__init__(f"{variable}: {message}")
        self.variable = variable


@dataclass(frozen=True, slots=True)
class AgentConfig:
    """Everything the agent needs to know before it starts; durations are seconds."""

    instance_id: str
    registration_addr: str
    agent_addr: str
    identity_dir: Path
    keys_dir: Path
    recv_dir: Path
    identity_mode: int = 0o600
    keys_mode: int = 0o640
    recv_mode: int = 0o640
    hostname: str = ""
    ipv4: str = ""
    ipv6: str = ""
    report_interval: float = DEFAULT_REPORT_INTERVAL
    spot_poll_interval: float = DEFAULT_SPOT_POLL_INTERVAL
    health_addr: str = ""
    provider: str = ""
    metadata_url: str = ""
    debug: bool = False

    @property
    def ca_path(self) -> Path:
        return self.identity_dir / "ca.crt"

    @property
    def nonce_path(self) -> Path:
        return self.identity_dir / "nonce.jwt"

    @property
    def key_path(self) -> Path:
        return self.identity_dir / "identity.key"

    @property
    def cert_path(self) -> Path:
        return self.identity_dir / "identity.crt"

    @property
    def config_hash_path(self) -> Path:
        return self.identity_dir / "config.hash"


def _get(env: Mapping[str, str], name: str) -> str:
    return env.get(f"NSTANCE_{name}", "").strip()


def _required(env: Mapping[str, str], name: str, fallback: str = "") -> str:
    value = _get(env, name) or fallback
    if not value:
        raise ConfigError(f"NSTANCE_{name}", "is required but not set")
    return value


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    raw = _get(env, name)
    if not raw:
        return default
    try:
        value = parse_duration(raw).total_seconds()
    except InvalidArgument as exc:
        raise ConfigError(f"NSTANCE_{name}", str(exc)) from exc
    if value < 0:
        raise ConfigError(f"NSTANCE_{name}", f"must not be negative (got {raw!r})")
    return value


def _mode(env: Mapping[str, str], name: str, default: int) -> int:
    raw = _get(env, name)
    if not raw:
        return default
    if not re.fullmatch(r"0?[0-7]{3}|0o[0-7]{3}", raw):
        raise ConfigError(f"NSTANCE_{name}", f"must be an octal file mode like 0640 (got {raw!r})")
    return int(raw.removeprefix("0o"), 8)


def _check_address(name: str, value: str) -> str:
    """``value`` if it is ``host:port`` (``[v6]:port``, port 1 to 65535), as upstream's ``addr`` check."""
    if any(c.isspace() for c in value) or split_host_port(value) is None:
        raise ConfigError(
            f"NSTANCE_{name}",
            f"must be host:port with a port from 1 to 65535, an IPv6 host in brackets (got {value!r})",
        )
    return value


def _address(env: Mapping[str, str], name: str, fallback: str = "") -> str:
    return _check_address(name, _required(env, name, fallback))


def _instance_id(env: Mapping[str, str], fallback: str) -> str:
    value = _required(env, "INSTANCE_ID", fallback)
    try:
        validate_puid(value)
    except InvalidArgument as exc:
        raise ConfigError("NSTANCE_INSTANCE_ID", f"{exc} (the server writes it into the userdata)") from None
    return value


def _ip(env: Mapping[str, str], name: str, version: int) -> str:
    raw = _get(env, name)
    if not raw:
        return ""
    try:
        parsed = ipaddress.ip_address(raw)
    except ValueError:
        parsed = None
    if parsed is None or parsed.version != version:
        raise ConfigError(f"NSTANCE_{name}", f"must be an IPv{version} address (got {raw!r})")
    return raw


def _hostname(env: Mapping[str, str]) -> str:
    """The configured host name, checked as the server checks the one a registration reports."""
    raw = _get(env, "INSTANCE_HOSTNAME")
    if raw and (problem := hostname_problem(raw)) is not None:
        raise ConfigError("NSTANCE_INSTANCE_HOSTNAME", f"{raw[:64]!r} {problem}")
    return raw


def _bool(env: Mapping[str, str], name: str) -> bool:
    raw = _get(env, name).lower()
    if raw in ("", "0", "false", "no", "off"):
        return False
    if raw in ("1", "true", "yes", "on"):
        return True
    raise ConfigError(f"NSTANCE_{name}", f"must be true or false (got {raw!r})")


def load_config(
    env: Mapping[str, str],
    *,
    instance_dir: Path | None = None,
    instance_info: Mapping[str, object] | None = None,
) -> AgentConfig:
    """Build the configuration from ``env``.

    With ``instance_dir`` (the local provider's ``--instance-dir``) the identity, keys and receive
    directories default to ``DIR/identity``, ``DIR/keys`` and ``DIR/recv``, the provider defaults to
    ``local``, and missing addresses or instance ID fall back to ``instance_info`` (the directory's
    ``instance.json``). Raises ConfigError naming the first bad variable.
    """
    info = instance_info or {}

    def fallback(key: str) -> str:
        value = info.get(key)
        return value if isinstance(value, str) else ""

    instance_id = _instance_id(env, fallback("instance_id"))
    registration_addr = _address(env, "SERVER_REGISTRATION_ADDR", fallback("server_registration_addr"))
    agent_addr = _address(env, "SERVER_AGENT_ADDR", fallback("server_agent_addr"))

    def directory(name: str, default: Path, local_name: str) -> Path:
        raw = _get(env, name)
        if raw:
            return Path(raw)
        return instance_dir / local_name if instance_dir is not None else default

    provider = _get(env, "PROVIDER").lower()
    if provider == "gcp":
        provider = "google"
    if provider and provider not in PROVIDERS:
        raise ConfigError("NSTANCE_PROVIDER", f"must be one of {', '.join(PROVIDERS)} (got {provider!r})")
    if not provider and instance_dir is not None:
        provider = "local"

    health_addr = _get(env, "HEALTH_ADDR")
    if health_addr:
        _check_address("HEALTH_ADDR", health_addr)
    metadata_url = _get(env, "METADATA_URL").rstrip("/")
    if metadata_url and not metadata_url.startswith(("http://", "https://")):
        raise ConfigError("NSTANCE_METADATA_URL", f"must be an http:// URL (got {metadata_url!r})")
    spot_poll = _seconds(env, "SPOT_POLL_INTERVAL", DEFAULT_SPOT_POLL_INTERVAL)
    if spot_poll == 0:
        raise ConfigError("NSTANCE_SPOT_POLL_INTERVAL", "must be greater than zero")

    return AgentConfig(
        instance_id=instance_id,
        registration_addr=registration_addr,
        agent_addr=agent_addr,
        identity_dir=directory("IDENTITY_DIR", DEFAULT_IDENTITY_DIR, "identity"),
        keys_dir=directory("KEYS_DIR", DEFAULT_KEYS_DIR, "keys"),
        recv_dir=directory("RECV_DIR", DEFAULT_RECV_DIR, "recv"),
        identity_mode=_mode(env, "IDENTITY_MODE", 0o600),
        keys_mode=_mode(env, "KEYS_MODE", 0o640),
        recv_mode=_mode(env, "RECV_MODE", 0o640),
        hostname=_hostname(env),
        ipv4=_ip(env, "INSTANCE_IPV4", 4),
        ipv6=_ip(env, "INSTANCE_IPV6", 6),
        report_interval=_seconds(env, "REPORT_INTERVAL", DEFAULT_REPORT_INTERVAL),
        spot_poll_interval=spot_poll,
        health_addr=health_addr,
        provider=provider,
        metadata_url=metadata_url,
        debug=_bool(env, "DEBUG"),
    )
