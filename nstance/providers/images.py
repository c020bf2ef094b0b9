"""The policy for resolving the config's ``images`` entries: cached, refreshed, never all-or-nothing.

``resolve_images`` takes a lookup (a provider's ``ImageLookup.lookup_image``) and a cache. For each
image: a cached answer younger than ``refresh_interval`` is used as it is (unless forced); otherwise
the provider is asked. When the lookup fails or matches nothing, the previous cached value is kept
(``stale-cache``), else the entry's ``fallback`` is used, else the image is reported as an error
naming ``images.<name>`` - so one broken filter never stops the others, and a cloud API outage does
not stop creates that use an image resolved before.

The cache is a small protocol: ``MemoryImageCache`` here; the server backs it with the SQLite
``images`` table. This module does no I/O itself and must not import a cloud SDK.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

from nstance.config.resources import ImageConfig
from nstance.core.errors import NstanceError

log = logging.getLogger(__name__)

#: Where an image id came from in one resolution.
SOURCE_LOOKUP = "lookup"
SOURCE_CACHE = "cache"
SOURCE_STALE = "stale-cache"
SOURCE_FALLBACK = "fallback"


@dataclass(frozen=True, slots=True)
class CachedImage:
    """One resolved image and when it was looked up."""

    image_id: str
    resolved_at: datetime


class ImageCache(Protocol):
    """Where resolved images persist between lookups (and restarts, when backed by SQLite)."""

    def get_image(self, name: str) -> CachedImage | None:
        """The cached image of ``name``, or None."""
        ...

    def put_image(self, name: str, image: CachedImage) -> None:
        """Store the image resolved for ``name``."""
        ...


class MemoryImageCache:
    """An ImageCache in a dict (tests, and providers used without a server)."""

    def __init__(self) -> None:
        self.entries: dict[str, CachedImage] = {}

    def get_image(self, name: str) -> CachedImage | None:
        return self.entries.get(name)

    def put_image(self, name: str, image: CachedImage) -> None:
        self.entries[name] = image


@dataclass(frozen=True, slots=True)
class ImageResolution:
    """The outcome of one ``resolve_images``: ids by name, where each came from, and errors by name."""

    images: Mapping[str, str]
    sources: Mapping[str, str]  # SOURCE_*
    errors: Mapping[str, str]


Lookup = Callable[[str, ImageConfig], Awaitable[str]]


async def resolve_images(
    lookup: Lookup,
    images: Mapping[str, ImageConfig],
    *,
    cache: ImageCache,
    now: datetime,
    refresh_interval: timedelta,
    force: bool = False,
) -> ImageResolution:
    """Image ids for every entry: cached when fresh, else looked up, else stale cache, else fallback.

    ``force`` asks the provider for every image even when its cached answer is fresh. A cache that
    knows the answer was for another version of the entry (the server's SQLite cache compares a hash
    of the entry) returns None for it, so a failed lookup never reuses an id that matched other filters.
    """
    ids: dict[str, str] = {}
    sources: dict[str, str] = {}
    errors: dict[str, str] = {}
    for name, image in images.items():
        cached = cache.get_image(name)
        if not force and cached is not None and now - cached.resolved_at < refresh_interval:
            ids[name], sources[name] = cached.image_id, SOURCE_CACHE
            continue
        try:
            image_id = await lookup(name, image)
        except NstanceError as exc:  # invalid request, throttled, unavailable
            if cached is not None:
                log.warning("image %s: lookup failed, keeping %s: %s", name, cached.image_id, exc)
                ids[name], sources[name] = cached.image_id, SOURCE_STALE
            elif image.fallback:
                log.warning("image %s: lookup failed, using fallback %s: %s", name, image.fallback, exc)
                ids[name], sources[name] = image.fallback, SOURCE_FALLBACK
            else:
                errors[name] = str(exc)
            continue
        cache.put_image(name, CachedImage(image_id, now))
        ids[name], sources[name] = image_id, SOURCE_LOOKUP
    return ImageResolution(ids, sources, errors)
