"""Rendering the files a shard pushes to agents, and the certificate log, on a real file:// store."""

from __future__ import annotations

import json
import logging
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from shard_helpers import sample_shard_identity

from nstance.config import CertConfig, FileConfig, MergedGroupConfig
from nstance.core.clock import ManualClock
from nstance.core.errors import Unavailable
from nstance.objectstore.file import FileObjectStore
from nstance.objectstore.scoped import ScopedObjectStore
from nstance.pki.ca import CertificateAuthority, create_ca
from nstance.pki.certs import IssuedCertificate
from nstance.pki.keys import generate_private_key, public_key_to_pem
from nstance.secrets.memory import MemorySecretStore
from nstance.server.agents.files import (
    FileCertificate,
    InstanceFacts,
    RenderResult,
    env_line,
    render_files,
    required_agent_keys,
    write_certlog,
)

INSTANCE_ID = "knc01jq6z8c8w9x2m4r5t7v9y1b3d"


def file(kind: str, **kw: Any) -> FileConfig:
    return FileConfig.model_validate({"kind": kind, **kw})


def merged(files: dict[str, FileConfig], vars: dict[str, str] | None = None) -> MergedGroupConfig:
    return MergedGroupConfig(
        tenant="acme",
        group="workers",
        template="knc",
        kind="knc",
        arch="amd64",
        size=1,
        instance_type="m7g.large",
        subnet_pool="default",
        vars={"cluster_name": "prod", **(vars or {})},
        args={},
        userdata=None,
        files=files,
        drain_timeout=timedelta(minutes=5),
        load_balancers=(),
        is_static=True,
        has_dynamic=False,
    )


CERTS = {
    "kubelet-server": CertConfig.model_validate(
        {
            "kind": "server",
            "cn": "system:node:{{ .Instance.Hostname }}",
            "organization": ["system:nodes"],
            "dns": ["{{ .Instance.Hostname }}", "{{ .Instance.Hostname }}.{{ .Vars.cluster_name }}.internal"],
            "ip": ["{{ .Instance.IP4 }}", "{{ .Instance.IP6 }}"],
            "ttl": 24,
        }
    ),
    "no-cn": CertConfig.model_validate({"kind": "client"}),
    "loose": CertConfig.model_validate(
        {
            "kind": "server",
            "country": ["AU", "Australia"],
            "ip": [
                "{{ .Instance.IP4 }}",
                "{{ .Instance.IP6 }}",
                "{{ .Instance.Hostname }}",
                "[2001:db8::7]",
                "fe80::1%eth0",
                "2001:db8::8",
            ],
        }
    ),
}


class Env:
    def __init__(self, tmp_path: Path) -> None:
        self.root = tmp_path / "bucket"
        self.store = ScopedObjectStore(FileObjectStore(self.root), "shard/zone-a/")
        self.secrets = MemorySecretStore()
        self.clock = ManualClock()
        self.ca: CertificateAuthority = create_ca(cluster_id="test", clock=self.clock)
        self.instance = InstanceFacts(
            instance_id=INSTANCE_ID,
            tenant="acme",
            group="workers",
            shard=sample_shard_identity(self.ca.cert_pem),
            hostname="ip-10-0-1-7",
            ipv4="10.0.1.7",
            images={"debian": "ami-123"},
        )
        self.agent_key = generate_private_key("ecdsa-p256")

    async def render(
        self,
        files: dict[str, FileConfig],
        *,
        public_keys: dict[str, bytes] | None = None,
        only: list[str] | None = None,
        secrets: MemorySecretStore | bool | None = True,
        store: Any = None,
    ) -> RenderResult:
        return await render_files(
            merged=merged(files),
            instance=self.instance,
            public_keys=public_keys or {},
            secrets=self.secrets if secrets is True else (secrets or None),
            store=store or self.store,
            ca=self.ca,
            clock=self.clock,
            certificates=CERTS,
            only=only,
        )

    def keys(self) -> dict[str, bytes]:
        return {"kubelet.server": public_key_to_pem(self.agent_key)}


