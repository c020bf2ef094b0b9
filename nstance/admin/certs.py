"""``nstance-admin cert revoke SERIAL`` and ``cert list-revoked``: the certificate deny-list in storage.

The deny-list is one object per revoked serial in the CLUSTER scope, ``revoked/{serial}.json`` with
``{"serial", "revoked_at", "reason"}``; the serial is canonical lowercase hex (``nstance.pki.serial``),
the same text the servers store in SQLite and compare against a peer certificate's serial. Every shard
server copies new entries into its SQLite deny-list (``nstance.server.identity.revocations``) and from then on
refuses the certificate.

A revocation is written with a conditional create, so it is never overwritten: revoking twice keeps
the first time and reason. This module writes only ``revoked/*.json``; it contacts no server and
never deletes an entry (un-revoking is not offered).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Annotated, Any

import typer

from nstance.core.errors import InvalidArgument, NstanceError
from nstance.objectstore.base import ObjectNotFound, ObjectStore, PreconditionFailed
from nstance.pki.revocation_record import REVOKED_PREFIX, revocation_document, revoked_key
from nstance.pki.serial import parse_serial_hex, serial_hex

from .options import StorageBucketOpt, StoragePrefixOpt, StorageProviderOpt
from .output import fail, print_table
from .stores import StorageOptions, open_cluster_stores

OUTPUT_FORMATS = ("table", "json")
MAX_REASON = 1000

cert_app = typer.Typer(add_completion=False, help="Certificate deny-list (direct storage access, no server).")


def canonical_serial(text: str, *, decimal: bool = False) -> str:
    """Canonical lowercase hex of a serial typed by a person; InvalidArgument if it is not one.

    Hex is the default (``3f0a``, ``3F:0A``, ``0x3f0a``: what OpenSSL and our logs print); with
    ``decimal`` the text is read as a base-10 number (what Go's ``%d`` of a serial prints).
    """
    if not decimal:
        return serial_hex(parse_serial_hex(text))
    cleaned = text.strip().replace("_", "")
    if not cleaned.isdecimal() or not cleaned.isascii():
        raise InvalidArgument(f"certificate serial {text!r} is not a decimal number")
    value = int(cleaned)
    if value <= 0:
        raise InvalidArgument(f"certificate serial {text!r} must be a positive number")
    return serial_hex(value)


def _read_entry(store: ObjectStore, key: str) -> dict[str, Any]:
    """A stored revocation as a dict; InvalidArgument naming the key if it is corrupt."""
    data, _ = store.get(key)
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidArgument(f"{key}: not valid UTF-8 JSON ({exc})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("serial"), str):
        raise InvalidArgument(f'{key}: must be a JSON object with a "serial" string')
    return {
        "serial": doc["serial"],
        "revoked_at": doc.get("revoked_at") if isinstance(doc.get("revoked_at"), str) else None,
        "reason": doc.get("reason") if isinstance(doc.get("reason"), str) else "",
    }


def revoke_serial(store: ObjectStore, serial: str, *, now: datetime, reason: str = "") -> bool:
    """Create the deny-list entry of a canonical ``serial``; False if it was already revoked."""
    try:
        store.put_if_match(revoked_key(serial), revocation_document(serial, now, reason), None)
    except PreconditionFailed:
        return False
    return True


def list_revoked(store: ObjectStore) -> tuple[list[dict[str, Any]], list[str]]:
    """Every readable entry, sorted by serial, and one warning per unreadable object."""
    rows: list[dict[str, Any]] = []
    warnings: list[str] = []
    for key in store.list(REVOKED_PREFIX):
        if not key.endswith(".json"):
            continue
        try:
            rows.append(_read_entry(store, key))
        except ObjectNotFound:
            continue
        except InvalidArgument as exc:
            warnings.append(f"skipped {exc}")
    rows.sort(key=lambda row: (len(row["serial"]), row["serial"]))
    return rows, warnings


# --- commands --------------------------------------------------------------------------------------


def _cluster_store(provider: str, bucket: str, prefix: str) -> ObjectStore:
    # The deny-list needs no secrets; the memory secrets provider avoids demanding a key.
    return open_cluster_stores(StorageOptions(provider, bucket, prefix, secrets_provider="memory")).cluster


@cert_app.command("revoke")
def cert_revoke(
    serial: Annotated[str, typer.Argument(help="Certificate serial: hex (3f0a, 3F:0A, 0x3f0a) by default.")],
    reason: Annotated[str, typer.Option("--reason", help="Why it is revoked (kept with the entry).")] = "",
    decimal: Annotated[
        bool, typer.Option("--decimal", help="SERIAL is a decimal number (as Go's %d prints it).")
    ] = False,
    storage_provider: StorageProviderOpt = "s3",
    storage_bucket: StorageBucketOpt = "",
    storage_prefix: StoragePrefixOpt = "cluster/",
) -> None:
    """Put a certificate serial on the cluster's deny-list; servers refuse it once they sync."""
    if len(reason) > MAX_REASON:
        raise fail(f"--reason is {len(reason)} characters long; at most {MAX_REASON} are kept")
    try:
        canonical = canonical_serial(serial, decimal=decimal)
        store = _cluster_store(storage_provider, storage_bucket, storage_prefix)
        created = revoke_serial(store, canonical, now=datetime.now(UTC), reason=reason)
        existing = None if created else _read_entry(store, revoked_key(canonical))
    except NstanceError as exc:
        raise fail(str(exc)) from None
    where = f"{storage_prefix}{revoked_key(canonical)}"
    if existing is None:
        typer.echo(f"revoked certificate serial {canonical} (wrote {where})")
        typer.echo("shard servers refuse it after their next deny-list sync")
        return
    since = existing["revoked_at"] or "an unknown time"
    said = f' (reason: "{existing["reason"]}")' if existing["reason"] else ""
    typer.echo(f"certificate serial {canonical} is already revoked since {since}{said}; nothing changed")


@cert_app.command("list-revoked")
def cert_list_revoked(
    output: Annotated[str, typer.Option("--output", "-o", help="Output format: table or json.")] = "table",
    storage_provider: StorageProviderOpt = "s3",
    storage_bucket: StorageBucketOpt = "",
    storage_prefix: StoragePrefixOpt = "cluster/",
) -> None:
    """List the cluster's revoked certificate serials."""
    if output not in OUTPUT_FORMATS:
        raise fail(f"--output {output!r} is not supported; use one of: {', '.join(OUTPUT_FORMATS)}")
    try:
        rows, warnings = list_revoked(_cluster_store(storage_provider, storage_bucket, storage_prefix))
    except NstanceError as exc:
        raise fail(str(exc)) from None
    for warning in warnings:
        typer.echo(f"warning: {warning}", err=True)
    if output == "json":
        typer.echo(json.dumps(rows, indent=2, ensure_ascii=False))
    elif not rows:
        typer.echo("no revoked certificates")
    else:
        print_table(rows, [("SERIAL", "serial"), ("REVOKED_AT", "revoked_at"), ("REASON", "reason")])


def register_certs(app: typer.Typer) -> None:
    """Attach the ``cert`` commands to nstance-admin's top-level typer app."""
    app.add_typer(cert_app, name="cert")
