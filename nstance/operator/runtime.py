"""The operator runtime: wires config, election, identity, shard connections, kopf and the loops.

Always running (leader or not): the health endpoint, the config source, and the Lease elector (unless
``--no-leader-elect``). Once this replica holds the Lease, a *lead session* starts:

1. wait for a good operator config, then the identity (``IdentityManager.ensure``: stored cert, or
   registration with the nonce);
2. ``ShardSet`` connected to every configured shard (and following config changes);
3. the Node index, the certificate renewer;
4. ``controllers.cluster.ensure_cluster(ctx, endpoint)`` (NstanceCluster + CAPI Cluster; the endpoint is
   ``NSTANCE_CAPI_ENDPOINT`` when set), retried until it works; when RBAC forbids it (upstream's first
   chart grants no rules for them) the session goes on and it is retried every ``FORBIDDEN_RETRY_S``;
5. kopf (``standalone``, cluster-wide, login from the Kube configuration, Events posted, webhook server per
   settings) with ``handlers.register``, plus ``SyncManager``, ``DrainCoordinator`` and, unless
   ``NSTANCE_CAPI_ENDPOINT`` is set, ``WorkloadKubeconfig`` (Cluster API's kubeconfig Secret).

kopf runs on the runtime's event loop through ``kopf.spawn_tasks`` + ``kopf.run_tasks`` rather than
``kopf.operator``: on exit, ``run_tasks`` cancels every task created after kopf started, and only kopf's
own tasks may be swept here (``NotKopfTasks``), not the shard connections', the streams' or the
election's.

Each long-running part is supervised: if it fails unexpectedly it is logged and restarted with backoff;
shard or API trouble never ends the process. When the Lease is lost (or cannot be renewed within the
deadline) the session is torn down at once — every task cancelled, kopf included, channels closed — and
the replica goes back to standby; the process never exits for that (upstream exits, §10-19). On a stop
request (SIGTERM in the CLI) kopf gets a short grace period, then everything stops and the Lease is
released so a standby takes over at its next poll.

Stopping (a stop request, a cancel of ``run``, or a lost Lease) always ends within a bounded time:
every step waits under a deadline (``_settle``); a task that does not end when cancelled is cancelled
once more and then left behind with an error logged, rather than hanging the stop. A cancel that
arrives while a step waits does not cut the cleanup short and is raised again once it is done.
``asyncio.wait_for`` is not used: on Python 3.11 it loses a cancel that arrives as the awaited call
completes.

H4's ``handlers`` / ``controllers.cluster`` and H5's ``sync`` / ``drain`` are imported lazily; while one
is missing the runtime logs it and runs without it (tests of the runtime itself rely on that).

Startup problems that only an admin can fix (a bad ``NSTANCE_CAPI_ENDPOINT`` or
``NSTANCE_CAPI_SERVICEACCOUNT``, Kubernetes credentials that do not load, a health port in use) raise
``SettingsError`` from ``run`` so the CLI exits 2 with the message.

Must not: contain controller, sync or drain behaviour, exit the process, or wait without a deadline
while stopping.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Coroutine, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Protocol

import aiohttp
import kopf
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from kubernetes_asyncio.client import Configuration
from kubernetes_asyncio.config.config_exception import ConfigException

from nstance.core.backoff import Backoff
from nstance.core.clock import Clock, SystemClock
from nstance.operator import handlers
from nstance.operator.config import ConfigMapSource, ConfigSource, FileSource
from nstance.operator.context import OperatorContext
from nstance.operator.controllers.cluster import ensure_cluster
from nstance.operator.controllers.kubeconfig import WorkloadKubeconfig
from nstance.operator.controllers.kubeconfig_secret import WorkloadAccess
from nstance.operator.crds import names
from nstance.operator.drain import DrainCoordinator
from nstance.operator.health import HealthServer, OperatorMetrics
from nstance.operator.identity import IdentityManager
from nstance.operator.kube import PODS, Kube, KubeError, load_configuration
from nstance.operator.kubecache import CachedKube, ObjectCache
from nstance.operator.leader import LeaseElector
from nstance.operator.nodes import NodeIndex
from nstance.operator.renewal import CertificateRenewer
from nstance.operator.settings import OperatorSettings, SettingsError, WebhookSettings
from nstance.operator.shards import ShardSet
from nstance.operator.sync import SyncManager
from nstance.pki.serial import random_serial

log = logging.getLogger(__name__)

FORBIDDEN_RETRY_S: float = 300.0
"""Seconds between two tries to write the NstanceCluster and CAPI Cluster while RBAC forbids it."""

STOP_TIMEOUT: float = 5.0
"""Seconds a cancelled task gets to end (twice, see ``_settle``) before it is left behind."""

RegisterHandlers = Callable[[kopf.OperatorRegistry], None]
EnsureCluster = Callable[[OperatorContext], Awaitable[None]]


class Component(Protocol):
    """A loop of the lead session (SyncManager, DrainCoordinator): runs until cancelled."""

    async def run(self) -> None: ...


ComponentFactory = Callable[[OperatorContext], Component]


@dataclass
class RuntimeOptions:
    """Knobs tests turn; production keeps the defaults."""

    run_kopf: bool = True
    kopf_grace: float = 5.0
    """Seconds kopf may take to stop on a graceful stop before it is cancelled."""
    identity_backoff: Backoff | None = None
    reconnect_min: float = 1.0
    reconnect_max: float = 30.0
    credentials_grace: float = 30.0
    renewal_retry_base: float = 60.0
    renewal_retry_cap: float = 1800.0
    renewal_min_delay: float = 1.0
    restart_backoff: Backoff | None = None
    webhook_dir: Path | None = None


# --- kopf plumbing ---------------------------------------------------------------------------------


async def connection_info(configuration: Configuration, namespace: str) -> kopf.ConnectionInfo:
    """kopf credentials from a kubernetes_asyncio Configuration (token, client cert or none)."""
    header = await configuration.get_api_key_with_prefix("BearerToken")
    token = None
    if isinstance(header, str) and header:
        token = header.split(" ", 1)[1] if header.lower().startswith("bearer ") else header
    return kopf.ConnectionInfo(
        server=str(configuration.host),
        ca_path=configuration.ssl_ca_cert or None,
        insecure=not configuration.verify_ssl,
        token=token,
        certificate_path=configuration.cert_file or None,
        private_key_path=configuration.key_file or None,
        username=configuration.username or None,
        password=configuration.password or None,
        default_namespace=namespace,
    )


class NoWebhookServer:
    """An admission "server" that never listens: webhooks disabled, kopf still starts."""

    async def __call__(self, fn: Any) -> AsyncIterator[kopf.WebhookClientConfig]:
        await asyncio.Event().wait()
        yield kopf.WebhookClientConfig()  # pragma: no cover - never reached


def self_signed_certificate(hosts: list[str], directory: Path) -> tuple[Path, Path, bytes]:
    """A self-signed ECDSA P-256 serving certificate for ``hosts`` (DNS names or IPs), written to
    ``directory``; returns (cert path, key path, cert PEM — the caBundle)."""
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    for host in dict.fromkeys(h for h in hosts if h):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0] or "nstance-operator-webhook")])
    now = SystemClock().now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(random_serial())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=365))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_pem = cert.public_bytes(serialization.Encoding.PEM)
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    cert_path, key_path = directory / "tls.crt", directory / "tls.key"
    cert_path.write_bytes(cert_pem)
    key_path.touch(mode=0o600)
    key_path.write_bytes(key_pem)
    return cert_path, key_path, cert_pem


def webhook_server(webhook: WebhookSettings, directory: Path) -> kopf.WebhookServer:
    """kopf's HTTPS webhook server per the settings (given PEM files, or a self-signed certificate)."""
    addr = webhook.listen.host or None
    if webhook.self_signed:
        listen_host = webhook.listen.host
        reachable = "" if listen_host in ("", "0.0.0.0", "::") else listen_host
        hosts = [webhook.host or reachable or "localhost", reachable, "localhost", "127.0.0.1"]
        cert, key, ca = self_signed_certificate(hosts, directory)
        return kopf.WebhookServer(
            addr=addr, port=webhook.listen.port, host=webhook.host, certfile=cert, pkeyfile=key, cadata=ca
        )
    return kopf.WebhookServer(
        addr=addr,
        port=webhook.listen.port,
        host=webhook.host,
        certfile=webhook.cert_file,
        pkeyfile=webhook.key_file,
    )


