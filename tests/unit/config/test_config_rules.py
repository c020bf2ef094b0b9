"""Each validation rule of config.jsonc, asserted with the path and wording a user sees."""

from __future__ import annotations

import base64
from datetime import timedelta
from typing import Any

import pytest
from config_samples import addrs, base_config, load, problems

IDENT_CHARS = "may contain only lowercase letters a-z, digits 0-9 and '-'"


def only(doc: dict[str, Any]) -> str:
    found = problems(doc)
    assert len(found) == 1, found
    return found[0]


# ---- identifiers -----------------------------------------------------------------------------


def test_cluster_and_shard_ids_are_identifiers() -> None:
    doc = base_config()
    doc["cluster"]["id"] = "-c1"
    doc["shard"]["id"] = "a" * 33
    assert sorted(problems(doc)) == [
        "cluster.id: must start and end with a lowercase letter or digit",
        "shard.id: must be at most 32 characters (got 33)",
    ]


def test_tenant_group_and_pool_names_are_identifiers() -> None:
    doc = base_config()
    doc["groups"]["Team_A"] = {"x--y": {"template": "web"}}
    doc["shard"]["subnet_pools"]["Pool"] = ["net-c"]
    assert sorted(problems(doc)) == [
        "groups.Team_A.x--y: group name must not contain '--' (reserved as a separator)",
        f"groups.Team_A: tenant name {IDENT_CHARS}",
        f"shard.subnet_pools.Pool: subnet pool name {IDENT_CHARS}",
    ]


def test_template_kind_is_three_lowercase_letters() -> None:
    doc = base_config()
    doc["templates"]["web"]["kind"] = "Web"
    assert only(doc) == "templates.web.kind: must be exactly 3 lowercase letters"


# ---- shard listeners -------------------------------------------------------------------------


def test_bind_addresses_must_differ() -> None:
    doc = base_config()
    doc["shard"]["bind"]["agent_addr"] = "127.0.0.1:8992"
    assert only(doc) == "shard.bind.agent_addr: must differ from shard.bind.registration_addr"


def test_wildcard_bind_conflicts_with_a_specific_host_on_the_same_port() -> None:
    doc = base_config()
    doc["shard"]["bind"] = addrs(host="")
    doc["shard"]["bind"]["operator_addr"] = "10.0.0.1:8992"
    assert only(doc) == "shard.bind.operator_addr: must differ from shard.bind.registration_addr"


def test_advertise_addresses_may_repeat_but_must_be_host_port() -> None:
    doc = base_config()
    doc["shard"]["advertise"]["agent_addr"] = doc["shard"]["advertise"]["registration_addr"]
    assert problems(doc) == []
    doc["shard"]["advertise"]["agent_addr"] = "example.com"
    assert only(doc) == (
        'shard.advertise.agent_addr: must be "host:port" with a port between 1 and 65535 (got "example.com")'
    )


def test_bind_port_range() -> None:
    doc = base_config()
    doc["shard"]["bind"]["health_addr"] = ":0"
    assert only(doc).startswith('shard.bind.health_addr: must be "host:port" with a port between 1 and 65535')


# ---- subnet pools ----------------------------------------------------------------------------


def test_subnet_pools_need_one_pool_and_one_subnet_each() -> None:
    doc = base_config()
    doc["shard"]["subnet_pools"] = {}
    doc["templates"]["web"].pop("subnet_pool")
    doc["groups"] = {}
    assert only(doc) == "shard.subnet_pools: must have at least 1 entry"
    doc["shard"]["subnet_pools"] = {"default": []}
    assert only(doc) == "shard.subnet_pools.default: must list at least one subnet"


def test_no_subnet_in_two_pools() -> None:
    doc = base_config()
    doc["shard"]["subnet_pools"]["other"] = ["net-b", "net-a"]
    assert only(doc) == 'shard.subnet_pools.other[1]: subnet "net-a" is already in pool "default"'


def test_dynamic_subnet_pools_must_name_pools() -> None:
    doc = base_config()
    doc["shard"]["dynamic_subnet_pools"] = ["other", "gone"]
    assert (
        only(doc) == 'shard.dynamic_subnet_pools[1]: subnet pool "gone" is not defined in shard.subnet_pools'
    )


