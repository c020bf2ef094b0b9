"""Wiring and lifecycle of one ``nstance-server`` process.

Start-up order: object-storage scopes and the SQLite cache (migrated), the health endpoint (so a config
that will not load is visible at once: on ``--health-addr``, else on ``:8990`` until the config names
``shard.bind.health_addr``), the shard config (retried with backoff; the exact error is on ``/health``
and in the log), the cluster election and cluster identity (CA and nonce key; created by
the cluster leader if the cluster was never initialised), the provider, the Operator gRPC API on mTLS
(served by standbys too, for reads), and finally the shard election, whose transitions start and stop
the leader-only machinery in ``Shard``. SIGTERM/SIGINT/SIGHUP stops in reverse order: leadership work first
(in-flight provider calls finish or are recorded), watch streams closed, gRPC drained, lock released.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import grpc

from nstance.config import ServerConfig
from nstance.core.atomicfile import directory_problem
from nstance.core.backoff import Backoff
from nstance.core.cli import stop_signals
from nstance.core.clock import Clock, SystemClock
from nstance.core.errors import FailedPrecondition, InvalidArgument, NstanceError, Unauthenticated
from nstance.core.hostport import split_host_port
from nstance.core.logformat import JsonFormatter
from nstance.core.logthrottle import LogThrottle
from nstance.core.ratelimit import TokenBucket
from nstance.db.engine import Database, open_database
from nstance.objectstore.base import ObjectStore
from nstance.objectstore.factory import StorageScopes, open_scopes, open_store
from nstance.objectstore.file import FileObjectStore
from nstance.objectstore.scoped import ScopedObjectStore
from nstance.pki.certs import issue_server_certificate
from nstance.pki.tlspipe import private_directory, remove_private_directory
from nstance.providers.factory import create_provider
from nstance.rpc import agent_pb2_grpc, operator_pb2_grpc, registration_pb2_grpc
from nstance.secrets.base import SecretStore
from nstance.secrets.cluster_identity import (
    ClusterIdentity,
    ensure_cluster_identity,
    identity_state,
    load_cluster_identity,
)
from nstance.secrets.factory import open_secret_store
from nstance.secrets.keys import load_encryption_keys
from nstance.server.identity.interceptors import ServerInterceptor
from nstance.server.identity.revocations import DenyList, revocation_loop, sync_revocations
from nstance.server.identity.tls import advertised_hosts, server_credentials
from nstance.server.leadership.election import Elector, ElectorLeadership
from nstance.server.net.addresses import advertised_addresses, bound_addresses
from nstance.server.net.fdbudget import HEALTH_CONNECTIONS, plan_connection_caps, raise_open_file_limit
from nstance.server.net.frontproc import FrontProcess, Listener
from nstance.server.net.grpcopts import server_options
from nstance.server.net.http import HealthServer
from nstance.server.net.tlsfront import PeerTable, listening_socket
from nstance.server.services.agent import AgentServicer
from nstance.server.services.operator import OperatorServicer
from nstance.server.services.registration import RegistrationServicer
from nstance.server.shard.build import build_shard
from nstance.server.shard.shard import Shard
from nstance.server.state.confighealth import report_config
from nstance.server.state.configstate import ConfigState
from nstance.server.state.degraded import Degradations
from nstance.server.state.limits import CreateLimiter
from nstance.server.state.looplag import LagProbe
from nstance.server.state.metrics import InstrumentedProvider, Metrics, watch_event_loop_lag
from nstance.server.state.provisioning import ShardIdentity

log = logging.getLogger("nstance.server")
T = TypeVar("T")

DEFAULT_HEALTH_ADDR = ":8990"
CONFIG_LOAD_FAILED = "cannot load the shard config"
"""How a failed config load is logged; errors that already say so are logged as they are."""
#: Worker threads for blocking I/O (object storage, userdata fetches).
IO_THREADS = 64
#: Seconds between reads of the revocation list in cluster storage (``revoked/``).
REVOCATION_SYNC_INTERVAL = 30.0


@dataclass(frozen=True)
class ServerOptions:
    """Command-line inputs of one server process."""

    server_id: str
    shard: str
    storage: str
    bucket: str
    cachedir: Path
    prefix: str = ""
    #: Where the health endpoint listens (``--health-addr``). None: on ``DEFAULT_HEALTH_ADDR`` until
    #: the config is loaded, then on ``shard.bind.health_addr`` (as upstream, which starts it only then).
    health_addr: str | None = None
    #: The host of every shard.bind address (one config, many servers); "" keeps the config's.
    bind_host: str = ""
    #: The host of shard.advertise.health_addr and election_addr, which must then be port-only.
    advertise_host: str = ""
    #: The provider's id of this server's VM (for shard.leader_network); "" = ask the metadata service.
    provider_instance_id: str = ""
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    #: Optional extra bucket on create calls (requests/s) - used by benchmarks to mirror cloud limits.
    create_bucket: tuple[float, float] | None = None
    #: Key type of the server certificates: ``ecdsa-p256`` (what grpcio clients can verify) or
    #: ``ed25519`` (what upstream's servers present; tests use it to stand in for a Go server).
    server_key_type: str = "ecdsa-p256"


def setup_logging(verbose: bool = False) -> None:
    """JSON logs on stderr; a warning or error repeated more than 10 times a minute is dropped and counted."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(LogThrottle())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    # Schema migrations log every step at INFO on each start; only --debug shows them.
    logging.getLogger("alembic").setLevel(logging.DEBUG if verbose else logging.WARNING)