_KOPF_DIR = os.path.dirname(os.path.abspath(kopf.__file__)) + os.sep


def is_kopf_task(task: asyncio.Task[Any]) -> bool:
    """Whether ``task`` runs kopf's own code (its coroutine is defined inside the kopf package)."""
    coro = task.get_coro()
    code = getattr(coro, "cr_code", None) or getattr(coro, "gi_code", None)
    return code is not None and os.path.abspath(code.co_filename).startswith(_KOPF_DIR)


class NotKopfTasks(Collection[asyncio.Task[Any]]):
    """kopf's ``ignored`` set for ``run_tasks``: tasks that existed before kopf, and every task that is
    not kopf's own — so stopping kopf never cancels the runtime's or the streams' tasks."""

    def __init__(self, existing: Collection[asyncio.Task[Any]]) -> None:
        self._existing = set(existing)

    def __contains__(self, task: object) -> bool:
        return task in self._existing or not (isinstance(task, asyncio.Task) and is_kopf_task(task))

    def __iter__(self) -> Iterator[asyncio.Task[Any]]:
        return iter(self._existing)

    def __len__(self) -> int:
        return len(self._existing)


def _default_register(registry: kopf.OperatorRegistry) -> None:
    handlers.register(registry)


def default_ensure_cluster(access: WorkloadAccess) -> EnsureCluster:
    """``ensure_cluster`` with the control plane endpoint of ``access`` (None: the API server used)."""

    async def ensure(ctx: OperatorContext) -> None:
        await ensure_cluster(ctx, access.endpoint)

    return ensure


