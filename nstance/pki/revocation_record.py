"""The certificate deny-list record in cluster storage: ``revoked/{serial}.json``.

One object per revoked serial, ``{"serial", "revoked_at", "reason"}`` with the serial in canonical
lowercase hex. Written by ``nstance-admin cert revoke`` and read by every server
(``nstance.server.identity.revocations``), so both use this module. Pure: builds and parses keys and bytes,
stores nothing.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from datetime import UTC, datetime

from nstance.core.errors import InvalidArgument
from nstance.pki.serial import parse_serial_hex, serial_hex

REVOKED_PREFIX = "revoked/"
"""Where the deny-list lives inside the cluster scope."""

RECORD_SUFFIX = ".json"


@dataclass(frozen=True, slots=True)
class Revocation:
    """One deny-list entry as stored."""

    serial: str
    revoked_at: datetime | None
    reason: str


def serial_of_key(key: str) -> str:
    """The canonical serial a ``revoked/{serial}.json`` key names; InvalidArgument if it names none."""
    if not key.startswith(REVOKED_PREFIX) or not key.endswith(RECORD_SUFFIX):
        raise InvalidArgument(f"{key!r} is not a deny-list key (revoked/{{serial}}.json)")
    name = key[len(REVOKED_PREFIX) : -len(RECORD_SUFFIX)]
    try:
        return serial_hex(parse_serial_hex(name))
    except InvalidArgument as exc:
        raise InvalidArgument(f"{key}: the name is not a certificate serial ({exc})") from None


def _timestamp(raw: object) -> datetime | None:
    if not isinstance(raw, str):
        return None
    try:
        value = datetime.fromisoformat(raw)
    except ValueError:
        return None
    return value.astimezone(UTC) if value.tzinfo is not None else None


def parse_revocation(key: str, data: bytes) -> Revocation:
    """Parse a stored entry; InvalidArgument naming ``key`` and the problem if it cannot be used."""
    serial = serial_of_key(key)
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidArgument(f"{key}: not valid UTF-8 JSON ({exc})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("serial"), str):
        raise InvalidArgument(f'{key}: must be a JSON object with a "serial" string')
    try:
        body_serial = serial_hex(parse_serial_hex(doc["serial"]))
    except InvalidArgument as exc:
        raise InvalidArgument(f'{key}: field "serial": {exc}') from None
    if body_serial != serial:
        raise InvalidArgument(f'{key}: field "serial" is {body_serial} but the object name says {serial}')
    reason = doc.get("reason")
    return Revocation(serial, _timestamp(doc.get("revoked_at")), reason if isinstance(reason, str) else "")


def serials_claimed(key: str, data: bytes) -> set[str]:
    """Every serial an entry that ``parse_revocation`` refused still names (fail closed).

    The object's name is what ``cert revoke`` chose, so a name that is a serial counts whatever the
    body holds; so does a readable ``serial`` field that differs from it. Empty if neither is a serial.
    """
    found: set[str] = set()
    with contextlib.suppress(InvalidArgument):
        found.add(serial_of_key(key))
    try:
        doc = json.loads(data.decode("utf-8"))
        if isinstance(doc, dict) and isinstance(doc.get("serial"), str):
            found.add(serial_hex(parse_serial_hex(doc["serial"])))
    except (UnicodeDecodeError, json.JSONDecodeError, InvalidArgument):
        pass
    return found


def revoked_key(serial: str) -> str:
    """``revoked/{serial}.json`` (``serial`` canonical)."""
    return f"{REVOKED_PREFIX}{serial}{RECORD_SUFFIX}"


def revocation_document(serial: str, revoked_at: datetime, reason: str) -> bytes:
    """The stored JSON of one revocation."""
    stamp = revoked_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    doc = {"serial": serial, "revoked_at": stamp, "reason": reason}
    return json.dumps(doc, indent=2, ensure_ascii=False).encode("utf-8") + b"\n"
