"""Helpers for the in-process shard tests (not in nstance.testing: it must not import the server)."""

from __future__ import annotations

import itertools
from datetime import datetime
from pathlib import Path

from sqlalchemy.orm import Session

from nstance.db import repo
from nstance.db.engine import Database, open_database
from nstance.db.rows import InstanceRow
from nstance.server.state.provisioning import ShardIdentity


def sample_shard_identity(ca_pem: bytes, *, cluster_id: str = "test", shard: str = "zone-a") -> ShardIdentity:
    """A ShardIdentity for in-process tests (sim provider, made-up advertise addresses)."""
    return ShardIdentity(
        cluster_id=cluster_id,
        shard=shard,
        provider_kind="sim",
        region="test",
        zone=shard,
        registration_addr="127.0.0.1:8992",
        agent_addr="127.0.0.1:8994",
        operator_addr="127.0.0.1:8993",
        ca_pem=ca_pem,
    )


def next_leaders_cache(current: Database, tmp_path: Path) -> Database:
    """Close ``current`` and open the next leader's cache: an empty database at a path of its own.

    The next leader runs on another machine, so its cache is another file. Deleting the old file
    and opening a new one at the same path, as these tests used to, left the old file's ``-shm``
    shared with any connection a task of the old leader still had open in this process, and SQLite
    refused the new database's first commit (``locking protocol``) in a CI run on a loaded machine.
    The old file stays where it is; a task still finishing writes there, not into the new cache.
    """
    current.close()
    for n in itertools.count(1):
        directory = tmp_path / f"next-leader-{n}"
        if not directory.exists():
            return open_database(directory / "nstance.db")
    raise AssertionError("unreachable")  # pragma: no cover - count() never ends


class Leader:
    """A Leadership that leads until ``leading`` is set to False (in-process shard tests)."""

    def __init__(self, address: str = "10.0.0.1:8993") -> None:
        self.leading = True
        self.address = address

    def is_leader(self) -> bool:
        return self.leading

    def leader_address(self) -> str:
        return self.address


async def no_sleep(_: float) -> None:
    """A sleep that returns at once (provider backoff in tests on an injected clock)."""
    return None


def claim_registration(session: Session, row: InstanceRow, now: datetime) -> bool:
    """What an agent's registration does first: claim the row's nonce in SQLite (no certificate, no
    record); False when the claim is refused."""
    return repo.mark_registered_atomically(
        session,
        nonce=row.nonce,
        public_key_pem="k",
        cert_serial=1,
        cert_expires_at=now,
        now=now,
        instance_id=row.id,
    )
