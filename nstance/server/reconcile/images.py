"""Machine images for templates (``Image.<name>``), resolved while this server leads the shard.

``ImageService.run`` resolves the config's ``images`` entries when leadership starts and then checks
every ``CHECK_INTERVAL`` seconds (or at once after ``kick``, e.g. on a config reload); the provider is
asked only for entries whose cached answer is older than ``shard.image_refresh_interval`` or whose
config entry changed, so a steady shard costs one DescribeImages per image per refresh interval. The
policy (cache, stale cache, fallback, error) is ``nstance.providers.images``; answers persist in the
SQLite ``images`` table with a fingerprint of the entry they answered, so a restarted or newly elected
server reuses them without asking the cloud.

The result lands in ``ShardContext.resolved_images`` (what templates see) and ``image_errors``; a new
error is logged and sent to error watchers once. ``explain_missing_image`` turns a template's
"undefined Image.x" into a message that also says why the image is missing. This module only
resolves; it never creates or deletes anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re
from collections.abc import Mapping

from nstance.config.resources import ImageConfig
from nstance.core.errors import NstanceError
from nstance.db import repo
from nstance.db.engine import Database
from nstance.providers.features import image_lookup
from nstance.providers.images import CachedImage, ImageResolution, resolve_images
from nstance.server.state.context import ShardContext
from nstance.server.state.events import ErrorEventData

log = logging.getLogger(__name__)

#: Seconds between checks for stale or changed images (lookups happen only when one is due).
CHECK_INTERVAL = 60.0
_MISSING_IMAGE = re.compile(r'undefined variable "Image\.([A-Za-z_][A-Za-z0-9_]*)"')


def image_fingerprint(image: ImageConfig) -> str:
    """A hash of what a lookup depends on (filters, owners, sort, order; not the fallback)."""
    text = image.model_dump_json(exclude={"fallback"})
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


class SqliteImageCache:
    """The ``ImageCache`` of the server: the SQLite ``images`` table, checked against fingerprints."""

    def __init__(self, db: Database, fingerprints: Mapping[str, str]) -> None:
        self._db = db
        self._fingerprints = fingerprints

    def get_image(self, name: str) -> CachedImage | None:
        with self._db.read_session() as session:
            row = repo.get_image(session, name)
        if row is None:
            return None
        if row.fingerprint is not None and row.fingerprint != self._fingerprints.get(name):
            return None  # answered another version of the entry
        return CachedImage(row.image_id, row.resolved_at)

    def put_image(self, name: str, image: CachedImage) -> None:
        with self._db.session() as session:
            repo.put_image(
                session,
                name,
                image_id=image.image_id,
                resolved_at=image.resolved_at,
                fingerprint=self._fingerprints.get(name),
            )


def explain_missing_image(message: str, errors: Mapping[str, str]) -> str:
    """``message`` plus why the image it names is missing, when it is a missing ``Image.<name>``."""
    match = _MISSING_IMAGE.search(message)
    if match is None:
        return message
    name = match.group(1)
    reason = errors.get(name)
    if reason is not None:
        return f"{message}; the image could not be resolved: {reason}"
    return f"{message}; there is no images.{name} entry in the config, or it has not been resolved yet"


class ImageService:
    """Keeps ``ctx.resolved_images`` current while leading (see the module docstring)."""

    def __init__(self, ctx: ShardContext, *, check_interval: float = CHECK_INTERVAL) -> None:
        self._ctx = ctx
        self._check_interval = check_interval
        self._wake = asyncio.Event()
        self._reported: dict[str, str] = {}

    def kick(self) -> None:
        """Check again now (the config may have changed)."""
        self._wake.set()

    async def refresh(self, *, force: bool = False) -> ImageResolution:
        """Resolve every configured image now (cached answers used unless stale, changed or forced)."""
        ctx = self._ctx
        snapshot = ctx.config.snapshot()
        if snapshot is None:
            return ImageResolution({}, {}, {})
        images = dict(snapshot.config.images)
        lookup = image_lookup(ctx.provider)
        if lookup is None:
            errors = {
                name: f'images.{name}: the "{ctx.provider.kind}" provider cannot look images up'
                for name in images
            }
            resolution = ImageResolution({}, {}, errors)
        else:
            fingerprints = {name: image_fingerprint(image) for name, image in images.items()}
            resolution = await resolve_images(
                lookup.lookup_image,
                images,
                cache=SqliteImageCache(ctx.db, fingerprints),
                now=ctx.clock.now(),
                refresh_interval=snapshot.config.shard.image_refresh_interval,
                force=force,
            )
        ctx.resolved_images = dict(resolution.images)
        ctx.image_errors = dict(resolution.errors)
        ctx.metrics.set_image_errors(len(resolution.errors))
        self._report(resolution.errors)
        return resolution

    def _report(self, errors: Mapping[str, str]) -> None:
        for name, error in errors.items():
            if self._reported.get(name) == error:
                continue
            log.error("image %s cannot be resolved: %s", name, error)
            self._ctx.events.errors.publish(
                ErrorEventData(
                    tenant="", group="", instance_id="", error=error, timestamp=self._ctx.clock.now()
                )
            )
        self._reported = dict(errors)

    async def run(self) -> None:
        """Check every ``check_interval`` (or when kicked) until cancelled; failures are logged.

        The first check waits: leadership start has just resolved everything (``refresh``).
        """
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._check_interval)
            self._wake.clear()
            try:
                await self.refresh()
            except NstanceError as exc:  # e.g. the SQLite cache is unavailable
                log.warning("image refresh failed: %s", exc)
