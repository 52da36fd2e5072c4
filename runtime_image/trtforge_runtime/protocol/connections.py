"""A cap on open HTTP connections that keeps the health probes answering.

:class:`ConnectionLimiter` is the listening socket's protocol factory. Up to ``limit`` connections go
to the HTTP server. Past it, a new connection gets one short answer from aiohttp's low-level server
and is closed: a health probe (``GET /v2/health/live`` or ``/ready``) its real answer, so the kubelet
does not restart a pod that is only busy, and anything else a 503 naming the limit. Those answers are
themselves bounded: at most ``limit`` of them at once (more are closed at once), each connection
closed after ``answer_timeout_s``, its request line and header lines at most 4 KiB each.

Counted connections also get an idle guard of our own (``idle_timeout_s``): a connection that has no
complete request head (``\r\n\r\n``) within that time of opening, or of its last answer, is closed.
aiohttp's keep-alive timer is meant to do this, but whether it runs before the first request differs
between aiohttp releases (3.14.3 leaves a silent connection open for ever; 3.14.5 closes it), and a
pod's safety must not depend on which one the image resolved.

At the cap, a new connection first closes the counted connection that has waited longest for a
complete request head (a slowloris, or a keep-alive connection idle longest), if any, and takes its
place: connections that never finish a head cannot keep new clients out until their idle guard
fires (docs/design.md §"Runtime request limits"). One whose whole head already waits unread in its
socket (accepted in the same batch as the newcomer) is passed over: a peek tells.
"""

from __future__ import annotations

import asyncio
import itertools
import socket
from collections.abc import Callable, Iterable
from typing import Any, cast

from aiohttp import web

from trtforge_runtime.serving.metrics import Metrics

HealthAnswer = Callable[[str], tuple[int, dict[str, object]] | None]

_MAX_LINE = 4096


def overflow_answer(
    method: str, path: str, health: HealthAnswer, limit: int
) -> tuple[int, dict[str, object]]:
    """What a connection past the cap is told, from its request's method and path (pure)."""
    if method == "GET":
        answer = health(path)
        if answer is not None:
            return answer
    return 503, {"error": f"the server has {limit} open connections, its limit; retry later"}


def _stream(transport: asyncio.BaseTransport) -> asyncio.Transport:
    """A TCP connection's transport as a stream transport. uvloop's (``--event-loop uvloop``) has the
    same methods without subclassing asyncio.Transport, so this is a cast, not an isinstance check."""
    return cast(asyncio.Transport, transport)


class _Overflow(asyncio.Protocol):
    """A connection past the cap: aiohttp's low-level server (``inner``) answers its request and
    closes it (:meth:`ConnectionLimiter.answer_overflow`); a timer closes it after the answer timeout
    whatever it has sent."""

    def __init__(self, inner: asyncio.Protocol, limiter: ConnectionLimiter) -> None:
        self._inner = inner
        self._limiter = limiter
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._limiter.answering += 1
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self._limiter.answer_timeout_s, _stream(transport).close)
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._limiter.answering -= 1
        self._inner.connection_lost(exc)


