"""Render the files a shard server pushes to an agent, and log the certificates it issues for them.

A template's ``files`` map a delivered file name to one of six kinds:

* ``secret``: the bytes of a secret (``source`` names it, templated) from the cluster secret store;
* ``storage``: the bytes of an object (``source`` is its key, templated) in the shard's store;
* ``env``: ``KEY=value`` lines, keys sorted, values templated and written as they are, lines joined
  by ``\n`` with none after the last (byte for byte what a Go server writes);
* ``json``: the object with every string templated, serialised as Go's ``json.MarshalIndent`` does
  (``nstance.core.gojson``: sorted keys, 2-space indent, ``\u003c``-style escapes, no final newline);
* ``string``: the templated text;
* ``certificate``: a certificate issued by the cluster CA for the public key the agent submitted
  under ``key.name`` (without ``.pub``), subject and SANs from the named ``certificates`` entry
  rendered with the instance's data. As a Go server does, an ``ip`` entry that renders to something
  that is not an IP address is left out rather than failing the file (``{{ .Instance.IP6 }}`` on an
  IPv4-only VM renders empty); so is a subject value no certificate can hold (a country that is not
  two letters, which a Go server never writes into a certificate). Each non-empty entry left out is
  logged as a warning naming the instance, the file and the value.

Each file succeeds or fails on its own: a missing secret, a key the agent has not submitted yet or a
template error lands in ``RenderResult.errors`` under the file's name and the others are still
delivered. Certificates of one call are one batch, logged with ``write_certlog`` before they are
returned; if the log cannot be written no certificate of the batch is handed out, so every delivered
certificate is in the log with its own serial.

Refused on purpose: the cluster's own secrets (``ca.key``, ``registration-nonce.key``) and the shard's
bookkeeping objects (instance records, the certificate log, the leader lock) are never delivered,
whatever a template says, because agent-reported values (hostname, IPs) can reach ``source``.

This module decides nothing about *when* files are pushed (that is the agent servicer's job) and
keeps no state; it only reads the secret store and object store and writes certificate log objects.
Blocking store calls and certificate signing run in worker threads.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from cryptography.x509 import ObjectIdentifier
from cryptography.x509.oid import NameOID

from nstance.config import (
    CertConfig,
    ClusterData,
    FileConfig,
    InstanceData,
    MergedGroupConfig,
    ProviderData,
    ServerData,
    TemplateData,
    render_template,
)
from nstance.config.errors import join_path
from nstance.config.render import render_value
from nstance.core.clock import Clock
from nstance.core.errors import InvalidArgument, NotFound, NstanceError
from nstance.core.gojson import go_marshal, go_marshal_indent
from nstance.objectstore.base import ObjectStore, PreconditionFailed
from nstance.objectstore.file import validate_key
from nstance.pki.ca import CertificateAuthority
from nstance.pki.certs import (
    IssuedCertificate,
    issue_workload_certificate,
    san_ip_address,
    subject_value_problem,
)
from nstance.secrets.base import SecretStore, validate_secret_name
from nstance.secrets.cluster_identity import CA_KEY_SECRET, NONCE_KEY_SECRET
from nstance.server.state.provisioning import ShardIdentity
from nstance.server.state.records import RECORD_PREFIX

log = logging.getLogger(__name__)

#: Where certificate log batches live in the shard store.
CERTLOG_PREFIX = "certlog/"
#: Largest file we deliver: a FileTransfer must fit in one gRPC message (4 MiB) with its name and hash.
MAX_FILE_BYTES = 4 * 1024 * 1024 - 64 * 1024
#: Secrets that identify the cluster itself; no template may hand them to an agent.
PROTECTED_SECRETS: frozenset[str] = frozenset({CA_KEY_SECRET, NONCE_KEY_SECRET})
#: Shard-store objects that are server bookkeeping, never agent files.
PROTECTED_OBJECT_PREFIXES: tuple[str, ...] = (RECORD_PREFIX, CERTLOG_PREFIX, "leader.json")

_ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_CERTLOG_ATTEMPTS = 16


# --- public types ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class AgentFile:
    """One rendered file, ready to send as a ``FileTransfer``."""

    name: str
    content: bytes


@dataclass(frozen=True, slots=True)
class FileCertificate(IssuedCertificate):
    """An ``IssuedCertificate`` for a template file: ``name`` is the file, ``key_name`` the agent key."""

    name: str = ""
    key_name: str = ""


@dataclass(frozen=True)
class RenderResult:
    """What ``render_files`` produced: files to push, per-file problems, certificates issued."""

    files: list[AgentFile]
    errors: dict[str, str]
    """File name -> why it could not be rendered (secret missing, agent key not yet submitted, ...)."""
    certificates: list[IssuedCertificate] = field(default_factory=list)
    """Certificates issued (and already logged) for this call; ``FileCertificate`` instances."""
    certlog_key: str | None = None
    """Key of the certificate log object written for ``certificates`` (shard store), if any."""


@dataclass(frozen=True)
class InstanceFacts:
    """What templates may know about the instance the files are for (``Instance.*`` and the shard).

    ``hostname``, ``ipv4`` and ``ipv6`` are what the agent reported at registration; ``instance_type``
    overrides the group's when the instance was created with another one (empty: the group's).
    """

    instance_id: str
    tenant: str
    group: str
    shard: ShardIdentity
    hostname: str = ""
    fqdn: str = ""
    ipv4: str = ""
    ipv6: str = ""
    instance_type: str = ""
    images: Mapping[str, str] = field(default_factory=dict)


# --- keys ------------------------------------------------------------------------------------------


def agent_key_base_name(name: str) -> str:
    """The key base name the agent generates for a template key name (``x.pub`` -> ``x``)."""
    return name.removesuffix(".pub")


def required_agent_keys(merged: MergedGroupConfig) -> list[str]:
    """Sorted, distinct key base names the agent must generate for the template's certificate files."""
    names = {
        agent_key_base_name(f.key.name)
        for f in merged.files.values()
        if f.kind == "certificate" and f.key is not None and f.key.source == "agent"
    }
    return sorted(names)


