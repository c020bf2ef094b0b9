"""nstance-operator's config document, flags and the pure decisions of its runtime (no sockets).

What a user sees: a config or flag mistake is reported with the key path or flag name and what is
accepted; an edited config that is invalid, or that would change the cluster or tenant, keeps the last
good config; renewal and election arithmetic follow the documented rules.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from nstance.operator.cli import app
from nstance.operator.config import (
    ConfigError,
    ConfigSource,
    FileSource,
    OperatorConfig,
    ShardEndpoint,
    parse_config,
)
from nstance.operator.crds import names
from nstance.operator.renewal import leader_address, retry_delay
from nstance.operator.settings import SettingsError, build_settings, parse_address, parse_seconds

GOOD = """
cluster_id: prod
tenant: team-a
shards:
  us-west-2a:
    registration_addr: "10.0.0.5:8992"
    operator_addr: "10.0.0.5:8993"
  us-west-2b: {registration_addr: "[2600:1f18::a]:8992", operator_addr: "[2600:1f18::a]:8993"}
"""


def problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(text, "config.yaml")
    return info.value.problems


# --- the document ----------------------------------------------------------------------------------


def test_a_good_config_keeps_the_shard_order_and_addresses() -> None:
    config = parse_config(GOOD)
    assert config.cluster_id == "prod"
    assert config.tenant == "team-a"
    assert list(config.shards) == ["us-west-2a", "us-west-2b"]
    assert config.shards["us-west-2b"] == ShardEndpoint("[2600:1f18::a]:8992", "[2600:1f18::a]:8993")
    assert config.capi_cluster_name == "prod--team-a"


def test_every_problem_is_reported_with_its_key_path() -> None:
    found = problems(
        """
cluster_id: Prod
shards:
  zone_a: {registration_addr: "10.0.0.5", operator_addr: "2600::1:8993"}
  zone-b: {registration_addr: "h:99999", operator_addr: "h:1", extra: 1}
