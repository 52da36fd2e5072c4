"""Request bodies within limits: size, content coding, arrival time and the memory all bodies share.

The HTTP server hands bodies over undecoded (``auto_decompress=False``): a gzip or deflate body is
read as sent, counted against ``--max-request-bytes`` as it arrives, and decompressed once, in a
worker thread, never past the same limit. Every refusal is a :class:`RequestError` that names the
limit (docs/design.md, "Runtime request limits").
"""

from __future__ import annotations

import asyncio
import collections
import enum
import zlib
from typing import Protocol

from trtforge_runtime.errors import RequestError


class Coding(enum.Enum):
    IDENTITY = "identity"
    GZIP = "gzip"
    DEFLATE = "deflate"


def content_coding(header: str | None) -> Coding:
    """The body's Content-Encoding; 415 for anything but one of gzip, deflate, identity."""
    value = (header or "").strip().lower()
    if value in ("", "identity"):
        return Coding.IDENTITY
    if value in ("gzip", "x-gzip"):
        return Coding.GZIP
    if value == "deflate":
        return Coding.DEFLATE
    raise RequestError(
        415, f"Content-Encoding {header!r} is not supported; send one of gzip, deflate, identity"
    )


def _is_zlib_stream(data: bytes | bytearray) -> bool:
    # RFC 1950 header: compression method 8, and the first two bytes are a multiple of 31.
    return len(data) >= 2 and data[0] & 0x0F == 8 and ((data[0] << 8) | data[1]) % 31 == 0


def decompress(data: bytes | bytearray, coding: Coding, limit: int) -> bytes | bytearray:
    """`data` decoded from `coding`, never more than `limit` bytes (413 past it, 400 if corrupt).

    HTTP's ``deflate`` is a zlib stream, but some clients send raw deflate: both are accepted.
    """
    if coding is Coding.IDENTITY:
        return data
    if coding is Coding.GZIP:
        wbits = 16 + zlib.MAX_WBITS
    else:
        wbits = zlib.MAX_WBITS if _is_zlib_stream(data) else -zlib.MAX_WBITS
    d = zlib.decompressobj(wbits)
    try:
        out = d.decompress(data, limit + 1)
    except zlib.error as e:
        raise RequestError(400, f"request body is not valid {coding.value}: {e}") from e
    if len(out) > limit or d.unconsumed_tail:
        raise RequestError(
            413, f"request body decompressed from {coding.value} exceeds the limit of {limit} bytes"
        )
    if not d.eof:
        raise RequestError(400, f"request body is not valid {coding.value}: the stream is truncated")
    if d.unused_data:
        raise RequestError(
            400, f"request body has {len(d.unused_data)} bytes after the end of its {coding.value} stream"
        )
    return out


class Source(Protocol):
    """What a body is read from (aiohttp's request.content)."""

    async def readany(self) -> bytes: ...


async def read_body(source: Source, length: int | None, limit: int) -> bytes | bytearray:
    """The whole body, as sent: `length` bytes when the request gave a Content-Length, else up to
    `limit` (chunked). 413 as soon as a chunked body passes `limit`; 400 if the body ends early.

    A body that arrives in one piece is returned as it is; one in several pieces is joined once."""
    if length is not None and length > limit:
        raise RequestError(413, f"request body of {length} bytes exceeds the limit of {limit} bytes")
    want = limit if length is None else length
    chunks: list[bytes] = []
    got = 0
    while length is None or got < length:
        chunk = await source.readany()
        if not chunk:
            if length is not None:
                raise RequestError(400, f"request body ended after {got} of its {length} bytes")
            break
        got += len(chunk)
        if got > want:
            if length is None:
                raise RequestError(413, f"request body exceeds the limit of {limit} bytes")
            chunk = chunk[: len(chunk) - (got - want)]
            got = want
        chunks.append(chunk)
    if len(chunks) == 1:
        return chunks[0]
    return b"".join(chunks)


class BodyMemoryFull(RequestError):
    """Other requests hold the whole body-memory budget (503 with Retry-After; RESOURCE_EXHAUSTED
    over gRPC)."""

    busy = True

    def __init__(self, total: int) -> None:
        super().__init__(
            503,
            f"other requests hold all {total} bytes of request-body memory (--max-body-memory); retry later",
            {"Retry-After": "1"},
        )


class MemoryBudget:
    """Bytes of request bodies held at once, over all requests: each request reserves its share before
    reading, and waits (first come, first served) while others hold the rest. Reading nothing while it
    waits, a request leaves its bytes in the client's socket (TCP back-pressure)."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.used = 0
        self._waiters: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()

    def try_acquire(self, n: int) -> int | None:
        """Reserve `n` bytes (at most the total) if that needs no waiting; None otherwise."""
        n = min(n, self.total)
        if not self._waiters and self.used + n <= self.total:
            self.used += n
            return n
        return None

    def hold(self, n: int) -> int:
        """Reserve `n` bytes that are already here (at most the total) without waiting;
        BodyMemoryFull when others hold the budget."""
        got = self.try_acquire(n)
        if got is None:
            raise BodyMemoryFull(self.total)
        return got

    async def acquire(self, n: int) -> int:
        """Reserve `n` bytes (at most the total); the amount reserved, for :meth:`release`."""
        got = self.try_acquire(n)
        if got is not None:
            return got
        n = min(n, self.total)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (n, fut)
        self._waiters.append(entry)
        try:
            await fut
        except BaseException:
            if fut.done() and not fut.cancelled():
                self.release(n)  # granted just as we gave up
            elif entry in self._waiters:
                self._waiters.remove(entry)
            raise
        return n

    def release(self, n: int) -> None:
        self.used -= n
        while self._waiters and self.used + self._waiters[0][0] <= self.total:
            m, fut = self._waiters.popleft()
            if fut.done():  # cancelled: its task removes nothing more
                continue
            self.used += m
            fut.set_result(None)

    @property
    def waiting(self) -> int:
        return len(self._waiters)
