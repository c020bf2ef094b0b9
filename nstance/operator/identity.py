"""The operator's client identity: the cluster CA, its key, and the certificate the shards trust.

Where each piece lives (names from the settings; upstream's defaults, reference §5.3):

* ConfigMap ``nstance-cluster-ca`` key ``ca.crt`` — the cluster CA (read only);
* Secret ``nstance-operator-key`` keys ``private.key`` / ``public.key`` — the identity key in PKCS#8 /
  SubjectPublicKeyInfo PEM, Ed25519 (what upstream's operator keeps there) or ECDSA P-256;
* Secret ``nstance-operator-nonce`` key ``nonce.jwt`` — the single-use registration nonce;
* Secret ``nstance-operator-cert`` keys ``tls.crt`` / ``tls.key`` — the issued certificate and its key.

An identity the Go operator left behind (its Ed25519 key and certificate, and no nonce, which it deleted
after registering) is used as it is. A key Secret holding a usable key is never replaced: registration
and every retry of it use that key. A new key (none stored, or one that cannot be read) is Ed25519
under an Ed25519 cluster CA and ECDSA P-256 under an ECDSA one (``new_key_type``): upstream's servers,
found only in clusters with an Ed25519 CA, certify nothing but Ed25519 operator keys, and this
project's servers take both; an ECDSA CA only exists in clusters of this project, where P-256 works
with every version of its servers. The Go operator, after a rollback, reads an Ed25519 key only.

``IdentityManager.ensure`` yields a usable identity, retrying for ever: a certificate that verifies
against the CA for our key (role ``operator``, our cluster and tenant, not expired) is used as it is
(and a leftover nonce Secret deleted); otherwise the key is loaded or generated, the nonce read and
``RegisterOperator`` tried on each shard's ``registration_addr`` in config order (server-authenticated
TLS, server name ``nstance-server``; over OpenSSL under an Ed25519 CA, as upstream's servers present
Ed25519 certificates that grpcio cannot verify) until one answers — non-leaders answer UNAVAILABLE
naming the cluster leader, which is logged before the next shard is tried. The certificate is stored,
read back and verified, and only then is the nonce Secret deleted. Whatever is missing is reported in
``problem`` (shown on /readyz) with what to do about it. ``store_certificate`` is the renewal's way to
replace the certificate.

Must not: open the mTLS Operator API connections (``shards.py``) or decide when to renew
(``renewal.py``).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

import grpc
import grpc.aio

from nstance.core.backoff import Backoff
from nstance.core.clock import Clock, SystemClock
from nstance.core.errors import InvalidArgument, Unauthenticated
from nstance.operator.config import OperatorConfig
from nstance.operator.health import OperatorMetrics
from nstance.operator.kube import CONFIGMAPS, SECRETS, Kube, KubeError, Object
from nstance.operator.settings import OperatorSettings
from nstance.pki.ca import parse_certificate
from nstance.pki.certs import CLIENT_KEY_TYPES, SERVER_COMMON_NAME
from nstance.pki.keys import (
    describe_key_types,
    generate_private_key,
    key_type_name,
    load_private_key_pem,
    private_key_to_pem,
    public_key_to_pem,
    public_keys_equal,
    require_public_key,
)
from nstance.pki.peer import verify_client_certificate
from nstance.pki.tlsclient import forwarded_aio_channel, needs_openssl
from nstance.rpc import registration_pb2, registration_pb2_grpc

log = logging.getLogger(__name__)

REGISTER_TIMEOUT: Final = 30.0
MAX_MESSAGE_BYTES: Final = 4 * 1024 * 1024
KEY_TYPES: Final = CLIENT_KEY_TYPES
"""Key types of an operator identity: Ed25519 (upstream's operators) and ECDSA P-256."""
PRIVATE_KEY: Final = "private.key"
PUBLIC_KEY: Final = "public.key"
TLS_CERT: Final = "tls.crt"
TLS_KEY: Final = "tls.key"
NONCE_KEY: Final = "nonce.jwt"


class IdentityProblem(Exception):
    """Why no identity is usable yet, in words an admin can act on."""


@dataclass(frozen=True)
class Identity:
    """A verified operator identity: PEM material plus what the certificate says."""

    ca_pem: bytes
    key_pem: bytes
    cert_pem: bytes
    client_id: str
    tenant: str
    serial: str
    not_before: datetime
    not_after: datetime


Registrar = Callable[[str, bytes, str, bytes], Awaitable[bytes]]
"""``(registration_addr, ca_pem, nonce, public_key_pem) -> certificate PEM``; raises grpc.aio.AioRpcError."""


def new_key_type(ca_pem: bytes) -> str:
    """Key type of a new operator identity: ``ed25519`` under an Ed25519 CA, else ``ecdsa-p256``."""
    ca_key = parse_certificate(ca_pem, what="the cluster CA").public_key()
    return "ed25519" if key_type_name(ca_key) == "ed25519" else "ecdsa-p256"


def registration_channel(target: str, ca_pem: bytes) -> grpc.aio.Channel:
    """Server-authenticated TLS to a RegistrationService, verifying the name ``nstance-server``.

    Over OpenSSL under an Ed25519 CA, where the server may present an Ed25519 certificate."""
    options: list[tuple[str, int | str]] = [
        ("grpc.ssl_target_name_override", SERVER_COMMON_NAME),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ]
    if needs_openssl(ca_pem):
        return forwarded_aio_channel(target, ca_pem, options=options)
    credentials = grpc.ssl_channel_credentials(root_certificates=ca_pem)
    return grpc.aio.secure_channel(target, credentials, options=options)


async def register_operator(target: str, ca_pem: bytes, nonce: str, public_key_pem: bytes) -> bytes:
    """One RegisterOperator call; the issued certificate PEM."""
    request = registration_pb2.RegisterClientRequest(
        registration_nonce_jwt=nonce, public_key_pem=public_key_pem
    )
    async with registration_channel(target, ca_pem) as channel:
        stub = registration_pb2_grpc.RegistrationServiceStub(channel)
        response = await stub.RegisterOperator(request, timeout=REGISTER_TIMEOUT)
    return bytes(response.client_certificate_pem)


def describe_rpc_error(exc: grpc.aio.AioRpcError) -> str:
    """``CODE: details`` on one line."""
    details = " ".join((exc.details() or "").split())
    return f"{exc.code().name}: {details}" if details else exc.code().name


def _decode(data: Mapping[str, Any] | None, key: str) -> bytes | None:
    raw = (data or {}).get(key)
    if not isinstance(raw, str):
        return None
    try:
        return base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError):
        return None


