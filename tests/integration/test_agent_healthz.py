"""The agent's /healthz endpoint on a real socket: 503 with the reason until registered and streaming."""

from __future__ import annotations

import asyncio

from nstance.agent.healthz import listen_address, serve_healthz
from nstance.agent.state import AgentState


async def test_healthz_answers_from_state() -> None:
    assert listen_address(":8080") == ("0.0.0.0", 8080)
    assert listen_address("[::1]:9") == ("::1", 9)
    assert listen_address("127.0.0.1:0") == ("127.0.0.1", 0)
    state = AgentState()
    state.problem = "registration UNAVAILABLE: down"
    server = await serve_healthz("127.0.0.1:0", state)
    port = server.sock.getsockname()[1]

    async def get(path: str, method: str = "GET") -> tuple[str, str]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(f"{method} {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        data = await reader.read()
        writer.close()
        head, _, body = data.decode().partition("\r\n\r\n")
        assert "Content-Type: text/plain; charset=utf-8" in head.splitlines()
        return head.splitlines()[0], body

    try:
        status, body = await get("/healthz")
        assert status == "HTTP/1.1 503 Service Unavailable"
        assert body == "not registered: registration UNAVAILABLE: down"
        state.registered = True
        status, body = await get("/healthz")
        assert status.endswith("503 Service Unavailable")
        assert body.startswith("health stream down")
        state.health_stream_up = True
        # upstream's own cases (internal/agent/health/server_test.go)
        assert await get("/healthz") == ("HTTP/1.1 200 OK", "ok")
        assert await get("/healthz", "HEAD") == ("HTTP/1.1 200 OK", "")
        assert (await get("/healthz", "POST"))[0] == "HTTP/1.1 405 Method Not Allowed"
        for other in ("/healthz/", "/", "/metrics", "/debug/healthcheck-test", "/other"):
            assert (await get(other))[0] == "HTTP/1.1 404 Not Found"
    finally:
        await server.close()
