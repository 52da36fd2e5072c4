"""The runtime's front door: bodies inflated in counted steps, each connection's share of the gRPC call
slots, and the connection cap that makes room by closing the longest-waiting head (issue 63)."""

from __future__ import annotations

import asyncio
import gzip
import os
import threading
import zlib

import pytest
from trtforge_runtime.errors import RequestError
from trtforge_runtime.protocol.connections import ConnectionLimiter, head_ends
from trtforge_runtime.protocol.grpc_call_guard import streams_per_connection
from trtforge_runtime.serving.body import Coding
from trtforge_runtime.serving.inflate import INFLATE_NICENESS, Inflater, inflate, inflate_pool
from trtforge_runtime.serving.metrics import Metrics

MiB = 1 << 20


def _bomb(mib: int) -> bytes:
    return gzip.compress(bytes(mib * MiB), compresslevel=9)


def _lying(body: bytes, claimed: int) -> bytes:
    """`body` with a gzip trailer that gives `claimed` bytes."""
    return body[:-4] + claimed.to_bytes(4, "little")


def test_a_bomb_whose_trailer_gives_more_than_the_limit_is_refused_before_any_step() -> None:
    with pytest.raises(
        RequestError, match=r"exceeds the limit of 4194304 bytes: its gzip trailer \(the last 4 bytes\) gives"
    ) as e:
        Inflater(_bomb(16), Coding.GZIP, 4 * MiB, step=MiB)
    assert e.value.status == 413


def test_a_stream_that_inflates_past_its_trailer_stops_there() -> None:
    inflater = Inflater(_lying(_bomb(16), MiB + 7), Coding.GZIP, 4 * MiB, step=MiB)
    with pytest.raises(RequestError, match="inflates past the 1048583 bytes its trailer gives") as e:
        while not inflater.done:
            inflater.step()
    assert e.value.status == 400 and inflater.total == MiB + 8


def test_each_step_makes_at_most_its_size_and_the_limit_stops_it() -> None:
    # The trailer lies (it gives the limit): inflating is what stops the bomb.
    inflater = Inflater(_lying(_bomb(16), 4 * MiB), Coding.GZIP, 4 * MiB, step=MiB)
    made = []
    with pytest.raises(RequestError, match="decompressed from gzip exceeds the limit of 4194304 bytes") as e:
        while not inflater.done:
            made.append(len(inflater.step()))
    assert e.value.status == 413
    assert made and max(made) <= MiB and sum(made) <= 4 * MiB
    assert inflater.total <= 4 * MiB + 1  # never more than one byte past the limit


def test_a_body_within_the_limit_inflates_whole_in_every_coding() -> None:
    data = bytes(range(256)) * 20_000  # 5 MB
    raw = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    for body, coding in (
        (gzip.compress(data), Coding.GZIP),
        (zlib.compress(data), Coding.DEFLATE),
        (raw.compress(data) + raw.flush(), Coding.DEFLATE),
    ):
        inflater = Inflater(body, coding, len(data), step=MiB)
        out = bytearray()
        while not inflater.done:
            out += inflater.step()
        assert out == data


def test_bodies_inflate_in_threads_below_the_loops_priority() -> None:
    def nice() -> int:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    pool = inflate_pool()
    try:
        assert pool.submit(nice).result() == min(19, nice() + INFLATE_NICENESS)
    finally:
        pool.shutdown()


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"\x1f\x8b\x08\x00" + bytes(1000), "is not valid gzip"),
        (gzip.compress(b"x" * 1000, mtime=0)[:-30], "the stream is truncated"),
        # (trailing bytes whose last 4 give more than the limit: 413, by that size)
        (
            _lying(gzip.compress(b"x" * 1000, mtime=0) + b"junk0000", 1000),
            "8 bytes after the end of its gzip",
        ),
    ],
)
def test_corrupt_truncated_and_trailing_bodies_are_400(body: bytes, message: str) -> None:
    inflater = Inflater(body, Coding.GZIP, MiB)
    with pytest.raises(RequestError, match=message) as e:
        while not inflater.done:
            inflater.step()
    assert e.value.status == 400


@pytest.mark.asyncio
async def test_inflate_counts_each_step_before_it_keeps_it() -> None:
    counted: list[int] = []

    async def take(n: int) -> None:
        counted.append(n)

    data = bytes(3 * MiB + 5)
    out = await inflate(gzip.compress(data), Coding.GZIP, 4 * MiB, take)
    assert out == data and sum(counted) == len(data) and max(counted) <= MiB
    counted.clear()
    with pytest.raises(RequestError) as e:
        await inflate(_lying(_bomb(64), 4 * MiB), Coding.GZIP, 4 * MiB, take)
    assert e.value.status == 413 and sum(counted) <= 4 * MiB