def _encode(value: bytes) -> str:
    return base64.b64encode(value).decode("ascii")


def nonce_claims_unverified(token: str) -> dict[str, Any]:
    """The JWT's claims, read without checking the signature (only to explain a mismatch early)."""
    parts = token.strip().split(".")
    if len(parts) != 3:
        raise InvalidArgument("the nonce is not a JWT (expected three dot-separated parts)")
    payload = parts[1] + "=" * (-len(parts[1]) % 4)
    try:
        claims = json.loads(base64.urlsafe_b64decode(payload))
    except (binascii.Error, ValueError) as exc:
        raise InvalidArgument(f"the nonce's claims are unreadable: {exc}") from None
    if not isinstance(claims, dict):
        raise InvalidArgument("the nonce's claims are not a JSON object")
    return claims


def check_certificate(
    ca_pem: bytes, cert_pem: bytes, key_pem: bytes, config: OperatorConfig, clock: Clock
) -> Identity:
    """Verify an operator certificate for our key, cluster and tenant; IdentityProblem says what is wrong."""
    try:
        ca = parse_certificate(ca_pem, what="the cluster CA")
        key = load_private_key_pem(key_pem, KEY_TYPES, what="the certificate's private key")
        peer = verify_client_certificate(cert_pem, ca, clock=clock)
        cert_key = require_public_key(peer.certificate.public_key(), KEY_TYPES, what="the certificate's key")
    except (InvalidArgument, Unauthenticated) as exc:
        raise IdentityProblem(str(exc)) from None
    if peer.role != "operator":
        raise IdentityProblem(
            f"the certificate is for role {peer.role!r}; an operator certificate is required"
        )
    if not public_keys_equal(cert_key, key):
        raise IdentityProblem("the certificate was issued for a different key than the one stored with it")
    if peer.client_id != config.cluster_id:
        raise IdentityProblem(
            f"the certificate is for cluster {peer.client_id!r} but the operator config says "
            f"{config.cluster_id!r}"
        )
    if peer.tenant != config.tenant:
        raise IdentityProblem(
            f"the certificate is for tenant {peer.tenant!r} but the operator config says {config.tenant!r}"
        )
    return Identity(
        ca_pem=ca_pem,
        key_pem=key_pem,
        cert_pem=cert_pem,
        client_id=peer.client_id,
        tenant=peer.tenant,
        serial=peer.serial,
        not_before=peer.certificate.not_valid_before_utc,
        not_after=peer.not_after,
    )


