"""The idle guard of counted connections (trtforge_runtime.protocol.connections), on real sockets.

The HTTP server behind it here never closes anything, so whatever closes a connection is the guard:
a silent or half-sent request head is closed after the timeout; a complete head is not, until its
answer has been written and no next head followed.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from trtforge_runtime.protocol.connections import ConnectionLimiter
from trtforge_runtime.serving.metrics import Metrics

pytestmark = pytest.mark.asyncio

TIMEOUT = 0.3


class _Server(asyncio.Protocol):
    """Answers a complete request head after `delay`, keeps every connection open."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.buf = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if b"\r\n\r\n" in self.buf:
            self.buf = b""
            asyncio.get_running_loop().call_later(self.delay, self._answer)

    def _answer(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")


@pytest_asyncio.fixture
async def server() -> AsyncIterator[tuple[int, ConnectionLimiter]]:
    loop = asyncio.get_running_loop()
    limiter = ConnectionLimiter(
        lambda: _Server(delay=2 * TIMEOUT), 100, lambda _p: None, Metrics, idle_timeout_s=TIMEOUT
    )
    srv = await loop.create_server(limiter, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    try:
        yield port, limiter
    finally:
        srv.close()
        await srv.wait_closed()


async def _closed(reader: asyncio.StreamReader) -> bool:
    """Whether the server closes the connection (EOF) before 10 timeouts pass."""
    try:
        rest = await asyncio.wait_for(reader.read(), timeout=10 * TIMEOUT)
    except TimeoutError:
        return False
    return reader.at_eof() and rest in (b"", b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")


async def test_silent_and_half_sent_heads_are_closed(server: tuple[int, ConnectionLimiter]) -> None:
    port, limiter = server
    silent = await asyncio.open_connection("127.0.0.1", port)
    partial = await asyncio.open_connection("127.0.0.1", port)
    partial[1].write(b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nContent-Le")
    await partial[1].drain()
    assert await _closed(silent[0]) and await _closed(partial[0])
    assert limiter.idle_closed == 2 and limiter.open == 0


async def test_a_request_in_flight_is_not_closed_and_the_next_head_is_due_after_its_answer(
    server: tuple[int, ConnectionLimiter],
) -> None:
    """The answer comes 2 timeouts after the head: the guard waits for it, then closes the idle
    connection one timeout after the answer."""
    port, limiter = server
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
    await writer.drain()
    answer = await asyncio.wait_for(reader.readexactly(40), timeout=10 * TIMEOUT)
    assert answer.endswith(b"ok") and limiter.idle_closed == 0
    assert await _closed(reader)
    assert limiter.idle_closed == 1
    writer.close()


async def test_a_head_whose_end_spans_reads_counts_as_complete(server: tuple[int, ConnectionLimiter]) -> None:
    """The blank line that ends the head arrives a byte at a time: the guard still sees the head
    complete, waits for the answer, and only then closes the idle connection."""
    port, limiter = server
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    for piece in (b"GET /x HTTP/1.1\r\nHost: x\r", b"\n", b"\r", b"\n"):
        writer.write(piece)
        await writer.drain()
        await asyncio.sleep(TIMEOUT / 10)
    answer = await asyncio.wait_for(reader.readexactly(40), timeout=10 * TIMEOUT)
    assert answer.endswith(b"ok") and limiter.idle_closed == 0
    assert await _closed(reader)
    writer.close()