def _find_public_key(public_keys: Mapping[str, bytes], key_name: str) -> bytes | None:
    base = agent_key_base_name(key_name)
    found = public_keys.get(base)
    if found is None:
        found = public_keys.get(key_name)
    return found or None


# --- template data ---------------------------------------------------------------------------------


def template_data(merged: MergedGroupConfig, instance: InstanceFacts) -> TemplateData:
    """The data file and certificate templates are rendered with (no registration nonce)."""
    shard = instance.shard
    return TemplateData(
        instance=InstanceData(
            id=instance.instance_id,
            kind=merged.kind,
            arch=merged.arch,
            instance_type=instance.instance_type or merged.instance_type,
            hostname=instance.hostname,
            fqdn=instance.fqdn,
            ip4=instance.ipv4,
            ip6=instance.ipv6,
        ),
        cluster=ClusterData(id=shard.cluster_id, ca_cert=shard.ca_pem.decode("ascii", "replace")),
        server=ServerData(
            shard=shard.shard,
            registration_addr=shard.registration_addr,
            agent_addr=shard.agent_addr,
            operator_addr=shard.operator_addr,
        ),
        provider=ProviderData(kind=shard.provider_kind, region=shard.region, zone=shard.zone),
        vars=merged.vars,
        image=dict(instance.images),
    )


# --- plain kinds -----------------------------------------------------------------------------------


def env_line(key: str, value: str) -> str:
    """One ``KEY=value`` line (no newline) as Go writes it: the value is not quoted or escaped.

    Keys must be variable names; values must not contain line breaks or NUL, which would break the
    file for the agent (Go writes them anyway; here the file fails with InvalidArgument).
    """
    if not _ENV_KEY.fullmatch(key):
        raise InvalidArgument(
            f"env key {key!r} is not a valid variable name (letters, digits and _, not starting with a digit)"
        )
    if "\n" in value or "\r" in value or "\x00" in value:
        raise InvalidArgument(
            f"env value of {key} contains a line break or NUL, which env files cannot hold; "
            'use a "string" or "json" file for multi-line values'
        )
    return f"{key}={value}"


def _render_env(path: str, template: Mapping[str, Any], data: TemplateData) -> bytes:
    lines = []
    for key in sorted(template, key=lambda k: k.encode("utf-8")):
        value = render_template(join_path(path, key), str(template[key]), data)
        lines.append(env_line(key, value))
    return "\n".join(lines).encode("utf-8")


def _render_json(path: str, template: Any, data: TemplateData) -> bytes:
    return go_marshal_indent(render_value(path, template, data))


def _secret_name(path: str, source: str, data: TemplateData) -> str:
    name = render_template(join_path(path, "source"), source, data)
    validate_secret_name(name)
    if name in PROTECTED_SECRETS:
        raise InvalidArgument(
            f'secret "{name}" belongs to the cluster itself and is never delivered to agents'
        )
    return name