def _host_port(addr: str, what: str) -> tuple[str, int]:
    parsed = split_host_port(addr)
    if parsed is None:
        raise InvalidArgument(f'{what}: "{addr}" is not host:port')
    host, port = parsed
    return (host.strip("[]") or "0.0.0.0"), port


@dataclass(frozen=True)
class LoadedConfig:
    """The shard config as loaded at start-up, with what this server derives from it once."""

    config: ServerConfig
    #: ``shard.bind`` with ``--bind-host`` applied: where this server listens.
    bind: dict[str, str]
    #: ``shard.advertise`` as this server announces it (``nstance.server.net.addresses``).
    advertise: dict[str, str]
    #: ``.Provider.Kind`` of templates: ``InfraConfig.provider_as_written``.
    provider_kind: str


async def retry_until_stopped(
    step: Callable[[], Awaitable[T]],
    stop: asyncio.Event,
    *,
    cap: float,
    failed: Callable[[Exception, float], None],
) -> T | None:
    """``step()``'s result, retried with backoff (1 s up to ``cap``) on errors; None once ``stop`` is set.

    ``failed(error, delay)`` reports each failure before the wait. Missing credentials (Unauthenticated)
    are not retried: they are raised at once.
    """
    backoff = Backoff(base=1.0, cap=cap)
    attempt = 0
    while not stop.is_set():
        try:
            return await step()
        except Unauthenticated:
            raise  # no storage credentials: waiting will not bring them; the CLI says so and exits 1
        except (NstanceError, OSError) as exc:
            delay = backoff.delay(attempt)
            attempt += 1
            failed(exc, delay)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)
    return None


