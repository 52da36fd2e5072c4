"""The infer fast path: well-formed binary infer requests without aiohttp's request and response objects.

:class:`InferConnection` is each counted connection's protocol (inside connections.py's idle guard).
At every request boundary it looks at the next request's head:

- :func:`infer_head` decides, from the head alone, whether the request is *eligible*: ``POST`` of
  HTTP/1.1 to exactly ``/v2/models/<served model>/infer``, keep-alive, one ``Content-Length`` within
  ``--max-request-bytes``, no ``Transfer-Encoding``, no ``Expect``, no ``Content-Encoding`` but
  ``identity``, an integer ``Inference-Header-Content-Length`` if any. The head is parsed by llhttp
  (``httptools``), and must end exactly where llhttp says it does, so the fast path and aiohttp can
  never frame a request differently.
- The runtime must also be ready, and the request's body must fit the shared body-memory budget
  without waiting.

An eligible request is read (``Content-Length`` bytes, into one buffer: its head and the start of
its body from the connection's shared read buffer, the rest of its body straight from the socket,
connections.py's :class:`~trtforge_runtime.connections.InPlaceBody`), decoded, queued on the
batcher and answered here, with the very JSON and binary data the aiohttp path would send. Anything
else (health, metadata, a chunked or compressed body, a version in the path, not ready, a full
memory budget, a head llhttp does not like...) is handed, with every byte already read, to the aiohttp
server, which then keeps the connection to its end and answers as it always has: 413, 415, 400 and
the 503s come from the existing code. What can go wrong only after the head (a malformed body, the
queue full, a body slower than ``--body-timeout``) is answered here with the same status and JSON.

Requests on one connection are answered one at a time, in order (pipelined requests wait in a
bounded buffer, past which the socket is not read). docs/design.md, "The runtime's request path".
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from trtforge_runtime.errors import RequestError
from trtforge_runtime.metrics import Outcome, outcome_for
from trtforge_runtime.v2 import HEADER_LENGTH, InferRequest, encode_response

if TYPE_CHECKING:
    from trtforge_runtime.model import ModelSpec
    from trtforge_runtime.server import Runtime

try:
    import httptools
except ImportError:  # pragma: no cover - the runtime's dependencies include it
    httptools = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

HEAD_END = b"\r\n\r\n"
MAX_HEAD = 16 * 1024  # a longer head than this is the aiohttp path's to judge
PIPELINE_BUFFER = 64 * 1024  # bytes of later requests held while one is answered; then stop reading
_PREFIX = b"POST /v2/models/"
# Requests whose JSON part is at most this big are decoded on the event loop (server.py's rule).
INLINE_DECODE_BYTES = 64 << 10


def why_off() -> str | None:
    """Why the fast path is off (None: it is on): httptools not importable, or
    ``TRTFORGE_HTTP_FAST_PATH=0``."""
    if httptools is None:
        return "httptools is not installed"
    if os.environ.get("TRTFORGE_HTTP_FAST_PATH", "1") == "0":
        return "TRTFORGE_HTTP_FAST_PATH=0"
    return None


def enabled() -> bool:
    """Whether the fast path is on (see :func:`why_off`)."""
    return why_off() is None


@dataclass(frozen=True)
class InferHead:
    """An eligible request's head: what the fast path needs to read and decode its body."""

    content_length: int
    header_length: int | None  # Inference-Header-Content-Length; None: the body is all JSON
    keep_alive: bool = True  # False: the client asked to close after the answer


@functools.lru_cache(maxsize=8)
def infer_path(model: str) -> bytes:
    """The one request target the fast path serves for `model` (any other spelling: aiohttp's)."""
    return f"/v2/models/{model}/infer".encode()


class _HeadParser:
    """httptools callbacks: the URL and the headers of one request head."""

    def __init__(self) -> None:
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.complete = False

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        self.complete = True


def _digits(value: bytes) -> int | None:
    return int(value) if value and value.isdigit() and len(value) <= 18 else None


