"""Resolve the config's ``images`` section to AMI ids with DescribeImages, cached and refreshed.

For each image: DescribeImages with its ``filters`` and ``owners`` (all pages), newest (or first by
name) according to ``sort``/``order``; only ``available`` images count. A lookup result is stored in an
``ImageCache`` with the time it was resolved; ``resolve`` re-asks AWS only when the entry is older than
``image_refresh_interval`` (or when forced, as on leadership start). When a lookup fails or matches
nothing, the previous cached value is kept, else the configured ``fallback`` is used, else the image is
reported as an error naming ``images.<name>`` - so one broken filter never stops the others.

The cache is a small protocol: ``MemoryImageCache`` here; the server backs it with the SQLite
``images`` table (nstance.db). This module must not import nstance.db, and never writes to AWS.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

from botocore.exceptions import ClientError

from nstance.config.resources import ImageConfig
from nstance.core.clock import Clock
from nstance.core.errors import NstanceError
from nstance.providers.aws.calls import AwsCaller, translate
from nstance.providers.base import ProviderInvalidRequest

log = logging.getLogger(__name__)


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
    """An ImageCache in a dict (tests, and servers that do not persist the cache)."""

    def __init__(self) -> None:
        self.entries: dict[str, CachedImage] = {}

    def get_image(self, name: str) -> CachedImage | None:
        return self.entries.get(name)

    def put_image(self, name: str, image: CachedImage) -> None:
        self.entries[name] = image


@dataclass(frozen=True, slots=True)
class ImageResolution:
    """The outcome of one ``resolve``: ids by name, where each came from, and errors by name."""

    images: Mapping[str, str]
    sources: Mapping[str, str]  # "lookup", "cache", "stale-cache", "fallback"
    errors: Mapping[str, str]


def _sort_key(image: Mapping[str, Any], sort: str) -> str:
    return str(image.get("CreationDate" if sort == "creation-date" else "Name", ""))


class ImageResolver:
    """Looks up AMIs for ``images`` entries, caching results for ``refresh_interval``."""

    def __init__(
        self,
        ec2: Any,
        caller: AwsCaller,
        *,
        clock: Clock,
        cache: ImageCache | None = None,
        refresh_interval: timedelta = timedelta(hours=6),
    ) -> None:
        self._ec2 = ec2
        self._caller = caller
        self._clock = clock
        self.cache: ImageCache = cache if cache is not None else MemoryImageCache()
        self.refresh_interval = refresh_interval

    async def lookup(self, name: str, image: ImageConfig) -> str:
        """Ask AWS for the best match of one image now; raise if the lookup fails or finds nothing."""
        where = f"images.{name}"
        if image.provider != "aws":
            raise ProviderInvalidRequest(f'{where}.provider: is "{image.provider}"; this shard runs on aws')
        params: dict[str, Any] = {
            "Filters": [{"Name": f.name, "Values": list(f.values)} for f in image.filters],
            "IncludeDeprecated": False,
        }
        if image.owners:
            params["Owners"] = list(image.owners)
        found: list[Mapping[str, Any]] = []
        token = ""
        while True:
            page_params = dict(params, NextToken=token) if token else params
            try:
                response = await self._caller.call(self._ec2, "describe_images", **page_params)
            except ClientError as exc:
                raise translate(exc, "DescribeImages", path=where) from exc
            found.extend(i for i in response.get("Images", []) if i.get("State", "available") == "available")
            token = str(response.get("NextToken") or "")
            if not token:
                break
        if not found:
            raise ProviderInvalidRequest(
                f"{where}: no available image matches the filters and owners; check them, or set a fallback"
            )
        found.sort(key=lambda i: (_sort_key(i, image.sort), str(i.get("ImageId", ""))))
        best = found[-1] if image.order == "desc" else found[0]
        return str(best["ImageId"])

    async def resolve(self, images: Mapping[str, ImageConfig], *, force: bool = False) -> ImageResolution:
        """AMI ids for every image: cached when fresh, else looked up, else stale cache, else fallback."""
        now = self._clock.now()
        ids: dict[str, str] = {}
        sources: dict[str, str] = {}
        errors: dict[str, str] = {}
        for name, image in images.items():
            cached = self.cache.get_image(name)
            if not force and cached is not None and now - cached.resolved_at < self.refresh_interval:
                ids[name], sources[name] = cached.image_id, "cache"
                continue
            try:
                image_id = await self.lookup(name, image)
            except NstanceError as exc:  # ProviderInvalidRequest, ProviderThrottled, ProviderUnavailable
                if cached is not None:
                    log.warning("image %s: lookup failed, keeping %s: %s", name, cached.image_id, exc)
                    ids[name], sources[name] = cached.image_id, "stale-cache"
                elif image.fallback:
                    log.warning("image %s: lookup failed, using fallback %s: %s", name, image.fallback, exc)
                    ids[name], sources[name] = image.fallback, "fallback"
                else:
                    errors[name] = str(exc)
                continue
            self.cache.put_image(name, CachedImage(image_id, now))
            ids[name], sources[name] = image_id, "lookup"
        return ImageResolution(ids, sources, errors)