@pytest.fixture
def env(tmp_path: Path) -> Env:
    return Env(tmp_path)


def contents(result: RenderResult) -> dict[str, bytes]:
    return {f.name: f.content for f in result.files}


CERT_FILE = file(
    "certificate", template="kubelet-server", key={"source": "agent", "name": "kubelet.server.pub"}
)


async def test_every_plain_kind_renders_with_vars_and_instance_data(env: Env) -> None:
    env.secrets.set("bootstrap-token", b"tok\x00en-bytes")
    env.store.put("files/acme/ip-10-0-1-7/motd", b"welcome\n")
    files = {
        "token": file("secret", source="bootstrap-token"),
        "motd": file("storage", source="files/acme/{{ .Instance.Hostname }}/motd"),
        "node.env": file(
            "env",
            template={
                "NODE": "{{ .Instance.ID }}",
                "CLUSTER": "{{ .Vars.cluster_name }}",
                "ZONE": "{{ .Provider.Zone }}",
            },
        ),
        "node.json": file(
            "json",
            template={
                "id": "{{ .Instance.ID }}",
                "ports": [80, "{{ .Vars.cluster_name }}"],
                "ok": True,
                "image": "{{ .Image.debian }}",
            },
        ),
        "hello.txt": file(
            "string", template="host {{ .Instance.Hostname }} ({{ .Instance.IP4 }}) in {{ .Server.Shard }}\n"
        ),
    }
    result = await env.render(files)
    assert result.errors == {}
    got = contents(result)
    assert [f.name for f in result.files] == sorted(files)
    assert got["token"] == b"tok\x00en-bytes"
    assert got["motd"] == b"welcome\n"
    assert got["node.env"] == f"CLUSTER=prod\nNODE={INSTANCE_ID}\nZONE=zone-a".encode()
    assert json.loads(got["node.json"]) == {
        "id": INSTANCE_ID,
        "ports": [80, "prod"],
        "ok": True,
        "image": "ami-123",
    }
    assert got["hello.txt"] == b"host ip-10-0-1-7 (10.0.1.7) in zone-a\n"
    assert result.certificates == []
    assert result.certlog_key is None


async def test_json_output_is_stable_whatever_the_config_key_order(env: Env) -> None:
    a = file("json", template={"b": {"y": 1, "x": "{{ .Vars.cluster_name }}"}, "a": [3, 1]})
    b = file("json", template={"a": [3, 1], "b": {"x": "{{ .Vars.cluster_name }}", "y": 1}})
    first = contents(await env.render({"c.json": a}))["c.json"]
    second = contents(await env.render({"c.json": b}))["c.json"]
    assert first == second
    assert first == b'{\n  "a": [\n    3,\n    1\n  ],\n  "b": {\n    "x": "prod",\n    "y": 1\n  }\n}'