def default_components(access: WorkloadAccess) -> list[tuple[str, ComponentFactory]]:
    """The lead session's loops: sync, drain, and the kubeconfig Secret of a self-managed cluster."""
    components: list[tuple[str, ComponentFactory]] = [
        ("sync manager", SyncManager),
        ("drain coordinator", DrainCoordinator),
    ]
    if access.self_managed:
        components.append(("workload kubeconfig", lambda ctx: WorkloadKubeconfig(ctx, access)))
    return components


# --- bounded stopping ------------------------------------------------------------------------------


def _cancel_requested() -> bool:
    """Whether the current task has been asked to cancel (even if a callee swallowed the request)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


async def _settle(
    tasks: Collection[asyncio.Task[Any]], *, what: str, grace: float = 0.0, within: float | None = None
) -> bool:
    """End ``tasks`` within a bounded time; returns whether the caller was cancelled meanwhile.

    The tasks get ``grace`` seconds to end by themselves, then are cancelled and get ``within`` seconds;
    a task still running is cancelled once more (it may have swallowed the first cancel) and gets another
    ``within``; one still running after that is left behind with an error logged. A cancel of the caller
    while it waits does not cut this short (the tasks must not outlive the stop); it is reported by the
    return value so the caller raises it once its own cleanup is done. Never raises.
    """
    within = STOP_TIMEOUT if within is None else within
    loop = asyncio.get_running_loop()
    interrupted = False

    async def wait(pending: set[asyncio.Task[Any]], seconds: float) -> set[asyncio.Task[Any]]:
        nonlocal interrupted
        deadline = loop.time() + seconds
        while pending and (remaining := deadline - loop.time()) > 0:
            try:
                _, pending = await asyncio.wait(pending, timeout=remaining)
            except asyncio.CancelledError:
                interrupted = True
        return pending

    pending = {task for task in tasks if not task.done()}
    stopping = set(pending)
    if grace > 0:
        pending = await wait(pending, grace)
    for attempt in (1, 2):
        if not pending:
            break
        for task in pending:
            task.cancel()
        pending = await wait(pending, within)
        if pending and attempt == 1:
            log.warning(
                "%s did not stop within %gs of being cancelled (%s); cancelling again",
                what,
                within,
                ", ".join(sorted(task.get_name() for task in pending)),
            )
    if pending:
        log.error(
            "%s still running %gs after being cancelled twice (%s); leaving it behind",
            what,
            2 * within,
            ", ".join(sorted(task.get_name() for task in pending)),
        )
    for task in stopping:
        if task.done() and not task.cancelled() and (error := task.exception()) is not None:
            log.error("%s failed while stopping: %r", what, error)
    return interrupted


async def _settle_call(call: Coroutine[Any, Any, Any], *, what: str, within: float | None = None) -> bool:
    """Run one cleanup call to its end, at most ``within`` seconds (then it is cancelled, see ``_settle``);
    returns whether the caller was cancelled meanwhile. Never raises."""
    within = STOP_TIMEOUT if within is None else within
    task = asyncio.create_task(call, name=what)
    return await _settle([task], what=what, grace=within, within=within)


# --- the runtime -----------------------------------------------------------------------------------


class OperatorRuntime:
    """One operator process: standby or leader, until ``request_stop``."""

    def __init__(
        self,
        settings: OperatorSettings,
        *,
        kube: Kube | None = None,
        clock: Clock | None = None,
        metrics: OperatorMetrics | None = None,
        options: RuntimeOptions | None = None,
        register_handlers: RegisterHandlers | None = None,
        ensure_cluster: EnsureCluster | None = None,
        components: list[tuple[str, ComponentFactory]] | None = None,
        workload: WorkloadAccess | None = None,
    ) -> None:
        self.settings = settings
        self.clock: Clock = clock or SystemClock()
        self.metrics = metrics or OperatorMetrics()
        self.options = options or RuntimeOptions()
        self._kube = kube
        self._owns_kube = kube is None
        self._register = register_handlers or _default_register
        self._ensure_cluster = ensure_cluster
        self._components = components
        self.workload = workload
        """How Cluster API reaches the workload cluster; read from the environment by ``run`` when None."""
        self._stop = asyncio.Event()
        self._graceful = True
        self.config: ConfigSource | None = None
        self.elector: LeaseElector | None = None
        self.identity: IdentityManager | None = None
        self.shards: ShardSet | None = None
        self.renewer: CertificateRenewer | None = None
        self.ctx: OperatorContext | None = None
        self.health: HealthServer | None = None
        self.metrics_server: HealthServer | None = None
        self.active = False
        """True while the lead session runs its controllers (after identity and connections)."""
        self.sessions = 0
        self.on_kopf_started: Callable[[], None] | None = None
        self._session_stopping = asyncio.Event()
        self._kopf_stop: asyncio.Event | None = None
        self._kopf_task: asyncio.Task[None] | None = None
        self._webhook_dir: tempfile.TemporaryDirectory[str] | None = None
        self._restart = self.options.restart_backoff or Backoff(
            base=settings.timings.backoff_base, cap=settings.timings.backoff_cap
        )

    @property
    def kube(self) -> Kube:
        if self._kube is None:
            raise RuntimeError("the runtime has not connected to Kubernetes yet")
        return self._kube

    # --- control ---------------------------------------------------------------------------------------

    def request_stop(self) -> None:
        """Stop gracefully: kopf gets its grace period, the Lease is released."""
        self._stop.set()

    def leading(self) -> bool:
        return self.elector.is_leader() if self.elector is not None else not self._stop.is_set()

    def readiness(self) -> tuple[bool, str]:
        """(ready, reason) for /readyz."""
        if self._stop.is_set():
            return False, "stopping"
        elector = self.elector
        if elector is not None and not elector.is_leader():
            lease = f"Lease {self.settings.namespace}/{elector.name}"
            if elector.following:
                return True, f"standby: following {lease} (held by {elector.holder or 'nobody'})"
            return False, f"standby: cannot read {lease}: {elector.last_error or 'not read yet'}"
        if self.config is None or self.config.current is None:
            problem = self.config.problem if self.config is not None else "starting"
            return False, f"leader: no operator config: {problem}"
        if self.identity is None or self.identity.current is None:
            problem = self.identity.problem if self.identity is not None else "starting"
            return False, f"leader: no operator identity: {problem}"
        shards = self.shards
        if shards is None:
            return False, "leader: connecting to shards"
        if not shards.any_reachable():
            return False, f"leader: no shard reachable ({shards.describe()})"
        return True, f"leader: {shards.describe()}"

    # --- main loop -------------------------------------------------------------------------------------

    def _config_source(self) -> ConfigSource:
        s = self.settings
        if s.config_file is not None:
            return FileSource(s.config_file, interval=s.config_poll_interval)
        return ConfigMapSource(self.kube, s.namespace, s.config_configmap, s.config_key)

    async def run(self) -> None:
        """Run until ``request_stop`` (or cancellation); never exits for shard, API or Lease trouble."""
        background: list[asyncio.Task[None]] = []
        session: asyncio.Task[None] | None = None
        if self.workload is None:
            self.workload = WorkloadAccess.from_environ(os.environ)
        try:
            if self._kube is None:
                try:
                    configuration = await load_configuration(self.settings.kubeconfig)
                except (ConfigException, OSError) as exc:
                    if self.settings.kubeconfig:
                        where = f"--kubeconfig {self.settings.kubeconfig}"
                    elif os.environ.get("KUBERNETES_SERVICE_HOST"):
                        where = "in-cluster"
                    else:
                        where = "not in a pod, and no --kubeconfig or KUBECONFIG"
                    raise SettingsError(f"cannot load the Kubernetes credentials ({where}): {exc}") from None
                self._kube = Kube.from_configuration(configuration)
            self.health = HealthServer(self.settings.health, self.readiness, self.metrics)
            try:
                await self.health.start()
            except OSError as exc:
                raise SettingsError(f"--health-addr {self.settings.health}: cannot listen: {exc}") from None
            if self.settings.metrics is not None:
                self.metrics_server = HealthServer(
                    self.settings.metrics, self.readiness, self.metrics, metrics_only=True
                )
                try:
                    await self.metrics_server.start()
                except OSError as exc:
                    raise SettingsError(
                        f"--metrics-bind-address {self.settings.metrics}: cannot listen: {exc}"
                    ) from None
            self.config = self._config_source()
            background.append(
                asyncio.create_task(self._supervise("config source", self.config.run), name="config")
            )
            self.identity = IdentityManager(
                self.kube,
                self.settings,
                metrics=self.metrics,
                clock=self.clock,
                backoff=self.options.identity_backoff,
            )
            lease = self.settings.leader
            if lease.enabled:
                self.elector = LeaseElector(
                    self.kube,
                    self.settings.namespace,
                    lease.lease_name,
                    lease.holder_identity,
                    lease_duration=lease.lease_duration,
                    renew_interval=lease.renew_interval,
                    renew_deadline=lease.renew_deadline,
                    clock=self.clock,
                )
                background.append(
                    asyncio.create_task(self._supervise("lease election", self.elector.run), name="lease")
                )
            while not self._stop.is_set():
                if self.elector is not None and not await self._first(self.elector.wait_leading()):
                    break
                self.metrics.leader.set(1)
                self.sessions += 1
                session = asyncio.create_task(self._lead(), name="lead-session")
                waits: list[asyncio.Task[Any]] = [session]
                if self.elector is not None:
                    term = self.elector.term
                    waits.append(asyncio.create_task(self.elector.wait_not_leading(term)))
                stop_wait = asyncio.create_task(self._stop.wait())
                try:
                    await asyncio.wait([*waits, stop_wait], return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for task in (*waits[1:], stop_wait):
                        task.cancel()
                graceful = self._stop.is_set()
                crashed = session.done() and not session.cancelled() and session.exception() is not None
                if crashed:
                    log.error("the lead session failed: %r; starting it again", session.exception())
                elif not graceful:
                    log.warning("leadership lost; stopping the controllers at once and returning to standby")
                await self._end_session(session, graceful=graceful)
                session = None
                self.metrics.leader.set(0)
                if crashed:
                    await self._first(asyncio.sleep(self._restart.delay(min(self.sessions, 8))))
        finally:
            await self._shut_down(session, background)

    async def _shut_down(
        self, session: asyncio.Task[None] | None, background: list[asyncio.Task[None]]
    ) -> None:
        """Every step of the stop, each bounded; a cancel meanwhile is raised at the end."""
        interrupted = False
        if session is not None:
            interrupted |= await self._end_session(session, graceful=False, reraise=False)
        self.metrics.leader.set(0)
        if self.elector is not None:
            # release() ends the election loop first, so no renewal in flight can undo the release.
            within = 2 * self.elector.renew_deadline + STOP_TIMEOUT
            interrupted |= await _settle_call(
                self.elector.release(), what="releasing the Lease", within=within
            )
        interrupted |= await _settle(background, what="the runtime's background tasks")
        if self.metrics_server is not None:
            interrupted |= await _settle_call(self.metrics_server.stop(), what="stopping the metrics server")
        if self.health is not None:
            interrupted |= await _settle_call(self.health.stop(), what="stopping the health server")
        if self._webhook_dir is not None:
            self._webhook_dir.cleanup()
            self._webhook_dir = None
        if self._owns_kube and self._kube is not None:
            interrupted |= await _settle_call(self._kube.close(), what="closing the Kubernetes client")
        if interrupted:
            raise asyncio.CancelledError

    async def _first(self, awaitable: Awaitable[None]) -> bool:
        """Wait for ``awaitable`` or a stop request; True when the awaitable finished first."""
        task = asyncio.ensure_future(awaitable)
        stop_wait = asyncio.create_task(self._stop.wait())
        try:
            await asyncio.wait([task, stop_wait], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pending in (task, stop_wait):
                pending.cancel()
        return not self._stop.is_set()

    async def _end_session(
        self, session: asyncio.Task[None], *, graceful: bool, reraise: bool = True
    ) -> bool:
        """Cancel the lead session and wait (bounded) until it has torn everything down. A cancel of the
        caller meanwhile is raised afterwards (``reraise``) or returned."""
        self._graceful = graceful
        self._session_stopping.set()
        # The session's own teardown is bounded step by step (kopf's grace, STOP_TIMEOUT per step).
        within = (self.options.kopf_grace if graceful else 0.0) + 4 * STOP_TIMEOUT
        try:
            interrupted = await _settle([session], what="the lead session", within=within)
        finally:
            self._session_stopping = asyncio.Event()
        if interrupted and reraise:
            raise asyncio.CancelledError
        return interrupted

    async def _supervise(self, name: str, factory: Callable[[], Awaitable[None]]) -> None:
        """Run ``factory()`` for ever: restart it with backoff when it fails or returns."""
        attempt = 0
        while True:
            try:
                await factory()
            except asyncio.CancelledError:
                if _cancel_requested() or asyncio.current_task() is None:
                    raise
                # grpc.aio raises CancelledError when a channel is closed under a call (ShardSet
                # retired it); this task was not cancelled, so it is a failure like any other.
                delay = self._restart.delay(attempt)
                log.warning("%s was interrupted by a closed connection; restarting it in %.1fs", name, delay)
            except Exception:
                if _cancel_requested():  # it swallowed this task's cancel: stop, never restart
                    log.exception("%s failed while stopping", name)
                    raise asyncio.CancelledError from None
                delay = self._restart.delay(attempt)
                log.exception("%s failed; restarting it in %.1fs", name, delay)
            else:
                if _cancel_requested():
                    raise asyncio.CancelledError
                if self._session_stopping.is_set():
                    return
                delay = self._restart.delay(attempt)
                log.warning("%s stopped unexpectedly; restarting it in %.1fs", name, delay)
            attempt += 1
            await asyncio.sleep(delay)

    # --- the lead session --------------------------------------------------------------------------------

    async def _lead(self) -> None:
        assert self.config is not None
        assert self.identity is not None
        tasks: list[asyncio.Task[None]] = []
        shards: ShardSet | None = None
        try:
            config = await self.config.wait_config()
            version = self.config.version
            identity = await self.identity.ensure(config)
            shards = ShardSet(
                identity.ca_pem,
                identity.cert_pem,
                identity.key_pem,
                metrics=self.metrics,
                grace=self.options.credentials_grace,
                reconnect_min=self.options.reconnect_min,
                reconnect_max=self.options.reconnect_max,
            )
            shards.update(config.shards)
            self.shards = shards
            timings = self.settings.timings
            nodes = NodeIndex(self.kube, backoff_base=timings.backoff_base, backoff_cap=timings.backoff_cap)
            ctx = OperatorContext(
                namespace=self.settings.namespace,
                cluster_id=config.cluster_id,
                tenant=config.tenant,
                # Reads of pools, MachinePools and shard groups come from memory (kopf's events
                # and the session's own writes keep it current); a new session starts empty.
                kube=CachedKube(self.kube, ObjectCache()),
                shards=shards,
                nodes=nodes,
                clock=self.clock,
                timings=timings,
            )
            self.ctx = ctx
            self.renewer = CertificateRenewer(
                self.identity,
                shards,
                metrics=self.metrics,
                clock=self.clock,
                retry_base=self.options.renewal_retry_base,
                retry_cap=self.options.renewal_retry_cap,
                min_delay=self.options.renewal_min_delay,
            )
            tasks.append(asyncio.create_task(self._follow_config(shards, version), name="config-follower"))
            tasks.append(asyncio.create_task(self._supervise("node index", nodes.run), name="node-index"))
            tasks.append(
                asyncio.create_task(self._supervise("certificate renewal", self.renewer.run), name="renewal")
            )
            workload = self.workload or WorkloadAccess()
            ensure = self._ensure_cluster or default_ensure_cluster(workload)
            if not await self._ensure_cluster_until_done(ctx, ensure):
                tasks.append(
                    asyncio.create_task(self._ensure_cluster_later(ctx, ensure), name="capi-cluster")
                )
            components = self._components
            if components is None:
                components = default_components(workload)
            for label, factory in components:
                component = factory(ctx)
                tasks.append(asyncio.create_task(self._supervise(label, component.run), name=label))
            if self.options.run_kopf:
                self._kopf_task = asyncio.create_task(
                    self._supervise("kopf", lambda: self._run_kopf(ctx)), name="kopf"
                )
                tasks.append(self._kopf_task)
            self.active = True
            await self._label_pod(leading=True)
            log.info(
                "leading: cluster %s, tenant %s, shards %s",
                config.cluster_id,
                config.tenant,
                ", ".join(shards.configured()),
            )
            await asyncio.Event().wait()
        finally:
            # Every step is bounded, and a cancel arriving meanwhile is raised only after the last one.
            was_active, self.active = self.active, False
            interrupted = await self._stop_tasks(tasks)
            if was_active:
                unlabel = self._label_pod(leading=False)
                interrupted |= await _settle_call(unlabel, what="removing the leader label")
            self.ctx = None
            self.renewer = None
            self.shards = None
            if shards is not None:
                interrupted |= await _settle_call(shards.close(), what="closing the shard connections")
            if interrupted:
                raise asyncio.CancelledError

    async def _label_pod(self, *, leading: bool) -> None:
        """Mark (or unmark) this replica's pod as the leader, for the webhook Service's selector.

        Only inside a pod (``POD_NAME`` set by the chart); best effort: a failure is logged, and a
        replica that lost the Lease without unlabelling is dropped by the Service once it is gone.
        """
        pod = os.environ.get("POD_NAME")
        if not pod:
            return
        value = "true" if leading else None
        patch = {"metadata": {"labels": {names.LEADER_POD_LABEL: value}}}
        try:
            async with asyncio.timeout(STOP_TIMEOUT):
                await self.kube.patch(PODS, pod, patch, self.settings.namespace)
        except (KubeError, TimeoutError, OSError, aiohttp.ClientError) as exc:
            log.warning("cannot %s the leader label on pod %s: %s", "set" if leading else "remove", pod, exc)

    async def _stop_tasks(self, tasks: list[asyncio.Task[None]]) -> bool:
        """Stop the session's tasks (kopf first, with its grace on a graceful stop); bounded. Returns
        whether the caller was cancelled meanwhile (see ``_settle``)."""
        kopf_task, self._kopf_task = self._kopf_task, None
        interrupted = False
        if kopf_task is not None and self._graceful and self._kopf_stop is not None:
            self._kopf_stop.set()
            interrupted |= await _settle([kopf_task], what="kopf", grace=self.options.kopf_grace)
        interrupted |= await _settle(tasks, what="the lead session's tasks")
        return interrupted

    async def _follow_config(self, shards: ShardSet, version: int) -> None:
        assert self.config is not None
        while True:
            config = await self.config.wait_changed(version)
            version = self.config.version
            shards.update(config.shards)

    async def _ensure_cluster_until_done(self, ctx: OperatorContext, ensure: EnsureCluster) -> bool:
        """Make sure the NstanceCluster and CAPI Cluster exist, retrying API trouble; False (at once)
        when the operator may not write them: RBAC without them (upstream's first Helm chart grants
        none) must not keep the rest of the operator from starting."""
        attempt = 0
        while True:
            try:
                await ensure(ctx)
                return True
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - API trouble: retry with backoff
                if isinstance(exc, KubeError) and exc.status == 403:
                    log.warning(
                        "not allowed to ensure the NstanceCluster and CAPI Cluster (%s); going on without "
                        "them, trying again every %.0fs (grant the operator's ClusterRole the rules of "
                        "config/rbac/role.yaml)",
                        exc,
                        FORBIDDEN_RETRY_S,
                    )
                    return False
                if _cancel_requested():
                    raise asyncio.CancelledError from None
                delay = self._restart.delay(attempt)
                attempt += 1
                log.warning("ensuring the CAPI Cluster failed (%s); retrying in %.1fs", exc, delay)
                await asyncio.sleep(delay)

    async def _ensure_cluster_later(self, ctx: OperatorContext, ensure: EnsureCluster) -> None:
        """Retry ``ensure`` every ``FORBIDDEN_RETRY_S`` while it is forbidden, until it works."""
        while True:
            await asyncio.sleep(FORBIDDEN_RETRY_S)
            try:
                await ensure(ctx)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - still not allowed, or API trouble: later
                log.debug("ensuring the CAPI Cluster still fails: %s", exc)
                continue
            log.info("the NstanceCluster and CAPI Cluster are in place")
            return

    def _kopf_settings(self) -> kopf.OperatorSettings:
        settings = kopf.OperatorSettings()
        settings.posting.enabled = True
        # kopf would post a Kubernetes Event (an API write) and log a line for every handler run;
        # our controllers record their own Events, so kopf posts and logs only its warnings.
        settings.posting.level = logging.WARNING
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
        settings.watching.server_timeout = 300
        settings.watching.client_timeout = 330
        settings.watching.connect_timeout = 30
        # The runtime decides when the process ends; kopf must never SIGKILL it.
        settings.process.ultimate_exiting_timeout = None
        webhook = self.settings.webhook
        if not webhook.enabled:
            settings.admission.server = NoWebhookServer()
            return settings
        if self._webhook_dir is None:
            self._webhook_dir = tempfile.TemporaryDirectory(
                prefix="nstance-webhook-", dir=self.options.webhook_dir
            )
        settings.admission.server = webhook_server(webhook, Path(self._webhook_dir.name))
        if webhook.managed:
            settings.admission.managed = webhook.managed
        return settings

    async def _run_kopf(self, ctx: OperatorContext) -> None:
        registry = kopf.OperatorRegistry()
        self._register(registry)
        configuration = self.kube.configuration
        namespace = self.settings.namespace

        @kopf.on.login(registry=registry)
        async def login(**_: Any) -> kopf.ConnectionInfo:
            return await connection_info(configuration, namespace)

        stop_flag = asyncio.Event()
        ready_flag = asyncio.Event()
        self._kopf_stop = stop_flag
        ready_waiter = asyncio.create_task(self._announce_kopf(ready_flag))
        try:
            # kopf.operator() = spawn_tasks + run_tasks, except that on exit run_tasks cancels every
            # task of the event loop created after kopf started ("hung" tasks). Here the loop is shared
            # with the runtime, the shard connections and the sync/drain streams, so only kopf's own
            # tasks may be swept.
            existing = asyncio.all_tasks()
            tasks = await kopf.spawn_tasks(
                registry=registry,
                settings=self._kopf_settings(),
                memo=kopf.Memo(ctx=ctx),
                standalone=True,
                # Cluster-wide: on-demand pods, their Machines and NstanceMachines live in users'
                # namespaces; the pools, the sync manager's imports and the Lease stay in ours.
                clusterwide=True,
                stop_flag=stop_flag,
                ready_flag=ready_flag,
            )
            await kopf.run_tasks(tasks, ignored=NotKopfTasks(existing))
        finally:
            ready_waiter.cancel()
        if not stop_flag.is_set() and not self._session_stopping.is_set():
            # kopf only returns by itself after it received SIGTERM/SIGINT (it installs its own handlers).
            log.info("kopf stopped on a signal; stopping the operator")
            self.request_stop()

    async def _announce_kopf(self, ready: asyncio.Event) -> None:
        await ready.wait()
        log.info("kopf is running (cluster-wide; operator namespace %s)", self.settings.namespace)
        if self.on_kopf_started is not None:
            self.on_kopf_started()