color: blue
"""
    )
    text = "\n".join(found)
    assert "cluster_id: 'Prod' may contain only lowercase letters" in text
    assert "tenant: required" in text
    assert "shards.zone_a: shard id 'zone_a' may contain only" in text
    assert "shards.zone_a.registration_addr: expected host:port (got '10.0.0.5')" in text
    assert "shards.zone_a.operator_addr: an IPv6 address must be written in brackets" in text
    assert "shards.zone-b.registration_addr: port '99999' is not a number between 1 and 65535" in text
    assert "shards.zone-b.extra: unknown key" in text
    assert "color: unknown key (known keys: cluster_id, tenant, shards, sleep)" in text


def test_the_error_message_names_the_source_before_each_problem() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config("cluster_id: a\ntenant: b\nshards: {}\n", "ConfigMap ns/cfg key config.yaml")
    assert str(info.value) == "ConfigMap ns/cfg key config.yaml: shards: at least one shard is required"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "the document is empty"),
        ("- a\n- b\n", "the document must be a mapping (got list)"),
        ("cluster_id: [unclosed\n", "line 2, column 1: not valid YAML"),
        ("cluster_id: a\ncluster_id: b\n", "key 'cluster_id' appears twice"),
        ("cluster_id: a\ntenant: b\nshards: [x]\n", "shards: must be a mapping of shard id to addresses"),
        (
            "cluster_id: a\ntenant: 7\nshards: {z: {registration_addr: 'h:1', operator_addr: 'h:2'}}\n",
            "tenant: must be a string (got int 7)",
        ),
        (
            "cluster_id: a\ntenant: b\nshards: {z: {registration_addr: 'h:1'}}\n",
            "shards.z.operator_addr: required (host:port)",
        ),
    ],
)
def test_malformed_documents_are_refused_with_a_reason(text: str, expected: str) -> None:
    assert any(expected in p for p in problems(text)), problems(text)


def test_the_upstream_sleep_section_is_accepted_and_ignored() -> None:
    config = parse_config(GOOD + "sleep: {enabled: true}\n")
    assert config.tenant == "team-a"


# --- following changes -------------------------------------------------------------------------------


async def test_an_invalid_edit_keeps_the_last_good_config_and_is_reported() -> None:
    source = ConfigSource("config.yaml")
    reports: list[tuple[str, str]] = []

    async def report(reason: str, message: str) -> None:
        reports.append((reason, message))

    await source.offer(GOOD, report=report)
    good = source.current
    assert good is not None
    assert source.version == 1
    await source.offer("cluster_id: prod\ntenant: team-a\nshards: nope\n", report=report)
    assert source.current is good
    assert source.version == 1
    assert reports[0][0] == "InvalidConfig"
    assert "shards: must be a mapping" in reports[0][1]
    assert "keeping the last good config" in reports[0][1]
    assert "shards: must be a mapping" in source.problem


async def test_a_changed_cluster_or_tenant_is_refused() -> None:
    source = ConfigSource("config.yaml")
    reports: list[tuple[str, str]] = []

    async def report(reason: str, message: str) -> None:
        reports.append((reason, message))

    await source.offer(GOOD, report=report)
    await source.offer(GOOD.replace("tenant: team-a", "tenant: team-b"), report=report)
    assert source.current is not None
    assert source.current.tenant == "team-a"
    assert reports == [(reports[0][0], reports[0][1])]
    assert reports[0][0] == "ConfigChangeRefused"
    assert "prod/team-a to prod/team-b" in reports[0][1]
    assert "Keeping prod/team-a" in reports[0][1]


async def test_a_shard_change_wakes_waiters_with_the_new_map() -> None:
    source = ConfigSource("config.yaml")
    await source.offer(GOOD)
    waiter = asyncio.create_task(source.wait_changed(source.version))
    await asyncio.sleep(0)
    assert not waiter.done()
    await source.offer(GOOD.replace("us-west-2b", "us-west-2c"))
    config = await asyncio.wait_for(waiter, 1)
    assert list(config.shards) == ["us-west-2a", "us-west-2c"]
    # The same text again (a re-read of an unchanged ConfigMap) is no change.
    before = source.version
    await source.offer(GOOD.replace("us-west-2b", "us-west-2c"))
    assert source.version == before


async def test_a_missing_document_keeps_the_config_and_says_why() -> None:
    source = ConfigSource("config.yaml")
    await source.offer(None, "ConfigMap ns/cfg not found; create it with the key config.yaml")
    assert source.current is None
    assert "not found" in source.problem
    await source.offer(GOOD)
    await source.offer(None, "ConfigMap ns/cfg not found")
    assert isinstance(source.current, OperatorConfig)


# --- flags ---------------------------------------------------------------------------------------------


def test_defaults_follow_upstream_names(tmp_path: Path) -> None:
    settings = build_settings(
        disable_webhooks=True, environ={}, service_account_namespace=tmp_path / "absent", holder_identity="me"
    )
    assert settings.namespace == "default"
    assert settings.config_file is None
    assert (settings.config_configmap, settings.config_key) == (names.CONFIG_CONFIGMAP, "config.yaml")
    assert (settings.ca_configmap, settings.cert_secret) == ("nstance-cluster-ca", "nstance-operator-cert")
    assert (settings.key_secret, settings.nonce_secret) == ("nstance-operator-key", "nstance-operator-nonce")
    assert settings.health.port == 8081
    assert settings.leader.enabled
    assert (settings.leader.lease_duration, settings.leader.renew_interval) == (15.0, 5.0)
    assert settings.timings.resync == 30.0
    assert not settings.webhook.enabled


def test_environment_and_pod_namespace_are_used(tmp_path: Path) -> None:
    namespace_file = tmp_path / "namespace"
    namespace_file.write_text("nstance-system\n")
    settings = build_settings(
        disable_webhooks=True,
        environ={"NSTANCE_CERT_SECRET": "my-cert", "NSTANCE_NONCE_SECRET": "my-nonce"},
        service_account_namespace=namespace_file,
    )
    assert settings.namespace == "nstance-system"
    assert (settings.cert_secret, settings.nonce_secret) == ("my-cert", "my-nonce")
    assert build_settings(disable_webhooks=True, environ={"NSTANCE_NAMESPACE": "ops"}).namespace == "ops"


def test_durations_and_addresses_use_go_syntax() -> None:
    assert parse_seconds("1m30s", "--resync-interval") == 90.0
    assert parse_seconds("250ms", "--x") == 0.25
    assert parse_address(":8081", "--health-addr").port == 8081
    assert parse_address("[::1]:9443", "--webhook-addr").host == "::1"
    with pytest.raises(SettingsError, match="between 1 and 65535"):
        parse_address(":0", "--health-addr")
    assert (
        build_settings(webhook_self_signed=True, webhook_addr="127.0.0.1:0", environ={}).webhook.listen.port
        == 0
    )
    settings = build_settings(disable_webhooks=True, resync_interval="45s", drain_fallback="10m", environ={})
    assert (settings.timings.resync, settings.timings.drain_fallback) == (45.0, 600.0)


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"resync_interval": "30"}, "--resync-interval: invalid duration '30'"),
        ({"resync_interval": "2d"}, "days are not a unit"),
        ({"health_addr": "localhost"}, "--health-addr 'localhost': expected HOST:PORT"),
        ({"webhook_addr": "::1:9443"}, "--webhook-addr '::1:9443': write an IPv6 address in brackets"),
        ({"namespace": "Bad_NS"}, "must be a Kubernetes namespace name"),
        ({"cert_secret": "-x"}, "NSTANCE_CERT_SECRET / --cert-secret '-x': must be a Kubernetes object name"),
        (
            {"leader_elect_renew_deadline": "20s"},
            "--leader-elect-renew-interval < --leader-elect-renew-deadline",
        ),
        ({"log_format": "xml"}, "--log-format 'xml': choose one of json, text"),
        ({"backoff_base": "10s", "backoff_cap": "1s"}, "--backoff-cap 1s must not be shorter"),
    ],
)
def test_bad_flags_name_the_flag(kwargs: dict[str, str], expected: str) -> None:
    with pytest.raises(SettingsError) as info:
        build_settings(disable_webhooks=True, environ={}, **kwargs)  # type: ignore[arg-type]
    assert expected in str(info.value)


def test_the_webhook_needs_a_certificate_unless_disabled_or_self_signed(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="--webhook-self-signed, or --disable-webhooks"):
        build_settings(environ={}, webhook_cert_dir=tmp_path)
    (tmp_path / "tls.crt").write_text("cert")
    (tmp_path / "tls.key").write_text("key")
    settings = build_settings(environ={"NSTANCE_WEBHOOK_CERT_DIR": str(tmp_path)})
    assert settings.webhook.cert_file == tmp_path / "tls.crt"
    with pytest.raises(SettingsError, match="must be given together"):
        build_settings(environ={}, webhook_cert=tmp_path / "tls.crt")
    signed = build_settings(environ={}, webhook_self_signed=True, webhook_managed="operator.nstance.dev")
    assert signed.webhook.self_signed
    assert signed.webhook.managed == "operator.nstance.dev"
    # kopf names each webhook "<id>.<value>"; kube-apiserver refuses webhook names of fewer than 3 parts.
    with pytest.raises(SettingsError, match="at least three dot-separated parts"):
        build_settings(environ={}, webhook_self_signed=True, webhook_managed="nstance-operator")
    assert not build_settings(environ={"NSTANCE_WEBHOOK_ENABLED": "false"}).webhook.enabled


def test_the_cli_exits_2_with_one_line_naming_the_problem(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["--disable-webhooks", "--resync-interval", "soon"])
    assert result.exit_code == 2
    assert "--resync-interval: invalid duration 'soon'" in result.output
    config = tmp_path / "config.yaml"
    config.write_text(
        "cluster_id: prod\ntenant: x\nshards:\n  a: {registration_addr: 'h:1', operator_addr: h}\n"
    )
    result = runner.invoke(app, ["--disable-webhooks", "--config", str(config)])
    assert result.exit_code == 2
    assert f"{config}: shards.a.operator_addr: expected host:port (got 'h')" in result.output
    result = runner.invoke(app, ["--disable-webhooks", "--config", str(tmp_path / "none.yaml")])
    assert result.exit_code == 2
    assert "--config" in result.output


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda p: p.mkdir(), "--config {p}: is a directory, not a file"),  # was "no such file"
        (lambda p: p.write_bytes(b"\xff\xfe"), "{p}: not UTF-8 text (byte 0)"),  # was "unexpected error"
    ],
    ids=["directory", "binary"],
)
def test_an_unusable_config_file_gets_one_line_and_exit_2(tmp_path: Path, make: Any, expected: str) -> None:
    path = tmp_path / "config.yaml"
    make(path)
    result = CliRunner().invoke(app, ["--disable-webhooks", "--config", str(path)])
    assert result.exit_code == 2, result.output
    assert expected.format(p=path) in result.output
    assert "unexpected error" not in result.output


async def test_a_polled_file_that_turns_binary_keeps_the_last_good_config(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(GOOD)
    source = FileSource(path, interval=3600)
    await source.poll()
    assert isinstance(source.current, OperatorConfig)
    path.write_bytes(b"\x00\xff binary")
    await source.poll()  # raised UnicodeDecodeError out of the polling task
    assert isinstance(source.current, OperatorConfig)
    assert f"{path}: the operator config is unusable: not UTF-8 text (byte 1)" in source.problem


# --- renewal arithmetic ---------------------------------------------------------------------------------


def test_the_cluster_leader_address_is_read_from_a_refusal() -> None:
    details = "certificate renewal is done by the cluster leader; the cluster leader is at 10.0.0.9:8993"
    assert leader_address(details) == "10.0.0.9:8993"
    assert leader_address("... the cluster leader is at [::1]:8993; retry there") == "[::1]:8993"
    assert leader_address("this server is a standby") == ""


def test_renewal_retries_double_from_one_minute_and_stay_inside_the_remaining_life() -> None:
    delays = [retry_delay(n, 86_400, base=60, cap=1800, minimum=1) for n in range(7)]
    assert delays == [60, 120, 240, 480, 960, 1800, 1800]
    assert retry_delay(3, 100, base=60, cap=1800, minimum=1) == 50
    assert retry_delay(0, 0.5, base=60, cap=1800, minimum=1) == 1