class ServerApp:
    """One running server; ``run`` returns when ``stop`` is set (or on a fatal error)."""

    def __init__(self, opts: ServerOptions, *, clock: Clock | None = None) -> None:
        self.opts = opts
        self.clock = clock or SystemClock()
        self.metrics = Metrics()
        #: The largest event-loop stall while ``run`` runs, at 25 ms resolution (benchmarks and tests read
        #: it; ``watch_event_loop_lag`` feeds the ``nstance_event_loop_lag_seconds`` histogram).
        self.lag_probe = LagProbe()
        self._config_error: str | None = "starting"
        self._starting: str | None = "loading the shard config"
        self._elector: Elector | None = None
        self._cluster_elector: Elector | None = None
        self.shard: Shard | None = None
        #: The OpenSSL front of the mTLS ports, once they listen.
        self.tls_front: FrontProcess | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._secrets: SecretStore | None = None
        self.degradations = Degradations()

    # --- HealthSource -----------------------------------------------------------------------

    def degraded(self) -> str | None:
        return self.degradations.summary()

    def config_error(self) -> str | None:
        return self._config_error

    def starting(self) -> str | None:
        return self._starting

    def is_leader(self) -> bool:
        return self._elector is not None and self._elector.is_leader()

    def leader_address(self) -> str:
        return ElectorLeadership(self._elector).leader_address() if self._elector is not None else ""

    def leader_network_status(self) -> str:
        return self.shard.leader_net.status if self.shard is not None else ""

    # --- lifecycle --------------------------------------------------------------------------

    def _scopes(self) -> StorageScopes:
        return open_scopes(
            self.opts.storage,
            self.opts.bucket,
            shard=self.opts.shard,
            prefix=self.opts.prefix or None,  # as upstream: the shard scope, default shard/{shard}/
        )

    def _cluster_store(self, config: ServerConfig, scopes: StorageScopes) -> ObjectStore:
        """The cluster scope: ``cluster/`` of the shard's bucket, or ``cluster.storage`` when set."""
        storage = config.cluster.storage
        if storage is None:
            return scopes.cluster
        prefix = storage.prefix
        if storage.provider == "gcs":
            return open_store(
                f"gcs://{storage.bucket}/{prefix}",
                **({"endpoint": storage.endpoint} if storage.endpoint else {}),
            )
        if storage.provider == "file":
            return ScopedObjectStore(FileObjectStore(Path(storage.bucket).expanduser()), prefix)
        opts: dict[str, str] = {}
        if storage.region:
            opts["region"] = storage.region
        if storage.endpoint:
            opts["endpoint"] = storage.endpoint
        query = "&".join(f"{k}={v}" for k, v in opts.items())
        return open_store(f"s3://{storage.bucket}/{prefix}" + (f"?{query}" if query else ""))

    async def _load_config(self, state: ConfigState, stop: asyncio.Event) -> LoadedConfig | None:
        """The shard config and this server's addresses, retried until they load (None once stopped).

        An ``--advertise-host`` that clashes with the config counts as a config error: it is on
        ``/health`` and in the log, and fixing the document in storage is enough.
        """

        async def load() -> LoadedConfig:
            await asyncio.to_thread(state.load, True)
            snapshot = state.snapshot()
            assert snapshot is not None
            config = snapshot.config
            if config.shard.id != self.opts.shard:
                raise FailedPrecondition(
                    f'shard.id in config.jsonc is "{config.shard.id}" but this server runs '
                    f'--shard "{self.opts.shard}"'
                )
            loaded = LoadedConfig(
                config=config,
                bind=bound_addresses(config.shard.bind.addrs(), self.opts.bind_host),
                advertise=advertised_addresses(
                    config.shard.advertise.addrs(),
                    advertise_host=self.opts.advertise_host,
                    bind_host=self.opts.bind_host,
                ),
                provider_kind=config.shard.infra.provider_as_written,
            )
            self._config_error = None
            self.metrics.set_config_loaded(True)
            return loaded

        def failed(exc: Exception, delay: float) -> None:
            self._config_error = str(exc)
            said = str(exc) if str(exc).startswith(CONFIG_LOAD_FAILED) else f"{CONFIG_LOAD_FAILED}: {exc}"
            log.error("%s (retrying in %.1fs)", said, delay)

        return await retry_until_stopped(load, stop, cap=30.0, failed=failed)

    async def _open_health(self, health: HealthServer) -> tuple[str, int] | None:
        """Start the health endpoint before the config loads: on ``--health-addr``, else the default.

        Returns where it listens. Without ``--health-addr`` a busy default port is only a warning
        (the endpoint opens on ``shard.bind.health_addr`` once the config is loaded); a given address
        that cannot be bound is an error.
        """
        given = self.opts.health_addr
        addr = given or DEFAULT_HEALTH_ADDR
        host, port = _host_port(addr, "--health-addr")
        try:
            self.health_port = await health.start(host, port)
        except OSError as exc:
            if given is not None:
                raise FailedPrecondition(f"cannot listen on --health-addr {addr}: {exc}") from None
            log.warning(
                "health endpoint: cannot listen on %s before the config is loaded (%s); it opens on "
                "shard.bind.health_addr once the config is loaded",
                addr,
                exc,
            )
            return None
        log.info("health endpoint on %s:%d", host, self.health_port)
        return host, port

    async def _move_health(self, health: HealthServer, at: tuple[str, int] | None, addr: str) -> None:
        """Without ``--health-addr``: serve health on ``shard.bind.health_addr``, as upstream listens."""
        host, port = _host_port(addr, "shard.bind.health_addr")
        if at == (host, port):
            return
        await health.close()
        try:
            self.health_port = await health.start(host, port)
        except OSError as exc:
            raise FailedPrecondition(f"cannot listen on shard.bind.health_addr {addr}: {exc}") from None
        log.info("health endpoint on %s:%d (shard.bind.health_addr)", host, self.health_port)

    async def _cluster_identity(
        self, config: ServerConfig, cluster_store: ObjectStore, stop: asyncio.Event
    ) -> ClusterIdentity | None:
        secrets_cfg = config.cluster.secrets
        keys: list[bytes] = []
        if secrets_cfg.encryption_key is not None:
            sources = [
                (k.provider, k.source, k.project_id)
                for k in (secrets_cfg.encryption_key, *secrets_cfg.old_encryption_keys)
            ]
            keys = load_encryption_keys(sources, self.opts.environ)
        secrets = open_secret_store(
            secrets_cfg.provider,
            object_store=cluster_store,
            prefix=secrets_cfg.prefix or None,
            keys=keys,
            project_id=secrets_cfg.project_id,
            bind_names=secrets_cfg.bind_names,
        )
        self._secrets = secrets
        backoff = Backoff(base=1.0, cap=15.0)
        attempt = 0
        while not stop.is_set():
            try:
                state = await asyncio.to_thread(identity_state, cluster_store, secrets)
                if state.complete:
                    return await asyncio.to_thread(load_cluster_identity, cluster_store, secrets)
                if self._cluster_elector is not None and self._cluster_elector.is_leader():
                    result = await asyncio.to_thread(
                        ensure_cluster_identity,
                        cluster_store,
                        secrets,
                        cluster_id=config.cluster.id,
                        clock=self.clock,
                    )
                    log.info("cluster leader created the missing cluster identity parts")
                    return result.identity
                self._config_error = (
                    "waiting for the cluster identity (CA and nonce key) from the cluster leader"
                )
            except NstanceError as exc:
                self._config_error = f"cluster identity: {exc}"
                log.error("cluster identity: %s", exc)
            delay = backoff.delay(attempt)
            attempt += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)
        return None

    async def run(self, stop: asyncio.Event) -> int:
        # Object-storage calls run in worker threads; S3 round trips take tens of milliseconds, so the
        # default pool (cores + 4) would cap a burst of creates at a few hundred record writes a second.
        asyncio.get_running_loop().set_default_executor(
            ThreadPoolExecutor(max_workers=IO_THREADS, thread_name_prefix="nstance-io")
        )
        lag_task = asyncio.create_task(self.lag_probe.run(), name="event-loop-lag")
        try:
            return await self._run(stop)
        finally:
            lag_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await lag_task

    async def _run(self, stop: asyncio.Event) -> int:
        opts = self.opts
        open_files = raise_open_file_limit()
        scopes = self._scopes()
        prepare_cachedir(opts.cachedir)
        db: Database = await asyncio.to_thread(open_database, opts.cachedir / "db" / "nstance.db")
        health = HealthServer(self, self.metrics, max_connections=HEALTH_CONNECTIONS)
        grpc_servers: list[grpc.aio.Server] = []
        fronts: list[FrontProcess] = []
        cleanup: list[Callable[[], None]] = []
        self.metrics.set_info(opts.server_id, opts.shard)
        background: list[asyncio.Task[None]] = [
            asyncio.create_task(watch_event_loop_lag(self.metrics, stop), name="event-loop-lag")
        ]
        electors: list[asyncio.Task[None]] = []
        provider = None
        try:
            health_at = await self._open_health(health)
            state = ConfigState(scopes.shard, opts.cachedir / "config", clock=self.clock)
            loaded = await self._load_config(state, stop)
            if loaded is None:
                return 0
            config, bind, advertise = loaded.config, loaded.bind, loaded.advertise
            if opts.health_addr is None:
                await self._move_health(health, health_at, bind["health_addr"])
            self._starting = "waiting for the cluster identity and opening the gRPC APIs"
            shard_cfg = config.shard

            cluster_store = self._cluster_store(config, scopes)
            self._cluster_elector = Elector(
                cluster_store,
                "leader.json",
                elector_id=f"{opts.shard}-{opts.server_id}",
                address=advertise["election_addr"],
                extra={"operatorAddr": advertise["operator_addr"]},
                config=config.cluster.leader_election,
                clock=self.clock,
                on_change=lambda leading: self.metrics.set_leader("cluster", leading),
                name="cluster",
            )
            electors.append(asyncio.create_task(self._cluster_elector.run(), name="cluster-election"))

            identity = await self._cluster_identity(config, cluster_store, stop)
            if identity is None:
                return 0
            self._config_error = None

            base_provider = create_provider(shard_cfg.infra, clock=self.clock, base_dir=opts.cachedir)
            provider = InstrumentedProvider(base_provider, self.metrics)
            bucket = None
            if opts.create_bucket is not None:
                bucket = TokenBucket(opts.create_bucket[0], opts.create_bucket[1], self.clock)
            limiter = CreateLimiter(
                clock=self.clock,
                max_concurrent=shard_cfg.max_concurrent_creates,
                min_spacing=shard_cfg.create_rate_limit,
                bucket=bucket,
            )
            elector = Elector(
                scopes.shard,
                "leader.json",
                elector_id=opts.server_id,
                address=advertise["election_addr"],
                extra={
                    "operatorAddr": advertise["operator_addr"],
                    "healthAddr": advertise["health_addr"],
                },
                config=shard_cfg.leader_election,
                clock=self.clock,
                on_change=self._on_shard_leadership,
                name="shard",
            )
            self._elector = elector
            built = build_shard(
                identity=ShardIdentity(
                    cluster_id=config.cluster.id,
                    shard=opts.shard,
                    provider_kind=loaded.provider_kind,
                    region=shard_cfg.infra.region,
                    zone=shard_cfg.infra.zone,
                    registration_addr=advertise["registration_addr"],
                    agent_addr=advertise["agent_addr"],
                    operator_addr=advertise["operator_addr"],
                    ca_pem=identity.ca.cert_pem,
                ),
                store=scopes.shard,
                cluster_store=cluster_store,
                db=db,
                config=state,
                provider=provider,
                nonce_key=identity.nonce_key,
                ca=identity.ca,
                clock=self.clock,
                limiter=limiter,
                leadership=ElectorLeadership(elector),
                metrics=self.metrics,
                cluster_leadership=ElectorLeadership(self._cluster_elector),
                secrets=self._secrets,
                own_provider_id=opts.provider_instance_id,
                degraded=self.degradations,
            )
            ctx, self.shard, registrar = built.ctx, built.shard, built.registrar
            report_config(ctx, state.fault)  # e.g. started from the disk copy while storage is down
            restored = await registrar.backfill_operators()
            if restored:
                log.debug("restored %d operator registrations from cluster storage", restored)

            # Fail closed: the deny-list is in SQLite and in memory before any port accepts a certificate.
            deny = DenyList()
            if not await self._first_revocation_sync(cluster_store, db, stop, deny):
                return 0
            # The mTLS ports terminate TLS in OpenSSL in a child process (frontproc, tlsfront) so Ed25519
            # identities connect too; each connection's verified certificate reaches the interceptor
            # through ``peers``.
            peers = PeerTable()
            interceptor = ServerInterceptor(
                ca=identity.ca,
                clock=self.clock,
                is_revoked=deny.revoked,
                metrics=self.metrics,
                peer_certificates=peers.certificate,
            )
            hosts = advertised_hosts([*advertise.values(), *bind.values()])
            front_dir = private_directory(fallbacks=(opts.cachedir,))
            cleanup.append(lambda: remove_private_directory(front_dir))
            mtls = issue_server_certificate(
                identity.ca, hosts=hosts, clock=self.clock, key_type=opts.server_key_type
            )
            assert mtls.key_pem is not None  # issue_server_certificate generates the key
            front = FrontProcess(
                peers,
                directory=front_dir,
                key_pem=mtls.key_pem,
                cert_pem=mtls.cert_pem,
                ca_pem=identity.ca.cert_pem,
                handshake_timeout=shard_cfg.limits.handshake_timeout.total_seconds(),
            )
            fronts.append(front)
            server_auth, registration_cert = server_credentials(
                identity.ca,
                hosts=hosts,
                clock=self.clock,
                require_client_cert=False,
                key_type=opts.server_key_type,
            )
            self.metrics.set_certificate_expiry("ca", identity.ca.not_after)
            self.metrics.set_certificate_expiry("server-mtls", mtls.not_after)
            self.metrics.set_certificate_expiry("server-registration", registration_cert.not_after)
            limits = shard_cfg.limits
            caps = plan_connection_caps(limits, open_files)
            log.log(
                logging.WARNING if caps.scaled else logging.INFO,
                "connections: at most %d registration, %d operator, %d agent (%d open files; %d reserved)%s",
                caps.registration,
                caps.operator,
                caps.agent,
                open_files,
                limits.reserved_file_descriptors,
                "; scaled down to fit the open-file limit (raise LimitNOFILE)" if caps.scaled else "",
            )
            operator_server = grpc.aio.server(
                interceptors=[interceptor],
                options=server_options(limits, streams=True, max_connections=caps.operator),
            )
            operator_pb2_grpc.add_OperatorServiceServicer_to_server(
                OperatorServicer(self.shard, max_message_bytes=limits.max_message_bytes), operator_server
            )
            registration_server = grpc.aio.server(
                interceptors=[interceptor],
                options=server_options(limits, streams=False, max_connections=caps.registration),
            )
            registration_pb2_grpc.add_RegistrationServiceServicer_to_server(
                RegistrationServicer(registrar), registration_server
            )
            agent_server = grpc.aio.server(
                interceptors=[interceptor],
                options=server_options(limits, streams=True, max_connections=caps.agent),
            )
            agent_pb2_grpc.add_AgentServiceServicer_to_server(
                AgentServicer(self.shard.agents, registrar), agent_server
            )
            # Every port is accepted in the front process, which applies the caps per port and per
            # client address before any TLS; the registration port's TLS stays grpcio's, behind it.
            for server, field, creds, what, cap, per_address, names in (
                (
                    operator_server,
                    "operator_addr",
                    None,
                    "operator API (mTLS)",
                    caps.operator,
                    limits.max_operator_connections_per_address,
                    ("max_operator_connections", "max_operator_connections_per_address"),
                ),
                (
                    registration_server,
                    "registration_addr",
                    server_auth,
                    "registration (TLS)",
                    caps.registration,
                    limits.max_registration_connections_per_address,
                    ("max_registration_connections", "max_registration_connections_per_address"),
                ),
                (
                    agent_server,
                    "agent_addr",
                    None,
                    "agent API (mTLS)",
                    caps.agent,
                    None,
                    ("max_agent_connections", "max_agent_connections"),
                ),
            ):
                host, port = _host_port(bind[field], f"shard.bind.{field}")
                backend = front_dir / f"{field}.sock"
                added = (
                    server.add_insecure_port(f"unix:{backend}")
                    if creds is None
                    else server.add_secure_port(f"unix:{backend}", creds)
                )
                if added == 0:
                    raise FailedPrecondition(f"cannot listen on {backend} for shard.bind.{field}")
                await server.start()
                grpc_servers.append(server)
                try:
                    sock = listening_socket(host, port)
                except OSError as exc:
                    raise FailedPrecondition(
                        f"cannot listen on shard.bind.{field} {bind[field]}: {exc}"
                    ) from exc
                front.add(
                    Listener(
                        sock,
                        backend,
                        what,
                        tls=creds is None,
                        max_connections=cap,
                        per_address=per_address,
                        limit_names=names,
                    )
                )
                bound = sock.getsockname()[1]
                log.info("%s on %s:%d", what, host, bound)
            await front.start()
            self.tls_front = front
            background.append(
                asyncio.create_task(
                    revocation_loop(
                        cluster_store, db, clock=self.clock, interval=REVOCATION_SYNC_INTERVAL, deny=deny
                    ),
                    name="revocations",
                )
            )
            background.append(asyncio.create_task(self.shard.standby_config_loop(), name="standby-config"))

            electors.append(asyncio.create_task(elector.run(), name="shard-election"))
            self._starting = None
            await stop.wait()
            log.info("shutting down")
            return 0
        finally:
            for task in background:
                task.cancel()
            await self._shutdown(grpc_servers, electors, provider, health, db, fronts)
            for step in cleanup:
                step()

    async def _first_revocation_sync(
        self, cluster_store: ObjectStore, db: Database, stop: asyncio.Event, deny: DenyList
    ) -> bool:
        """Copy the deny-list into SQLite and ``deny``, retrying with backoff; False if ``stop`` was set
        first."""

        async def sync() -> bool:
            await sync_revocations(cluster_store, db, clock=self.clock, deny=deny)
            return True

        def failed(exc: Exception, delay: float) -> None:
            self._starting = f"reading the certificate deny-list (revoked/): {exc}"
            log.error("cannot read the certificate deny-list: %s (retrying in %.1fs)", exc, delay)

        return await retry_until_stopped(sync, stop, cap=15.0, failed=failed) is not None

    def _on_shard_leadership(self, leading: bool) -> None:
        shard = self.shard
        if shard is None:
            return
        log.info("shard leadership %s", "acquired" if leading else "lost")
        coro = shard.start_leading() if leading else shard.stop_leading()
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.append(task)
        task.add_done_callback(self._tasks.remove)

    async def _shutdown(
        self,
        grpc_servers: list[grpc.aio.Server],
        electors: list[asyncio.Task[None]],
        provider: InstrumentedProvider | None,
        health: HealthServer,
        db: Database,
        fronts: Sequence[FrontProcess] = (),
    ) -> None:
        if self.shard is not None:
            await self.shard.stop_leading()
            await self.shard.flush_config_copy()
            self.shard.events.close_all()
            await self.shard.agents.close()
        await asyncio.gather(*(server.stop(grace=2.0) for server in grpc_servers))
        for front in fronts:
            await front.close()
        for task in electors:
            task.cancel()
        for task in electors:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if provider is not None:
            await provider.close()
        await health.close()
        db.close()
        log.info("stopped")


