"""Registration of agents and operators, and agent certificate renewal (the RegistrationService logic).

``Registrar`` turns a single-use registration nonce JWT plus an ECDSA P-256 or Ed25519 public key
into a client certificate signed by the cluster CA, and records the registration durably:

* **Agents** (``register_agent``, shard leader only): the nonce (kind ``agent``, this cluster, this
  shard) is consumed by one conditional SQLite UPDATE (``repo.claim_agent_registration``), so of any
  number of concurrent or replayed registrations exactly one succeeds; the others get ALREADY_EXISTS
  and change nothing. The winner's certificate facts are then written to the instance record in
  object storage (compare-and-swap); if that write fails, the SQLite claim is undone (guarded by the
  certificate serial) and the agent gets UNAVAILABLE, so it can retry with the same nonce.
* **Operators** (``register_operator``, cluster leader only): the nonce (kind ``operator``,
  ``sub == cluster_id``) is bound to the first public key presented by a create-only write of
  ``operator-nonce/{sha256hex(nonce)}.pem`` in cluster storage. The same key may retry (and gets a
  fresh certificate); any other key is refused. The registration is cached in SQLite (``operators``)
  and written to the operator record ``operator/{tenant}.{cluster_id}.json``.
* **Agent renewal** (``renew_agent``): an authenticated agent presenting its *current* certificate
  (serial equal to the instance's ``cert_serial``) gets a new certificate for a new key; the serial
  swap is a compare-and-swap, so a superseded certificate can never renew.
* ``backfill_operators`` fills an empty ``operators`` table from the operator records in storage.

Each flow is its own module - ``agentreg``, ``operatorreg`` and ``renewal`` - with what they share
(signing the certificate, finishing a claimed step even if the caller leaves) in ``issuing``;
``Registrar`` is the one object the servicers and the wiring hold.

Blocking work (SQLite, object storage) runs in worker threads; the event loop only verifies the
JWT and signs the certificate (well under a millisecond each). Errors are ``nstance.core.errors``
exceptions; the gRPC interceptor maps them to status codes. This module must not import generated
gRPC code (the servicer translates), decide anything about an instance's lifecycle, or write to
stores other than the ones named above. See ``docs/registration.md``.
"""

from __future__ import annotations

from concurrent.futures import Executor, ThreadPoolExecutor

from nstance.server.identity.agentreg import AgentRegistration, RegistrationEvents
from nstance.server.identity.operatorreg import OperatorRegistration
from nstance.server.identity.renewal import AgentRenewal
from nstance.server.state.context import ShardContext

__all__ = ["Registrar", "RegistrationEvents"]


class Registrar:
    """The registration logic of one shard server (see the module docstring)."""

    def __init__(
        self,
        ctx: ShardContext,
        *,
        db_writer: Executor | None = None,
        events: RegistrationEvents | None = None,
    ) -> None:
        self.ctx = ctx
        # SQLite writes of the hot path go to one thread: dozens of I/O threads queueing on SQLite's
        # write lock (busy_timeout polling) made registration latency seconds long under load. The
        # server passes the shard's single database writer, shared with the create path and health.
        writer = db_writer or ThreadPoolExecutor(max_workers=1, thread_name_prefix="nstance-reg-db")
        self.agents = AgentRegistration(ctx, db_writer=writer, events=events)
        self.renewal = AgentRenewal(ctx)
        self.operators = OperatorRegistration(ctx)
        self.register_agent = self.agents.register_agent
        self.renew_agent = self.renewal.renew_agent
        self.register_operator = self.operators.register_operator
        self.backfill_operators = self.operators.backfill_operators
