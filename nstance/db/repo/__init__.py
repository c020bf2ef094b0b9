"""The SQLite repository: every query the server runs, one module per table, and this one entry point.

Callers import the package (``from nstance.db import repo``) and call ``repo.<function>``; the table
modules behind it are an implementation detail. Each function takes an open bind and neither commits
nor rolls back: the caller owns the transaction, so several calls can form one atomic step. Times are
passed in (``now``) from the injected clock, never read here.

The hot paths (the reconciler's, GC's and provider sync's listings, instance lookups, health, status
and delete writes, registration) run plain SQL on the DBAPI connection instead of the ORM: the ORM
spent several times the statement's own cost building and tracking objects. Those functions take a
``Bind``: a Session (they run in its transaction) or a plain ``sqlite3.Connection`` from
``Database.read_connection()`` / ``write_connection()``, which skips the Session's own cost too.
They return immutable ``rows`` tuples (``InstanceRow``, ``PublicKeyRow``, ``LbRow``). The other
functions use the ORM and return ORM rows, which stay readable after the session ends
(``expire_on_commit=False``). The busiest writers (health, the create path's batches, the
registration claim) run on the shard's single database writer thread (``InstanceOps.db_writer``),
so they never queue on SQLite's write lock behind each other.

Single-use guarantees rest on one conditional statement whose affected-row count is checked, never on
read-then-write: ``mark_registered_atomically`` and ``claim_agent_registration`` (``agent_registration``)
and ``claim_operator_nonce`` (``operators``) are safe when any number of threads or processes race on
the same nonce.

Modules: ``instances`` (reads of the instances table), ``instance_lifecycle`` (its writes from create
intent to purge), ``instance_restore`` (the cache rebuild from object storage), ``agent_registration``
(an agent's identity columns), ``groups``, ``public_keys``, ``revocations``, ``operators``, ``images``,
``load_balancers`` (one table each) and ``_sql`` (the helpers they share). A table module imports
none of the others; a new public function is also imported here (a unit test checks both).
"""

from __future__ import annotations

from nstance.db.repo._sql import Bind, normalize_serial
from nstance.db.repo.agent_registration import (
    AgentClaim,
    claim_agent_registration,
    mark_registered_atomically,
    replace_agent_certificate,
    store_reported_addresses,
    unmark_registered,
)
from nstance.db.repo.groups import delete_group_hashes, get_group_hashes, list_groups, upsert_group_hashes
from nstance.db.repo.images import get_image, put_image
from nstance.db.repo.instance_lifecycle import (
    PurgedInstance,
    acknowledge_drain,
    forget_instance,
    insert_instance,
    insert_instances,
    mark_create_failed,
    purge_deleted_before,
    record_health_many,
    set_provider_details,
    set_provider_details_many,
    set_provider_status,
    soft_delete,
    soft_delete_many,
    start_drain,
)
from nstance.db.repo.instance_restore import restore_instance, restore_instances
from nstance.db.repo.instances import (
    awaiting_drain_ack,
    count_instances,
    get_instance,
    get_instance_by_nonce,
    get_instances,
    list_active_instances,
    list_instances,
    list_unregistered_instances,
    live_instance_ids,
    live_provider_ids,
    live_rows_by_group,
    recorded_instance_ids,
    serving_provider_ids,
    sync_rows,
    unlaunched_on_demand_tombstones,
)
from nstance.db.repo.load_balancers import delete_lb_memberships, lb_members, lb_memberships, set_lb_status
from nstance.db.repo.operators import (
    NonceClaim,
    claim_operator_nonce,
    count_operators,
    get_operator,
    list_operators,
    upsert_operator,
)
from nstance.db.repo.public_keys import list_public_keys, upsert_public_key
from nstance.db.repo.revocations import add_revoked_serial, revoked_serials

__all__ = [
    "AgentClaim",
    "Bind",
    "NonceClaim",
    "PurgedInstance",
    "acknowledge_drain",
    "add_revoked_serial",
    "awaiting_drain_ack",
    "claim_agent_registration",
    "claim_operator_nonce",
    "count_instances",
    "count_operators",
    "delete_group_hashes",
    "delete_lb_memberships",
    "forget_instance",
    "get_group_hashes",
    "get_image",
    "get_instance",
    "get_instance_by_nonce",
    "get_instances",
    "get_operator",
    "insert_instance",
    "insert_instances",
    "lb_members",
    "lb_memberships",
    "list_active_instances",
    "list_groups",
    "list_instances",
    "list_operators",
    "list_public_keys",
    "list_unregistered_instances",
    "live_instance_ids",
    "live_provider_ids",
    "live_rows_by_group",
    "mark_create_failed",
    "mark_registered_atomically",
    "normalize_serial",
    "purge_deleted_before",
    "put_image",
    "record_health_many",
    "recorded_instance_ids",
    "replace_agent_certificate",
    "restore_instance",
    "restore_instances",
    "revoked_serials",
    "serving_provider_ids",
    "set_lb_status",
    "set_provider_details",
    "set_provider_details_many",
    "set_provider_status",
    "soft_delete",
    "soft_delete_many",
    "start_drain",
    "store_reported_addresses",
    "sync_rows",
    "unlaunched_on_demand_tombstones",
    "unmark_registered",
    "upsert_group_hashes",
    "upsert_operator",
    "upsert_public_key",
]
