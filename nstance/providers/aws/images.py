"""Look up the config's ``images`` entries with EC2 DescribeImages.

For one entry: DescribeImages with its ``filters`` and ``owners`` (all pages, deprecated images
excluded); only ``available`` images count; the best is the last (``order: desc``) or first
(``asc``) by ``sort`` (creation date or name). Caching, refresh and fallback are the provider-neutral
policy in ``nstance.providers.images``, which the server runs with this lookup and a SQLite cache.
This module never writes to AWS.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from botocore.exceptions import ClientError

from nstance.config.resources import ImageConfig
from nstance.providers.aws.calls import AwsCaller, translate
from nstance.providers.base import ProviderInvalidRequest


def _sort_key(image: Mapping[str, Any], sort: str) -> str:
    return str(image.get("CreationDate" if sort == "creation-date" else "Name", ""))


class ImageFinder:
    """Finds the AMI that best matches an ``images`` entry."""

    def __init__(self, ec2: Any, caller: AwsCaller) -> None:
        self._ec2 = ec2
        self._caller = caller

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
