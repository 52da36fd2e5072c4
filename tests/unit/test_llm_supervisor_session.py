"""The LLM supervisor's client for its server keeps no connection open between polls: a real aiohttp
server on loopback counts the connections its requests arrive on and whether any is left open."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from trtforge_runtime.llm.supervisor import server_session


@pytest.mark.asyncio
async def test_every_request_comes_on_its_own_connection_and_none_stays_open() -> None:
    peers: list[object] = []

    async def health(request: web.Request) -> web.Response:
        peers.append(request.transport.get_extra_info("peername") if request.transport else None)
        return web.json_response({"status": "ok"})

    app = web.Application()
    app.router.add_get("/health", health)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        async with server_session() as session:
            for _ in range(3):
                async with session.get(server.make_url("/health")) as r:
                    assert r.status == 200
            for _ in range(100):  # the server notices each close within a few loop turns
                if not server.handler.connections:
                    break
                await asyncio.sleep(0.01)
            assert server.handler.connections == []  # no idle kept-alive connection for it to watch
        assert len(set(peers)) == 3  # three requests, three connections
    finally:
        await server.close()