def infer_head(head: bytes, infer_path: bytes, max_request_bytes: int) -> InferHead | str:
    """The fast path's decision on one request head (the bytes up to and including its first blank
    line): an :class:`InferHead`, or why the request goes to the aiohttp path (pure)."""
    if httptools is None:
        return "httptools is not installed"
    if not head.endswith(HEAD_END) or head.find(HEAD_END) != len(head) - len(HEAD_END):
        return "not exactly one request head"
    if not head.startswith(_PREFIX):
        return "not a POST to /v2/models/"
    cb = _HeadParser()
    parser = httptools.HttpRequestParser(cb)
    try:
        parser.feed_data(head[:-1])
        if cb.complete:  # llhttp ended the head earlier than the blank line
            return "the head ends before its blank line"
        parser.feed_data(head[-1:])
    except Exception as e:  # HttpParserError, HttpParserUpgrade: aiohttp answers those
        return f"malformed head or an upgrade: {type(e).__name__} {e}"
    if not cb.complete:
        return "llhttp did not end the head at its blank line"
    if parser.get_method() != b"POST" or parser.get_http_version() != "1.1":
        return "not POST over HTTP/1.1"
    if cb.url != infer_path:
        return "not the served model's infer path"
    if parser.should_upgrade():
        return "an upgrade"
    found: dict[bytes, list[bytes]] = {}
    for name, value in cb.headers:
        found.setdefault(name, []).append(value)
    for name in (b"transfer-encoding", b"expect", b"upgrade"):
        if name in found:
            return f"has {name.decode()}"
    coding = found.get(b"content-encoding")
    if coding is not None and (len(coding) != 1 or coding[0].strip().lower() not in (b"", b"identity")):
        return "a content coding"
    cls = found.get(b"content-length", [])
    length = _digits(cls[0].strip()) if len(cls) == 1 else None
    if length is None:
        return "not exactly one integer Content-Length"
    if length > max_request_bytes:
        return "the body is over the limit"
    hls = found.get(b"inference-header-content-length")
    header_length = None
    if hls is not None:
        header_length = _digits(hls[0].strip()) if len(hls) == 1 else None
        if header_length is None:
            return "Inference-Header-Content-Length is not one integer"
    return InferHead(length, header_length, parser.should_keep_alive())


# Clients send the same head again and again (only the body changes): decide each distinct head once.
# At most 256 heads of at most 16 KiB are kept.
decide = functools.lru_cache(maxsize=256)(infer_head)


