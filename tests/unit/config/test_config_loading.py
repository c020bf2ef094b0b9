"""Loading config.jsonc: JSONC syntax, defaults, unknown/unsupported keys, error reporting, examples."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import pytest
from config_samples import REPO_ROOT, as_text, base_config, load, problems

from nstance.config import (
    ConfigError,
    load_config_file,
    load_config_text,
    load_groups_file,
    merged_group,
    validate_config_text,
)
from nstance.config.jsonc import parse_jsonc
from nstance.core.errors import InvalidArgument, NstanceError


def test_defaults_follow_upstream() -> None:
    config = load(base_config())
    shard = config.shard
    assert shard.request_timeout == timedelta(seconds=30)
    assert shard.health_check_interval == timedelta(seconds=60)
    assert shard.default_drain_timeout == timedelta(minutes=5)
    assert shard.image_refresh_interval == timedelta(hours=6)
    assert shard.shutdown_timeout == timedelta(seconds=10)
    assert shard.create_rate_limit == timedelta(0)
    assert shard.garbage_collection.interval == timedelta(minutes=2)
    assert shard.garbage_collection.registration_timeout == timedelta(minutes=5)
    assert shard.garbage_collection.deleted_record_retention == timedelta(minutes=30)
    assert shard.error_exit_jitter.min_delay == timedelta(seconds=10)
    assert shard.error_exit_jitter.max_delay == timedelta(seconds=40)
    assert shard.max_concurrent_creates == 16
    assert shard.expiry.eligible_age is None
    assert shard.dynamic_subnet_pools is None
    for election in (config.cluster.leader_election, shard.leader_election):
        assert election.enabled is True
        assert election.frequent_interval == timedelta(seconds=5)
        assert election.infrequent_interval == timedelta(seconds=30)
        assert election.leader_timeout == timedelta(seconds=15)
    assert config.cluster.secrets.cache_ttl == timedelta(0)
    template = config.templates["web"]
    assert template.size == 1
    assert template.userdata is not None
    assert (template.userdata.source, template.userdata.encoding) == ("inline", "plain")
    assert config.groups["default"]["web"].drain_timeout is None
    assert config.load_balancers == {}
    assert config.images == {}
    assert config.certificates == {}


def test_zero_default_drain_timeout_disables_drain_instead_of_becoming_5m() -> None:
    doc = base_config()
    doc["shard"]["default_drain_timeout"] = "0s"
    config = load(doc)
    assert config.shard.default_drain_timeout == timedelta(0)
    assert merged_group(config, {}, "default", "web").drain_timeout == timedelta(0)


def test_section_defaults_for_optional_subsections() -> None:
    doc = base_config()
    doc["cluster"]["storage"] = {"provider": "s3", "bucket": "b"}
    doc["certificates"] = {"x": {"kind": "client"}}
    doc["images"] = {"deb": {"provider": "oci", "filters": [{"name": "n", "values": ["v"]}]}}
    config = load(doc)
    assert config.cluster.storage is not None
    assert config.cluster.storage.prefix == "cluster/"
    assert config.certificates["x"].ttl == 8760
    assert (config.images["deb"].sort, config.images["deb"].order) == ("creation-date", "desc")


def test_jsonc_comments_and_trailing_commas() -> None:
    text = as_text(base_config())
    text = text.replace('"cluster": {', '// the cluster\n  "cluster": { /* inline */', 1)
    text = text.replace('"size": 2', '"size": 2,', 1)
    text = text.rstrip()[:-1] + ",\n}"
    config = load_config_text(text)
    assert config.groups["default"]["web"].size == 2


def test_syntax_error_reports_line_and_column() -> None:
    text = '{\n  "cluster": {\n    "id": ]\n  }\n}'
    with pytest.raises(ConfigError) as info:
        load_config_text(text, "shard/s1/config.jsonc")
    (problem,) = info.value.problems
    assert problem.message.startswith("line 3, column 11: invalid JSONC")
    assert "expected a value, found ']'" in problem.message
    assert str(info.value).startswith("shard/s1/config.jsonc: invalid configuration (1 problem):")


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ('{"a": "hi \\ there"}', "line 1, column 11"),  # an escape JSON lacks: the backslash was dropped
        ("{'a': 1}", "line 1, column 2"),
        ("{a: 1}", "line 1, column 2"),
        ('{\n  "a": 0x10\n}', "line 2, column 9"),
        ('{"a": +1}', "line 1, column 7"),
    ],
)
def test_json5_syntax_that_upstreams_parser_refuses_is_refused(text: str, where: str) -> None:
    (problem,) = problems_of(text)
    assert problem.startswith(f"{where}: invalid JSONC: ")
    assert problem.endswith(
        "only comments and trailing commas may be added to JSON, as upstream's parser reads it)"
    )


@pytest.mark.parametrize("constant", ["Infinity", "-Infinity", "NaN"])
def test_non_numbers_are_refused(constant: str) -> None:
    assert problems_of(f'{{"a": {constant}}}') == [f"invalid JSONC: {constant} is not JSON"]


def test_comments_and_trailing_commas_anywhere_but_in_strings() -> None:
    text = '{"a": "// kept, /* kept */ ,]", // gone\n "b": [1, 2, /* gone */ ], }'
    assert parse_jsonc(text) == {"a": "// kept, /* kept */ ,]", "b": [1, 2]}


def test_extra_data_after_document_points_at_it() -> None:
    with pytest.raises(ConfigError) as info:
        load_config_text("{}\n\n  }", "x")
    assert info.value.problems[0].message.startswith("line 3, column 3:")


def test_empty_document_and_non_object() -> None:
    assert problems_of("") == [
        "line 1, column 1: invalid JSONC: the document is empty (expected a JSON object)"
    ]
    assert problems_of("[1, 2]") == ["the document must be a JSON object"]


def problems_of(text: str) -> list[str]:
    return [str(p) for p in validate_config_text(text)]


def test_error_is_an_invalid_argument_listing_one_problem_per_line() -> None:
    doc = base_config()
    doc["templates"]["web"]["kind"] = "knc1"
    doc["groups"]["default"]["web"]["template"] = "nope"
    with pytest.raises(ConfigError) as info:
        load(doc)
    err = info.value
    assert isinstance(err, InvalidArgument)
    assert isinstance(err, NstanceError)
    assert str(err).splitlines() == [
        "test.jsonc: invalid configuration (2 problems):",
        "  templates.web.kind: must be exactly 3 lowercase letters",
        '  groups.default.web.template: template "nope" is not defined',
    ]
    assert next((p.path, p.message) for p in err.problems) == (
        "templates.web.kind",
        "must be exactly 3 lowercase letters",
    )


def test_three_distinct_mistakes_give_three_problems() -> None:
    doc = base_config()
    doc["templates"]["web"]["kind"] = "knc1"
    doc["groups"]["default"]["web"]["template"] = "nope"
    doc["shard"]["bind"]["agent_addr"] = doc["shard"]["bind"]["registration_addr"]
    assert sorted(problems(doc)) == sorted(
        [
            "templates.web.kind: must be exactly 3 lowercase letters",
            'groups.default.web.template: template "nope" is not defined',
            "shard.bind.agent_addr: must differ from shard.bind.registration_addr",
        ]
    )


def test_problems_in_many_sections_are_all_reported() -> None:
    doc = base_config()
    doc["cluster"]["id"] = "Bad"
    doc["shard"]["health_check_interval"] = "5d"
    doc["shard"]["subnet_pools"]["other"] = ["net-a"]
    doc["templates"]["web"]["arch"] = "x86"
    doc["templates"]["api"] = {"kind": "api", "arch": "amd64", "subnet_pool": "missing"}
    doc["groups"]["default"]["other"] = {"template": "web", "size": "3"}
    doc["groups"]["default"]["lb"] = {"template": "api", "load_balancers": ["nope"]}
    found = problems(doc)
    assert len(found) == 7, found
    assert "cluster.id: may contain only lowercase letters a-z, digits 0-9 and '-'" in found
    assert 'shard.subnet_pools.other[0]: subnet "net-a" is already in pool "default"' in found
    assert 'templates.web.arch: must be one of: amd64, arm64 (got "x86")' in found
    assert 'templates.api.subnet_pool: subnet pool "missing" is not defined in shard.subnet_pools' in found
    assert "groups.default.other.size: must be a whole number" in found
    assert 'groups.default.lb.load_balancers[0]: load balancer "nope" is not defined' in found
    assert any(
        p.startswith("shard.health_check_interval: invalid duration '5d' (days are not a unit") for p in found
    )


def test_unknown_fields_are_named_by_path() -> None:
    doc = base_config()
    doc["shard"]["bind"]["helth_addr"] = ":1"
    doc["templates"]["web"]["userdata"]["contents"] = "x"
    doc["extra"] = 1
    assert sorted(problems(doc)) == [
        "extra: unknown field",
        "shard.bind.helth_addr: unknown field",
        "templates.web.userdata.contents: unknown field",
    ]


@pytest.mark.parametrize(("key", "what"), [("nat", "Nstance-managed NAT"), ("tunnels", "tunnel pods")])
def test_nat_and_tunnels_are_not_supported_yet(key: str, what: str) -> None:
    doc = base_config()
    doc[key] = {}
    assert problems(doc) == [f'{key}: not supported yet ({what}); remove the "{key}" section']


def test_required_sections_and_fields() -> None:
    assert problems_of("{}") == ["cluster: is required", "shard: is required", "templates: is required"]
    doc = base_config()
    del doc["shard"]["infra"]["zone"]
    del doc["templates"]["web"]["arch"]
    assert sorted(problems(doc)) == ["shard.infra.zone: is required", "templates.web.arch: is required"]


def test_type_errors_are_plain_sentences() -> None:
    doc = base_config()
    doc["shard"]["max_concurrent_creates"] = "16"
    doc["shard"]["leader_election"] = {"enabled": "yes"}
    doc["templates"]["web"]["vars"] = {"n": 1}
    doc["templates"]["web"]["files"] = []
    doc["groups"]["default"]["web"]["load_balancers"] = "lb"
    assert sorted(problems(doc)) == [
        "groups.default.web.load_balancers: must be a list",
        "shard.leader_election.enabled: must be true or false",
        "shard.max_concurrent_creates: must be a whole number",
        "templates.web.files: must be an object",
        "templates.web.vars.n: must be a string",
    ]


PROVIDERS = [
    ("aws", "aws"),
    ("google", "google"),
    ("gcp", "google"),
    ("proxmox", "proxmox"),
    ("local", "local"),
]


@pytest.mark.parametrize(("given_name", "stored"), [*PROVIDERS, ("sim", "sim")])
def test_provider_names(given_name: str, stored: str) -> None:
    doc = base_config()
    doc["shard"]["infra"]["provider"] = given_name
    if given_name == "proxmox":
        doc["defaults"] = {"args": {"StoragePool": "local-lvm", "TemplateName": "debian"}}
    assert load(doc).shard.infra.provider == stored


@pytest.mark.parametrize(("name", "stand_in"), [("tmux", "local"), ("mock", "sim")])
def test_dev_providers_of_upstream_run_as_local_and_sim_with_a_notice(
    name: str, stand_in: str, caplog: pytest.LogCaptureFixture
) -> None:
    doc = base_config()
    doc["shard"]["infra"]["provider"] = name
    with caplog.at_level(logging.WARNING, logger="nstance.config"):
        assert load(doc).shard.infra.provider == stand_in
    assert f'shard.infra.provider "{name}" (upstream\'s development provider) runs as "{stand_in}" here' in (
        caplog.text
    )


def test_unknown_provider_lists_choices() -> None:
    doc = base_config()
    doc["shard"]["infra"]["provider"] = "azure"
    assert problems(doc) == [
        'shard.infra.provider: must be one of: aws, google, proxmox, local, sim (got "azure")'
    ]


def test_local_example_validates_with_the_documented_settings() -> None:
    config = load_config_file(REPO_ROOT / "examples" / "local" / "config.jsonc")
    assert config.cluster.id == "local"
    assert config.cluster.secrets.provider == "object-storage"
    assert config.cluster.secrets.encryption_key is not None
    assert config.cluster.secrets.encryption_key.source == "NSTANCE_ENCRYPTION_KEY"
    shard = config.shard
    assert (shard.id, shard.infra.provider, shard.infra.region, shard.infra.zone) == (
        "local-a",
        "local",
        "local",
        "local-a",
    )
    ports = sorted(int(a.rsplit(":", 1)[1]) for a in shard.bind.addrs().values())
    assert ports == [8990, 8991, 8992, 8993, 8994]
    assert all(
        a.startswith("127.0.0.1:") for a in [*shard.bind.addrs().values(), *shard.advertise.addrs().values()]
    )
    assert shard.subnet_pools == {"default": ["local-net"]}
    assert shard.health_check_interval == timedelta(seconds=10)
    assert shard.default_drain_timeout == timedelta(seconds=30)
    assert shard.garbage_collection.registration_timeout == timedelta(minutes=2)
    assert shard.garbage_collection.interval == timedelta(seconds=30)
    merged = merged_group(config, {}, "default", "app")
    assert (merged.kind, merged.size, merged.subnet_pool) == ("app", 1, "default")
    assert merged.userdata is not None
    assert "Instance.ID" in merged.userdata.content
    assert "Nonce" in merged.userdata.content
    assert load_groups_file(REPO_ROOT / "examples" / "local" / "groups.jsonc") == {}


def test_aws_example_validates() -> None:
    config = load_config_file(REPO_ROOT / "examples" / "aws" / "config.jsonc")
    assert config.shard.infra.provider == "aws"
    assert config.images["debian"].owners == ["136693071363"]
    files = config.templates["knc"].files
    assert files["kubelet-client.crt"].kind == "certificate"
    assert all(s.startswith("subnet-") for pool in config.shard.subnet_pools.values() for s in pool)
    assert config.groups["default"]["control"].drain_timeout == timedelta(0)


def test_missing_file_is_a_config_error(tmp_path: Any) -> None:
    with pytest.raises(ConfigError) as info:
        load_config_file(tmp_path / "nope.jsonc")
    assert "cannot read the file" in str(info.value)


def test_non_utf8_file_is_a_config_error(tmp_path: Any) -> None:
    path = tmp_path / "c.jsonc"
    path.write_bytes(b'{"a": "\xff"}')
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_config_file(path)
