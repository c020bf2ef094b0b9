"""Decode userdata content according to its configured encoding.

``plain`` is used as is; ``base64`` is decoded (whitespace ignored); ``gzip`` is decompressed;
``base64+gzip`` is both, in that order. Decompressed output is capped so a hostile archive cannot
exhaust memory. Pure: fetching ``source: url`` content is the server's job.
"""

from __future__ import annotations

import base64
import binascii
import zlib

from nstance.config.workloads import UserdataEncoding
from nstance.core.errors import InvalidArgument

MAX_USERDATA_BYTES = 16 * 1024 * 1024


def _gunzip(data: bytes, limit: int) -> bytes:
    decompressor = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    try:
        out = decompressor.decompress(data, limit + 1)
    except zlib.error as exc:
        raise InvalidArgument(f"userdata: not valid gzip data ({exc})") from None
    if len(out) > limit:
        raise InvalidArgument(f"userdata: decompressed content is larger than {limit} bytes")
    if not decompressor.eof:
        raise InvalidArgument("userdata: gzip data is truncated")
    return out


def _unbase64(data: bytes) -> bytes:
    try:
        return base64.b64decode(b"".join(data.split()), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidArgument(f"userdata: not valid base64 ({exc})") from None


def decode_userdata(content: bytes, encoding: UserdataEncoding, max_bytes: int = MAX_USERDATA_BYTES) -> bytes:
    """Return the plain bytes of ``content`` stored with ``encoding``; raise InvalidArgument if bad."""
    if encoding == "plain":
        return content
    if encoding == "base64":
        return _unbase64(content)
    if encoding == "gzip":
        return _gunzip(content, max_bytes)
    if encoding == "base64+gzip":
        return _gunzip(_unbase64(content), max_bytes)
    raise InvalidArgument(f'userdata: unknown encoding "{encoding}" (use plain, base64, gzip or base64+gzip)')