def test_template_and_group_subnet_pools_must_exist() -> None:
    doc = base_config()
    doc["templates"]["web"]["subnet_pool"] = "nope"
    doc["groups"]["default"]["web"]["subnet_pool"] = "other"
    assert only(doc) == 'templates.web.subnet_pool: subnet pool "nope" is not defined in shard.subnet_pools'
    doc["templates"]["web"]["subnet_pool"] = "default"
    doc["groups"]["default"]["web"]["subnet_pool"] = "nope"
    assert (
        only(doc) == 'groups.default.web.subnet_pool: subnet pool "nope" is not defined in shard.subnet_pools'
    )


def test_a_group_without_a_subnet_pool_is_valid_as_in_upstream() -> None:
    doc = base_config()
    del doc["templates"]["web"]["subnet_pool"]
    assert problems(doc) == []
    doc["groups"]["default"]["web"]["subnet_pool"] = "nope"
    assert only(doc).startswith("groups.default.web.subnet_pool: ")


# ---- references ------------------------------------------------------------------------------


def test_group_template_must_exist() -> None:
    doc = base_config()
    doc["groups"]["default"]["web"]["template"] = "nope"
    assert only(doc) == 'groups.default.web.template: template "nope" is not defined'


def test_group_load_balancers_must_exist() -> None:
    doc = base_config()
    doc["load_balancers"] = {
        "lb": {"provider": "aws", "target_groups": [{"arn": "arn:tg", "target_port": 80}]}
    }
    doc["groups"]["default"]["web"]["load_balancers"] = ["lb", "nope"]
    assert only(doc) == 'groups.default.web.load_balancers[1]: load balancer "nope" is not defined'


def test_group_reference_check_still_runs_when_the_template_itself_is_invalid() -> None:
    doc = base_config()
    doc["templates"]["web"]["arch"] = "sparc"
    doc["groups"]["default"]["api"] = {"template": "api"}
    assert sorted(problems(doc)) == [
        'groups.default.api.template: template "api" is not defined',
        'templates.web.arch: must be one of: amd64, arm64 (got "sparc")',
    ]


# ---- durations, GC, expiry -------------------------------------------------------------------


def test_durations_are_go_style_strings() -> None:
    doc = base_config()
    doc["shard"]["request_timeout"] = "1h30m"
    doc["shard"]["create_rate_limit"] = "250ms"
    config = load(doc)
    assert config.shard.request_timeout == timedelta(hours=1, minutes=30)
    assert config.shard.create_rate_limit == timedelta(milliseconds=250)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("21d", "invalid duration '21d' (days are not a unit; write hours, e.g. \"504h\" for 21 days)"),
        ("soon", "invalid duration 'soon': expected <number><unit> with unit ns, us, ms, s, m or h"),
        ("-5s", "must not be negative"),
        (30, 'must be a duration string such as "90s", "5m" or "1h30m"'),
    ],
)
def test_duration_errors(value: Any, message: str) -> None:
    doc = base_config()
    doc["shard"]["request_timeout"] = value
    assert only(doc).startswith(f"shard.request_timeout: {message}")


def test_zero_durations_mean_the_default_where_upstream_reads_them_so() -> None:
    """Upstream replaces a zero request timeout, health check interval and deleted-record retention
    by its default; a config written for it loads here with the same meaning (a zero retention used to
    purge every deleted record at the next collection)."""
    doc = base_config()
    doc["shard"]["request_timeout"] = "0s"
    doc["shard"]["health_check_interval"] = "0s"
    doc["shard"]["garbage_collection"] = {"deleted_record_retention": "0s"}
    shard = load(doc).shard
    assert shard.request_timeout == timedelta(seconds=30)
    assert shard.health_check_interval == timedelta(seconds=60)
    assert shard.garbage_collection.deleted_record_retention == timedelta(minutes=30)


def test_upstreams_empty_v2_sections_load_and_content_there_is_refused() -> None:
    """Go's encoder writes upstream v2's unused ``server`` (and ``proxy``) section as ``{}``."""
    for section in ("server", "proxy"):
        doc = base_config()
        doc[section] = {}
        assert problems(doc) == []
    doc = base_config()
    doc["server"] = {"files": {"proxy.env": {"kind": "env", "template": {"A": "b"}}}}
    assert only(doc) == (
        'server: not supported yet (files for services local to nstance-server); leave the "server" '
        "section empty"
    )