def _object_key(path: str, source: str, data: TemplateData) -> str:
    key = render_template(join_path(path, "source"), source, data)
    validate_key(key)
    if any(key.startswith(p) if p.endswith("/") else key == p for p in PROTECTED_OBJECT_PREFIXES):
        raise InvalidArgument(
            f'object "{key}" is shard bookkeeping (instance records, certificate log, leader lock) '
            "and is never delivered to agents"
        )
    return key


async def _read_secret(secrets: SecretStore | None, name: str) -> bytes:
    if secrets is None:
        raise InvalidArgument(
            f'secret "{name}" cannot be read: this server has no secret store configured (cluster.secrets)'
        )
    try:
        return await asyncio.to_thread(secrets.get, name)
    except NotFound:
        raise NotFound(
            f'secret "{name}" does not exist; create it with the secret store of cluster.secrets'
        ) from None


async def _read_object(store: ObjectStore, key: str) -> bytes:
    try:
        data, _etag = await asyncio.to_thread(store.get, key)
    except NotFound:
        raise NotFound(f'object "{key}" does not exist in the shard storage') from None
    return data


async def _render_plain(
    path: str, file: FileConfig, data: TemplateData, secrets: SecretStore | None, store: ObjectStore
) -> bytes:
    if file.kind == "secret":
        return await _read_secret(secrets, _secret_name(path, file.source, data))
    if file.kind == "storage":
        return await _read_object(store, _object_key(path, file.source, data))
    if file.kind == "env":
        return _render_env(join_path(path, "template"), file.template, data)
    if file.kind == "json":
        return _render_json(join_path(path, "template"), file.template, data)
    if file.kind == "string":
        return render_template(join_path(path, "template"), str(file.template), data).encode("utf-8")
    raise InvalidArgument(f'{path}: unknown file kind "{file.kind}"')


# --- certificates ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _CertRequest:
    file_name: str
    key_name: str
    public_key: bytes
    kind: str
    common_name: str
    organization: list[str]
    country: list[str]
    province: list[str]
    locality: list[str]
    street: list[str]
    postal_code: list[str]
    dns: list[str]
    ip: list[str]
    uri: list[str]
    ttl: timedelta
    left_out: list[str] = field(default_factory=list)
    """Why rendered entries were left out of the certificate (non-IPs, unencodable subject values)."""


def _render_list(path: str, values: Sequence[str], data: TemplateData) -> list[str]:
    """Render each item; items that render empty (e.g. ``{{ .Instance.IP6 }}`` without IPv6) are dropped."""
    out = []
    for i, value in enumerate(values):
        text = render_template(join_path(path, i), value, data).strip()
        if text:
            out.append(text)
    return out


def _usable_ips(path: str, values: list[str], left_out: list[str]) -> list[str]:
    """The entries that are IP addresses; each other one is described in ``left_out``."""
    kept = []
    for value in values:
        if san_ip_address(value) is None:
            left_out.append(f'{path}: "{value}" is not an IP address; left out of the certificate')
        else:
            kept.append(value)
    return kept


def _usable_subject(path: str, oid: ObjectIdentifier, values: list[str], left_out: list[str]) -> list[str]:
    """The entries a subject attribute of type ``oid`` can hold; each other one goes to ``left_out``."""
    kept = []
    for value in values:
        problem = subject_value_problem(oid, value)
        if problem is None:
            kept.append(value)
        else:
            left_out.append(f'{path}: "{value}" cannot be used ({problem}); left out of the certificate')
    return kept


def _cert_request(
    file_name: str,
    file: FileConfig,
    certificates: Mapping[str, CertConfig],
    public_keys: Mapping[str, bytes],
    data: TemplateData,
) -> _CertRequest:
    assert file.key is not None  # guaranteed by FileConfig validation
    cert_name = str(file.template)
    cert = certificates.get(cert_name)
    if cert is None:
        raise InvalidArgument(f'certificate template "{cert_name}" is not defined in "certificates"')
    if cert.kind is None:
        raise InvalidArgument(f'certificate template "{cert_name}" has no kind (set "client" or "server")')
    key_name = agent_key_base_name(file.key.name)
    public_key = _find_public_key(public_keys, file.key.name)
    if public_key is None:
        raise NotFound(
            f'waiting for the agent to submit public key "{key_name}" '
            "(requested through ReceiveKeyRequests, submitted with SubmitPublicKeys)"
        )
    path = join_path("certificates", cert_name)
    cn = render_template(join_path(path, "cn"), cert.cn, data).strip() if cert.cn else ""
    left_out: list[str] = []

    def subject(field_name: str, oid: ObjectIdentifier, values: list[str]) -> list[str]:
        where = join_path(path, field_name)
        return _usable_subject(where, oid, _render_list(where, values, data), left_out)

    ip_path = join_path(path, "ip")
    return _CertRequest(
        file_name=file_name,
        key_name=key_name,
        public_key=public_key,
        kind=cert.kind,
        common_name=cn or cert_name,
        organization=subject("organization", NameOID.ORGANIZATION_NAME, cert.organization),
        country=subject("country", NameOID.COUNTRY_NAME, cert.country),
        province=subject("province", NameOID.STATE_OR_PROVINCE_NAME, cert.province),
        locality=subject("locality", NameOID.LOCALITY_NAME, cert.locality),
        street=subject("street", NameOID.STREET_ADDRESS, cert.street),
        postal_code=subject("postal_code", NameOID.POSTAL_CODE, cert.postal_code),
        dns=_render_list(join_path(path, "dns"), cert.dns, data),
        ip=_usable_ips(ip_path, _render_list(ip_path, cert.ip, data), left_out),
        uri=_render_list(join_path(path, "uri"), cert.uri, data),
        ttl=timedelta(hours=cert.ttl),
        left_out=left_out,
    )


