"""The operator's probe and metrics endpoint (``--health-addr``, default ``:8081``), on aiohttp.

* ``/healthz`` — 200 ``ok`` whenever the event loop answers (liveness: the process is not wedged).
* ``/readyz`` — 200 when the runtime says it is ready (a standby following the Lease, or a leader with
  its identity loaded and at least one shard reachable), else 503 with the reason as one line of text.
* ``/metrics`` — Prometheus text: ``OperatorMetrics`` (leader, shards reachable, registrations,
  renewals, reconnects, certificate expiry).

Each ``OperatorMetrics`` has its own registry, so two runtimes in one test process do not collide.
This module decides nothing: readiness comes from a callable the runtime supplies.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from nstance.operator.settings import Address

log = logging.getLogger(__name__)

Readiness = Callable[[], tuple[bool, str]]
"""``() -> (ready, reason)``; the reason is shown on /readyz either way."""


class OperatorMetrics:
    """The operator's Prometheus metrics, in a registry of their own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.leader = Gauge(
            "nstance_operator_leader",
            "1 while this replica holds the Lease and runs the controllers, else 0.",
            registry=self.registry,
        )
        self.shard_reachable = Gauge(
            "nstance_operator_shard_reachable",
            "1 when the shard's last call, stream or connection attempt succeeded, else 0.",
            ["shard"],
            registry=self.registry,
        )
        self.shards_reachable = Gauge(
            "nstance_operator_shards_reachable",
            "Number of configured shards that are reachable.",
            registry=self.registry,
        )
        self.shards_configured = Gauge(
            "nstance_operator_shards_configured",
            "Number of shards in the operator config.",
            registry=self.registry,
        )
        self.registrations = Counter(
            "nstance_operator_registrations",
            "RegisterOperator attempts by result (ok, standby, refused, error).",
            ["result"],
            registry=self.registry,
        )
        self.renewals = Counter(
            "nstance_operator_certificate_renewals",
            "RenewCertificate attempts by result (ok, error).",
            ["result"],
            registry=self.registry,
        )
        self.reconnects = Counter(
            "nstance_operator_shard_reconnects",
            "Times a shard connection became ready again after it had been lost.",
            ["shard"],
            registry=self.registry,
        )
        self.certificate_expiry = Gauge(
            "nstance_operator_certificate_expiry_timestamp_seconds",
            "notAfter of the operator client certificate in use (Unix seconds).",
            registry=self.registry,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)


class HealthServer:
    """An aiohttp site serving /healthz, /readyz and /metrics until ``stop``."""

    def __init__(
        self, address: Address, readiness: Readiness, metrics: OperatorMetrics, *, metrics_only: bool = False
    ) -> None:
        self.address = address
        self._readiness = readiness
        self._metrics = metrics
        #: Serve /metrics alone (upstream's separate metrics listener, ``--metrics-bind-address``).
        self._metrics_only = metrics_only
        self._runner: web.AppRunner | None = None
        self.port = address.port

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _readyz(self, request: web.Request) -> web.Response:
        try:
            ready, reason = self._readiness()
        except Exception as exc:  # noqa: BLE001 - a probe must answer, whatever the state holder does
            ready, reason = False, f"readiness check failed: {exc}"
        text = " ".join(reason.split()) or ("ok" if ready else "not ready")
        return web.Response(status=200 if ready else 503, text=text + "\n")

    async def _metrics_view(self, request: web.Request) -> web.Response:
        response = web.Response(body=self._metrics.render())
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response

    async def start(self) -> None:
        app = web.Application()
        if not self._metrics_only:
            app.router.add_get("/healthz", self._healthz)
            app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/metrics", self._metrics_view)
        runner = web.AppRunner(app, handle_signals=False, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self.address.host or None, self.address.port, reuse_address=True)
        await site.start()
        self._runner = runner
        server = getattr(site, "_server", None)
        sockets = getattr(server, "sockets", None) or []
        if sockets:
            self.port = int(sockets[0].getsockname()[1])
        served = "/metrics" if self._metrics_only else "/healthz, /readyz and /metrics"
        log.info("serving %s on %s", served, self.address)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