def test_gc_interval_and_registration_timeout_are_both_zero_or_both_set() -> None:
    doc = base_config()
    doc["shard"]["garbage_collection"] = {"interval": "0s", "registration_timeout": "0s"}
    assert problems(doc) == []
    doc["shard"]["garbage_collection"] = {"interval": "0s"}
    assert only(doc) == (
        "shard.garbage_collection.registration_timeout: must be 0 when "
        "shard.garbage_collection.interval is 0 (both 0 disables GC)"
    )
    doc["shard"]["garbage_collection"] = {"interval": "1m", "registration_timeout": "0s"}
    assert only(doc) == (
        "shard.garbage_collection.registration_timeout: must be greater than 0 when "
        "shard.garbage_collection.interval is set"
    )


def test_gc_registration_timeout_exceeds_interval() -> None:
    doc = base_config()
    doc["shard"]["garbage_collection"] = {"interval": "5m", "registration_timeout": "5m"}
    assert only(doc) == (
        "shard.garbage_collection.registration_timeout: must be greater than "
        "shard.garbage_collection.interval"
    )


def test_eligible_age_below_forced_age() -> None:
    doc = base_config()
    doc["shard"]["expiry"] = {"eligible_age": "720h", "forced_age": "504h"}
    assert only(doc) == "shard.expiry.forced_age: must be greater than shard.expiry.eligible_age"


def test_max_concurrent_creates_is_at_least_one() -> None:
    doc = base_config()
    doc["shard"]["max_concurrent_creates"] = 0
    assert only(doc) == "shard.max_concurrent_creates: must be at least 1"
    doc["shard"]["max_concurrent_creates"] = 4
    assert load(doc).shard.max_concurrent_creates == 4


def test_error_exit_jitter_order() -> None:
    doc = base_config()
    doc["shard"]["error_exit_jitter"] = {"min_delay": "1m", "max_delay": "10s"}
    assert (
        only(doc)
        == "shard.error_exit_jitter.max_delay: must not be less than shard.error_exit_jitter.min_delay"
    )


# ---- leader network --------------------------------------------------------------------------


def test_leader_network_ip_is_required_and_an_ip() -> None:
    doc = base_config()
    doc["shard"]["leader_network"] = {"interface_id": "eni-1"}
    assert only(doc) == "shard.leader_network.ip: is required"
    doc["shard"]["leader_network"] = {"ip": "10.0.0.300"}
    assert only(doc) == 'shard.leader_network.ip: must be an IP address (got "10.0.0.300")'


def test_aws_leader_network_needs_an_interface() -> None:
    doc = base_config()
    doc["shard"]["infra"]["provider"] = "aws"
    doc["shard"]["leader_network"] = {"ip": "10.0.0.10"}
    assert only(doc) == (
        'shard.leader_network.interface_id: is required when the provider is "aws" '
        "(the ENI that carries the leader IP)"
    )


# ---- secrets ---------------------------------------------------------------------------------


def test_encryption_key_required_iff_object_storage() -> None:
    doc = base_config()
    del doc["cluster"]["secrets"]["encryption_key"]
    assert only(doc) == 'cluster.secrets.encryption_key: is required when provider is "object-storage"'
    doc["cluster"]["secrets"] = {"provider": "memory", "encryption_key": {"provider": "env", "source": "K"}}
    assert (
        only(doc) == 'cluster.secrets.encryption_key: is only used with provider "object-storage"; remove it'
    )
    doc["cluster"]["secrets"] = {"provider": "aws-secrets-manager"}
    assert problems(doc) == []


def test_secrets_provider_and_key_provider_choices() -> None:
    doc = base_config()
    doc["cluster"]["secrets"]["encryption_key"]["provider"] = "vault"
    assert only(doc) == (
        "cluster.secrets.encryption_key.provider: must be one of: env, file, aws-parameter-store, "
        'aws-secrets-manager, google-secret-manager (got "vault")'
    )


def test_google_secret_manager_needs_a_project_under_either_name() -> None:
    doc = base_config()
    for name in ("gcp-secret-manager", "google-secret-manager"):
        doc["cluster"]["secrets"] = {"provider": name, "project_id": "p"}
        assert load(doc).cluster.secrets.provider == "google-secret-manager"
        doc["cluster"]["secrets"] = {"provider": name}
        assert only(doc).startswith(
            'cluster.secrets.project_id: is required when provider is "google-secret-manager"'
        )


def test_a_google_key_source_needs_a_project() -> None:
    doc = base_config()
    doc["cluster"]["secrets"]["encryption_key"] = {"provider": "google-secret-manager", "source": "k"}
    assert only(doc) == (
        'cluster.secrets.encryption_key.project_id: is required when provider is "google-secret-manager"'
    )
    doc["cluster"]["secrets"]["encryption_key"]["project_id"] = "p"
    assert problems(doc) == []


