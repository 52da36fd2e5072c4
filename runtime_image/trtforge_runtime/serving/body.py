"""Request bodies within limits: size, content coding, arrival time and the memory all bodies share.

The HTTP server hands bodies over undecoded (``auto_decompress=False``): a gzip or deflate body is
read as sent, counted against ``--max-request-bytes`` as it arrives, and inflated in counted steps
in a worker thread, never past the same limit (``inflate``). Every refusal is a
:class:`RequestError` that names the limit (docs/design.md, "Runtime request limits").
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable
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


class Source(Protocol):
    """What a body is read from (aiohttp's request.content)."""

    async def readany(self) -> bytes: ...


async def read_body(
    source: Source, length: int | None, limit: int, arrived: Callable[[int], Awaitable[None]] | None = None
) -> bytes | bytearray:
    """The whole body, as sent: `length` bytes when the request gave a Content-Length, else up to
    `limit` (chunked). 413 as soon as a chunked body passes `limit`; 400 if the body ends early.
    `arrived` is told the size of each piece as it is kept, before the next is read: the
    body-memory budget counts bytes as they arrive, not the length a client claims.

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
        if arrived is not None:
            await arrived(len(chunk))
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
    """Bytes of request bodies held at once, over all requests, counted as they arrive (HTTP) or once
    a whole message has (gRPC, which grpc.aio reads before the call starts), never on a length a
    client only claims: a slow or stuck sender holds only what it has sent.

    A request reading its body whose next bytes do not fit waits for them, first come first served,
    leaving them in its socket (TCP back-pressure). Should every request that holds bytes be waiting
    (each needing what the others hold), the last to wait is refused (:class:`BodyMemoryFull`) and
    gives its bytes back, so the rest go on."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.used = 0
        self._waiters: list[tuple[Reader, int, asyncio.Future[None]]] = []
        self._holding: set[Reader] = set()  # readers holding bytes

    def hold(self, n: int) -> int:
        """Reserve `n` bytes that are already here, without waiting; BodyMemoryFull when they do not
        fit."""
        if self._waiters or self.used + n > self.total:
            raise BodyMemoryFull(self.total)
        self.used += n
        return n

    def reader(self) -> Reader:
        return Reader(self)

    def release(self, n: int) -> None:
        self.used -= n
        while self._waiters and self.used + self._waiters[0][1] <= self.total:
            r, m, fut = self._waiters.pop(0)
            self.used += m
            r.held += m
            self._holding.add(r)
            fut.set_result(None)

    def _stuck(self) -> None:
        """Every reader holding bytes waits: refuse the last of them to wait."""
        waiting = {w[0] for w in self._waiters}
        if self._holding and self._holding <= waiting:
            for i in range(len(self._waiters) - 1, -1, -1):
                r, _, fut = self._waiters[i]
                if r in self._holding:
                    del self._waiters[i]
                    fut.set_exception(BodyMemoryFull(self.total))
                    return

    @property
    def waiting(self) -> int:
        return len(self._waiters)


class Reader:
    """One request's bytes in a :class:`MemoryBudget` as its body arrives (:meth:`take`); give them
    all back with :meth:`close`."""

    def __init__(self, budget: MemoryBudget) -> None:
        self.budget = budget
        self.held = 0

    async def take(self, n: int) -> None:
        b = self.budget
        if not b._waiters and b.used + n <= b.total:
            b.used += n
            self.held += n
            if self.held:
                b._holding.add(self)
            return
        if n > b.total:
            raise BodyMemoryFull(b.total)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (self, n, fut)
        b._waiters.append(entry)
        b._stuck()
        try:
            await fut
        except BaseException:
            if entry in b._waiters:
                b._waiters.remove(entry)
            raise

    def keep(self) -> int:
        """The body has arrived: the bytes it holds, handed to the caller to release."""
        self.budget._holding.discard(self)
        held, self.held = self.held, 0
        return held

    def close(self) -> None:
        b = self.budget
        b._holding.discard(self)
        for i in range(len(b._waiters) - 1, -1, -1):
            if b._waiters[i][0] is self:
                del b._waiters[i]
        held, self.held = self.held, 0
        if held:
            b.release(held)
        else:
            b._stuck()


# The body deadline: a body of `claimed` bytes may take BODY_GRACE_S plus its size at BODY_MIN_RATE,
# and never more than --body-timeout; a body of unknown size (chunked) gets --body-timeout.
BODY_GRACE_S = 5.0
BODY_MIN_RATE = 1 << 20  # bytes per second


def body_deadline(claimed: int | None, body_timeout_s: float) -> float:
    """Seconds a body of `claimed` bytes (None: chunked) may take to arrive (pure)."""
    if claimed is None:
        return body_timeout_s
    return min(body_timeout_s, BODY_GRACE_S + claimed / BODY_MIN_RATE)
