"""The leader's loop that keeps Cluster API's kubeconfig Secret for a self-managed cluster current.

``WorkloadKubeconfig.check`` reads Secret ``<cluster>-kubeconfig`` in the operator's namespace and acts
on ``kubeconfig_secret.decide``: when the Secret is missing, or is the operator's and its token has less
than ten minutes left, it asks the API server for a one-hour token of the workload ServiceAccount
(TokenRequest) and writes the kubeconfig (create, or a replace that keeps the Secret's other fields and
fails on a concurrent change). A Secret the operator did not write is left as it is, with a warning.
``run`` checks at once and then every ``CHECK_INTERVAL`` (five minutes); a failed check (the
ServiceAccount missing, the API refusing or unreachable) is logged and retried with backoff, from
``--backoff-base`` up to that interval.

The runtime starts it with the lead session when ``NSTANCE_CAPI_ENDPOINT`` is unset and cancels it when
leadership ends. The CA in the kubeconfig is the one the operator trusts for its own API server (its
kubeconfig's, or the pod's service-account ``ca.crt``), re-read at every write.

Must not: delete a Secret, or change one the operator did not write.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Final

import aiohttp

from nstance.core.backoff import Backoff
from nstance.operator.context import OperatorContext
from nstance.operator.controllers.kubeconfig_secret import (
    CHECK_INTERVAL,
    TOKEN_SECONDS,
    Action,
    Decision,
    WorkloadAccess,
    decide,
    issued_token,
    kubeconfig_text,
    new_secret,
    renewed_secret,
    secret_name,
)
from nstance.operator.kube import SECRETS, KubeError

log = logging.getLogger(__name__)

SERVICE_ACCOUNT_CA: Final = Path("/var/run/secrets/kubernetes.io/serviceaccount/ca.crt")
Sleep = Callable[[float], Awaitable[None]]


def read_cluster_ca(ca_file: str | None, fallback: Path = SERVICE_ACCOUNT_CA) -> bytes | None:
    """The PEM of the CA the operator trusts for its API server: ``ca_file``, else the pod's
    service-account CA; None when neither can be read."""
    for path in (ca_file, fallback):
        if not path:
            continue
        try:
            data = Path(path).read_bytes()
        except OSError:
            continue
        if data.strip():
            return data
    return None


class WorkloadKubeconfig:
    """Writes and renews Secret ``<cluster>-kubeconfig`` (see the module docstring)."""

    def __init__(
        self,
        ctx: OperatorContext,
        access: WorkloadAccess,
        *,
        interval: float = CHECK_INTERVAL,
        sleep: Sleep = asyncio.sleep,
        backoff: Backoff | None = None,
        ca_reader: Callable[[], bytes | None] | None = None,
    ) -> None:
        self.ctx = ctx
        self.access = access
        self.interval = interval
        self._sleep = sleep
        # Quick retries at first (a passing API hiccup), then no more often than the regular checks: a
        # ServiceAccount nobody created is reported every five minutes, not every few seconds.
        base = min(ctx.timings.backoff_base, interval)
        self._backoff = backoff or Backoff(base=base, cap=interval)
        self._read_ca = ca_reader or (lambda: read_cluster_ca(ctx.kube.configuration.ssl_ca_cert))
        self._warned_foreign = False

    @property
    def name(self) -> str:
        return secret_name(self.ctx.capi_cluster_name)

    async def run(self) -> None:
        """Check now and every ``interval`` seconds, sooner after a failure; until cancelled."""
        failures = 0
        while True:
            try:
                await self.check()
            except (KubeError, ValueError, OSError, aiohttp.ClientError, TimeoutError) as exc:
                delay = min(self._backoff.delay(failures), self.interval)
                failures += 1
                log.warning(
                    "cannot keep Cluster API's kubeconfig Secret %s/%s current: %s; retrying in %.1fs",
                    self.ctx.namespace,
                    self.name,
                    self._explain(exc),
                    delay,
                )
            else:
                delay, failures = self.interval, 0
            await self._sleep(delay)

    async def check(self) -> Decision:
        """One check: read the Secret, and write a fresh token when ``decide`` says so."""
        ctx = self.ctx
        current = await ctx.kube.get(SECRETS, self.name, ctx.namespace)
        decision = decide(current, ctx.clock.now())
        if decision.action is Action.KEEP:
            log.debug("kubeconfig Secret %s/%s: %s", ctx.namespace, self.name, decision.reason)
            return decision
        if decision.action is Action.FOREIGN:
            level = logging.DEBUG if self._warned_foreign else logging.WARNING
            self._warned_foreign = True
            log.log(
                level,
                "kubeconfig Secret %s/%s is left as it is: %s (delete it to let the operator manage it)",
                ctx.namespace,
                self.name,
                decision.reason,
            )
            return decision
        answer = await ctx.kube.request_token(
            self.access.service_account, ctx.namespace, expiration_seconds=TOKEN_SECONDS
        )
        token = issued_token(answer)
        cluster = ctx.capi_cluster_name
        text = kubeconfig_text(cluster, token.token, self._read_ca())
        if current is None:
            await ctx.kube.create(
                SECRETS, new_secret(cluster, ctx.namespace, text, token.expiry), ctx.namespace
            )
            verb = "created"
        else:
            body = renewed_secret(current, cluster, text, token.expiry)
            await ctx.kube.replace(SECRETS, self.name, body, ctx.namespace)
            verb = "renewed"
        log.info(
            "%s Cluster API's kubeconfig Secret %s/%s (%s; token of ServiceAccount %s valid until %s)",
            verb,
            ctx.namespace,
            self.name,
            decision.reason,
            self.access.service_account,
            token.expiry.isoformat(),
        )
        return decision

    def _explain(self, exc: BaseException) -> str:
        if isinstance(exc, KubeError) and exc.status == 404 and "serviceaccount" in exc.message.lower():
            return (
                f"the ServiceAccount {self.ctx.namespace}/{self.access.service_account} does not exist "
                "(the Helm chart creates it; or name another with NSTANCE_CAPI_SERVICEACCOUNT)"
            )
        if isinstance(exc, KubeError) and exc.status == 409:
            return "the Secret changed meanwhile"
        return str(exc) or type(exc).__name__