def _issue_batch(
    ca: CertificateAuthority, clock: Clock, requests: Sequence[_CertRequest]
) -> list[FileCertificate | str]:
    """Sign every request; each entry is the certificate or why it could not be issued."""
    out: list[FileCertificate | str] = []
    for req in requests:
        try:
            issued = issue_workload_certificate(
                ca,
                req.public_key,
                kind=req.kind,
                common_name=req.common_name,
                organization=req.organization,
                country=req.country,
                province=req.province,
                locality=req.locality,
                street_address=req.street,
                postal_code=req.postal_code,
                dns_names=req.dns,
                ip_addresses=req.ip,
                uris=req.uri,
                ttl=req.ttl,
                clock=clock,
            )
        except NstanceError as exc:
            out.append(str(exc))
            continue
        out.append(
            FileCertificate(
                certificate=issued.certificate,
                serial=issued.serial,
                serial_hex=issued.serial_hex,
                not_before=issued.not_before,
                not_after=issued.not_after,
                name=req.file_name,
                key_name=req.key_name,
            )
        )
    return out


# --- certificate log -------------------------------------------------------------------------------


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _certificate_name(cert: IssuedCertificate) -> str:
    if isinstance(cert, FileCertificate) and cert.name:
        return cert.name
    cns = cert.certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(cns[0].value) if cns else ""


def certlog_document(
    *, tenant: str, instance_id: str, certificates: Sequence[IssuedCertificate], now: datetime
) -> dict[str, Any]:
    """The JSON object ``write_certlog`` stores: upstream's fields (see docs/files.md), plus
    ``not_before`` in each entry."""
    return {
        "tenant": tenant,
        "instance_id": instance_id,
        "issued_at": now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "batch_size": len(certificates),
        "certificates": [
            {
                "certificate_name": _certificate_name(cert),
                "serial_number": cert.serial_hex,
                "expires_at": _iso(cert.not_after),
                "not_before": _iso(cert.not_before),
            }
            for cert in certificates
        ],
    }


def certlog_stamp(moment: datetime) -> int:
    """The time part of a certificate log key: ``yyyyMMddHHmmss`` and milliseconds, as one number.

    Upstream's keys have the same 17 digits (its last three are always ``000``), so both sort in time
    order together.
    """
    utc = moment.astimezone(UTC)
    return int(utc.strftime("%Y%m%d%H%M%S")) * 1000 + utc.microsecond // 1000


def write_certlog(
    store: ObjectStore,
    *,
    tenant: str,
    instance_id: str,
    certificates: Sequence[IssuedCertificate],
    now: datetime,
) -> str:
    """Write one certificate log batch to ``certlog/{tenant}.{stamp}.{instance_id}.json``; return the key.

    ``store`` is the shard-scoped store; ``stamp`` is ``certlog_stamp(now)``. The object is created,
    never overwritten: if a batch for the same instance already holds that stamp, the next free
    millisecond is used. Serials are the certificates' own (``IssuedCertificate.serial_hex``). The
    body is compact JSON as upstream's ``json.Marshal`` writes it.
    """
    if not certificates:
        raise InvalidArgument("a certificate log batch needs at least one certificate")
    if not tenant or not instance_id:
        raise InvalidArgument("a certificate log batch needs a tenant and an instance id")
    body = go_marshal(
        certlog_document(tenant=tenant, instance_id=instance_id, certificates=certificates, now=now)
    )
    ms = certlog_stamp(now)
    for attempt in range(_CERTLOG_ATTEMPTS):
        key = f"{CERTLOG_PREFIX}{tenant}.{ms + attempt}.{instance_id}.json"
        try:
            store.put_if_match(key, body, None)
        except PreconditionFailed:
            continue
        return key
    raise PreconditionFailed(
        f"could not find a free certificate log key for instance {instance_id} near {ms} ms "
        f"after {_CERTLOG_ATTEMPTS} attempts"
    )