@pytest.mark.asyncio
async def test_a_full_budget_stops_inflating_until_it_has_room() -> None:
    """`take` waits (the shared budget is full): no further step runs meanwhile."""
    gate = asyncio.Event()
    counted: list[int] = []

    async def take(n: int) -> None:
        counted.append(n)
        if len(counted) == 2:
            await gate.wait()

    task = asyncio.create_task(inflate(gzip.compress(bytes(8 * MiB)), Coding.GZIP, 16 * MiB, take))
    for _ in range(200):
        await asyncio.sleep(0.01)
        if len(counted) == 2:
            break
    await asyncio.sleep(0.1)
    assert len(counted) == 2 and not task.done()
    gate.set()
    assert len(await task) == 8 * MiB


def test_each_connection_may_hold_a_sixteenth_of_the_call_slots() -> None:
    assert streams_per_connection(1024) == 64
    assert streams_per_connection(100_000) == 100  # RFC 9113's recommended floor caps it
    assert streams_per_connection(8) == 1
    for slots in (16, 200, 1024, 1600):
        assert 16 * streams_per_connection(slots) <= slots


class _Echo(asyncio.Protocol):
    """Stands in for the HTTP server: answers each complete head with a short line."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.t = transport

    def data_received(self, data: bytes) -> None:
        if b"\r\n\r\n" in data:
            self.t.write(b"ok\n")  # type: ignore[attr-defined]


class _Unread(asyncio.Protocol):
    """Stands in for an HTTP server that has not read its connections yet: reading paused."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.pause_reading()  # type: ignore[attr-defined]


@pytest.mark.asyncio
async def test_at_the_cap_a_whole_head_not_yet_read_keeps_its_place() -> None:
    """Connections whose whole heads wait unread in their sockets (accepted in the same batch as a
    newcomer) are not closed for it: the newcomer is turned away instead."""
    limiter = ConnectionLimiter(_Unread, 2, lambda path: None, lambda: Metrics("m"), idle_timeout_s=60.0)
    server = await asyncio.get_running_loop().create_server(limiter, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        early = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2)]
        for _, w in early:
            w.write(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 9\r\n\r\n")
            await w.drain()
        await asyncio.sleep(0.05)
        assert limiter.open == 2 and len(limiter.awaiting) == 2  # unread: still awaiting a head
        fresh = await asyncio.open_connection("127.0.0.1", port)
        fresh[1].write(b"GET /v2/models HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (await asyncio.wait_for(fresh[0].readline(), 10)).startswith(b"HTTP/1.1 503")
        assert limiter.evicted == 0 and limiter.open == 2
        for _, w in (*early, fresh):
            w.close()
    finally:
        server.close()
        await server.wait_closed()


def test_a_head_ends_in_the_peeked_bytes_or_across_the_tail() -> None:
    assert head_ends(b"", b"GET / HTTP/1.1\r\n\r\n") and head_ends(b"\r\n\r", b"\n")
    assert not head_ends(b"", b"POST / HTTP/1.1\r\nX-Slow: s") and not head_ends(b"\r\n", b"x\r\n")


@pytest.mark.asyncio
async def test_at_the_cap_the_longest_waiting_head_makes_room() -> None:
    limiter = ConnectionLimiter(_Echo, 2, lambda path: None, lambda: Metrics("m"), idle_timeout_s=60.0)
    server = await asyncio.get_running_loop().create_server(limiter, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        slow1 = await asyncio.open_connection("127.0.0.1", port)
        slow1[1].write(b"POST / HTTP/1.1\r\nX-Slow: s")
        await asyncio.sleep(0.05)
        slow2 = await asyncio.open_connection("127.0.0.1", port)
        slow2[1].write(b"POST / HTTP/1.1\r\nX-Slow: s")
        await asyncio.sleep(0.05)
        assert limiter.open == 2 and len(limiter.awaiting) == 2
        fresh = await asyncio.open_connection("127.0.0.1", port)
        fresh[1].write(b"GET / HTTP/1.1\r\n\r\n")
        assert await asyncio.wait_for(fresh[0].readline(), 10) == b"ok\n"  # counted, not refused
        assert await asyncio.wait_for(slow1[0].read(), 10) == b""  # the longest waiting: closed
        assert limiter.evicted == 1 and limiter.open == 2
        slow2[1].write(b"\r\n\r\n")  # the other one is still served
        assert await asyncio.wait_for(slow2[0].readline(), 10) == b"ok\n"
        for _, w in (slow2, fresh):
            w.close()
    finally:
        server.close()
        await server.wait_closed()
