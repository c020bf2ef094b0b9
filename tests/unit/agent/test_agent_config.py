"""Agent settings from NSTANCE_* variables: defaults, the local provider's instance directory, and errors
that name the variable."""

from __future__ import annotations

from pathlib import Path

import pytest

from nstance.agent.config import ConfigError, load_config

WEB_1 = "web06h1me03z9srk7h6t0f09cb1f4"
WEB_2 = "web06h1me03z9srnc5jf1kh3entkm"
BASE = {
    "NSTANCE_INSTANCE_ID": WEB_1,
    "NSTANCE_SERVER_REGISTRATION_ADDR": "10.0.0.1:8992",
    "NSTANCE_SERVER_AGENT_ADDR": "10.0.0.1:8994",
}


def test_defaults_follow_upstream() -> None:
    config = load_config(BASE)
    assert config.identity_dir == Path("/opt/nstance-agent/identity")
    assert config.recv_dir == Path("/opt/nstance-agent/recv")
    assert config.report_interval == 60.0
    assert config.spot_poll_interval == 2.0
    assert config.recv_mode == 0o640
    assert config.identity_mode == 0o600
    assert config.health_addr == ""
    assert config.provider == ""


def test_durations_modes_and_provider_are_parsed() -> None:
    env = BASE | {
        "NSTANCE_REPORT_INTERVAL": "1m30s",
        "NSTANCE_SPOT_POLL_INTERVAL": "500ms",
        "NSTANCE_RECV_MODE": "0600",
        "NSTANCE_PROVIDER": "GCP",
        "NSTANCE_HEALTH_ADDR": ":8080",
    }
    config = load_config(env)
    assert config.report_interval == 90.0
    assert config.spot_poll_interval == 0.5
    assert config.recv_mode == 0o600
    assert config.provider == "google"
    assert config.health_addr == ":8080"
    assert load_config(BASE | {"NSTANCE_REPORT_INTERVAL": "0"}).report_interval == 0


def test_instance_dir_sets_directories_provider_and_fills_addresses(tmp_path: Path) -> None:
    info = {
        "instance_id": WEB_2,
        "server_registration_addr": "127.0.0.1:1",
        "server_agent_addr": "127.0.0.1:2",
    }
    config = load_config({}, instance_dir=tmp_path, instance_info=info)
    assert config.identity_dir == tmp_path / "identity"
    assert config.keys_dir == tmp_path / "keys"
    assert config.recv_dir == tmp_path / "recv"
    assert config.provider == "local"
    assert (config.instance_id, config.registration_addr, config.agent_addr) == (
        WEB_2,
        "127.0.0.1:1",
        "127.0.0.1:2",
    )
    # the environment wins over instance.json and over the directory defaults
    env = BASE | {"NSTANCE_IDENTITY_DIR": str(tmp_path / "id")}
    config = load_config(env, instance_dir=tmp_path, instance_info=info)
    assert config.instance_id == WEB_1
    assert config.identity_dir == tmp_path / "id"


