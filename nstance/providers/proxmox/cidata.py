"""Build a cloud-init NoCloud seed image: an ISO 9660 image labelled ``cidata`` with Joliet names.

cloud-init's NoCloud datasource finds a filesystem labelled ``cidata`` and reads ``user-data`` and
``meta-data`` (and ``network-config`` if present) from its root. The names have a hyphen and lowercase
letters, which ISO 9660 level 1 forbids, so the files are also listed in a Joliet directory (UCS-2
names, which Linux and blkid prefer); the primary directory carries 8.3 fallbacks (``USERDATA.;1``).

Layout, in 2048-byte sectors: 0-15 system area, 16 primary volume descriptor, 17 Joliet supplementary
descriptor, 18 terminator, 19-22 the four path tables, 23 primary root, 24 Joliet root, then the files.
Only a single root directory with up to a handful of small files is supported, which is all a seed
needs. Pure bytes in, bytes out; no I/O.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from datetime import UTC, datetime

SECTOR = 2048
VOLUME_LABEL = "cidata"
_PVD, _SVD, _TERM, _PATHS, _ROOT1, _ROOT2, _DATA = 16, 17, 18, 19, 23, 24, 25
_JOLIET_ESCAPE = b"%/E"  # UCS-2 level 3


def nocloud_seed(user_data: bytes, meta_data: bytes, *, now: datetime | None = None) -> bytes:
    """The seed image for one VM: ``user-data`` and ``meta-data`` at the root, labelled ``cidata``."""
    return iso9660({"meta-data": meta_data, "user-data": user_data}, label=VOLUME_LABEL, now=now)


def meta_data(instance_id: str, hostname: str) -> bytes:
    """NoCloud ``meta-data``: the instance id (a new one makes cloud-init run again) and hostname."""
    return f"instance-id: {instance_id}\nlocal-hostname: {hostname}\n".encode()


def iso9660(files: Mapping[str, bytes], *, label: str, now: datetime | None = None) -> bytes:
    """An ISO 9660 + Joliet image holding ``files`` in its root directory."""
    if not files:
        raise ValueError("an ISO image needs at least one file")
    if len(label) > 16:
        raise ValueError("a volume label is at most 16 characters (Joliet limit)")
    names = sorted(files)
    stamp = (now or datetime.now(UTC)).astimezone(UTC)
    extents: dict[str, int] = {}
    sector = _DATA
    for name in names:
        extents[name] = sector
        sector += max(1, -(-len(files[name]) // SECTOR))
    total = sector

    primary = {name: _short_name(name) for name in names}
    if len(set(primary.values())) != len(names):
        raise ValueError("file names clash once shortened to ISO 9660 8.3 form")
    root1 = _directory(
        _ROOT1, [(primary[n].encode("ascii"), extents[n], len(files[n])) for n in names], stamp
    )
    root2 = _directory(_ROOT2, [(n.encode("utf-16-be"), extents[n], len(files[n])) for n in names], stamp)

    image = bytearray(total * SECTOR)
    image[_PVD * SECTOR : (_PVD + 1) * SECTOR] = _descriptor(1, label, _ROOT1, 19, 20, total, stamp)
    image[_SVD * SECTOR : (_SVD + 1) * SECTOR] = _descriptor(2, label, _ROOT2, 21, 22, total, stamp)
    image[_TERM * SECTOR : _TERM * SECTOR + 7] = b"\xffCD001\x01"
    for offset, (root, little) in enumerate(
        ((_ROOT1, True), (_ROOT1, False), (_ROOT2, True), (_ROOT2, False))
    ):
        table = _path_table(root, little)
        start = (_PATHS + offset) * SECTOR
        image[start : start + len(table)] = table
    image[_ROOT1 * SECTOR : _ROOT1 * SECTOR + len(root1)] = root1
    image[_ROOT2 * SECTOR : _ROOT2 * SECTOR + len(root2)] = root2
    for name in names:
        start = extents[name] * SECTOR
        image[start : start + len(files[name])] = files[name]
    return bytes(image)


def _short_name(name: str) -> str:
    """An ISO 9660 level 1 name: uppercase d-characters, 8.3, with version ``;1``."""
    base, _, ext = name.upper().partition(".")
    keep = "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_"
    base = "".join(c for c in base if c in keep)[:8] or "FILE"
    ext = "".join(c for c in ext if c in keep)[:3]
    return f"{base}.{ext};1"


def _both16(value: int) -> bytes:
    return struct.pack("<H", value) + struct.pack(">H", value)


def _both32(value: int) -> bytes:
    return struct.pack("<I", value) + struct.pack(">I", value)


def _record_date(stamp: datetime) -> bytes:
    return bytes([stamp.year - 1900, stamp.month, stamp.day, stamp.hour, stamp.minute, stamp.second, 0])


def _volume_date(stamp: datetime | None) -> bytes:
    if stamp is None:
        return b"0" * 16 + b"\x00"
    return stamp.strftime("%Y%m%d%H%M%S").encode("ascii") + b"00" + b"\x00"


def _record(name: bytes, extent: int, size: int, stamp: datetime, *, directory: bool) -> bytes:
    length = 33 + len(name) + (1 if len(name) % 2 == 0 else 0)
    body = (
        bytes([length, 0])
        + _both32(extent)
        + _both32(size)
        + _record_date(stamp)
        + bytes([0x02 if directory else 0x00, 0, 0])
        + _both16(1)
        + bytes([len(name)])
        + name
    )
    return body + b"\x00" * (length - len(body))


def _directory(own: int, entries: list[tuple[bytes, int, int]], stamp: datetime) -> bytes:
    out = _record(b"\x00", own, SECTOR, stamp, directory=True) + _record(
        b"\x01", own, SECTOR, stamp, directory=True
    )
    for name, extent, size in entries:
        out += _record(name, extent, size, stamp, directory=False)
    if len(out) > SECTOR:
        raise ValueError("too many files for a one-sector root directory")
    return out


def _path_table(root: int, little: bool) -> bytes:
    extent = struct.pack("<I" if little else ">I", root)
    parent = struct.pack("<H" if little else ">H", 1)
    return bytes([1, 0]) + extent + parent + b"\x00\x00"  # name: one NUL byte, padded to even


def _text(value: str, size: int, joliet: bool) -> bytes:
    if joliet:
        raw = value.encode("utf-16-be")[:size]
        return raw + " ".encode("utf-16-be") * ((size - len(raw)) // 2) + b" " * ((size - len(raw)) % 2)
    return value.encode("ascii")[:size].ljust(size, b" ")


def _descriptor(
    kind: int, label: str, root: int, l_table: int, m_table: int, total: int, stamp: datetime
) -> bytes:
    joliet = kind == 2
    d = bytearray(SECTOR)
    d[0] = kind
    d[1:6] = b"CD001"
    d[6] = 1
    d[8:40] = _text("LINUX", 32, joliet)
    d[40:72] = _text(label, 32, joliet)
    d[80:88] = _both32(total)
    if joliet:
        d[88:91] = _JOLIET_ESCAPE
    d[120:124] = _both16(1)
    d[124:128] = _both16(1)
    d[128:132] = _both16(SECTOR)
    d[132:140] = _both32(10)  # path table size: one 10-byte root entry
    d[140:144] = struct.pack("<I", l_table)
    d[148:152] = struct.pack(">I", m_table)
    d[156:190] = _record(b"\x00", root, SECTOR, stamp, directory=True)
    for start, size in ((190, 128), (318, 128), (446, 128), (574, 128), (702, 37), (739, 37), (776, 37)):
        d[start : start + size] = _text("", size, joliet)
    d[574 : 574 + 128] = _text("NSTANCE", 128, joliet)
    d[813:830] = _volume_date(stamp)
    d[830:847] = _volume_date(stamp)
    d[847:864] = _volume_date(None)
    d[864:881] = _volume_date(None)
    d[881] = 1
    return bytes(d)
