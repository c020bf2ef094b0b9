"""Fixtures for the contract suites: a session-wide moto_server and per-test S3 buckets.

moto_server starts only when an S3-parametrised test asks for it; every S3 test gets a fresh bucket
with a random name and fake credentials, so tests never see each other's objects or real AWS.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from nstance.objectstore.gcs import GcsObjectStore, gcs_client
from nstance.objectstore.s3 import S3ObjectStore
from nstance.testing.gcsfake import GcsFake
from nstance.testing.gsmfake import GsmFake
from nstance.testing.motoserver import MotoServer

REGION = "us-east-1"


@pytest.fixture(scope="session")
def gsm_fake() -> Iterator[GsmFake]:
    """A local Secret Manager (gRPC) for the whole session; tests use their own project ids."""
    with GsmFake() as fake:
        yield fake


@pytest.fixture(scope="session")
def moto_server() -> Iterator[MotoServer]:
    server = MotoServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fake credentials and region; no profile, config file or endpoint leaking in from the host."""
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": REGION,
        "AWS_REGION": REGION,
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    }.items():
        monkeypatch.setenv(name, value)
    for name in (
        "AWS_SESSION_TOKEN",
        "AWS_PROFILE",
        "AWS_ENDPOINT_URL",
        "AWS_ENDPOINT_URL_S3",
        "AWS_S3_USE_PATH_STYLE",
    ):
        monkeypatch.delenv(name, raising=False)


S3StoreFactory = Callable[..., S3ObjectStore]


@pytest.fixture(scope="session")
def gcs_fake() -> Iterator[GcsFake]:
    fake = GcsFake().start()
    try:
        yield fake
    finally:
        fake.stop()


@pytest.fixture
def gcs_store_factory(gcs_fake: GcsFake) -> Iterator[Callable[..., GcsObjectStore]]:
    """Return ``make(prefix="")``: a GcsObjectStore on a new bucket of the local GCS fake."""
    stores: list[GcsObjectStore] = []

    def make(prefix: str = "") -> GcsObjectStore:
        store = GcsObjectStore(
            f"nstance-test-{uuid.uuid4().hex[:16]}", prefix, client=gcs_client(gcs_fake.endpoint)
        )
        stores.append(store)
        return store

    yield make
    for store in stores:
        store.close()


@pytest.fixture
def s3_store_factory(moto_server: MotoServer, aws_env: None) -> Iterator[S3StoreFactory]:
    """Return ``make(prefix="", **opts)``: an S3ObjectStore on a new bucket (or ``bucket=`` given)."""
    stores: list[S3ObjectStore] = []

    def make(prefix: str = "", *, bucket: str | None = None, **opts: Any) -> S3ObjectStore:
        store = S3ObjectStore(
            bucket or f"nstance-test-{uuid.uuid4().hex[:16]}",
            prefix,
            endpoint_url=moto_server.endpoint_url,
            region=REGION,
            path_style=True,
            **opts,
        )
        stores.append(store)
        if bucket is None:
            store.client.create_bucket(Bucket=store.bucket)
        return store

    yield make
    for store in stores:
        store.close()
