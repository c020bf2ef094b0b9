"""Asking a cloud's instance-metadata service which VM this process runs on.

AWS: IMDSv2 - a session token from ``PUT /latest/api/token``, then ``GET /latest/meta-data/instance-id``
with it; the endpoint is ``AWS_EC2_METADATA_SERVICE_ENDPOINT`` (the variable the AWS SDKs read) or
``http://169.254.169.254``. Google: ``GET /computeMetadata/v1/instance/<field>`` with
``Metadata-Flavor: Google`` on ``GCE_METADATA_HOST`` (as google-auth reads it: ``host[:port]``) or
``metadata.google.internal``. Blocking stdlib HTTP with a short timeout, run in a worker thread; a
service that does not answer raises ``ProviderUnavailable`` saying how to skip the lookup. No cloud
SDK is imported here.
"""

from __future__ import annotations

import asyncio
import os
import urllib.error
import urllib.request
from collections.abc import Mapping

from nstance.providers.base import ProviderUnavailable

AWS_DEFAULT_ENDPOINT = "http://169.254.169.254"
GOOGLE_DEFAULT_HOST = "metadata.google.internal"
TIMEOUT = 2.0
_HINT = "run the server on the VM, or give its id with --provider-instance-id (NSTANCE_PROVIDER_INSTANCE_ID)"


def _request(url: str, *, method: str = "GET", headers: Mapping[str, str], timeout: float) -> str:
    request = urllib.request.Request(url, method=method, headers=dict(headers))
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # a link-local service
            body: bytes = response.read(4096)
    except urllib.error.HTTPError as exc:
        exc.close()
        raise ProviderUnavailable(f"metadata service: {method} {url} answered {exc.code}; {_HINT}") from exc
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise ProviderUnavailable(
            f"metadata service: {method} {url} did not answer ({exc}); {_HINT}"
        ) from exc
    text = body.decode("utf-8", "replace").strip()
    if not text:
        raise ProviderUnavailable(f"metadata service: {method} {url} answered with nothing; {_HINT}")
    return text


def aws_instance_id_blocking(environ: Mapping[str, str], timeout: float = TIMEOUT) -> str:
    """This EC2 instance's id through IMDSv2."""
    base = (environ.get("AWS_EC2_METADATA_SERVICE_ENDPOINT") or AWS_DEFAULT_ENDPOINT).rstrip("/")
    token = _request(
        f"{base}/latest/api/token",
        method="PUT",
        headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"},
        timeout=timeout,
    )
    return _request(
        f"{base}/latest/meta-data/instance-id",
        headers={"X-aws-ec2-metadata-token": token},
        timeout=timeout,
    )


def google_instance_field_blocking(field: str, environ: Mapping[str, str], timeout: float = TIMEOUT) -> str:
    """One ``instance/<field>`` value of this GCE VM (``id``, ``name``, ``zone``)."""
    host = environ.get("GCE_METADATA_HOST") or GOOGLE_DEFAULT_HOST
    return _request(
        f"http://{host}/computeMetadata/v1/instance/{field}",
        headers={"Metadata-Flavor": "Google"},
        timeout=timeout,
    )


async def aws_instance_id(environ: Mapping[str, str] | None = None) -> str:
    """``aws_instance_id_blocking`` in a worker thread (environment: ``os.environ`` by default)."""
    return await asyncio.to_thread(aws_instance_id_blocking, dict(environ or os.environ))


async def google_instance_field(field: str, environ: Mapping[str, str] | None = None) -> str:
    """``google_instance_field_blocking`` in a worker thread."""
    return await asyncio.to_thread(google_instance_field_blocking, field, dict(environ or os.environ))
