"""ObjectStore on Google Cloud Storage (``gcs://bucket/prefix``), as upstream's ``gcs`` storage.

ETags are object generations in double quotes (``"1700000000000001"``): every write creates a new
generation, so they change with every write as the contract requires. Conditional writes and
deletes use GCS's generation preconditions: ``put_if_match(key, data, None)`` sends
``ifGenerationMatch=0`` (create only), an ETag sends ``ifGenerationMatch=<generation>``; the
service answers 412 when another writer won, which becomes PreconditionFailed. Reads fetch the
bytes and the generation in one request.

Errors: 404 -> ObjectNotFound; 412 -> PreconditionFailed; 401/403 -> PermissionDenied; 429 ->
Throttled; 5xx and connection failures -> Unavailable; a missing bucket -> FailedPrecondition. The
client library's own retry policy handles transient errors of idempotent calls; conditional writes
are idempotent by their precondition. Credentials are Application Default Credentials, or anonymous
for an emulator (``STORAGE_EMULATOR_HOST`` or an explicit endpoint).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, NoReturn, TypeVar

from google.api_core import exceptions as gexc
from google.auth.credentials import AnonymousCredentials
from google.auth.exceptions import DefaultCredentialsError
from google.cloud import storage  # type: ignore[attr-defined]

from nstance.core.errors import FailedPrecondition, InvalidArgument, PermissionDenied, Unavailable
from nstance.objectstore.base import ObjectInfo, ObjectNotFound, PreconditionFailed, Throttled
from nstance.objectstore.file import validate_key
from nstance.objectstore.scoped import normalize_prefix

T = TypeVar("T")


def gcs_client(endpoint: str | None = None, project: str | None = None) -> storage.Client:
    """A client for GCS, or for an emulator at ``endpoint`` / ``STORAGE_EMULATOR_HOST`` (anonymous)."""
    endpoint = endpoint or os.environ.get("STORAGE_EMULATOR_HOST") or None
    if endpoint:
        return storage.Client(
            project=project or "nstance-test",
            credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]
            client_options={"api_endpoint": endpoint},
        )
    try:
        return storage.Client(project=project)
    except DefaultCredentialsError as exc:
        raise InvalidArgument(
            f"Google Cloud Storage needs credentials (Application Default Credentials): {exc}"
        ) from None


def _etag(generation: int | None) -> str:
    return f'"{generation}"'


def _generation(key: str, etag: str) -> int:
    try:
        generation = int(etag.strip('"'))
    except ValueError:
        raise PreconditionFailed(f"{key}: {etag!r} is not a generation of this store") from None
    if generation <= 0:  # 0 would mean "does not exist" to GCS; no object has that generation
        raise PreconditionFailed(f"{key}: {etag!r} is not a generation of this store")
    return generation


class GcsObjectStore:
    """Objects of one GCS bucket under a key prefix."""

    def __init__(self, bucket: str, prefix: str = "", *, client: storage.Client | None = None) -> None:
        if not bucket:
            raise InvalidArgument("a gcs store needs a bucket name")
        self._client = client if client is not None else gcs_client()
        self._bucket = self._client.bucket(bucket)
        self.bucket = bucket
        self.prefix = normalize_prefix(prefix)

    def _name(self, key: str) -> str:
        return self.prefix + validate_key(key)

    def _call(self, key: str, action: str, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except gexc.NotFound as exc:
            self._missing(exc, key)
        except gexc.PreconditionFailed as exc:
            raise PreconditionFailed(f"{key}: the object changed (generation precondition)") from exc
        except (gexc.Unauthorized, gexc.Forbidden) as exc:
            raise PermissionDenied(
                f"gs://{self.bucket}/{self._name(key)}: {action} refused: {exc.message}"
            ) from exc
        except gexc.TooManyRequests as exc:
            raise Throttled(f"gs://{self.bucket}: {action} throttled (429): {exc.message}") from exc
        except gexc.GoogleAPICallError as exc:
            raise Unavailable(f"gs://{self.bucket}: {action} of {key} failed: {exc.message}") from exc
        except (ConnectionError, OSError) as exc:
            raise Unavailable(f"cannot reach Google Cloud Storage: {exc}") from exc

    def _missing(self, exc: gexc.NotFound, key: str) -> NoReturn:
        if "bucket" in str(exc.message).lower() and "object" not in str(exc.message).lower():
            raise FailedPrecondition(f"gcs bucket {self.bucket!r} does not exist") from exc
        raise ObjectNotFound(f"{key} does not exist") from exc

    def get(self, key: str) -> tuple[bytes, str]:
        blob = self._bucket.blob(self._name(key))
        data = self._call(key, "read", blob.download_as_bytes)
        return data, _etag(blob.generation)

    def head(self, key: str) -> ObjectInfo:
        blob = self._call(key, "look up", lambda: self._bucket.get_blob(self._name(key)))
        if blob is None:
            raise ObjectNotFound(f"{key} does not exist")
        updated = blob.updated or datetime.now(UTC)
        return ObjectInfo(
            key=key, etag=_etag(blob.generation), size=int(blob.size or 0), last_modified=updated
        )

    def _upload(self, key: str, data: bytes, generation: int | None) -> str:
        blob = self._bucket.blob(self._name(key))
        self._call(
            key,
            "write",
            lambda: blob.upload_from_string(
                bytes(data), content_type="application/octet-stream", if_generation_match=generation
            ),
        )
        return _etag(blob.generation)

    def put(self, key: str, data: bytes) -> str:
        return self._upload(key, data, None)

    def put_if_match(self, key: str, data: bytes, etag: str | None) -> str:
        if etag is None:
            return self._upload(key, data, 0)
        generation = _generation(key, etag)
        try:
            return self._upload(key, data, generation)
        except ObjectNotFound:
            raise PreconditionFailed(f"{key}: the object does not exist") from None

    def delete(self, key: str, if_match: str | None = None) -> None:
        blob = self._bucket.blob(self._name(key))
        if if_match is None:
            try:
                self._call(key, "delete", blob.delete)
            except ObjectNotFound:
                return
            return
        generation = _generation(key, if_match)
        self._call(key, "delete", lambda: blob.delete(if_generation_match=generation))

    def list(self, prefix: str = "") -> list[str]:
        full = self.prefix + prefix

        def names() -> list[str]:
            return [b.name for b in self._client.list_blobs(self.bucket, prefix=full)]

        found = self._call(prefix or "/", "list", names)
        return sorted(name[len(self.prefix) :] for name in found)

    def exists(self, key: str) -> bool:
        return bool(self._call(key, "look up", lambda: self._bucket.get_blob(self._name(key)) is not None))

    def close(self) -> None:
        """Release the HTTP session."""
        closer: Any = getattr(self._client, "close", None)
        if callable(closer):
            closer()
