"""A gzip or deflate request body inflated in steps, each counted against the body budget.

:class:`Inflater` makes at most ``INFLATE_STEP`` bytes per :meth:`~Inflater.step` and stops with 413
as soon as the body passes its limit; :func:`inflate` runs the steps in a worker thread (zlib lets go
of the GIL while it inflates) and has each step's bytes counted (``take``) before it keeps them, so a
bomb holds at most the limit, counted in the budget all bodies share, never a claimed or unbounded
size. A gzip body whose trailer gives a size past the limit is refused before any step (a valid
stream's trailer is its size modulo 2**32), and one that inflates past its trailer's size stops there
(400): an honest bomb costs nothing, a lying one no more than the limit. docs/design.md §"Runtime
request limits". The steps run in :func:`inflate_pool`, whose threads run at a lower priority than
the event loop's, so a body that inflates to the limit takes the CPU the loop leaves: probes and
other calls go first.
"""

from __future__ import annotations

import asyncio
import os
import threading
import zlib
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor, ThreadPoolExecutor

from trtforge_runtime.errors import RequestError
from trtforge_runtime.serving.body import Coding, _is_zlib_stream

INFLATE_STEP = 1 << 20  # bytes made by one step
INFLATE_NICENESS = 10  # added to the inflating threads' nice value: the loop outweighs them about 9:1
GZIP_MIN_SIZE = 18  # a 10-byte header and an 8-byte trailer (CRC-32, then the size modulo 2**32)


def gzip_trailer_size(data: bytes | bytearray) -> int | None:
    """The decompressed size that a gzip body's trailer gives (its last 4 bytes, little-endian), or
    None for a body too short to have one (pure). Only a claim: the stream is checked as it inflates."""
    if len(data) < GZIP_MIN_SIZE:
        return None
    return int.from_bytes(data[-4:], "little")


def _lower_priority() -> None:
    """Run the calling thread at INFLATE_NICENESS above the process's nice value (Linux: per thread)."""
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + INFLATE_NICENESS)
    except OSError:  # lowering one's own priority is always allowed; where it is not, run as is
        pass


def inflate_pool(threads: int = 2) -> ThreadPoolExecutor:
    """The threads that inflate bodies, at a lower priority than the event loop's."""
    return ThreadPoolExecutor(threads, thread_name_prefix="inflate", initializer=_lower_priority)


class Inflater:
    """`data` decoded from `coding` step by step, never past `limit` bytes in all."""

    def __init__(self, data: bytes | bytearray, coding: Coding, limit: int, step: int = INFLATE_STEP) -> None:
        if coding is Coding.GZIP:
            wbits = 16 + zlib.MAX_WBITS
        else:  # HTTP's deflate is a zlib stream, but some clients send raw deflate: both are accepted
            wbits = zlib.MAX_WBITS if _is_zlib_stream(data) else -zlib.MAX_WBITS
        self._z = zlib.decompressobj(wbits)
        self._pending: bytes | bytearray = data
        self.coding, self.limit, self.size = coding, limit, step
        self.total = 0
        self.done = False
        # Bytes this stream may make: the limit, or less where a gzip trailer gives less. A trailer is
        # the size modulo 2**32, so with a limit under 4 GiB a valid stream never makes more than it.
        self.cap = limit
        claimed = gzip_trailer_size(data) if coding is Coding.GZIP and limit < 1 << 32 else None
        if claimed is not None and claimed > limit:
            raise RequestError(
                413,
                f"request body decompressed from gzip exceeds the limit of {limit} bytes: its gzip trailer"
                f" (the last 4 bytes) gives {claimed} bytes; a body cut short ends in other bytes: send the"
                " whole stream",
            )
        if claimed is not None:
            self.cap = claimed

    def step(self) -> bytes:
        """The next at most `size` bytes; b"" once the stream has ended. 413 past the limit, 400 for a
        corrupt or truncated stream or bytes after its end."""
        if self.done:
            return b""
        name = self.coding.value
        try:
            out = self._z.decompress(self._pending, min(self.size, self.cap - self.total + 1))
        except zlib.error as e:
            raise RequestError(400, f"request body is not valid {name}: {e}") from e
        self._pending = self._z.unconsumed_tail
        self.total += len(out)
        if self.total > self.limit:
            raise RequestError(
                413, f"request body decompressed from {name} exceeds the limit of {self.limit} bytes"
            )
        if self.total > self.cap:
            raise RequestError(
                400,
                f"request body is not valid {name}: it inflates past the {self.cap} bytes its trailer gives",
            )
        if self._z.eof:
            self.done = True
            extra = len(self._z.unused_data)
            if extra:
                raise RequestError(400, f"request body has {extra} bytes after the end of its {name} stream")
        elif not out:  # zlib stops short of max_length only when its input runs out
            raise RequestError(400, f"request body is not valid {name}: the stream is truncated")
        return out


async def inflate(
    data: bytes | bytearray,
    coding: Coding,
    limit: int,
    take: Callable[[int], Awaitable[None]],
    pool: Executor | None = None,
) -> bytearray:
    """The whole body inflated, each step run in `pool` (the loop's default: None) and its bytes
    counted with `take` before they are kept."""
    loop = asyncio.get_running_loop()
    inflater = Inflater(data, coding, limit)
    out = bytearray()
    while not inflater.done:
        piece = await loop.run_in_executor(pool, inflater.step)
        await take(len(piece))
        out += piece
    return out
