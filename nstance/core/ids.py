"""Identifiers and instance IDs.

Two things live here:

* the identifier rule shared by cluster, shard, tenant, group and subnet-pool names
  (``^[a-z0-9]([a-z0-9-]*[a-z0-9])?$``, no ``--``, at most 32 characters), with an error that says
  which part of the rule failed;
* puidv7 instance IDs: a 3-letter lowercase kind prefix followed by the lowercase Crockford base32
  form of a UUIDv7 (29 characters in all), plus the ``{uuid}-{prefix}`` storage-key form that keeps
  object-storage listings in creation order.

Pure functions only; the clock and randomness used for new IDs can be injected.
"""

from __future__ import annotations

import base64
import os
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import NewType

from nstance.core.errors import InvalidArgument

InstanceId = NewType("InstanceId", str)

IDENTIFIER_MAX_LEN = 32
_IDENTIFIER_CHARS = re.compile(r"^[a-z0-9-]*$")
_KIND = re.compile(r"^[a-z]{3}$")

# Crockford base32, lowercase: no i, l, o, u.
_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"
_DECODE = {c: i for i, c in enumerate(_ALPHABET)}
# Crockford decoding is lenient on look-alike letters; we accept them on input only.
_DECODE.update({"i": 1, "l": 1, "o": 0})
_ENCODED_LEN = 26  # ceil(128 / 5)
PUID_LEN = 3 + _ENCODED_LEN

# The same digits in the alphabet of ``int(text, 32)`` (RFC 4648 "base32hex": 0-9 then a-v), so that
# decoding runs in C instead of a loop over the characters: the GC cycle of a 100,000-instance shard
# decodes every instance id.
_B32HEX = "0123456789abcdefghijklmnopqrstuv"
# A base32hex digit that is no Crockford digit ("u") becomes "!", so that it stays refused.
_TO_B32HEX = str.maketrans({c: "!" for c in _B32HEX} | {c: _B32HEX[i] for c, i in _DECODE.items()})
_B32HEX_DIGITS = re.compile(f"[0-9a-v]{{{_ENCODED_LEN}}}")
# And back: the digits of ``base64.b32hexencode`` (upper case) to the Crockford alphabet.
_FROM_B32HEX = bytes.maketrans(_B32HEX.upper().encode("ascii"), _ALPHABET.encode("ascii"))


def identifier_problem(value: str) -> str | None:
    """Return why ``value`` is not a valid identifier, or None when it is."""
    if not value:
        return "must not be empty"
    if len(value) > IDENTIFIER_MAX_LEN:
        return f"must be at most {IDENTIFIER_MAX_LEN} characters (got {len(value)})"
    if not _IDENTIFIER_CHARS.fullmatch(value):  # fullmatch: '$' alone lets a trailing newline through
        return "may contain only lowercase letters a-z, digits 0-9 and '-'"
    if value[0] == "-" or value[-1] == "-":
        return "must start and end with a lowercase letter or digit"
    if "--" in value:
        return "must not contain '--' (reserved as a separator)"
    return None


def validate_identifier(value: str, what: str = "identifier") -> str:
    """Return ``value`` unchanged if valid, else raise InvalidArgument naming ``what`` and the rule."""
    problem = identifier_problem(value)
    if problem is not None:
        raise InvalidArgument(f"{what} {value!r}: {problem}")
    return value


def kind_problem(kind: str) -> str | None:
    """Return why ``kind`` is not a valid puidv7 prefix, or None when it is."""
    if not _KIND.fullmatch(kind):
        return "must be exactly 3 lowercase letters"
    return None


def _new_kind(kind: str) -> str:
    """``kind`` when a new id may carry it; InvalidArgument saying why not otherwise."""
    if (problem := kind_problem(kind)) is not None:
        raise InvalidArgument(f"kind {kind!r}: {problem}")
    return kind


def _encode(value: int) -> str:
    # 128 bits, left-aligned in 130 bits (two zero pad bits at the end), MSB first: what base32hex
    # makes of the 16 bytes (its 26 digits before the "=" padding), in C, then mapped to Crockford's.
    digits = base64.b32hexencode(value.to_bytes(16, "big"))[:_ENCODED_LEN]
    return digits.translate(_FROM_B32HEX).decode("ascii")


def _decode(text: str) -> int:
    digits = text.translate(_TO_B32HEX)
    # Checked before ``int``, which would also take white space, signs, "_" and non-ASCII digits.
    if _B32HEX_DIGITS.fullmatch(digits) is None:
        bad = next((char for char in text if char not in _DECODE), None)
        if bad is not None:
            raise InvalidArgument(f"invalid base32 character {bad!r}")
        raise InvalidArgument(f"must be {_ENCODED_LEN} base32 digits (got {len(text)})")
    padded = int(digits, 32)
    if padded & 0b11:
        raise InvalidArgument("trailing pad bits must be zero")
    return padded >> 2


@dataclass(frozen=True, slots=True)
class Puid:
    """A parsed puidv7: kind prefix plus UUID."""

    kind: str
    uuid: uuid.UUID

    def __str__(self) -> str:
        return self.kind + _encode(self.uuid.int)

    @property
    def storage_key(self) -> str:
        """``{uuid}-{kind}``: sorts by creation time in object-storage listings."""
        return _storage_key(self.kind, self.uuid.int)

    @property
    def timestamp_ms(self) -> int:
        """Milliseconds since the Unix epoch embedded in the UUIDv7."""
        return self.uuid.int >> 80