@pytest.mark.parametrize(
    ("provider", "expected"), [("aws", "aws-parameter-store"), ("google", "google-secret-manager")]
)
def test_without_a_secrets_block_the_provider_default_applies(provider: str, expected: str) -> None:
    doc = base_config()
    doc["shard"]["infra"]["provider"] = provider
    del doc["cluster"]["secrets"]
    if provider == "google":
        doc["shard"]["infra"]["options"] = {"project": "fleet-project"}
    secrets = load(doc).cluster.secrets
    assert secrets.provider == expected
    if provider == "google":
        assert secrets.project_id == "fleet-project"  # taken from the provider's own project
        doc["shard"]["infra"]["options"] = {"project_id": "upstream-key"}  # upstream's name of the option
        assert load(doc).cluster.secrets.project_id == "upstream-key"
        doc["shard"]["infra"]["options"] = {}
        assert only(doc).startswith("cluster.secrets.project_id: is required")
    doc["shard"]["infra"]["provider"] = "proxmox"
    doc["shard"]["infra"]["options"] = {}
    doc["defaults"] = {"args": {"StoragePool": "local-lvm", "TemplateName": "debian"}}
    assert only(doc) == "cluster.secrets: is required"


def test_gcs_cluster_storage_is_valid() -> None:
    doc = base_config()
    doc["cluster"]["storage"] = {"provider": "gcs", "bucket": "b"}
    assert problems(doc) == []


# ---- userdata --------------------------------------------------------------------------------


def test_gzip_userdata_only_from_url() -> None:
    doc = base_config()
    doc["templates"]["web"]["userdata"] = {"content": "x", "encoding": "gzip"}
    assert only(doc) == (
        'templates.web.userdata.encoding: "gzip" is only allowed with source "url" '
        '(inline content is text; use "base64+gzip")'
    )
    doc["templates"]["web"]["userdata"] = {"source": "url", "content": "https://x/u.gz", "encoding": "gzip"}
    assert problems(doc) == []


def test_userdata_content_required() -> None:
    doc = base_config()
    doc["templates"]["web"]["userdata"] = {"content": ""}
    assert only(doc) == "templates.web.userdata.content: must not be empty"


def test_unsupported_template_constructs_in_userdata_are_reported_at_load() -> None:
    doc = base_config()
    doc["templates"]["web"]["userdata"]["content"] = '{{ range .Vars }}x{{ end }}{{ template "x" }}'
    assert only(doc) == 'templates.web.userdata: line 1: Go template construct "template" is not supported'
    doc["templates"]["web"]["userdata"]["content"] = "#!/bin/bash\necho ${#A[@]} {% {#\n{{ .Instance.Nope }}"
    assert only(doc) == (
        "templates.web.userdata: line 3: executing at <.Instance.Nope>: "
        "can't evaluate field Nope in type InstanceData"
    )


def test_encoded_inline_userdata_is_decoded_before_checking() -> None:
    doc = base_config()
    encoded = base64.b64encode(b"{{ if .Vars.x }}").decode()
    doc["templates"]["web"]["userdata"] = {"content": encoded, "encoding": "base64"}
    assert only(doc) == "templates.web.userdata: unexpected EOF: {{if}} has no matching {{end}}"
    doc["templates"]["web"]["userdata"] = {"content": "not base64!", "encoding": "base64"}
    assert only(doc).startswith("templates.web.userdata.content: not valid base64")


def test_template_syntax_errors_in_args_files_and_certificates() -> None:
    doc = base_config()
    doc["defaults"] = {"args": {"Tags": [{"Value": "{{ .Instance.ID "}]}}
    doc["templates"]["web"]["files"] = {"app.env": {"kind": "env", "template": {"A": "{{ if .Vars.x }}"}}}
    doc["certificates"] = {"srv": {"kind": "server", "cn": '{{ printf "%s" .Instance.ID | js }}'}}
    found = sorted(problems(doc))
    assert found == [
        'certificates.srv.cn: line 1: Go template construct "js" is not supported',
        "defaults.args.Tags[0].Value: line 1: unclosed action",
        'templates.web.files["app.env"].template.A: unexpected EOF: {{if}} has no matching {{end}}',
    ]


# ---- files -----------------------------------------------------------------------------------