async def test_env_and_json_files_are_the_bytes_a_go_server_writes(env: Env) -> None:
    """Vectors from upstream's ``filegen/templates_test.go`` (env and JSON kinds), whole files."""
    tricky = {
        "SPACES": "two words",
        "QUOTES": "say \"hi\" and 'bye'",
        "DOLLAR": "$HOME and `id` and \\n",
        "EMPTY": "",
        "INSTANCE_ID": "{{ .Instance.ID }}",
        "MISSING": "{{ .Vars.not_set }}",
    }
    kubelet = {
        "kind": "KubeletConfiguration",
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "port": 10250,
        "ratio": 0.5,
        "big": 1e21,
        "clusterDNS": ["{{ .Vars.cluster_name }}"],
        "html": "<a & b>",
        "nodeLabels": {"instance.nadrama.com/id": "{{ .Instance.ID }}"},
        "empty": {},
        "none": None,
    }
    result = await env.render(
        {"app.env": file("env", template=tricky), "k.json": file("json", template=kubelet)}
    )
    assert result.errors == {}
    got = contents(result)
    assert (
        got["app.env"]
        == (
            "DOLLAR=$HOME and `id` and \\n\nEMPTY=\nINSTANCE_ID=" + INSTANCE_ID + "\nMISSING=\n"
            "QUOTES=say \"hi\" and 'bye'\nSPACES=two words"
        ).encode()
    )
    assert (
        got["k.json"]
        == (
            '{\n  "apiVersion": "kubelet.config.k8s.io/v1beta1",\n  "big": 1e+21,\n'
            '  "clusterDNS": [\n    "prod"\n  ],\n'
            '  "empty": {},\n  "html": "\\u003ca \\u0026 b\\u003e",\n  "kind": "KubeletConfiguration",\n'
            '  "nodeLabels": {\n    "instance.nadrama.com/id": "' + INSTANCE_ID + '"\n  },\n  "none": null,\n'
            '  "port": 10250,\n  "ratio": 0.5\n}'
        ).encode()
    )
    assert env_line("SPACES", "a b") == "SPACES=a b"


async def test_env_value_with_a_line_break_fails_only_that_file(env: Env) -> None:
    files = {
        "bad.env": file("env", template={"MULTI": "line1\nline2"}),
        "bad-key.env": file("env", template={"1X": "v"}),
        "good.env": file("env", template={"A": "1"}),
    }
    result = await env.render(files)
    assert set(result.errors) == {"bad.env", "bad-key.env"}
    assert "line break" in result.errors["bad.env"]
    assert "string" in result.errors["bad.env"]
    assert "1X" in result.errors["bad-key.env"]
    assert contents(result) == {"good.env": b"A=1"}


async def test_missing_secret_object_key_and_template_errors_do_not_stop_the_others(env: Env) -> None:
    files = {
        "token": file("secret", source="not-there"),
        "blob": file("storage", source="missing/object"),
        "broken.txt": file("string", template="{{ .Vars.nope.x }}"),
        "cert.pem": CERT_FILE,
        "ok.txt": file("string", template="fine"),
    }
    result = await env.render(files)
    assert contents(result) == {"ok.txt": b"fine"}
    assert 'secret "not-there" does not exist' in result.errors["token"]
    assert 'object "missing/object" does not exist' in result.errors["blob"]
    assert "broken.txt" in result.errors["broken.txt"]
    assert "<.Vars.nope.x>" in result.errors["broken.txt"]
    assert 'public key "kubelet.server"' in result.errors["cert.pem"]
    assert result.certificates == []
    assert env.store.list("certlog/") == []


async def test_without_a_secret_store_secret_files_report_it(env: Env) -> None:
    result = await env.render({"token": file("secret", source="x")}, secrets=None)
    assert "no secret store" in result.errors["token"]


async def test_cluster_secrets_and_shard_bookkeeping_are_never_delivered(env: Env) -> None:
    env.secrets.set("ca.key", b"PRIVATE")
    env.store.put("instance/acme.rec.json", b'{"registration_jwt": "secret"}')
    # The agent reports its hostname; a hostile one must not steer a templated source anywhere.
    env.instance = InstanceFacts(
        instance_id=INSTANCE_ID,
        tenant="acme",
        group="workers",
        shard=env.instance.shard,
        hostname="../instance",
    )
    files = {
        "ca": file("secret", source="ca.key"),
        "ca2": file("secret", source="{{ .Vars.which }}.key"),
        "rec": file("storage", source="instance/acme.rec.json"),
        "climb": file("storage", source="files/{{ .Instance.Hostname }}/acme.rec.json"),
    }
    result = await render_files(
        merged=merged(files, vars={"which": "ca"}),
        instance=env.instance,
        public_keys={},
        secrets=env.secrets,
        store=env.store,
        ca=env.ca,
        clock=env.clock,
        certificates=CERTS,
    )
    assert result.files == []
    assert set(result.errors) == set(files)
    assert "never delivered" in result.errors["ca"]
    assert "never delivered" in result.errors["ca2"]
    assert "never delivered" in result.errors["rec"]
    assert "'..'" in result.errors["climb"]