@pytest.mark.parametrize(
    ("change", "variable"),
    [
        ({"NSTANCE_INSTANCE_ID": ""}, "NSTANCE_INSTANCE_ID"),
        ({"NSTANCE_SERVER_AGENT_ADDR": ""}, "NSTANCE_SERVER_AGENT_ADDR"),
        ({"NSTANCE_SERVER_REGISTRATION_ADDR": "https://x:1"}, "NSTANCE_SERVER_REGISTRATION_ADDR"),
        ({"NSTANCE_REPORT_INTERVAL": "60"}, "NSTANCE_REPORT_INTERVAL"),
        ({"NSTANCE_REPORT_INTERVAL": "2d"}, "NSTANCE_REPORT_INTERVAL"),
        ({"NSTANCE_REPORT_INTERVAL": "-5s"}, "NSTANCE_REPORT_INTERVAL"),
        ({"NSTANCE_SPOT_POLL_INTERVAL": "0s"}, "NSTANCE_SPOT_POLL_INTERVAL"),
        ({"NSTANCE_RECV_MODE": "rw-r-----"}, "NSTANCE_RECV_MODE"),
        ({"NSTANCE_KEYS_MODE": "0999"}, "NSTANCE_KEYS_MODE"),
        ({"NSTANCE_PROVIDER": "azure"}, "NSTANCE_PROVIDER"),
        ({"NSTANCE_HEALTH_ADDR": "localhost"}, "NSTANCE_HEALTH_ADDR"),
        ({"NSTANCE_INSTANCE_ID": "web-1"}, "NSTANCE_INSTANCE_ID"),
        ({"NSTANCE_INSTANCE_IPV4": "2001:db8::1"}, "NSTANCE_INSTANCE_IPV4"),
        ({"NSTANCE_INSTANCE_IPV6": "192.0.2.1"}, "NSTANCE_INSTANCE_IPV6"),
        ({"NSTANCE_INSTANCE_HOSTNAME": "agent host"}, "NSTANCE_INSTANCE_HOSTNAME"),
        ({"NSTANCE_SERVER_AGENT_ADDR": "nstance-server.local"}, "NSTANCE_SERVER_AGENT_ADDR"),
        ({"NSTANCE_SERVER_AGENT_ADDR": "nstance-server.local:0"}, "NSTANCE_SERVER_AGENT_ADDR"),
        ({"NSTANCE_METADATA_URL": "169.254.169.254"}, "NSTANCE_METADATA_URL"),
        ({"NSTANCE_DEBUG": "maybe"}, "NSTANCE_DEBUG"),
    ],
)
def test_bad_values_name_the_variable(change: dict[str, str], variable: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(BASE | change)
    assert info.value.variable == variable
    assert str(info.value).startswith(f"{variable}: ")


# Upstream's own agent config tests (internal/agent/config/config_test.go, TestHealthAddr): which
# health addresses it takes. Its "addr" rule applies to the two server addresses as well.
@pytest.mark.parametrize(
    ("addr", "valid"),
    [
        ("", True),
        ("127.0.0.1:1", True),
        ("0.0.0.0:8080", True),
        ("[::1]:65535", True),
        ("[::]:8080", True),
        ("8080", False),
        ("::1:8080", False),
        ("localhost:0", False),
        ("localhost:65536", False),
        ("localhost:http", False),
    ],
)
def test_health_addresses_upstream_takes_and_refuses(addr: str, valid: bool) -> None:
    env = BASE | {"NSTANCE_HEALTH_ADDR": addr, "NSTANCE_REPORT_INTERVAL": "0"}
    if valid:
        assert load_config(env).health_addr == addr
    else:
        with pytest.raises(ConfigError, match=r"^NSTANCE_HEALTH_ADDR: must be host:port"):
            load_config(env)
    if addr:
        server = BASE | {"NSTANCE_SERVER_REGISTRATION_ADDR": addr}
        if valid:
            assert load_config(server).registration_addr == addr
        else:
            with pytest.raises(ConfigError, match=r"^NSTANCE_SERVER_REGISTRATION_ADDR: "):
                load_config(server)


def test_upstream_overrides_load() -> None:
    # TestLoadOverrides's values, those this agent reads.
    env = BASE | {
        "NSTANCE_SERVER_REGISTRATION_ADDR": "nstance-server.local:8992",
        "NSTANCE_SERVER_AGENT_ADDR": "nstance-server.local:8994",
        "NSTANCE_DEBUG": "true",
        "NSTANCE_IDENTITY_MODE": "0640",
        "NSTANCE_RECV_MODE": "0660",
        "NSTANCE_INSTANCE_HOSTNAME": "agent-host",
        "NSTANCE_INSTANCE_IPV4": "192.0.2.1",
        "NSTANCE_INSTANCE_IPV6": "2001:db8::1",
        "NSTANCE_REPORT_INTERVAL": "0",
        "NSTANCE_HEALTH_ADDR": "127.0.0.1:8080",
    }
    config = load_config(env)
    assert (config.debug, config.identity_mode, config.recv_mode, config.report_interval) == (
        True,
        0o640,
        0o660,
        0,
    )
    assert (config.hostname, config.ipv4, config.ipv6) == ("agent-host", "192.0.2.1", "2001:db8::1")
    assert (config.registration_addr, config.agent_addr) == (
        "nstance-server.local:8992",
        "nstance-server.local:8994",
    )