def _parse(text: str) -> tuple[str, int]:
    """``(kind, the UUID's 128 bits)`` of a puidv7 string; InvalidArgument saying what is wrong."""
    if len(text) != PUID_LEN:
        raise InvalidArgument(f"instance id {text!r}: must be {PUID_LEN} characters (got {len(text)})")
    kind, body = text[:3], text[3:]
    if (problem := kind_problem(kind)) is not None:
        raise InvalidArgument(f"instance id {text!r}: prefix {problem}")
    try:
        value = _decode(body.lower())
    except InvalidArgument as exc:
        raise InvalidArgument(f"instance id {text!r}: {exc}") from None
    # What ``uuid.UUID(int=value).version`` says, read off the bits: the RFC 4122 variant (10 in
    # bits 63-62), then the version in bits 79-76.
    version = (value >> 76) & 0xF if (value >> 62) & 0b11 == 0b10 else None
    if version != 7:
        raise InvalidArgument(f"instance id {text!r}: not a UUIDv7 (version {version})")
    return kind, value


def parse_puid(text: str) -> Puid:
    """Parse a puidv7 string; raise InvalidArgument saying what is wrong."""
    kind, value = _parse(text)
    return Puid(kind=kind, uuid=uuid.UUID(int=value))


def validate_puid(text: str) -> str:
    """Return ``text`` if it is a puidv7 instance id (as ``parse_puid`` reads them), else raise
    InvalidArgument saying why; no object is built."""
    _parse(text)
    return text


def storage_key_of(text: str) -> str:
    """``parse_puid(text).storage_key`` without building the UUID (what a record's key needs)."""
    return _storage_key(*_parse(text))


def _storage_key(kind: str, value: int) -> str:
    """``{uuid}-{kind}``, the UUID in its standard form (as ``str(uuid.UUID(int=value))`` writes it)."""
    h = f"{value:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}-{kind}"


def parse_storage_key(key: str) -> Puid:
    """Parse the ``{uuid}-{kind}`` form back into a Puid."""
    head, sep, kind = key.rpartition("-")
    if not sep or kind_problem(kind) is not None:
        raise InvalidArgument(f"storage key {key!r}: must end in '-' and a 3-letter kind")
    try:
        parsed = uuid.UUID(head)
    except ValueError:
        raise InvalidArgument(f"storage key {key!r}: {head!r} is not a UUID") from None
    return Puid(kind=kind, uuid=parsed)


def puid_from_uuid(kind: str, value: uuid.UUID) -> Puid:
    """Build a Puid from a kind and an existing UUID (checked to be v7)."""
    if (problem := kind_problem(kind)) is not None:
        raise InvalidArgument(f"kind {kind!r}: {problem}")
    if value.version != 7:
        raise InvalidArgument(f"uuid {value}: not a UUIDv7")
    return Puid(kind=kind, uuid=value)


class PuidGenerator:
    """Makes time-ordered, unique puidv7s, safe to share between threads.

    Within one millisecond the 12-bit ``rand_a`` field acts as a counter seeded at random, so IDs
    made by one generator are strictly increasing even under concurrency; when the counter would
    overflow, the timestamp is advanced by one millisecond (RFC 9562 §6.2 method 3 style).
    """

    def __init__(
        self,
        now_ms: Callable[[], int] | None = None,
        randbytes: Callable[[int], bytes] = os.urandom,
    ) -> None:
        self._now_ms = now_ms or (lambda: time.time_ns() // 1_000_000)
        self._randbytes = randbytes
        self._lock = threading.Lock()
        self._last_ms = -1
        self._counter = 0

    def new_uuid(self) -> uuid.UUID:
        """Return a fresh UUIDv7 greater than every one returned before by this generator."""
        return uuid.UUID(int=self.new_value())

    def new_value(self) -> int:
        """``new_uuid``'s 128 bits, without building the ``uuid.UUID``."""
        rand = int.from_bytes(self._randbytes(10), "big")
        with self._lock:
            ms = self._now_ms()
            if ms > self._last_ms:
                self._last_ms = ms
                self._counter = (rand >> 64) & 0x7FF  # leave headroom before overflow
            else:
                self._counter += 1
                if self._counter > 0xFFF:
                    self._last_ms += 1
                    self._counter = 0
            ms, counter = self._last_ms, self._counter
        rand_b = rand & ((1 << 62) - 1)
        return (ms & ((1 << 48) - 1)) << 80 | 0x7 << 76 | counter << 64 | 0b10 << 62 | rand_b

    def new(self, kind: str) -> Puid:
        """Return a new Puid with the given 3-letter kind."""
        return Puid(kind=_new_kind(kind), uuid=self.new_uuid())


_default_generator = PuidGenerator()


def new_puid(kind: str) -> Puid:
    """Return a new Puid from the process-wide generator."""
    return _default_generator.new(kind)


def new_instance_id(kind: str) -> InstanceId:
    """Return a new instance ID string for the given template kind (``str(new_puid(kind))``)."""
    return InstanceId(_new_kind(kind) + _encode(_default_generator.new_value()))


#: A group's key everywhere it is tracked: (tenant, group).
GroupKey = tuple[str, str]


def groups_by_tenant(keys: Iterable[GroupKey]) -> dict[str, set[str]]:
    """The group names of ``keys``, per tenant."""
    names: dict[str, set[str]] = {}
    for tenant, group in keys:
        names.setdefault(tenant, set()).add(group)
    return names