# --- rendering -------------------------------------------------------------------------------------


async def render_files(
    *,
    merged: MergedGroupConfig,
    instance: InstanceFacts,
    public_keys: Mapping[str, bytes],
    secrets: SecretStore | None,
    store: ObjectStore,
    ca: CertificateAuthority,
    clock: Clock,
    certificates: Mapping[str, CertConfig],
    only: Collection[str] | None = None,
) -> RenderResult:
    """Render the template's files for ``instance`` (all of them, or the names in ``only``).

    ``public_keys`` maps the key names the agent submitted (``kubelet.server``) to PEM public keys;
    ``certificates`` is the server config's ``certificates`` map; ``store`` is the shard-scoped store
    (``storage`` files are read from it, the certificate log is written to it). Never raises for a
    single file's problem: those are in ``errors``. Raises InvalidArgument when ``instance`` is not of
    ``merged``'s tenant and group.
    """
    if (instance.tenant, instance.group) != (merged.tenant, merged.group):
        raise InvalidArgument(
            f"instance {instance.instance_id} is in {instance.tenant}/{instance.group}, "
            f"not in {merged.tenant}/{merged.group}"
        )
    data = template_data(merged, instance)
    errors: dict[str, str] = {}
    wanted = sorted(merged.files) if only is None else sorted(set(only))
    plain: list[tuple[str, FileConfig]] = []
    cert_requests: list[_CertRequest] = []
    for name in wanted:
        file = merged.files.get(name)
        if file is None:
            errors[name] = f'"{name}" is not a file of template "{merged.template}"'
            continue
        if file.kind != "certificate":
            plain.append((name, file))
            continue
        try:
            request = _cert_request(name, file, certificates, public_keys, data)
        except NstanceError as exc:
            errors[name] = str(exc)
            continue
        for reason in request.left_out:
            log.warning("certificate file %s for %s: %s", name, instance.instance_id, reason)
        cert_requests.append(request)

    base = join_path("templates", merged.template, "files")

    async def one(name: str, file: FileConfig) -> bytes | str:
        try:
            return await _render_plain(join_path(base, name), file, data, secrets, store)
        except NstanceError as exc:
            return str(exc)
        except Exception:  # a store backend's own error must not cost the other files
            log.exception("rendering file %s for %s failed", name, instance.instance_id)
            return "internal error while rendering this file; see the server log"

    contents: dict[str, bytes] = {}
    results = await asyncio.gather(*(one(name, file) for name, file in plain))
    for (name, _file), result in zip(plain, results, strict=True):
        if isinstance(result, str):
            errors[name] = result
        else:
            contents[name] = result

    issued: list[IssuedCertificate] = []
    certlog_key: str | None = None
    if cert_requests:
        batch = await asyncio.to_thread(_issue_batch, ca, clock, cert_requests)
        good: list[FileCertificate] = []
        for req, outcome in zip(cert_requests, batch, strict=True):
            if isinstance(outcome, str):
                errors[req.file_name] = outcome
            else:
                good.append(outcome)
        if good:
            try:
                certlog_key = await asyncio.to_thread(
                    write_certlog,
                    store,
                    tenant=instance.tenant,
                    instance_id=instance.instance_id,
                    certificates=good,
                    now=clock.now(),
                )
            except NstanceError as exc:
                log.warning(
                    "certificate log write failed for %s; withholding %d certificate(s): %s",
                    instance.instance_id,
                    len(good),
                    exc,
                )
                for cert in good:
                    errors[cert.name] = (
                        f"certificate withheld: the certificate log could not be written ({exc})"
                    )
                good = []
            for cert in good:
                contents[cert.name] = cert.cert_pem
            issued.extend(good)

    files: list[AgentFile] = []
    for name in sorted(contents):
        content = contents[name]
        if len(content) > MAX_FILE_BYTES:
            errors[name] = (
                f"file is {len(content)} bytes; at most {MAX_FILE_BYTES} bytes fit in one file transfer"
            )
            continue
        files.append(AgentFile(name=name, content=content))
    return RenderResult(files=files, errors=errors, certificates=issued, certlog_key=certlog_key)