def test_file_kinds_and_their_fields() -> None:
    doc = base_config()
    doc["templates"]["web"]["files"] = {
        "a": {"kind": "binary"},
        "b": {"kind": "secret"},
        "c": {"kind": "certificate", "template": "nope", "key": {"source": "agent", "name": "c.pub"}},
        "d": {"kind": "env", "template": {"A": 1}},
        "e": {"kind": "json", "template": "x"},
        "f": {"kind": "string", "template": {"x": 1}},
        "g": {"kind": "certificate", "template": "tls"},
        "h": {"kind": "storage", "source": "obj/key", "template": "x"},
    }
    doc["certificates"] = {"tls": {"kind": "server"}}
    assert sorted(problems(doc)) == [
        "templates.web.files.a.kind: must be one of: secret, storage, certificate, env, json, string "
        '(got "binary")',
        'templates.web.files.b.source: is required for kind "secret"',
        'templates.web.files.d.template: must be an object of strings for kind "env"',
        'templates.web.files.e.template: must be an object for kind "json"',
        'templates.web.files.f.template: must be a string for kind "string"',
        'templates.web.files.g.key: is required for kind "certificate" '
        '(e.g. {"source": "agent", "name": "x.pub"})',
        'templates.web.files.h.template: is not used by kind "storage"; remove it',
    ]


def test_certificate_file_must_name_a_certificate() -> None:
    doc = base_config()
    doc["templates"]["web"]["files"] = {
        "tls.crt": {"kind": "certificate", "template": "nope", "key": {"source": "agent", "name": "tls.pub"}}
    }
    assert (
        only(doc)
        == 'templates.web.files["tls.crt"].template: certificate "nope" is not defined in certificates'
    )


def test_file_names_are_clean_relative_paths() -> None:
    doc = base_config()
    doc["templates"]["web"]["files"] = {
        "/etc/x": {"kind": "string", "template": "x"},
        "a/../../b": {"kind": "string", "template": "x"},
        "conf/app.env": {"kind": "string", "template": "x"},
    }
    assert sorted(problems(doc)) == [
        "templates.web.files[\"/etc/x\"]: file name must be a relative path using '/' separators",
        'templates.web.files["a/../../b"]: file name must be a clean relative path '
        "(no '.', '..' or '//' segments)",
    ]


# ---- images, certificates, load balancers ----------------------------------------------------


def _image(provider: str) -> dict[str, Any]:
    return {"provider": provider, "filters": [{"name": "name", "values": ["debian-12-*"]}], "owners": ["1"]}


def test_image_provider_must_match_shard_provider() -> None:
    doc = base_config()
    doc["images"] = {"debian": _image("aws")}
    assert problems(doc) == []  # the sim provider imitates every kind of image lookup
    doc["shard"]["infra"]["provider"] = "local"
    assert only(doc) == 'images.debian.provider: "aws" images need shard.infra.provider "aws" (it is "local")'
    doc["shard"]["infra"]["provider"] = "google"
    assert only(doc).endswith("on google, set args.SourceImage to an image or image family path instead")
    doc["shard"]["infra"]["provider"] = "aws"
    assert problems(doc) == []
    doc["images"] = {"debian": _image("oci")}
    assert only(doc) == (
        'images.debian.provider: "oci" images need shard.infra.provider "oci" (it is "aws"); '
        "no OCI provider exists yet"
    )


def test_load_balancer_provider_must_match_shard_provider() -> None:
    doc = base_config()
    doc["shard"]["infra"]["provider"] = "aws"
    doc["load_balancers"] = {
        "tg": {"provider": "aws", "target_groups": [{"arn": "arn:tg", "target_port": 80}]},
        "neg": {"provider": "google", "network_endpoint_groups": ["neg-a"]},
        "tun": {"provider": "tunnel", "listeners": [{"target_port": 80}]},
    }
    assert sorted(problems(doc)) == [
        'load_balancers.neg.provider: "google" load balancers need shard.infra.provider "google" '
        '(it is "aws")',
        'load_balancers.tun.provider: "tunnel" load balancers are not supported by this server yet',
    ]
    doc["shard"]["infra"]["provider"] = "sim"  # imitates aws and google load balancers
    assert problems(doc) == [
        'load_balancers.tun.provider: "tunnel" load balancers are not supported by this server yet'
    ]