#: Allocations between young-generation collections in the daemon (CPython's default is 700).
GC_YOUNG_THRESHOLD = 20_000
#: Seconds a thread may hold the GIL while others wait (CPython's default is 0.005).
SWITCH_INTERVAL_S = 0.001


def tune_gc() -> None:
    """Make the cyclic garbage collector cheaper for a long-running server process.

    Everything allocated at start-up (modules, config, protobuf descriptors) is frozen out of the
    collector's view, and young collections run every 20,000 allocations instead of 700: during a
    burst of creates the default threshold fires a collection every few instances, and each one walks
    every tracked object. Reference counting still frees almost everything at once; only cycles wait.

    The interpreter's thread switch interval drops from 5 ms to 1 ms: worker threads (object-storage
    reads, SQLite batches) then hand the GIL back to the event loop sooner. With eight threads reading
    records, the loop otherwise waited over 100 ms for its turn.
    """
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)


def prepare_cachedir(cachedir: Path) -> None:
    """Create ``--cachedir`` if needed; InvalidArgument naming it when it cannot be the cache directory
    (a file of that name, no permission), instead of a FileExistsError nobody expects."""
    try:
        cachedir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        problem = directory_problem(cachedir, exc)
        raise InvalidArgument(f"--cachedir {cachedir}: {problem}; the server keeps its cache there") from None


async def serve(opts: ServerOptions) -> int:
    """Run a server until SIGTERM, SIGINT or SIGHUP (``stop_signals``)."""
    tune_gc()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in stop_signals():
        loop.add_signal_handler(sig, stop.set)
    return await ServerApp(opts).run(stop)