async def test_certificate_file_chains_to_the_ca_and_matches_the_certlog(env: Env) -> None:
    result = await env.render(
        {"kubelet.crt": CERT_FILE, "other.txt": file("string", template="x")}, public_keys=env.keys()
    )
    assert result.errors == {}
    cert = x509.load_pem_x509_certificate(contents(result)["kubelet.crt"])

    cert.verify_directly_issued_by(env.ca.certificate)
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "system:node:ip-10-0-1-7"
    assert cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value == "system:nodes"
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["ip-10-0-1-7", "ip-10-0-1-7.prod.internal"]
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["10.0.1.7"]  # empty IP6 dropped
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert cert.public_key() == env.agent_key.public_key()
    assert cert.not_valid_after_utc == env.clock.now() + timedelta(hours=24)

    assert len(result.certificates) == 1
    issued = result.certificates[0]
    assert isinstance(issued, FileCertificate)
    assert issued.name == "kubelet.crt"
    assert issued.serial == cert.serial_number

    now = env.clock.now()
    stamp = now.strftime("%Y%m%d%H%M%S") + f"{now.microsecond // 1000:03d}"  # upstream's 17 digits
    key = f"certlog/acme.{stamp}.{INSTANCE_ID}.json"
    assert result.certlog_key == key
    assert (env.root / "shard/zone-a" / key).is_file()
    doc = json.loads(env.store.get(key)[0])
    assert doc["tenant"] == "acme"
    assert doc["instance_id"] == INSTANCE_ID
    assert doc["batch_size"] == 1
    assert doc["issued_at"] == now.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert doc["certificates"] == [
        {
            "certificate_name": "kubelet.crt",
            "serial_number": format(cert.serial_number, "x"),
            "expires_at": cert.not_valid_after_utc.isoformat().replace("+00:00", "Z"),
            "not_before": cert.not_valid_before_utc.isoformat().replace("+00:00", "Z"),
        }
    ]


async def test_certificate_without_cn_uses_the_template_name_and_ed25519_keys_work(env: Env) -> None:
    key = generate_private_key("ed25519")
    f = file("certificate", template="no-cn", key={"source": "agent", "name": "etcd.pub"})
    result = await env.render({"etcd.crt": f}, public_keys={"etcd": public_key_to_pem(key)})
    assert result.errors == {}
    cert = x509.load_pem_x509_certificate(contents(result)["etcd.crt"])
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "no-cn"
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.CLIENT_AUTH]


