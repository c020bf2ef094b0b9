"""Preparing an instance: id, nonce, userdata from a URL (with timeout and encodings), subnet choice."""

from __future__ import annotations

import dataclasses
import gzip
import http.server
import json
import threading
from collections.abc import Iterator
from datetime import timedelta

import pytest
from shard_helpers import sample_shard_identity

from nstance.config import UserdataConfig, load_config_text, merged_group
from nstance.config.merge import MergedGroupConfig
from nstance.core.clock import ManualClock
from nstance.core.errors import FailedPrecondition, InvalidArgument, Unavailable
from nstance.core.ids import new_instance_id
from nstance.pki.ca import create_ca
from nstance.pki.keys import generate_private_key
from nstance.pki.nonce import verify_nonce
from nstance.server.state.provisioning import choose_subnet, prepare_instance, render_userdata
from nstance.testing.shardproc import server_addrs, shard_config

PAYLOADS: dict[str, bytes] = {
    "/plain": b"#!/bin/sh\necho {{ .Instance.ID }} {{ .Vars.role }}\n",
    "/gz": gzip.compress(b"#!/bin/sh\necho gz {{ .Instance.ID }}\n"),
    "/slow": b"#!/bin/sh\necho too late\n",
}
SLOW_ANSWER = threading.Event()
"""Holds /slow's (successful) answer back until the test that asked for it has seen its fetch fail."""


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path == "/slow":
            SLOW_ANSWER.wait(30)
        body = PAYLOADS.get(self.path)
        if body is None:
            self.send_error(404)
            return
        try:
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            return  # the client gave up (the timeout test)

    def log_message(self, *args: object) -> None:
        return None


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def merged(userdata: UserdataConfig | None) -> MergedGroupConfig:
    doc = shard_config(
        addrs=server_addrs(), groups={"web": {"template": "app", "size": 1, "vars": {"role": "db"}}}
    )
    config = load_config_text(json.dumps(doc))
    return dataclasses.replace(merged_group(config, {}, "default", "web"), userdata=userdata)


IDENTITY = sample_shard_identity(create_ca(cluster_id="test").cert_pem)


async def always(_: str) -> bool:
    return True


async def prepare(m: MergedGroupConfig, **kw: object):  # type: ignore[no-untyped-def]
    key = generate_private_key("ed25519")
    prepared = await prepare_instance(
        m,
        shard=IDENTITY,
        nonce_key=key,  # type: ignore[arg-type]
        has_capacity=kw.pop("has_capacity", always),  # type: ignore[arg-type]
        subnet_pools={"default": ["net-1"]},
        registration_timeout=timedelta(minutes=5),
        clock=ManualClock(),
        **kw,  # type: ignore[arg-type]
    )
    return prepared, key


async def test_userdata_from_url_is_fetched_and_rendered(url: str) -> None:
    prepared, key = await prepare(merged(UserdataConfig(source="url", content=f"{url}/plain")))
    iid = prepared.request.instance_id
    assert prepared.request.userdata == f"#!/bin/sh\necho {iid} db\n".encode()
    assert iid.startswith("app")
    assert prepared.request.idempotency_token == iid
    claims = verify_nonce(
        prepared.nonce,
        key.public_key(),  # type: ignore[arg-type]
        expected_kind="agent",
        cluster_id="test",
        shard="zone-a",
        clock=ManualClock(),
    )
    assert claims.sub == iid


async def test_userdata_url_gzip_encoding_is_decoded(url: str) -> None:
    prepared, _ = await prepare(merged(UserdataConfig(source="url", content=f"{url}/gz", encoding="gzip")))
    assert prepared.request.userdata.startswith(b"#!/bin/sh\necho gz app")


async def test_userdata_url_errors_name_the_url(url: str) -> None:
    with pytest.raises(Unavailable, match=f"{url}/missing"):
        await prepare(merged(UserdataConfig(source="url", content=f"{url}/missing")))


async def test_userdata_url_fetch_times_out(url: str) -> None:
    m = merged(UserdataConfig(source="url", content=f"{url}/slow"))
    try:
        # The answer would be a success, but only after the test is over: failing is the timeout.
        with pytest.raises(Unavailable, match="/slow"):
            # the fetch fails before any rendering, so no template data is needed
            await render_userdata(m, None, fetch_timeout=0.2)  # type: ignore[arg-type]
    finally:
        SLOW_ANSWER.set()


async def test_client_instance_id_must_match_the_template_kind() -> None:
    wrong = str(new_instance_id("knc"))
    with pytest.raises(InvalidArgument, match='kind "app"'):
        await prepare(merged(None), instance_id=wrong)
    right = str(new_instance_id("app"))
    prepared, _ = await prepare(merged(None), instance_id=right)
    assert prepared.request.instance_id == right


async def test_subnet_choice_skips_full_subnets() -> None:
    full = {"net-1"}

    async def capacity(subnet: str) -> bool:
        return subnet not in full

    pools = {"default": ["net-1", "net-2"]}
    assert await choose_subnet(capacity, pools, "default") == "net-2"
    full.add("net-2")
    with pytest.raises(Unavailable, match="net-1, net-2"):
        await choose_subnet(capacity, pools, "default")
    with pytest.raises(FailedPrecondition, match='"other"'):
        await choose_subnet(capacity, pools, "other")
    # one subnet: nothing to choose, the provider is not asked
    assert await choose_subnet(capacity, {"solo": ["net-1"]}, "solo") == "net-1"
