"""How counted connections hand their reads to an InPlaceBody protocol (trtforge_runtime.connections),
on real sockets.

The protocol behind the limiter here frames requests as ``<length>\\r\\n\\r\\n<body>`` and answers each
with its body's sha256. It counts the bytes that reached it in place and those it took from the
shared read buffer, and keeps nothing of that buffer past the call. The real fast path over the
same mechanism is tested in tests/integration/test_serve_fastpath.py.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from trtforge_runtime.connections import IN_PLACE_MIN, ConnectionLimiter
from trtforge_runtime.metrics import Metrics

pytestmark = pytest.mark.asyncio


class _Bodies(asyncio.Protocol):
    """Reads framed bodies (an InPlaceBody), answers each with its sha256."""

    def __init__(self) -> None:
        self.buf = b""
        self.body: bytearray | None = None
        self.got = 0
        self.in_place = 0
        self.from_scratch = 0
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def body_view(self) -> memoryview | None:
        if self.body is None or self.buf:
            return None
        return memoryview(self.body)[self.got :]

    def body_received(self, nbytes: int) -> None:
        self.in_place += nbytes
        self.got += nbytes
        self._maybe_done()

    def chunk_received(self, raw: bytearray, size: int) -> None:
        self.from_scratch += size
        self.data_received(bytes(raw[:size]))  # copied: `raw` is the shared buffer

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            if self.body is not None:
                n = min(len(self.buf), len(self.body) - self.got)
                self.body[self.got : self.got + n] = self.buf[:n]
                self.got, self.buf = self.got + n, self.buf[n:]
                if not self._maybe_done():
                    return
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            self.body, self.got = bytearray(int(self.buf[:end])), 0
            self.buf = self.buf[end + 4 :]

    def _maybe_done(self) -> bool:
        assert self.body is not None and self.transport is not None
        if self.got < len(self.body):
            return False
        self.transport.write(hashlib.sha256(self.body).hexdigest().encode() + b"\n")
        self.body = None
        return True


@pytest_asyncio.fixture
async def served() -> AsyncIterator[tuple[int, list[_Bodies], ConnectionLimiter]]:
    made: list[_Bodies] = []

    def make() -> _Bodies:
        made.append(_Bodies())
        return made[-1]

    limiter = ConnectionLimiter(make, 10, lambda _p: None, Metrics, idle_timeout_s=5.0)
    srv = await asyncio.get_running_loop().create_server(limiter, "127.0.0.1", 0)
    try:
        yield srv.sockets[0].getsockname()[1], made, limiter
    finally:
        srv.close()
        await srv.wait_closed()


def framed(body: bytes) -> bytes:
    return str(len(body)).encode() + b"\r\n\r\n" + body


async def test_large_bodies_land_in_place_and_every_byte_arrives_once(
    served: tuple[int, list[_Bodies], ConnectionLimiter],
) -> None:
    port, made, limiter = served
    sizes = (600_000, 3 * IN_PLACE_MIN, 100, 1)
    bodies = [bytes(range(256)) * (n // 256) + b"x" * (n % 256) for n in sizes]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"".join(framed(b) for b in bodies))  # pipelined: heads and bodies in one stream
    await writer.drain()
    for b in bodies:
        assert await reader.readline() == hashlib.sha256(b).hexdigest().encode() + b"\n"
    big = bodies[0]
    wire = framed(big)
    for i in range(0, len(wire), 70_001):  # odd pieces, each its own write
        writer.write(wire[i : i + 70_001])
        await writer.drain()
        await asyncio.sleep(0.005)
    assert await reader.readline() == hashlib.sha256(big).hexdigest().encode() + b"\n"
    writer.close()
    await writer.wait_closed()
    (proto,) = made
    assert proto.in_place + proto.from_scratch == sum(len(framed(b)) for b in bodies) + len(wire)
    assert proto.in_place >= len(big)  # most of the two large bodies came in place
    assert proto.from_scratch > 0  # heads and small bodies came through the shared buffer
    assert len(limiter.scratch) == len(limiter.scratch_bytes) > 0


async def test_only_protocols_that_can_take_their_bytes_in_place_are_read_so() -> None:
    class Plain(asyncio.Protocol):
        pass

    plain = ConnectionLimiter(Plain, 10, lambda _p: None, Metrics)()
    in_place = ConnectionLimiter(_Bodies, 10, lambda _p: None, Metrics)()
    assert not isinstance(plain, asyncio.BufferedProtocol)
    assert isinstance(in_place, asyncio.BufferedProtocol)
