"""Agent settings from NSTANCE_* variables: defaults, the local provider's instance directory, and errors
that name the variable."""

from __future__ import annotations

from pathlib import Path

import pytest

from nstance.agent.config import ConfigError, load_config

BASE = {
    "NSTANCE_INSTANCE_ID": "web-1",
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
        "instance_id": "web-2",
        "server_registration_addr": "127.0.0.1:1",
        "server_agent_addr": "127.0.0.1:2",
    }
    config = load_config({}, instance_dir=tmp_path, instance_info=info)
    assert config.identity_dir == tmp_path / "identity"
    assert config.keys_dir == tmp_path / "keys"
    assert config.recv_dir == tmp_path / "recv"
    assert config.provider == "local"
    assert (config.instance_id, config.registration_addr, config.agent_addr) == (
        "web-2",
        "127.0.0.1:1",
        "127.0.0.1:2",
    )
    # the environment wins over instance.json and over the directory defaults
    env = BASE | {"NSTANCE_IDENTITY_DIR": str(tmp_path / "id")}
    config = load_config(env, instance_dir=tmp_path, instance_info=info)
    assert config.instance_id == "web-1"
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
        ({"NSTANCE_METADATA_URL": "169.254.169.254"}, "NSTANCE_METADATA_URL"),
        ({"NSTANCE_DEBUG": "maybe"}, "NSTANCE_DEBUG"),
    ],
)
def test_bad_values_name_the_variable(change: dict[str, str], variable: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(BASE | change)
    assert info.value.variable == variable
    assert str(info.value).startswith(f"{variable}: ")
