"""A cap on open HTTP connections that keeps the health probes answering.

:class:`ConnectionLimiter` is the listening socket's protocol factory. Up to ``limit`` connections go
to the HTTP server. Past it, a new connection gets one short answer and is closed: a health probe
(``GET /v2/health/live`` or ``/ready``) its real answer, so the kubelet does not restart a pod that
is only busy, and anything else a 503 naming the limit. Those answers are themselves bounded: at most
``limit`` of them at once (more are closed at once), each waits at most ``answer_timeout_s`` for
its request line and reads at most 4 KiB.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

from trtforge_runtime.metrics import Metrics

HealthAnswer = Callable[[str], tuple[int, dict[str, object]] | None]
_REASONS = {200: "OK", 503: "Service Unavailable"}
_MAX_LINE = 4096


def overflow_answer(request_line: bytes, health: HealthAnswer, limit: int) -> tuple[int, dict[str, object]]:
    """What a connection past the cap is told, from its request line (pure)."""
    parts = request_line.split(b" ")
    if len(parts) >= 2 and parts[0] == b"GET":
        answer = health(parts[1].decode("latin-1"))
        if answer is not None:
            return answer
    return 503, {"error": f"the server has {limit} open connections, its limit; retry later"}


def http_response(status: int, body: dict[str, object]) -> bytes:
    data = json.dumps(body).encode()
    lines = [
        f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}",
        "Content-Type: application/json",
        f"Content-Length: {len(data)}",
        "Connection: close",
    ]
    if status == 503:
        lines.append("Retry-After: 1")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + data


class _Overflow(asyncio.Protocol):
    def __init__(self, limiter: ConnectionLimiter) -> None:
        self._limiter = limiter
        self._buf = b""
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._limiter.answering += 1
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self._limiter.answer_timeout_s, self._answer, b"")

    def data_received(self, data: bytes) -> None:
        self._buf += data[: _MAX_LINE - len(self._buf)]
        end = self._buf.find(b"\r\n")
        if end >= 0:
            self._answer(self._buf[:end])
        elif len(self._buf) >= _MAX_LINE:
            self._answer(b"")

    def _answer(self, line: bytes) -> None:
        t = self._transport
        if t is None or t.is_closing():
            return
        if self._timer is not None:
            self._timer.cancel()
        lim = self._limiter
        status, body = overflow_answer(line, lim.health, lim.limit)
        t.write(http_response(status, body))
        t.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._transport = None
        self._limiter.answering -= 1


class _Abort(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.abort()  # type: ignore[attr-defined]


class _Counted(asyncio.Protocol):
    """The HTTP server's protocol, counted from its creation to its connection's end."""

    __slots__ = ("_inner", "_limiter")

    def __init__(self, inner: asyncio.Protocol, limiter: ConnectionLimiter) -> None:
        self._inner = inner
        self._limiter = limiter
        limiter.open += 1

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
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
        self._limiter.open -= 1
        self._inner.connection_lost(exc)


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
    ) -> None:
        self._server = server
        self.open = 0
        self.limit = limit
        self.health = health
        self._metrics = metrics
        self.answer_timeout_s = answer_timeout_s
        self.answering = 0

    def __call__(self) -> asyncio.BaseProtocol:
        if self.open < self.limit:
            return _Counted(self._server(), self)
        self._metrics().connections_refused.inc()
        if self.answering >= self.limit:
            return _Abort()
        return _Overflow(self)
