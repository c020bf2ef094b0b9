"""``build_shard``: the one place a shard's parts are put together.

The daemon (``app``), the deterministic simulation and the in-process tests all build a shard here,
so they run the same wiring: one ``ShardContext`` (the fenced store and provider, the leader clock),
the ``Shard`` with its reconciler machinery and agent hub, and the ``Registrar`` writing through the
shard's single database writer. Collaborators are passed in, never attached afterwards: the hub
signals groups to the shard (``GroupSignals``), the registrar tells the shard of each registration
(``RegistrationEvents``), and the simulation's crash injection arrives as the context's ``faults``.
What differs between callers (where storage, the provider and leadership come from) are arguments.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from nstance.core.clock import Clock
from nstance.db.engine import Database
from nstance.objectstore.base import ObjectStore
from nstance.pki.ca import CertificateAuthority
from nstance.providers.base import Provider
from nstance.secrets.base import SecretStore
from nstance.server.identity.registration import Registrar
from nstance.server.leadership.session import METRICS_INTERVAL
from nstance.server.shard.shard import Shard
from nstance.server.state.configstate import ConfigState
from nstance.server.state.context import Leadership, ShardContext
from nstance.server.state.degraded import Degradations
from nstance.server.state.limits import CreateLimiter
from nstance.server.state.metrics import Metrics
from nstance.server.state.provisioning import ShardIdentity


@dataclass(frozen=True, slots=True)
class BuiltShard:
    """What ``build_shard`` returns: the shared context, the shard and its registrar."""

    ctx: ShardContext
    shard: Shard
    registrar: Registrar


def build_shard(
    *,
    identity: ShardIdentity,
    store: ObjectStore,
    cluster_store: ObjectStore,
    db: Database,
    config: ConfigState,
    provider: Provider,
    nonce_key: Ed25519PrivateKey,
    ca: CertificateAuthority,
    clock: Clock,
    limiter: CreateLimiter,
    leadership: Leadership,
    metrics: Metrics | None = None,
    cluster_leadership: Leadership | None = None,
    secrets: SecretStore | None = None,
    own_provider_id: str = "",
    degraded: Degradations | None = None,
    faults: Callable[[str], None] | None = None,
    resync_interval: float = 60.0,
    metrics_interval: float = METRICS_INTERVAL,
) -> BuiltShard:
    """Put one shard together (see the module docstring); nothing starts until leadership is won."""
    ctx = ShardContext(
        identity=identity,
        store=store,
        cluster_store=cluster_store,
        db=db,
        config=config,
        provider=provider,
        nonce_key=nonce_key,
        ca=ca,
        clock=clock,
        limiter=limiter,
        leadership=leadership,
        metrics=metrics if metrics is not None else Metrics(),
        cluster_leadership=cluster_leadership,
        secrets=secrets,
        own_provider_id=own_provider_id,
        degraded=degraded if degraded is not None else Degradations(),
        faults=faults,
    )
    shard = Shard(ctx, resync_interval=resync_interval, metrics_interval=metrics_interval)
    registrar = Registrar(ctx, db_writer=shard.ops.db_writer, events=shard)
    return BuiltShard(ctx=ctx, shard=shard, registrar=registrar)
