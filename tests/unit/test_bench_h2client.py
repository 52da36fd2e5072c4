"""benchmarks.h2client, the load generator's gRPC client, against a real gRPC server (grpcio's) over
a real socket: answers, statuses, flow control on messages larger than the windows, a dead server."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import grpc
import pytest
import pytest_asyncio

from benchmarks.h2client import GrpcCallError, H2Connection, grpc_message, request_block

PATH = "/test.Echo/Reverse"


async def _reverse(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    if request == b"refuse":
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the request says refuse")
    return request[::-1]


@pytest_asyncio.fixture
async def server() -> AsyncIterator[int]:
    srv = grpc.aio.server(
        options=[("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
    )
    handler = grpc.method_handlers_generic_handler(
        "test.Echo", {"Reverse": grpc.unary_unary_rpc_method_handler(_reverse)}
    )
    srv.add_generic_rpc_handlers((handler,))
    port = srv.add_insecure_port("127.0.0.1:0")
    await srv.start()
    try:
        yield port
    finally:
        await srv.stop(None)


async def _connect(port: int) -> H2Connection:
    loop = asyncio.get_running_loop()
    block = request_block(f"127.0.0.1:{port}", PATH)
    _, conn = await loop.create_connection(lambda: H2Connection(loop, block), "127.0.0.1", port)
    return conn


@pytest_asyncio.fixture
async def conn(server: int) -> AsyncIterator[H2Connection]:
    """A connection to the echo server, closed after the test."""
    c = await _connect(server)
    try:
        yield c
    finally:
        c.close()


@pytest.mark.asyncio
async def test_calls_on_one_connection_get_their_answers(conn: H2Connection) -> None:
    for i in range(5):
        msg = b"request %d " % i * 100
        assert await conn.call(grpc_message(msg), 30) == msg[::-1]
    assert conn.open


@pytest.mark.asyncio
async def test_a_message_larger_than_the_windows_waits_for_them(conn: H2Connection) -> None:
    big = bytes(range(256)) * (48 << 10)  # 12 MiB: past the server's initial windows (a few MiB)
    assert await conn.call(grpc_message(big), 60) == big[::-1]
    assert conn.window_waits > 0  # it did wait
    assert await conn.call(grpc_message(b"after"), 30) == b"retfa"  # the connection goes on


@pytest.mark.asyncio
async def test_a_status_other_than_ok_fails_the_call_with_its_code_and_message(conn: H2Connection) -> None:
    with pytest.raises(GrpcCallError, match="grpc-status 3: the request says refuse"):
        await conn.call(grpc_message(b"refuse"), 30)
    assert await conn.call(grpc_message(b"ok"), 30) == b"ko"


@pytest.mark.asyncio
async def test_a_server_that_goes_away_fails_the_call_in_flight() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    loop = asyncio.get_running_loop()

    async def accept_and_close() -> None:
        peer, _ = await loop.sock_accept(listener)
        await loop.sock_recv(peer, 65536)  # the preface and the call's first bytes
        peer.close()

    listener.setblocking(False)
    closer = asyncio.create_task(accept_and_close())
    conn = await _connect(port)
    try:
        with pytest.raises(GrpcCallError, match="the connection closed"):
            await conn.call(grpc_message(b"x" * 1000), 30)
        assert not conn.open
    finally:
        conn.close()
        await closer
        listener.close()
