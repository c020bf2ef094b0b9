"""Certificate serial numbers: random 128-bit positive integers, and their canonical hex form.

Upstream Nstance used ``time.Now().UnixNano()`` as the serial, which collides when two certificates are
issued in the same nanosecond tick (coarse clocks make that likely) and is guessable. We draw the
serial from the operating system's CSPRNG instead:

* ``secrets.randbits(128)`` gives 128 bits of entropy; the (2^-128) chance of drawing 0 is handled by
  drawing again, because RFC 5280 §4.1.2.2 requires a positive serial.
* A Python int is unsigned here, so the value is always positive. Its DER INTEGER encoding is at most
  17 octets (a leading 0x00 is added when bit 127 is set), inside RFC 5280's 20-octet limit.
* CA/Browser Forum baseline requirements ask for at least 64 bits of CSPRNG output; we use all 128.

``x509.random_serial_number()`` would also work but draws 159 bits; 128 is what our records and
upstream's ``cert_serial`` fields are sized for and is plenty against collisions.

The canonical text form (``serial_hex``) is lowercase hexadecimal without leading zeros or ``0x`` —
the same digits OpenSSL and Go (``big.Int.Text(16)``) print — so a certificate log entry can be
compared with the certificate it describes by string equality.

Pure functions; the only side effect is reading the CSPRNG.
"""

from __future__ import annotations

import re
import secrets

from nstance.core.errors import InvalidArgument

SERIAL_BITS = 128
_HEX = re.compile(r"[0-9a-f]+")


def random_serial() -> int:
    """A uniformly random positive serial of up to 128 bits (never 0)."""
    while True:
        value = secrets.randbits(SERIAL_BITS)
        if value > 0:
            return value


def serial_hex(serial: int) -> str:
    """Canonical lowercase hex of a serial, e.g. ``"3f0a..."`` (no padding, no prefix)."""
    if serial <= 0:
        raise InvalidArgument(f"certificate serial must be positive, got {serial}")
    return format(serial, "x")


def parse_serial_hex(text: str) -> int:
    """Inverse of ``serial_hex``; also accepts upper case, a ``0x`` prefix and ``:`` separators."""
    cleaned = text.strip().lower().removeprefix("0x").replace(":", "")
    if not _HEX.fullmatch(cleaned):
        raise InvalidArgument(f"certificate serial {text!r} is not hexadecimal")
    value = int(cleaned, 16)
    if value <= 0:
        raise InvalidArgument(f"certificate serial {text!r} must be a positive number")
    return value