class _Abort(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.abort()  # type: ignore[attr-defined]


_HEAD_END = b"\r\n\r\n"
# At the cap, the longest-waiting of the first EVICT_CANDIDATES connections awaiting a head whose
# socket holds no complete head unread is closed for a newcomer; what a peek reads of each.
EVICT_CANDIDATES = 8
_PEEK_BYTES = 16384


def head_ends(tail: bytes, data: bytes) -> bool:
    """Whether `data`, after the `tail` already seen (its last bytes), completes a request head."""
    return _HEAD_END in tail + data[:3] or data.find(_HEAD_END) >= 0


class _Counted(asyncio.Protocol):
    """The HTTP server's protocol, counted from its creation to its connection's end, with the idle
    guard: while no request head is complete, a timer runs; it closes the connection when it fires."""

    __slots__ = (
        "_awaiting",
        "_counted",
        "_deadline",
        "_guard",
        "_inner",
        "_limiter",
        "_tail",
        "_timer",
        "_transport",
    )

    def __init__(self, inner: asyncio.Protocol, limiter: ConnectionLimiter) -> None:
        self._inner = inner
        self._limiter = limiter
        self._transport: asyncio.Transport | None = None
        self._guard = limiter.idle_timeout_s is not None
        self._timer: asyncio.TimerHandle | None = None
        self._deadline = 0.0  # the loop time by which a head is due (while awaiting one)
        self._tail = b""  # the last bytes seen while awaiting a head (an end may span two reads)
        self._awaiting = True
        self._counted = True  # in limiter.open (until its connection ends, or it is evicted)
        limiter.open += 1

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = self._transport = _stream(transport)
        if self._guard:
            self._arm()
            self._limiter.awaiting[self] = None
            transport = _AnswerWatch(transport, self._answered)
        self._inner.connection_made(transport)

    def _arm(self) -> None:
        """A head is due within the timeout from now. The one timer is moved lazily: when it fires
        early (the deadline moved on meanwhile) it waits again, so a request costs no timer calls."""
        timeout = self._limiter.idle_timeout_s
        assert timeout is not None
        loop = asyncio.get_running_loop()
        self._deadline = loop.time() + timeout
        if self._timer is None:
            self._timer = loop.call_at(self._deadline, self._idle)

    def _idle(self) -> None:
        self._timer = None
        t = self._transport
        if t is None or t.is_closing():
            return
        if not self._awaiting or t.get_write_buffer_size() > 0:  # a request or an answer in flight
            self._arm()
            return
        loop = asyncio.get_running_loop()
        if loop.time() < self._deadline:
            self._timer = loop.call_at(self._deadline, self._idle)
            return
        self._limiter.idle_closed += 1
        t.close()

    def _answered(self) -> None:
        """The server wrote (part of) an answer: the next request head is due within the timeout."""
        if not self._awaiting:
            self._awaiting, self._tail = True, b""
            self._arm()
            self._limiter.awaiting[self] = None

    def data_received(self, data: bytes) -> None:
        self._scan(data, len(data))
        self._inner.data_received(data)

    def _scan(self, data: bytes | bytearray, size: int) -> None:
        """The idle guard's look at a read (the first `size` bytes of `data`) for a head's end."""
        if self._awaiting and self._guard:
            # No copy of the read: only its first and last bytes meet the previous read's.
            if data.find(_HEAD_END, 0, size) >= 0 or _HEAD_END in self._tail + data[: min(3, size)]:
                self._awaiting, self._tail = False, b""
                self._limiter.awaiting.pop(self, None)
            else:
                self._tail = bytes((self._tail + data[max(0, size - 3) : size])[-3:])

    def head_pending(self) -> bool:
        """Whether a complete head already waits unread in this connection's socket (a peek: a
        connection accepted in the same batch as a newcomer has not been read yet)."""
        ts = self._transport.get_extra_info("socket") if self._transport is not None else None
        if ts is None:
            return False
        try:
            with socket.fromfd(ts.fileno(), ts.family, ts.type) as dup:
                data = dup.recv(_PEEK_BYTES, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except OSError:  # nothing to read (EAGAIN), or gone
            return False
        return head_ends(self._tail, data)

    def evict(self) -> None:
        """Close this connection to make room for a new one: it stops counting at once."""
        self._limiter.awaiting.pop(self, None)
        if self._counted:
            self._counted = False
            self._limiter.open -= 1
            self._limiter.evicted += 1
        if self._transport is not None:
            self._transport.close()

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._transport = None
        self._limiter.awaiting.pop(self, None)
        if self._counted:
            self._counted = False
            self._limiter.open -= 1
        self._inner.connection_lost(exc)


class _AnswerWatch(asyncio.Transport):
    """The transport the HTTP server writes to: every call goes to the real one; a write also tells
    the idle guard that an answer is on its way."""

    def __init__(self, inner: asyncio.Transport, on_write: Callable[[], None]) -> None:
        super().__init__(inner.get_extra_info("extra") or {})
        self._t = inner
        self._on_write = on_write

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self._t.write(data)
        self._on_write()

    def writelines(self, list_of_data: Iterable[bytes | bytearray | memoryview]) -> None:
        self._t.writelines(list_of_data)
        self._on_write()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._t, name)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._t.get_extra_info(name, default)

    def is_closing(self) -> bool:
        return self._t.is_closing()

    def close(self) -> None:
        self._t.close()

    def abort(self) -> None:
        self._t.abort()

    def can_write_eof(self) -> bool:
        return self._t.can_write_eof()

    def write_eof(self) -> None:
        self._t.write_eof()

    def get_write_buffer_size(self) -> int:
        return self._t.get_write_buffer_size()

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._t.get_write_buffer_limits()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._t.set_write_buffer_limits(high, low)

    def is_reading(self) -> bool:
        return self._t.is_reading()

    def pause_reading(self) -> None:
        self._t.pause_reading()

    def resume_reading(self) -> None:
        self._t.resume_reading()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._t.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._t.get_protocol()


class ConnectionLimiter:
    """Protocol factory for the listening socket (see the module docstring).

    Connections are counted from the moment their protocol is made, so connections accepted in one
    batch cannot overshoot the cap.
    """

    def __init__(
        self,
        server: Callable[[], asyncio.Protocol],
        limit: int,
        health: HealthAnswer,
        metrics: Callable[[], Metrics],
        answer_timeout_s: float = 2.0,
        idle_timeout_s: float | None = None,
    ) -> None:
        self._server = server
        self.open = 0
        self.limit = limit
        self.health = health
        self._metrics = metrics
        self.answer_timeout_s = answer_timeout_s
        self.answering = 0
        self.idle_timeout_s = idle_timeout_s
        self.idle_closed = 0  # connections the idle guard closed
        # Counted connections awaiting a complete request head, the longest waiting first.
        self.awaiting: dict[_Counted, None] = {}
        self.evicted = 0  # connections closed at the cap to make room for a new one
        self._overflow: web.Server | None = None  # made on first use, in the running loop

    async def answer_overflow(self, request: web.BaseRequest) -> web.StreamResponse:
        status, body = overflow_answer(request.method, request.path, self.health, self.limit)
        answer = web.json_response(
            body, status=status, headers={"Retry-After": "1"} if status == 503 else None
        )
        answer.force_close()
        return answer

    def __call__(self) -> asyncio.BaseProtocol:
        if self.open >= self.limit and self.awaiting:
            for waiting in list(itertools.islice(self.awaiting, EVICT_CANDIDATES)):
                if not waiting.head_pending():
                    waiting.evict()
                    break
        if self.open < self.limit:
            return _Counted(self._server(), self)
        self._metrics().connections_refused.inc()
        if self.answering >= self.limit:
            return _Abort()
        if self._overflow is None:
            self._overflow = web.Server(
                self.answer_overflow,
                access_log=None,
                max_line_size=_MAX_LINE,
                max_field_size=_MAX_LINE,
                lingering_time=0,  # a body sent with the request is not waited for
            )
        return _Overflow(self._overflow(), self)
