"""Upstream's own configuration documents load here (tests/fixtures/upstream/README.md says where
each comes from), and what this implementation writes for them is what Go reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nstance.config import load_config_file, load_groups_file, load_groups_text, merged_group
from nstance.config.groupstext import GroupsText
from nstance.config.loader import dump_groups_text
from nstance.config.render import render_template
from nstance.config.templatedata import ClusterData, InstanceData, ServerData, TemplateData

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "upstream"
#: Per document: json.MarshalIndent(groups, "", "  ") of it decoded into map[string]map[string]GroupConfig,
#: as a scratch Go program printed it (the fixtures' README.md says how).
GO_GROUPS = {
    case["name"]: case
    for case in json.loads((FIXTURES / "go-json-vectors.json").read_text(encoding="utf-8"))["groups_jsonc"]
}


@pytest.mark.parametrize(
    ("name", "provider"),
    [
        ("config-tmux.jsonc", "local"),
        ("config-proxmox.jsonc", "proxmox"),
        ("tf-aws-shard.json", "aws"),
        ("tf-aws-shard-object-storage.json", "aws"),
        ("tf-gcp-shard.json", "google"),
        ("tf-gcp-shard-object-storage.json", "google"),
    ],
)
def test_upstream_configs_load(name: str, provider: str) -> None:
    config = load_config_file(FIXTURES / name)
    assert config.shard.infra.provider == provider
    for tenant, groups in config.groups.items():
        for group in groups:
            assert merged_group(config, {}, tenant, group).template in config.templates


def test_terraform_module_config_keeps_its_v1_shapes() -> None:
    config = load_config_file(FIXTURES / "tf-aws-shard.json")
    lb = config.load_balancers["ingress"]
    assert lb.provider == "aws"
    assert len(lb.target_group_arns) == 2
    assert lb.target_groups == []
    assert config.cluster.secrets.provider == "aws-secrets-manager"
    assert config.cluster.secrets.encryption_key is None  # "encryption_key": null
    spare = config.groups["default"]["spare"]  # "size": null, "subnet_pool": null, ...
    assert (spare.size, spare.subnet_pool, spare.load_balancers) == (None, None, [])
    assert config.templates["default"].subnet_pool is None  # the default template has none
    storage = load_config_file(FIXTURES / "tf-aws-shard-object-storage.json").cluster.secrets
    assert storage.encryption_key is not None
    assert storage.encryption_key.provider == "aws-secrets-manager"


def test_terraform_gcp_module_config_keeps_its_v1_shapes() -> None:
    config = load_config_file(FIXTURES / "tf-gcp-shard.json")
    assert config.shard.infra.options == {"project_id": "acme-prod"}  # the provider reads project_id
    lb = config.load_balancers["ingress"]
    assert (lb.provider, lb.instance_group_name, lb.backend_service_name) == ("google", "ingress-usc1a", None)
    secrets = config.cluster.secrets  # {"provider": "gcp-secret-manager", "options": {"project_id": ...}}
    assert (secrets.provider, secrets.prefix, secrets.project_id) == (
        "google-secret-manager",
        "nstance-prod-",
        "acme-prod",
    )
    key = load_config_file(FIXTURES / "tf-gcp-shard-object-storage.json").cluster.secrets.encryption_key
    assert key is not None
    assert (key.provider, key.source, key.project_id) == (
        "google-secret-manager",
        "nstance-prod-encryption-key",
        "acme-prod",
    )


def test_terraform_agent_userdata_renders_without_its_optional_ssh_var() -> None:
    config = load_config_file(FIXTURES / "tf-aws-shard.json")
    userdata = config.templates["default"].userdata
    assert userdata is not None
    data = TemplateData(
        instance=InstanceData(id="dft01jexample", kind="dft"),
        cluster=ClusterData(id="prod", ca_cert="-----BEGIN CERTIFICATE-----"),
        server=ServerData(registration_addr="10.0.1.10:8992", agent_addr="10.0.1.10:8994"),
        nonce="jwt",
    )
    text = render_template("templates.default.userdata", userdata.content, data)
    assert 'echo "${#KEYS[@]} ssh keys"' in text
    assert "KEYS+=" not in text
    assert "NSTANCE_INSTANCE_ID=dft01jexample\n" in text
    with_key = TemplateData(instance=data.instance, vars={"SSH_AUTHORIZED_KEY": "ssh-ed25519 AAAA"})
    assert 'KEYS=()\nKEYS+=("ssh-ed25519 AAAA")\necho' in render_template("u", userdata.content, with_key)


def test_upstream_groups_example_loads_and_is_written_back_as_go_writes_it() -> None:
    # Upstream's example is laid out as json.MarshalIndent writes it (GroupConfig's fields in declaration
    # order: template, size, subnet_pool), apart from the file's final newline.
    text = (FIXTURES / "groups.jsonc").read_text()
    dynamic = load_groups_file(FIXTURES / "groups.jsonc")
    assert dynamic["default"]["test"].size == 1
    assert dump_groups_text(dynamic) == text.rstrip("\n") == GO_GROUPS["groups.jsonc"]["written"]


@pytest.mark.parametrize("name", sorted(GO_GROUPS))
def test_groups_documents_are_written_byte_for_byte_as_go_writes_them(name: str) -> None:
    dynamic = load_groups_text(json.dumps(GO_GROUPS[name]["document"]))
    assert dump_groups_text(dynamic) == GO_GROUPS[name]["written"]
    assert GroupsText().dump(dynamic) == GO_GROUPS[name]["written"]


def _problems_of(doc: dict[str, object]) -> list[str]:
    from config_samples import problems

    return [str(p) for p in problems(doc)]


def test_v1_load_balancer_shapes() -> None:
    from config_samples import base_config

    doc = base_config()
    doc["shard"]["infra"]["provider"] = "gcp"
    # Upstream v1's own shape: both names, which v1 requires together.
    v1 = {"provider": "gcp", "backend_service_name": "web-backend", "instance_group_name": "web-ig"}
    doc["load_balancers"] = {"web": v1}
    assert _problems_of(doc) == []
    doc["load_balancers"] = {"web": {"provider": "gcp", "instance_group_name": "web-ig"}}
    assert _problems_of(doc) == []  # the backend service is documentation here; not required
    doc["load_balancers"] = {"web": {"provider": "gcp", "network_endpoint_groups": ["neg-a"]}}
    assert _problems_of(doc) == []
    # Go v1 reads only the instance group of such an entry and v2 only its NEGs: refused, not guessed.
    doc["load_balancers"] = {"web": {**v1, "network_endpoint_groups": ["neg-a"]}}
    assert _problems_of(doc) == [
        "load_balancers.web.instance_group_name: cannot be combined with network_endpoint_groups "
        "(upstream's v1 reads only the instance group and v2 only the NEGs); make them two "
        "load_balancers entries"
    ]
    doc["load_balancers"] = {"web": {"provider": "gcp", "backend_service_name": "web-backend"}}
    assert _problems_of(doc) == [
        'load_balancers.web.network_endpoint_groups: must have at least one entry for provider "google" '
        "(or set instance_group_name)"
    ]
    doc["shard"]["infra"]["provider"] = "aws"
    doc["load_balancers"] = {"web": {"provider": "aws", "instance_group_name": "web-ig"}}
    assert sorted(_problems_of(doc)) == [
        'load_balancers.web.instance_group_name: is for provider "google", not "aws"',
        'load_balancers.web.target_groups: must have at least one entry for provider "aws"',
    ]
    doc["load_balancers"] = {"web": {"provider": "aws", "target_group_arns": ["arn:aws:tg/a"]}}
    assert _problems_of(doc) == []
    doc["load_balancers"] = {"web": {"provider": "aws"}}
    assert _problems_of(doc) == [
        'load_balancers.web.target_groups: must have at least one entry for provider "aws"'
    ]


def test_v1_secret_options_carry_only_the_google_project() -> None:
    from config_samples import base_config

    doc = base_config()
    key = {"provider": "gcp-secret-manager", "source": "k", "project_id": "a", "options": {"project_id": "b"}}
    doc["cluster"]["secrets"] = {"provider": "object-storage", "encryption_key": key}
    assert _problems_of(doc) == [
        "cluster.secrets.encryption_key.options.project_id: differs from project_id; set one of them"
    ]
    key["options"] = {"project_id": "a", "region": "x"}
    assert _problems_of(doc) == [
        "cluster.secrets.encryption_key.options.region: unknown field (upstream v1's options carry only "
        "project_id)"
    ]
    doc["cluster"]["secrets"] = {"provider": "gcp-secret-manager", "options": "acme"}
    assert _problems_of(doc) == [
        'cluster.secrets.options: must be an object such as {"project_id": "my-project"} '
        "(upstream v1's shape)"
    ]


def test_google_frontend_ip_must_be_an_ip_address() -> None:
    from config_samples import base_config

    doc = base_config()
    doc["shard"]["infra"]["provider"] = "google"
    lb = {
        "provider": "google",
        "network_endpoint_groups": ["neg-a"],
        "frontends": [{"ip": "ingress", "port": 443}],
    }
    doc["load_balancers"] = {"web": lb}
    assert _problems_of(doc) == [
        'load_balancers.web.frontends[0].ip: must be an IPv4 or IPv6 address (got "ingress")'
    ]
    lb["frontends"] = [{"ip": "203.0.113.7", "port": 443}, {"ip": "2001:db8::1", "port": 443}]
    assert _problems_of(doc) == []