class IdentityManager:
    """Loads, registers and stores the operator identity in Kubernetes Secrets."""

    def __init__(
        self,
        kube: Kube,
        settings: OperatorSettings,
        *,
        metrics: OperatorMetrics | None = None,
        clock: Clock | None = None,
        registrar: Registrar = register_operator,
        backoff: Backoff | None = None,
    ) -> None:
        self.kube = kube
        self.settings = settings
        self.namespace = settings.namespace
        self.metrics = metrics or OperatorMetrics()
        self.clock: Clock = clock or SystemClock()
        self.registrar = registrar
        self.backoff = backoff or Backoff(base=1.0, cap=30.0)
        self.current: Identity | None = None
        self.problem = "identity not loaded yet"
        self.config: OperatorConfig | None = None
        #: Set once deleting the used nonce Secret was forbidden (warned once, then left alone).
        self._nonce_kept = False

    # --- the loop ----------------------------------------------------------------------------------

    async def ensure(self, config: OperatorConfig) -> Identity:
        """A usable identity; retries with backoff until there is one (never raises for missing parts)."""
        attempt = 0
        last = ""
        while True:
            try:
                identity = await self.attempt(config)
            except asyncio.CancelledError:
                raise
            except (IdentityProblem, KubeError) as exc:
                problem = str(exc) if isinstance(exc, IdentityProblem) else f"Kubernetes API: {exc}"
            except Exception as exc:  # an unexpected failure is retried like the rest
                log.exception("unexpected error while loading the operator identity")
                problem = f"unexpected error: {exc}"
            else:
                self.problem = ""
                return identity
            self.problem = problem
            delay = self.backoff.delay(attempt)
            attempt += 1
            if problem != last:
                log.error(
                    "operator identity not usable: %s (retrying; next attempt in %.1fs)", problem, delay
                )
                last = problem
            else:
                log.debug("operator identity still not usable: %s", problem)
            await asyncio.sleep(delay)

    async def attempt(self, config: OperatorConfig) -> Identity:
        """One pass: a valid stored certificate, else register with the nonce; IdentityProblem if neither."""
        self.config = config
        ca_pem = await self._read_ca()
        cert_secret = await self.kube.get(SECRETS, self.settings.cert_secret, self.namespace)
        stale = ""
        if cert_secret is not None:
            cert_pem = _decode(cert_secret.get("data"), TLS_CERT)
            key_pem = _decode(cert_secret.get("data"), TLS_KEY)
            if cert_pem and key_pem:
                try:
                    identity = check_certificate(ca_pem, cert_pem, key_pem, config, self.clock)
                except IdentityProblem as exc:
                    where = self._where(self.settings.cert_secret)
                    stale = f"the certificate in Secret {where} is unusable ({exc})"
                    log.warning("%s; registering again", stale)
                else:
                    await self._delete_nonce()
                    self._use(identity)
                    log.info(
                        "using the operator certificate in Secret %s (serial %s, valid until %s)",
                        self._where(self.settings.cert_secret),
                        identity.serial,
                        identity.not_after.isoformat(),
                    )
                    return identity
            else:
                stale = f"Secret {self._where(self.settings.cert_secret)} lacks {TLS_CERT} or {TLS_KEY}"
        return await self._register(config, ca_pem, stale)

    # --- pieces --------------------------------------------------------------------------------------

    def _where(self, name: str) -> str:
        return f"{self.namespace}/{name}"

    def _use(self, identity: Identity) -> None:
        self.current = identity
        self.problem = ""
        self.metrics.certificate_expiry.set(identity.not_after.timestamp())

    async def _read_ca(self) -> bytes:
        name, key = self.settings.ca_configmap, self.settings.ca_key
        obj = await self.kube.get(CONFIGMAPS, name, self.namespace)
        if obj is None:
            raise IdentityProblem(
                f"ConfigMap {self._where(name)} not found: create it with key {key} holding the cluster CA "
                "certificate (cluster/ca.crt in the cluster's object storage)"
            )
        text = (obj.get("data") or {}).get(key)
        if not isinstance(text, str) or not text.strip():
            raise IdentityProblem(
                f"ConfigMap {self._where(name)} has no key {key} (the cluster CA certificate)"
            )
        try:
            parse_certificate(text, what=f"ConfigMap {self._where(name)} key {key}")
        except InvalidArgument as exc:
            raise IdentityProblem(str(exc)) from None
        return text.encode()

    async def _load_or_create_key(self, ca_pem: bytes) -> bytes:
        """The key in the key Secret; a new one only when it holds none this operator can use."""
        name = self.settings.key_secret
        obj = await self.kube.get(SECRETS, name, self.namespace)
        if obj is not None:
            key_pem = _decode(obj.get("data"), PRIVATE_KEY)
            if key_pem:
                try:
                    load_private_key_pem(
                        key_pem, KEY_TYPES, what=f"Secret {self._where(name)} key {PRIVATE_KEY}"
                    )
                except InvalidArgument as exc:
                    log.warning("%s; replacing it with a new identity key", exc)
                else:
                    return key_pem
            else:
                log.warning(
                    "Secret %s has no readable key %s; storing a new identity key in it",
                    self._where(name),
                    PRIVATE_KEY,
                )
        key_type = new_key_type(ca_pem)
        key = generate_private_key(key_type)
        key_pem = private_key_to_pem(key)
        body: Object = {
            "metadata": {"name": name, "namespace": self.namespace},
            "type": "Opaque",
            "data": {PRIVATE_KEY: _encode(key_pem), PUBLIC_KEY: _encode(public_key_to_pem(key))},
        }
        if obj is None:
            try:
                await self.kube.create(SECRETS, body, self.namespace)
            except KubeError as exc:
                if exc.status != 409:
                    raise
                raise IdentityProblem(
                    f"Secret {self._where(name)} appeared while this operator was creating it; "
                    "reading it again"
                ) from None
        else:
            # The resourceVersion makes a concurrent writer's key win: this replace then fails (409).
            body["metadata"]["resourceVersion"] = obj["metadata"].get("resourceVersion")
            await self.kube.replace(SECRETS, name, body, self.namespace)
        log.info(
            "generated a new %s identity key in Secret %s", describe_key_types([key_type]), self._where(name)
        )
        return key_pem

    async def _read_nonce(self, config: OperatorConfig, stale: str) -> str:
        name = self.settings.nonce_secret
        obj = await self.kube.get(SECRETS, name, self.namespace)
        raw = _decode((obj or {}).get("data"), NONCE_KEY) if obj is not None else None
        token = raw.decode("utf-8", "replace").strip() if raw else ""
        if not token:
            why = (
                f"{stale}; and "
                if stale
                else f"no certificate in Secret {self._where(self.settings.cert_secret)} and "
            )
            found = "has no key nonce.jwt" if obj is not None else "does not exist"
            raise IdentityProblem(
                f"{why}the registration nonce Secret {self._where(name)} {found}. Create one: "
                f"`nstance-admin cluster nonce --cluster-id {config.cluster_id} --tenant {config.tenant} "
                f"-o nonce.jwt` then `kubectl -n {self.namespace} create secret generic {name} "
                "--from-file=nonce.jwt`"
            )
        try:
            claims = nonce_claims_unverified(token)
        except InvalidArgument as exc:
            raise IdentityProblem(f"Secret {self._where(name)} key {NONCE_KEY}: {exc}") from None
        for claim, expected in (
            ("kind", "operator"),
            ("cluster_id", config.cluster_id),
            ("tenant", config.tenant),
        ):
            if claims.get(claim) != expected:
                raise IdentityProblem(
                    f"the nonce in Secret {self._where(name)} has {claim} {claims.get(claim)!r} but this "
                    f"operator needs {expected!r}; create a nonce for cluster {config.cluster_id} tenant "
                    f"{config.tenant}"
                )
        exp = claims.get("exp")
        if isinstance(exp, int | float) and exp < self.clock.now().timestamp():
            when = datetime.fromtimestamp(exp, UTC).isoformat()
            raise IdentityProblem(
                f"the nonce in Secret {self._where(name)} expired at {when}; create a new one with "
                "`nstance-admin cluster nonce`"
            )
        return token

    async def _register(self, config: OperatorConfig, ca_pem: bytes, stale: str) -> Identity:
        key_pem = await self._load_or_create_key(ca_pem)
        nonce = await self._read_nonce(config, stale)
        key = load_private_key_pem(key_pem, KEY_TYPES)
        public_pem = public_key_to_pem(key)
        answers: list[str] = []
        for shard, endpoint in config.shards.items():
            target = endpoint.registration_addr
            try:
                cert_pem = await self.registrar(target, ca_pem, nonce, public_pem)
            except grpc.aio.AioRpcError as exc:
                text = describe_rpc_error(exc)
                answers.append(f"{shard} ({target}): {text}")
                if exc.code() == grpc.StatusCode.UNAVAILABLE and "cluster leader" in (exc.details() or ""):
                    self.metrics.registrations.labels("standby").inc()
                    log.info(
                        "shard %s (%s) is not the cluster leader: %s; trying the next shard",
                        shard,
                        target,
                        text,
                    )
                elif exc.code() == grpc.StatusCode.UNAVAILABLE:
                    self.metrics.registrations.labels("error").inc()
                    log.warning("shard %s (%s) unreachable for registration: %s", shard, target, text)
                else:
                    self.metrics.registrations.labels("refused").inc()
                    log.warning("shard %s (%s) refused the registration: %s", shard, target, text)
                continue
            self.metrics.registrations.labels("ok").inc()
            try:
                check_certificate(ca_pem, cert_pem, key_pem, config, self.clock)
            except IdentityProblem as exc:
                raise IdentityProblem(
                    f"shard {shard} issued a certificate this operator cannot use: {exc}"
                ) from None
            log.info("registered with shard %s (%s)", shard, target)
            return await self._store(config, ca_pem, cert_pem, key_pem, registered=True)
        raise IdentityProblem("registration failed on every shard: " + "; ".join(answers))

    async def _store(
        self, config: OperatorConfig, ca_pem: bytes, cert_pem: bytes, key_pem: bytes, *, registered: bool
    ) -> Identity:
        name = self.settings.cert_secret
        body: Object = {
            "metadata": {"name": name, "namespace": self.namespace},
            "type": "kubernetes.io/tls",
            "data": {TLS_CERT: _encode(cert_pem), TLS_KEY: _encode(key_pem)},
        }
        existing = await self.kube.get(SECRETS, name, self.namespace)
        if existing is None:
            await self.kube.create(SECRETS, body, self.namespace)
        elif existing.get("type", "kubernetes.io/tls") != "kubernetes.io/tls":
            # The type of a Secret is immutable; a differently typed leftover is replaced.
            await self.kube.delete(SECRETS, name, self.namespace)
            await self.kube.create(SECRETS, body, self.namespace)
        else:
            body["metadata"]["resourceVersion"] = existing["metadata"].get("resourceVersion")
            await self.kube.replace(SECRETS, name, body, self.namespace)
        stored = await self.kube.get(SECRETS, name, self.namespace)
        data = (stored or {}).get("data")
        read_cert, read_key = _decode(data, TLS_CERT), _decode(data, TLS_KEY)
        if not read_cert or not read_key:
            raise IdentityProblem(f"Secret {self._where(name)} could not be read back after writing it")
        identity = check_certificate(ca_pem, read_cert, read_key, config, self.clock)
        if registered:
            await self._delete_nonce()
        self._use(identity)
        log.info(
            "stored the operator certificate in Secret %s (serial %s, valid until %s)",
            self._where(name),
            identity.serial,
            identity.not_after.isoformat(),
        )
        return identity

    async def _delete_nonce(self) -> None:
        """Delete the used nonce Secret; where deleting Secrets is not allowed (upstream's first chart
        grants no ``delete`` on them), warn and go on: a used nonce cannot register anyone again."""
        name = self.settings.nonce_secret
        try:
            deleted = await self.kube.delete(SECRETS, name, self.namespace)
        except KubeError as exc:
            if exc.status != 403:
                raise
            if not self._nonce_kept:
                log.warning(
                    "cannot delete the used registration nonce Secret %s (%s); it is kept, and is "
                    "harmless (a nonce registers once): delete it by hand, or grant delete on Secrets",
                    self._where(name),
                    exc.message,
                )
            self._nonce_kept = True
            return
        if deleted:
            log.info("deleted the used registration nonce Secret %s", self._where(name))

    async def store_certificate(self, cert_pem: bytes) -> Identity:
        """Replace the stored certificate with a renewed one for the same key (verified first)."""
        current, config = self.current, self.config
        if current is None or config is None:
            raise IdentityProblem("no identity is loaded; nothing to renew")
        check_certificate(current.ca_pem, cert_pem, current.key_pem, config, self.clock)
        return await self._store(config, current.ca_pem, cert_pem, current.key_pem, registered=False)