def response_head(status: int, content_length: int, extra: dict[str, str] | None = None) -> bytes:
    """An HTTP/1.1 response head (pure)."""
    reason = _REASONS.get(status, "Error")
    lines = [f"HTTP/1.1 {status} {reason}"]
    for k, v in (extra or {}).items():
        lines.append(f"{k}: {v}")
    lines.append(f"Content-Length: {content_length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    408: "Request Timeout",
    413: "Payload Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}
_JSON = "application/json"


class _Request:
    """One eligible request, from its head to its answer."""

    __slots__ = ("body", "got", "head", "reserved", "spec", "t0", "timer")

    def __init__(self, head: InferHead, spec: ModelSpec, reserved: int) -> None:
        self.head = head
        self.spec = spec
        self.reserved = reserved
        self.body = np.empty(head.content_length, np.uint8)  # not zero-filled: every byte is written
        self.got = 0
        self.t0 = time.perf_counter()
        self.timer: asyncio.TimerHandle | None = None


class InferConnection(asyncio.Protocol):
    """One connection: the fast path for eligible infer requests, aiohttp for the rest (see the
    module docstring). `fallback` makes aiohttp's protocol for the connection when it is needed."""

    def __init__(self, runtime: Runtime, fallback: Callable[[], asyncio.Protocol]) -> None:
        self._rt = runtime
        self._fallback = fallback
        self._inner: asyncio.Protocol | None = None  # aiohttp's, once handed over
        self._transport: asyncio.Transport | None = None
        self._buf: bytes | bytearray = b""  # bytes of requests not yet taken
        self._req: _Request | None = None  # reading its body
        self._busy = False  # a request is being decoded, executed or answered
        self._write_paused = False
        self._read_paused = False

    # --- asyncio.Protocol --------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        if self._inner is not None:
            self._inner.data_received(data)
            return
        req = self._req
        if req is not None:
            n = min(len(data), len(req.body) - req.got)
            req.body[req.got : req.got + n] = memoryview(data)[:n]
            req.got += n
            if n < len(data):
                self._buf = self._buf + data[n:] if self._buf else data[n:]
            if req.got == len(req.body):
                self._body_done(req)
        elif self._buf:
            self._buf += data  # a head in pieces, or pipelined requests: rare
        else:
            self._buf = data  # the common case: no copy
        self._after_data()

    def _after_data(self) -> None:
        """Bytes were taken: take the next request, or stop reading past the pipeline buffer."""
        if self._inner is None and self._transport is not None:
            if self._busy or self._req is not None or self._write_paused:
                if len(self._buf) > PIPELINE_BUFFER and not self._read_paused:
                    self._read_paused = True
                    self._transport.pause_reading()
            else:
                self._next()

    # --- connections.InPlaceBody: bytes taken where they belong, copied once -------------------
    def body_view(self) -> memoryview | None:
        req = self._req
        if req is None or self._inner is not None or self._buf:
            return None
        return req.body.data[req.got :]

    def body_received(self, nbytes: int) -> None:
        req = self._req
        assert req is not None and req.got + nbytes <= len(req.body)
        req.got += nbytes
        if req.got == len(req.body):
            self._body_done(req)

    def chunk_received(self, raw: bytearray, size: int) -> None:
        if self._buf or self._write_paused or not self._at_boundary():
            self.data_received(bytes(raw[:size]))  # kept as bytes, as a plain read is
            return
        self._take(raw, size)  # a request's head and its body's start, straight from the read
        if self._busy:
            self._after_data()  # bytes past that request: stop reading past the pipeline buffer

    def eof_received(self) -> bool | None:
        if self._inner is not None:
            return self._inner.eof_received()
        return None

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()
        self._write_paused = True

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()
        self._write_paused = False
        self._next()

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        if self._inner is not None:
            self._inner.connection_lost(exc)
            return
        req, self._req = self._req, None
        if req is not None:  # gone while its body was arriving
            self._end(req, Outcome.ERROR)

    # --- requests ---------------------------------------------------------------------------
    def _at_boundary(self) -> bool:
        t = self._transport
        return not (
            t is None or t.is_closing() or self._busy or self._req is not None or self._inner is not None
        )

    def _next(self) -> None:
        """At a request boundary: take the next request, if its head is here."""
        if not self._at_boundary():
            return
        buf = self._buf
        if not buf:
            self._resume_reading()
            return
        self._buf = b""
        self._take(buf, len(buf))

    def _take(self, buf: bytes | bytearray, size: int) -> None:
        """Take the request that begins `buf`, of which the first `size` bytes are read; `buf` may be
        a shared read buffer valid only during this call, so what is kept of it is copied."""
        if not buf.startswith(_PREFIX, 0, size) and not _PREFIX.startswith(
            bytes(buf[: min(size, len(_PREFIX))])
        ):
            self._keep_and_hand_over(buf, size)
            return
        end = buf.find(HEAD_END, 0, size)
        if end < 0:
            self._buf = bytes(buf[:size])
            if size > MAX_HEAD:
                self._hand_over()
            else:
                self._resume_reading()
            return
        rt = self._rt
        spec = rt.spec
        batcher = rt.batcher
        if spec is None or batcher is None or rt.state != "ready":
            self._keep_and_hand_over(buf, size)
            return
        head = decide(bytes(buf[: end + len(HEAD_END)]), infer_path(spec.name), rt.s.max_request_bytes)
        if isinstance(head, str):
            self._keep_and_hand_over(buf, size)
            return
        reserved = rt.bodies.try_acquire(head.content_length)
        if reserved is None:
            # The aiohttp path waits for the budget, within --body-timeout.
            self._keep_and_hand_over(buf, size)
            return
        rt.active += 1
        req = _Request(head, spec, reserved)
        start = end + len(HEAD_END)
        n = min(size - start, len(req.body))
        req.body[:n] = memoryview(buf)[start : start + n]
        req.got = n
        self._buf = bytes(buf[start + n : size]) if start + n < size else b""
        if req.got == len(req.body):
            self._body_done(req)
        else:
            self._req = req
            req.timer = asyncio.get_running_loop().call_later(rt.s.body_timeout_s, self._body_late, req)
            self._resume_reading()

    def _keep_and_hand_over(self, buf: bytes | bytearray, size: int) -> None:
        """aiohttp takes the connection, starting with the first `size` bytes of `buf` (copied)."""
        self._buf = bytes(buf[:size])
        self._hand_over()

    def _resume_reading(self) -> None:
        if self._read_paused and self._transport is not None:
            self._read_paused = False
            self._transport.resume_reading()

    def _hand_over(self) -> None:
        """aiohttp takes the connection from here to its end, starting with the bytes not taken."""
        t = self._transport
        assert t is not None
        inner = self._inner = self._fallback()
        inner.connection_made(t)
        if self._write_paused:
            inner.pause_writing()
        data, self._buf = bytes(self._buf), b""
        self._resume_reading()
        if data:
            inner.data_received(data)

    def _body_late(self, req: _Request) -> None:
        if self._req is not req:
            return
        self._req = None
        s = self._rt.s.body_timeout_s
        self._answer_error(
            RequestError(408, f"the request body did not arrive within {s:g} s (--body-timeout)"), close=True
        )
        self._end(req, Outcome.TIMEOUT)

    def _body_done(self, req: _Request) -> None:
        if req.timer is not None:
            req.timer.cancel()
        self._req = None
        self._busy = True
        rt = self._rt
        spec = req.spec
        hl = req.head.header_length
        json_part = len(req.body) if hl is None else hl
        if json_part <= INLINE_DECODE_BYTES and not spec.has_bytes_inputs:
            try:
                decoded = rt.decode_body(req.body.data, hl, spec)
            except RequestError as e:
                self._failed(req, e)
                return
            except Exception as e:
                self._crashed(req, e)
                return
            self._submit(req, *decoded)
        else:
            fut = asyncio.get_running_loop().run_in_executor(
                rt.decode_pool, rt.decode_body, req.body.data, hl, spec
            )
            fut.add_done_callback(lambda f: self._decoded(req, f))

    def _decoded(self, req: _Request, fut: asyncio.Future[tuple[InferRequest, int]]) -> None:
        if fut.cancelled():  # the decode pool shut down (the server is stopping)
            self._crashed(req, RuntimeError("the decode was cancelled"))
            return
        exc = fut.exception()
        if isinstance(exc, RequestError):
            self._failed(req, exc)
        elif exc is not None:
            self._crashed(req, exc)
        else:
            self._submit(req, *fut.result())

    def _submit(self, req: _Request, ir: InferRequest, rows: int) -> None:
        batcher = self._rt.batcher
        if batcher is None or self._rt.state != "ready":
            msg = f"model {req.spec.name!r} is not ready: {self._rt.reason}"
            self._failed(req, RequestError(503, msg, {"Retry-After": "1"}))
            return
        try:
            fut = batcher.enqueue(ir.inputs, rows)
        except RequestError as e:
            self._failed(req, e)
            return
        fut.add_done_callback(lambda f: self._executed(req, ir, f))

    def _executed(self, req: _Request, ir: InferRequest, fut: asyncio.Future[dict[str, np.ndarray]]) -> None:
        if fut.cancelled():
            self._crashed(req, RuntimeError("the request was cancelled"))
            return
        exc = fut.exception()
        if isinstance(exc, RequestError):
            self._failed(req, exc)
            return
        if exc is not None:
            self._crashed(req, exc)
            return
        try:
            out, out_hl = encode_response(req.spec, ir, fut.result())
        except Exception as e:
            self._crashed(req, e)
            return
        if out_hl is None:
            extra = {"Content-Type": _JSON}
        else:
            extra = {
                HEADER_LENGTH: str(out_hl),
                "Content-Type": "application/octet-stream",
            }
        if not req.head.keep_alive:
            extra["Connection"] = "close"
        self._write(response_head(200, len(out), extra), out)
        self._close_unless_kept(req)
        self._end(req, Outcome.SUCCESS)

    def _failed(self, req: _Request, e: RequestError) -> None:
        self._answer_error(e, close=not req.head.keep_alive)
        self._end(req, outcome_for(e.status))

    def _crashed(self, req: _Request, e: BaseException) -> None:
        log.error("inference failed", exc_info=e)
        self._answer_error(RequestError(500, f"inference failed: {e}"), close=not req.head.keep_alive)
        self._end(req, Outcome.ERROR)

    def _close_unless_kept(self, req: _Request) -> None:
        if not req.head.keep_alive and self._transport is not None:
            self._transport.close()  # after what is buffered is written

    def _answer_error(self, e: RequestError, close: bool = False) -> None:
        body = json.dumps({"error": e.message}).encode()
        extra = {"Content-Type": _JSON, **(e.headers or {})}
        if close:
            extra["Connection"] = "close"
        self._write(response_head(e.status, len(body), extra), body)
        if close and self._transport is not None:
            self._transport.close()

    def _write(self, head: bytes, body: bytes) -> None:
        t = self._transport
        if t is not None and not t.is_closing():
            t.writelines((head, body))

    def _end(self, req: _Request, outcome: Outcome) -> None:
        """The request is over (answered, or its connection gone): release what it held, count it,
        and take the next request on the connection."""
        rt = self._rt
        if req.timer is not None:
            req.timer.cancel()
        rt.bodies.release(req.reserved)
        req.reserved = 0
        rt.active -= 1
        rt.metrics.observe_request(outcome, time.perf_counter() - req.t0)
        self._busy = False
        if self._inner is None and not self._write_paused:
            if self._buf:
                # Not a direct call: pipelined requests that fail at once must not nest ever deeper.
                asyncio.get_running_loop().call_soon(self._next)
            else:
                self._resume_reading()  # what was held ended at this request's end: read on