async def test_entries_go_leaves_out_are_left_out_with_a_warning_not_a_failed_file(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    f = file("certificate", template="loose", key={"source": "agent", "name": "kubelet.server.pub"})
    with caplog.at_level(logging.WARNING, logger="nstance.server.agents.files"):
        result = await env.render({"loose.crt": f}, public_keys=env.keys())
    assert result.errors == {}
    cert = x509.load_pem_x509_certificate(contents(result)["loose.crt"])
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["10.0.1.7", "2001:db8::8"]
    assert [a.value for a in cert.subject.get_attributes_for_oid(NameOID.COUNTRY_NAME)] == ["AU"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert all(INSTANCE_ID in w and "loose.crt" in w for w in warnings)
    left_out = sorted(w.split(": ", 1)[1] for w in warnings)
    assert left_out == sorted(
        [
            'certificates.loose.ip: "ip-10-0-1-7" is not an IP address; left out of the certificate',
            'certificates.loose.ip: "[2001:db8::7]" is not an IP address; left out of the certificate',
            'certificates.loose.ip: "fe80::1%eth0" is not an IP address; left out of the certificate',
            'certificates.loose.country: "Australia" cannot be used '
            "(Attribute's length must be >= 2 and <= 2, but it was 9); left out of the certificate",
        ]
    )


async def test_unusable_agent_key_fails_only_its_file(env: Env) -> None:
    rsa_like = b"-----BEGIN PUBLIC KEY-----\nnot a key\n-----END PUBLIC KEY-----\n"
    files = {"kubelet.crt": CERT_FILE, "ok.txt": file("string", template="x")}
    result = await env.render(files, public_keys={"kubelet.server": rsa_like})
    assert set(result.errors) == {"kubelet.crt"}
    assert contents(result) == {"ok.txt": b"x"}
    assert env.store.list("certlog/") == []


async def test_only_limits_what_is_rendered_and_issued(env: Env) -> None:
    files = {
        "kubelet.crt": CERT_FILE,
        "a.txt": file("string", template="a"),
        "b.txt": file("string", template="b"),
    }
    result = await env.render(files, public_keys=env.keys(), only=["b.txt", "nope.txt"])
    assert contents(result) == {"b.txt": b"b"}
    assert result.certificates == []
    assert "not a file of template" in result.errors["nope.txt"]
    assert env.store.list("certlog/") == []

    result = await env.render(files, public_keys=env.keys(), only=["kubelet.crt"])
    assert [f.name for f in result.files] == ["kubelet.crt"]
    assert len(env.store.list("certlog/")) == 1


async def test_certificates_are_withheld_when_the_certlog_cannot_be_written(env: Env) -> None:
    class FailingCertlog(ScopedObjectStore):
        def put_if_match(self, key: str, data: bytes, etag: str | None) -> str:
            if key.startswith("certlog/"):
                raise Unavailable("storage is down")
            return super().put_if_match(key, data, etag)

    store = FailingCertlog(FileObjectStore(env.root), "shard/zone-a/")
    result = await env.render(
        {"kubelet.crt": CERT_FILE, "ok.txt": file("string", template="x")},
        public_keys=env.keys(),
        store=store,
    )
    assert contents(result) == {"ok.txt": b"x"}
    assert "certificate log could not be written" in result.errors["kubelet.crt"]
    assert result.certificates == []
    assert result.certlog_key is None


def test_required_agent_keys_are_base_names_without_pub(env: Env) -> None:
    m = merged(
        {
            "kubelet.crt": CERT_FILE,
            "kubelet-client.crt": file(
                "certificate", template="no-cn", key={"source": "agent", "name": "kubelet.server.pub"}
            ),
            "etcd.crt": file("certificate", template="no-cn", key={"source": "agent", "name": "etcd"}),
            "x.txt": file("string", template="x"),
        }
    )
    assert required_agent_keys(m) == ["etcd", "kubelet.server"]


async def test_certlog_batches_in_the_same_millisecond_do_not_overwrite_each_other(env: Env) -> None:
    first = await env.render({"kubelet.crt": CERT_FILE}, public_keys=env.keys())
    second = await env.render({"kubelet.crt": CERT_FILE}, public_keys=env.keys())
    assert first.certlog_key != second.certlog_key
    serials: set[str] = set()
    for key in env.store.list("certlog/"):
        serials.update(c["serial_number"] for c in json.loads(env.store.get(key)[0])["certificates"])
    issued: list[IssuedCertificate] = [*first.certificates, *second.certificates]
    assert serials == {c.serial_hex for c in issued}
    assert len(serials) == 2

    direct = write_certlog(
        env.store, tenant="acme", instance_id="x", certificates=issued, now=env.clock.now()
    )
    assert direct.startswith("certlog/acme.")
    assert direct.endswith(".x.json")
    assert [c["certificate_name"] for c in json.loads(env.store.get(direct)[0])["certificates"]] == [
        "kubelet.crt"
    ] * 2