def test_leader_network_only_where_the_provider_can_move_it() -> None:
    doc = base_config()
    doc["shard"]["leader_network"] = {"ip": "10.0.0.10"}
    assert problems(doc) == []  # sim
    doc = _proxmox(doc)
    doc["groups"]["default"]["web"]["args"] = {"TemplateVMID": 9000, "StoragePool": "local-lvm"}
    assert only(doc) == (
        'shard.leader_network: the "proxmox" provider cannot move a leader address; remove it (keep a '
        "floating address with keepalived/VRRP between the servers instead)"
    )
    doc["shard"]["infra"]["provider"] = "aws"
    assert only(doc) == (
        'shard.leader_network.interface_id: is required when the provider is "aws" (the ENI that carries '
        "the leader IP)"
    )


def test_image_filters_and_names() -> None:
    doc = base_config()
    doc["shard"]["infra"]["provider"] = "aws"
    doc["images"] = {"debian": {**_image("aws"), "filters": []}, "my-image": _image("aws")}
    assert sorted(problems(doc)) == [
        "images.debian.filters: must have at least 1 item",
        "images.my-image: image name must be a template identifier (letters, digits and '_', not starting "
        "with a digit) so it can be used as Image.<name>",
    ]


def test_certificate_kind_is_client_or_server() -> None:
    doc = base_config()
    doc["certificates"] = {"a": {"kind": "both"}, "b": {"cn": "x"}, "ca": {"cn": "My CA", "ttl": 87600}}
    assert sorted(problems(doc)) == [
        'certificates.a.kind: must be one of: client, server (got "both")',
        "certificates.b.kind: is required (client or server)",
    ]


def test_certificate_ttl_and_uris() -> None:
    doc = base_config()
    doc["certificates"] = {"a": {"kind": "client", "ttl": 0, "uri": ["relative/path"]}}
    assert sorted(problems(doc)) == [
        "certificates.a.ttl: must be at least 1",
        'certificates.a.uri[0]: must be an absolute URI such as "spiffe://example/x" (got "relative/path")',
    ]


def test_load_balancer_ports_and_shapes() -> None:
    doc = base_config()
    doc["load_balancers"] = {
        "a": {"provider": "aws", "target_groups": [{"arn": "arn:x", "target_port": 70000}]},
        "b": {"provider": "aws", "listeners": [{"target_port": 80}]},
        "c": {"provider": "google", "frontends": [{"ip": "1.2.3.4", "port": 443}]},
        "d": {"provider": "tunnel", "listeners": [{"target_port": 80, "proxy_port": 8080}]},
    }
    assert sorted(problems(doc)) == [
        "load_balancers.a.target_groups[0].target_port: must be a port number between 1 and 65535",
        'load_balancers.b.listeners: is for provider "tunnel", not "aws"',
        'load_balancers.b.target_groups: must have at least one entry for provider "aws"',
        'load_balancers.c.network_endpoint_groups: must have at least one entry for provider "google" '
        "(or set instance_group_name)",
        'load_balancers.d.provider: "tunnel" load balancers are not supported by this server yet',
    ]


# ---- proxmox ---------------------------------------------------------------------------------


def _proxmox(doc: dict[str, Any]) -> dict[str, Any]:
    doc["shard"]["infra"]["provider"] = "proxmox"
    return doc


def test_proxmox_merged_args_need_storage_pool_and_one_template_source() -> None:
    doc = _proxmox(base_config())
    doc["groups"]["default"]["web"]["args"] = {"TemplateVMID": 9000}
    assert only(doc) == (
        'groups.default.web.args: provider "proxmox" needs "StoragePool" in the merged args '
        "(defaults, template and group)"
    )
    doc["defaults"] = {"args": {"StoragePool": "local-lvm", "TemplateName": "debian"}}
    assert only(doc) == (
        'groups.default.web.args: provider "proxmox" needs exactly one of "TemplateVMID" or "TemplateName" '
        "in the merged args (found both)"
    )
    del doc["groups"]["default"]["web"]["args"]
    assert problems(doc) == []


def test_proxmox_rule_does_not_apply_to_other_providers() -> None:
    doc = base_config()
    doc["groups"]["default"]["web"]["args"] = {"Anything": 1}
    assert problems(doc) == []


# ---- groups ----------------------------------------------------------------------------------


def test_group_fields() -> None:
    doc = base_config()
    doc["groups"]["default"]["web"].update({"size": -1, "drain_timeout": "2m", "instance_type": 5})
    assert sorted(problems(doc)) == [
        "groups.default.web.instance_type: must be a string",
        "groups.default.web.size: must be at least 0",
    ]
    del doc["groups"]["default"]["web"]["template"]
    assert "groups.default.web.template: is required" in problems(doc)
