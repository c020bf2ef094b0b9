"""Pages of ListInstances: the page size a request may ask for, and the token that continues a listing.

A listing is ordered oldest first (``created_at``, then instance id), and a page token names the last
instance of the previous page by those two: the next page starts after it, so instances created or
deleted between two pages neither repeat nor shift the rest. The token is opaque to clients
(base64url of a small JSON array); a token this server did not make is INVALID_ARGUMENT.

Must not read the database or speak protobuf: the servicer does both.
"""

from __future__ import annotations

import base64
import binascii
import json
from datetime import datetime

from nstance.core.errors import InvalidArgument

MAX_PAGE_SIZE = 5000
"""The most instances one page holds, whatever a request asks for (about 450 KB on the wire)."""


def page_limit(page_size: int) -> int | None:
    """The rows to read for a request's ``page_size`` (None: all of them, in one answer)."""
    if page_size < 0:
        raise InvalidArgument(f"page_size must not be negative (got {page_size})")
    return min(page_size, MAX_PAGE_SIZE) if page_size else None


def encode_token(created_at: datetime, instance_id: str) -> str:
    """The token of a page that ends with this instance."""
    raw = json.dumps([created_at.isoformat(), instance_id], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_token(token: str) -> tuple[datetime, str]:
    """(``created_at``, instance id) of the instance a page token continues after."""
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        created, instance_id = json.loads(raw)
        when = datetime.fromisoformat(created)
    except (binascii.Error, ValueError, TypeError, UnicodeDecodeError):
        raise InvalidArgument("page_token is not a token of this server's ListInstances") from None
    if not isinstance(instance_id, str) or when.tzinfo is None:
        raise InvalidArgument("page_token is not a token of this server's ListInstances")
    return when, instance_id
