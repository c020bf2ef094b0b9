"""Spot / preemption notices from the cloud's instance-metadata service (AWS IMDSv2 and Google).

Responsible for finding out whether this machine can be reclaimed (AWS ``instance-life-cycle`` is
``spot``; Google ``scheduling/preemptible`` is ``TRUE``), then polling for the notice (AWS
``spot/instance-action`` 200 with ``{"action","time"}``; Google ``instance/preempted`` ``TRUE``, no
deadline) every SPOT_POLL_INTERVAL and handing the first notice to a callback. HTTP is stdlib urllib run
in a worker thread; the metadata base URL is injectable for tests. It does not send reports itself.
"""

from __future__ import annotations

import asyncio
import json
import logging
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime

from nstance.agent.state import TerminationNotice
from nstance.core.backoff import Backoff

log = logging.getLogger("nstance.agent.spot")

AWS_METADATA_URL = "http://169.254.169.254"
GOOGLE_METADATA_URL = "http://metadata.google.internal"
AWS_TOKEN_TTL = "21600"

Sleep = Callable[[float], Awaitable[None]]


class MetadataError(Exception):
    """The metadata service did not answer as expected."""


@dataclass(frozen=True, slots=True)
class HttpResult:
    status: int
    body: bytes


def http_request(
    url: str, *, method: str = "GET", headers: dict[str, str] | None = None, timeout: float = 1.0
) -> HttpResult:
    """One blocking HTTP request; any HTTP status is returned, network failures raise MetadataError."""
    request = urllib.request.Request(url, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return HttpResult(status=int(response.status), body=response.read())
    except urllib.error.HTTPError as exc:
        body = exc.read() if exc.fp is not None else b""
        exc.close()
        return HttpResult(status=exc.code, body=body)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise MetadataError(f"{method} {url}: {exc}") from exc


def parse_aws_instance_action(body: bytes) -> TerminationNotice:
    """The notice in AWS's ``spot/instance-action`` JSON (``time`` optional, RFC 3339)."""
    try:
        data = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise MetadataError(f"spot/instance-action is not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise MetadataError("spot/instance-action is not a JSON object")
    action = str(data.get("action") or "terminate")
    deadline: datetime | None = None
    raw_time = data.get("time")
    if isinstance(raw_time, str) and raw_time:
        try:
            deadline = datetime.fromisoformat(raw_time.replace("Z", "+00:00"))
        except ValueError:
            log.warning("spot/instance-action time %r is not RFC 3339; reporting no deadline", raw_time)
    return TerminationNotice(action=action, deadline=deadline)


class AwsMetadata:
    """IMDSv2 client: a session token, then token-authenticated GETs."""

    def __init__(self, base_url: str = AWS_METADATA_URL, *, timeout: float = 1.0) -> None:
        self._base = base_url.rstrip("/")
        self._timeout = timeout
        self._token = ""

    def _fetch_token(self) -> str:
        result = http_request(
            f"{self._base}/latest/api/token",
            method="PUT",
            headers={"X-aws-ec2-metadata-token-ttl-seconds": AWS_TOKEN_TTL},
            timeout=self._timeout,
        )
        if result.status != 200:
            raise MetadataError(f"IMDSv2 token request answered HTTP {result.status}")
        return result.body.decode("utf-8", "replace").strip()

    def get(self, path: str) -> HttpResult:
        if not self._token:
            self._token = self._fetch_token()
        url = f"{self._base}/latest/meta-data/{path}"
        result = http_request(url, headers={"X-aws-ec2-metadata-token": self._token}, timeout=self._timeout)
        if result.status == 401:  # token expired
            self._token = self._fetch_token()
            result = http_request(
                url, headers={"X-aws-ec2-metadata-token": self._token}, timeout=self._timeout
            )
        return result

    def is_spot(self) -> bool:
        result = self.get("instance-life-cycle")
        if result.status != 200:
            raise MetadataError(f"instance-life-cycle answered HTTP {result.status}")
        return result.body.decode("utf-8", "replace").strip() == "spot"

    def notice(self) -> TerminationNotice | None:
        result = self.get("spot/instance-action")
        if result.status == 404:
            return None
        if result.status != 200:
            raise MetadataError(f"spot/instance-action answered HTTP {result.status}")
        return parse_aws_instance_action(result.body)


class GoogleMetadata:
    """GCE metadata client (``Metadata-Flavor: Google``)."""

    def __init__(self, base_url: str = GOOGLE_METADATA_URL, *, timeout: float = 1.0) -> None:
        self._base = base_url.rstrip("/")
        self._timeout = timeout

    def _value(self, path: str) -> str:
        result = http_request(
            f"{self._base}/computeMetadata/v1/instance/{path}",
            headers={"Metadata-Flavor": "Google"},
            timeout=self._timeout,
        )
        if result.status != 200:
            raise MetadataError(f"instance/{path} answered HTTP {result.status}")
        return result.body.decode("utf-8", "replace").strip()

    def is_spot(self) -> bool:
        return self._value("scheduling/preemptible").upper() == "TRUE"

    def notice(self) -> TerminationNotice | None:
        if self._value("preempted").upper() == "TRUE":
            return TerminationNotice(action="terminate")
        return None


Platform = AwsMetadata | GoogleMetadata


def detect_platform(provider: str, metadata_url: str = "", *, timeout: float = 1.0) -> Platform | None:
    """The metadata client of a machine that can be reclaimed, or None (blocking; run in a thread).

    ``provider`` ``aws`` or ``google`` checks only that cloud; ``local``/``proxmox`` never poll; empty
    tries AWS, then Google. MetadataError when an explicitly named cloud's metadata does not answer.
    """
    if provider in ("local", "proxmox"):
        return None
    candidates: list[Platform] = []
    if provider in ("", "aws"):
        candidates.append(AwsMetadata(metadata_url or AWS_METADATA_URL, timeout=timeout))
    if provider in ("", "google"):
        candidates.append(GoogleMetadata(metadata_url or GOOGLE_METADATA_URL, timeout=timeout))
    for platform in candidates:
        try:
            spot = platform.is_spot()
        except MetadataError as exc:
            if provider:
                raise
            log.debug("no %s metadata service: %s", type(platform).__name__, exc)
            continue
        return platform if spot else None
    return None


class SpotPoller:
    """Finds the platform, then polls until a termination notice appears and reports it once."""

    def __init__(
        self,
        *,
        provider: str,
        metadata_url: str,
        interval: float,
        on_notice: Callable[[TerminationNotice], None],
        sleep: Sleep = asyncio.sleep,
        timeout: float = 1.0,
        backoff: Backoff | None = None,
    ) -> None:
        self._provider = provider
        self._metadata_url = metadata_url
        self._interval = interval
        self._on_notice = on_notice
        self._sleep = sleep
        self._timeout = timeout
        self._backoff = backoff or Backoff(base=1.0, cap=60.0)

    async def detect(self) -> Platform | None:
        attempt = 0
        while True:
            try:
                return await asyncio.to_thread(
                    detect_platform, self._provider, self._metadata_url, timeout=self._timeout
                )
            except MetadataError as exc:
                delay = self._backoff.delay(attempt)
                log.warning("spot detection (%s) failed: %s; retrying in %.1fs", self._provider, exc, delay)
                attempt += 1
                await self._sleep(delay)

    async def run(self) -> TerminationNotice | None:
        """Poll until a notice arrives (returned after calling ``on_notice``); None when not spot."""
        platform = await self.detect()
        if platform is None:
            log.info(
                "spot poller off (provider %s: not a spot or preemptible machine)", self._provider or "auto"
            )
            return None
        log.info("spot poller on (%s), every %.1fs", type(platform).__name__, self._interval)
        while True:
            try:
                notice = await asyncio.to_thread(platform.notice)
            except MetadataError as exc:
                log.debug("spot poll failed: %s", exc)
                notice = None
            if notice is not None:
                log.warning(
                    "termination notice: %s at %s",
                    notice.action,
                    notice.deadline.isoformat() if notice.deadline else "an unannounced time",
                )
                self._on_notice(notice)
                return notice
            await self._sleep(self._interval)
