"""The v2 gRPC protocol on the runtime's own HTTP/2 server, in its event loop (the default front end).

Why not grpcio's server: its asyncio stack moves every call across threads (the C core reads the
socket, a poller thread wakes the loop), ~21 context switches per call against ~3 for HTTP, and on a
pod's few cores that cost SqueezeNet's gRPC 10-20% of its HTTP throughput (docs/design.md, "Runtime
gRPC"). Here a connection is an ``asyncio.BufferedProtocol``: frames are parsed as they arrive, a
message's bytes land in a buffer of the size its gRPC prefix states (large runs of them read there
directly, see :meth:`H2Connection.get_buffer`), and ModelInfer goes from the last frame to the
batcher and back to the socket through callbacks, with no task and no other thread.

What it speaks (RFC 9113, and gRPC over HTTP/2): h2c with prior knowledge, as gRPC clients do
without TLS; unary calls of ``inference.GRPCInferenceService`` and ``grpc.health.v1.Health/Check``
(``grpc_calls``, ``grpc_health``); uncompressed messages, and ``gzip`` or ``deflate`` ones
(decompressed off the loop, within the size limit).
Header blocks are decoded with ``hpack``, a repeated block once per state of the table
(``header_blocks``); answers' headers are written as literals, never indexed,
so no encoder state is kept. Nothing is pushed; priorities are ignored.

Limits, each a refusal with a status or a closed connection, never unbounded memory or work:
- a message over ``--max-request-bytes`` (as its prefix states it): RESOURCE_EXHAUSTED, the rest
  of its frames discarded; a message whose bytes the shared body-memory budget cannot hold now:
  RESOURCE_EXHAUSTED at once; a message not whole ``--body-timeout`` after its headers:
  DEADLINE_EXCEEDED;
- ``MAX_CONCURRENT_STREAMS`` calls per connection (more are refused with REFUSED_STREAM, which
  clients retry), ``--max-connections`` connections and as many calls in flight in all
  (RESOURCE_EXHAUSTED past it); a stream the client resets keeps its place until its work ends;
- header blocks over ``MAX_HEADER_BLOCK`` bytes, frames over ``MAX_FRAME_SIZE``, flow-control
  violations and malformed frames close the connection with GOAWAY; so do ``MAX_CHATTER`` frames
  that carry no call (PING, SETTINGS, PRIORITY, WINDOW_UPDATE, RST_STREAM) in a row;
- reading stops while the peer does not read what is written to it; a connection with no call in
  flight for ``--idle-timeout`` is closed with GOAWAY.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import hpack
import numpy as np

from trtforge.logs import fields
from trtforge_runtime import grpc_calls as calls
from trtforge_runtime.body import BodyMemoryFull, Coding, decompress
from trtforge_runtime.errors import RequestError
from trtforge_runtime.grpc_calls import SERVICE, CallError, Code
from trtforge_runtime.grpc_plans import InferPlans
from trtforge_runtime.header_blocks import HeaderBlocks
from trtforge_runtime.metrics import Outcome, outcome_for

if TYPE_CHECKING:
    from trtforge_runtime.model import ModelSpec
    from trtforge_runtime.server import Runtime
    from trtforge_runtime.v2 import InferRequest

log = logging.getLogger(__name__)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
# Frame types (RFC 9113 §6) and flags.
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = (
    range(10)
)
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20
# Error codes (§7).
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0x0, 0x1, 0x2, 0x3
FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR, ENHANCE_YOUR_CALM = 0x6, 0x7, 0x8, 0x9, 0xB
# Settings (§6.5.2).
S_HEADER_TABLE_SIZE, S_ENABLE_PUSH, S_MAX_CONCURRENT_STREAMS = 0x1, 0x2, 0x3
S_INITIAL_WINDOW_SIZE, S_MAX_FRAME_SIZE, S_MAX_HEADER_LIST_SIZE = 0x4, 0x5, 0x6

MAX_CONCURRENT_STREAMS = 128
MAX_FRAME_SIZE = 1 << 20  # what this server reads; fewer, larger frames per message
STREAM_WINDOW = 4 << 20  # each stream's receive window, given back as its message fills
CONNECTION_WINDOW = 16 << 20  # the connection's receive window, given back as data is taken
MAX_HEADER_BLOCK = 64 << 10  # a header block's bytes, over all its frames
MAX_HEADER_LIST = 16 << 10  # decoded header names and values (what SETTINGS announces)
MAX_CHATTER = 1000  # frames in a row that carry no call
MAX_MESSAGE_TEXT = 1024  # characters of grpc-message
FAIL_LINGER_S = 2.0  # after a connection error, how long the client's bytes are still read
DEFAULT_WINDOW = 65535
_MAX_WINDOW = (1 << 31) - 1
_PREFIX = 5  # a gRPC message's compressed flag and length
READ_SIZE = 256 << 10  # the most one read takes into the shared scratch buffer (asyncio's own size)
DIRECT_READ_MIN = 16 << 10  # a message's bytes still to come from at least this many: read in place
_ENCODINGS = {b"gzip": Coding.GZIP, b"deflate": Coding.DEFLATE, b"identity": Coding.IDENTITY}


def frame_head(kind: int, flags: int, stream: int, length: int) -> bytes:
    """The 9-byte header of an HTTP/2 frame whose payload is `length` bytes."""
    return struct.pack(">I", length)[1:] + bytes((kind, flags)) + struct.pack(">I", stream)


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    """One HTTP/2 frame."""
    return frame_head(kind, flags, stream, len(payload)) + payload


def _hpack_int(n: int) -> bytes:
    """An HPACK integer with a 7-bit prefix and the first byte's high bit clear (RFC 7541 §5.1)."""
    if n < 127:
        return bytes((n,))
    out = bytearray((127,))
    n -= 127
    while n >= 128:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def literal(name: bytes, value: bytes) -> bytes:
    """A header field as a literal never added to the table (RFC 7541 §6.2.2), without Huffman."""
    return b"\x00" + _hpack_int(len(name)) + name + _hpack_int(len(value)) + value


def grpc_message_text(message: str) -> bytes:
    """`message` as grpc-message carries it: UTF-8, percent-encoded outside printable ASCII and
    '%' (gRPC over HTTP/2), cut to MAX_MESSAGE_TEXT characters."""
    out = bytearray()
    for b in message[:MAX_MESSAGE_TEXT].encode():
        out += b"%%%02X" % b if b < 0x20 or b > 0x7E or b == 0x25 else bytes((b,))
    return bytes(out)


_RESPONSE_HEADERS = b"\x88" + literal(b"content-type", b"application/grpc")  # :status 200, indexed
_OK_TRAILERS = literal(b"grpc-status", b"0")
_ACCEPT_ENCODING = literal(b"grpc-accept-encoding", b"identity,deflate,gzip")


def status_block(code: Code, message: str, trailers_only: bool) -> bytes:
    """The header block that ends a call with `code` (trailers-only: with the response headers)."""
    block = _RESPONSE_HEADERS if trailers_only else b""
    block += literal(b"grpc-status", str(int(code)).encode())
    if message:
        block += literal(b"grpc-message", grpc_message_text(message))
    if code is Code.UNIMPLEMENTED:
        block += _ACCEPT_ENCODING
    return block


def parse_timeout(value: bytes) -> float | None:
    """grpc-timeout ("<digits><unit>", at most 8 digits) in seconds; None when malformed."""
    units = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}
    digits, unit = value[:-1], value[-1:]
    if not digits.isdigit() or len(digits) > 8 or unit not in units:
        return None
    return int(digits) * units[unit]


class ConnectionError_(Exception):
    """A connection error (RFC 9113 §5.4.1): GOAWAY with `code`, then close."""

    def __init__(self, code: int, why: str) -> None:
        super().__init__(why)
        self.code = code


class _Stream:
    """One call: its request headers, its message as it arrives, its answer as it leaves."""

    __slots__ = (
        "answered",
        "closed_remote",
        "coding",
        "deadline",
        "filled",
        "flushed",
        "id",
        "method",
        "msg",
        "out",
        "outcome",
        "pending",
        "prefix",
        "recv_window",
        "reserved",
        "send_window",
        "service",
        "t0",
        "timer",
        "trailers",
        "unreturned",
        "working",
    )

    def __init__(self, sid: int, send_window: int) -> None:
        self.id = sid
        self.service = ""
        self.method = ""
        self.coding = Coding.IDENTITY
        self.prefix = bytearray()  # the message's first bytes, until its length is known
        self.msg: memoryview | None = None  # the message, filled as it arrives
        self.filled = 0
        self.reserved = 0  # bytes of the body-memory budget it holds
        self.recv_window = STREAM_WINDOW
        self.unreturned = 0  # bytes taken and not yet given back to the stream's window
        self.send_window = send_window
        self.out: list[memoryview] = []  # answer data waiting for a window
        self.trailers = b""  # the block that ends the answer, once it is known
        self.answered = False  # the answer is decided (whatever is left is discarded)
        self.flushed = False  # the answer is written, or will never be
        self.pending: asyncio.Future[Any] | None = None  # the call's work in flight (cancel to drop)
        self.deadline = False  # `timer` is the client's grpc-timeout, not the message's arrival
        self.outcome: Outcome | None = None  # for the metrics, when decided before the work ends
        self.closed_remote = False  # the client sent END_STREAM
        self.working = False  # its call runs (counts against the limits until it ends)
        self.t0 = time.perf_counter()
        self.timer: asyncio.TimerHandle | None = None


class GrpcServer:
    """The listening socket's connections and what they share: the call limit and shutdown."""

    def __init__(self, runtime: Runtime) -> None:
        self.rt = runtime
        self.connections: set[H2Connection] = set()
        self.calls = 0  # calls in flight, all connections
        self.plans = InferPlans()  # ModelInfer messages decoded before, by their heads
        # What every connection reads into, except a message's bytes (see H2Connection.get_buffer).
        # One for all: the loop runs one connection's read at a time, and each read is taken whole
        # (copied out of it) before the next.
        self.scratch = memoryview(bytearray(READ_SIZE))
        self.draining = False
        self._listener: asyncio.AbstractServer | None = None

    def __call__(self) -> asyncio.BufferedProtocol:
        return H2Connection(self)

    async def start(self, host: str, port: int) -> int:
        """Listen on host:port (0: any free port); the port. OSError naming the address if taken."""
        loop = asyncio.get_running_loop()
        s = self.rt.s
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            self._listener = await loop.create_server(
                self, host, port, backlog=1024, reuse_address=True, reuse_port=s.reuse_port
            )
        except OSError as e:
            raise OSError(f"cannot listen for gRPC on {address}: {e.strerror or e}") from e
        return int(self._listener.sockets[0].getsockname()[1]) if self._listener.sockets else port

    async def stop(self, grace_s: float) -> None:
        """No new connections or calls (GOAWAY); the calls in flight get `grace_s` to end."""
        self.draining = True
        if self._listener is not None:
            self._listener.close()
        for c in list(self.connections):
            c.go_away(NO_ERROR)
        deadline = time.monotonic() + grace_s
        while self.calls and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        for c in list(self.connections):
            c.close()


class H2Connection(asyncio.BufferedProtocol):
    """One HTTP/2 connection carrying gRPC calls (see the module docstring)."""

    def __init__(self, server: GrpcServer) -> None:
        self._server = server
        self._rt = server.rt
        self._transport: asyncio.Transport | None = None
        self._loop = asyncio.get_running_loop()
        self._counted = False
        self._preface = b""  # the client's preface, until whole
        self._started = False
        self._head = bytearray()  # a frame header in pieces
        self._frame: tuple[int, int, int, int] | None = None  # kind, flags, stream, length
        self._payload = bytearray()  # a non-DATA frame's payload in pieces
        self._data_left = 0  # bytes of the DATA frame being read
        self._data_stream: _Stream | None = None
        self._block: list[bytes] = []  # a header block in pieces (HEADERS then CONTINUATION)
        self._block_size = 0
        self._block_stream = 0
        self._block_flags = 0
        self._headers = HeaderBlocks(MAX_HEADER_LIST)
        self._streams: dict[int, _Stream] = {}
        self._last_stream = 0
        self._recv_window = CONNECTION_WINDOW
        self._unreturned = 0
        self._send_window = DEFAULT_WINDOW
        self._peer_initial_window = DEFAULT_WINDOW
        self._peer_frame = 16384
        self._blocked: list[_Stream] = []  # streams with answer data waiting for a window
        self._chatter = 0
        self._idle: asyncio.TimerHandle | None = None  # at most one; fires at or before _idle_at
        self._idle_at = 0.0  # when the connection, if still without streams, is idle
        self._gone_away = False  # the client sent GOAWAY
        self._sent_goaway = False
        self._read_paused = False
        self._data_flags = 0
        self._failed = False  # a connection error was sent
        self._direct = False  # the buffer get_buffer gave is the current message's own

    # --- asyncio.Protocol -------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        srv = self._server
        if srv.draining or len(srv.connections) >= self._rt.s.max_connections:
            self._rt.metrics.connections_refused.inc()
            transport.abort()
            return
        srv.connections.add(self)
        self._counted = True
        settings = b"".join(
            struct.pack(">HI", k, v)
            for k, v in (
                (S_ENABLE_PUSH, 0),
                (S_MAX_CONCURRENT_STREAMS, MAX_CONCURRENT_STREAMS),
                (S_INITIAL_WINDOW_SIZE, STREAM_WINDOW),
                (S_MAX_FRAME_SIZE, MAX_FRAME_SIZE),
                (S_MAX_HEADER_LIST_SIZE, MAX_HEADER_LIST),
            )
        )
        grow = struct.pack(">I", CONNECTION_WINDOW - DEFAULT_WINDOW)
        transport.write(frame(SETTINGS, 0, 0, settings) + frame(WINDOW_UPDATE, 0, 0, grow))
        self._arm_idle()

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        if self._idle is not None:
            self._idle.cancel()
        if self._counted:
            self._server.connections.discard(self)
            self._counted = False
        for st in list(self._streams.values()):
            self._reset_by_client(st)  # its work is dropped as if the client had reset it

    def pause_writing(self) -> None:
        if self._transport is not None and not self._read_paused:
            self._read_paused = True
            self._transport.pause_reading()

    def resume_writing(self) -> None:
        if self._transport is not None and self._read_paused:
            self._read_paused = False
            self._transport.resume_reading()

    def get_buffer(self, sizehint: int) -> memoryview:
        """Where the next read goes: inside a DATA frame whose bytes fill a call's message, that
        message's own buffer, up to the frame's end and the message's (the kernel copies them in
        place: the message is copied once, not twice); anything else, the server's scratch buffer,
        which :meth:`buffer_updated` takes whole."""
        st = self._data_stream
        if st is not None and st.msg is not None and not st.answered and not self._failed:
            n = min(self._data_left, len(st.msg) - st.filled)
            if n >= DIRECT_READ_MIN:
                self._direct = True
                return st.msg[st.filled : st.filled + n]
        self._direct = False
        return self._server.scratch

    def buffer_updated(self, nbytes: int) -> None:
        if self._direct:
            self._direct = False
            self._guarded(self._data_in_place, nbytes)
        else:
            self.data_received(self._server.scratch[:nbytes])

    def _data_in_place(self, nbytes: int) -> None:
        """`nbytes` of the current DATA frame were read straight into its message."""
        st = self._data_stream
        assert st is not None
        st.filled += nbytes
        self._data_left -= nbytes
        if not self._data_left:
            self._data_end()

    def data_received(self, data: bytes | memoryview) -> None:
        """Bytes read (from the scratch buffer, or handed over whole): nothing keeps a view of them."""
        self._guarded(self._receive, memoryview(data))

    def _guarded(self, step: Callable[[Any], None], arg: Any) -> None:
        """Run one step of reading; a protocol error ends the connection, and so does a bug."""
        if self._transport is None or self._transport.is_closing() or self._failed:
            return  # after a connection error: read and dropped until the peer closes
        try:
            step(arg)
        except ConnectionError_ as e:
            self._fail_connection(e.code, str(e))
        except hpack.HPACKError as e:
            self._fail_connection(COMPRESSION_ERROR, f"header block: {e}")
        except Exception as e:  # a bug here must cost one connection, never the server
            log.exception("gRPC connection failed")
            self._fail_connection(INTERNAL_ERROR, f"internal error: {type(e).__name__}")

    def eof_received(self) -> bool | None:
        return False  # the client is done sending: close

    def _fail_connection(self, code: int, why: str) -> None:
        """A connection error: GOAWAY, no more writes, and whatever the client still sends is read
        and dropped for FAIL_LINGER_S (closing with unread bytes would reset the connection, and
        the client could lose the GOAWAY that says why), then the connection is closed."""
        log.info("gRPC connection error", extra=fields(h2_error=code, why=why))
        self._failed = True
        self.go_away(code, why)
        for st in list(self._streams.values()):
            self._reset_by_client(st)
        t = self._transport
        if t is None or t.is_closing():
            return
        if t.can_write_eof():
            t.write_eof()
            self._loop.call_later(FAIL_LINGER_S, t.abort)
        else:
            t.close()

    # --- frames in ---------------------------------------------------------------------------
    def _receive(self, mv: memoryview) -> None:
        i, n = 0, len(mv)
        if not self._started:
            need = len(PREFACE) - len(self._preface)
            self._preface += bytes(mv[:need])
            i = min(need, n)
            if not PREFACE.startswith(self._preface):
                raise ConnectionError_(PROTOCOL_ERROR, "not an HTTP/2 connection preface (gRPC needs HTTP/2)")
            if len(self._preface) < len(PREFACE):
                return
            self._started = True
        while i < n:
            if self._data_left:  # inside a DATA frame's payload: straight into its message
                take = min(self._data_left, n - i)
                self._data_bytes(mv[i : i + take])
                i += take
                self._data_left -= take
                if not self._data_left:
                    self._data_end()
                continue
            if self._frame is not None:  # a frame's payload in pieces
                kind, flags, sid, length = self._frame
                take = min(length - len(self._payload), n - i)
                self._payload += mv[i : i + take]
                i += take
                if len(self._payload) == length:
                    payload, self._payload, self._frame = bytes(self._payload), bytearray(), None
                    self._on_frame(kind, flags, sid, payload)
                continue
            if self._head or n - i < 9:  # a frame header in pieces
                take = min(9 - len(self._head), n - i)
                self._head += mv[i : i + take]
                i += take
                if len(self._head) < 9:
                    return
                head, self._head = bytes(self._head), bytearray()
            else:
                head = bytes(mv[i : i + 9])
                i += 9
            length = int.from_bytes(head[:3], "big")
            kind, flags = head[3], head[4]
            sid = int.from_bytes(head[5:9], "big") & 0x7FFFFFFF
            if length > MAX_FRAME_SIZE:
                raise ConnectionError_(FRAME_SIZE_ERROR, f"a frame of {length} bytes, over {MAX_FRAME_SIZE}")
            if self._block and kind != CONTINUATION:
                raise ConnectionError_(PROTOCOL_ERROR, "a header block was interrupted by another frame")
            if kind == DATA and not flags & PADDED:
                self._data_begin(sid, flags, length)
                self._data_left = length
                if not length:
                    self._data_end()
                continue
            if length <= n - i:
                self._on_frame(kind, flags, sid, bytes(mv[i : i + length]))
                i += length
            else:
                self._frame = (kind, flags, sid, length)

    def _on_frame(self, kind: int, flags: int, sid: int, payload: bytes) -> None:
        if kind in (HEADERS, CONTINUATION):
            self._on_header_frame(kind, flags, sid, payload)
            return
        if kind == DATA:  # padded: rare, whole
            pad = payload[0] if payload else 0
            if not payload or pad >= len(payload):
                raise ConnectionError_(PROTOCOL_ERROR, "DATA padding exceeds the frame")
            self._data_begin(sid, flags, len(payload))
            self._data_bytes(memoryview(payload)[1 : len(payload) - pad])
            self._data_end()
            return
        self._chatter += 1
        if self._chatter > MAX_CHATTER:
            raise ConnectionError_(ENHANCE_YOUR_CALM, f"{MAX_CHATTER} frames in a row carried no call")
        if kind == SETTINGS:
            self._on_settings(flags, sid, payload)
        elif kind == PING:
            if sid or len(payload) != 8:
                raise ConnectionError_(PROTOCOL_ERROR, "a malformed PING")
            if not flags & ACK:
                self._write(frame(PING, ACK, 0, payload))
        elif kind == WINDOW_UPDATE:
            self._on_window_update(sid, payload)
        elif kind == RST_STREAM:
            if not sid or len(payload) != 4:
                raise ConnectionError_(PROTOCOL_ERROR, "a malformed RST_STREAM")
            st = self._streams.get(sid)
            if st is not None:
                self._reset_by_client(st)
        elif kind == GOAWAY:
            self._gone_away = True  # the client opens no more streams; the ones open may end
        elif kind == PUSH_PROMISE:
            raise ConnectionError_(PROTOCOL_ERROR, "a client may not push")
        # PRIORITY and unknown types are ignored (§5.5)

    def _on_settings(self, flags: int, sid: int, payload: bytes) -> None:
        if sid:
            raise ConnectionError_(PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & ACK:
            return
        if len(payload) % 6:
            raise ConnectionError_(FRAME_SIZE_ERROR, "SETTINGS of a length not a multiple of 6")
        for off in range(0, len(payload), 6):
            key, value = struct.unpack_from(">HI", payload, off)
            if key == S_INITIAL_WINDOW_SIZE:
                if value > _MAX_WINDOW:
                    raise ConnectionError_(FLOW_CONTROL_ERROR, "SETTINGS_INITIAL_WINDOW_SIZE over 2^31-1")
                delta = value - self._peer_initial_window
                self._peer_initial_window = value
                for st in self._streams.values():
                    st.send_window += delta
            elif key == S_MAX_FRAME_SIZE:
                if not 16384 <= value <= (1 << 24) - 1:
                    raise ConnectionError_(PROTOCOL_ERROR, f"SETTINGS_MAX_FRAME_SIZE {value} out of range")
                self._peer_frame = value
        self._write(frame(SETTINGS, ACK, 0))
        self._flush_blocked()

    def _on_window_update(self, sid: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise ConnectionError_(FRAME_SIZE_ERROR, "a WINDOW_UPDATE not of 4 bytes")
        grow = int.from_bytes(payload, "big") & 0x7FFFFFFF
        if sid == 0:
            self._send_window += grow
            if self._send_window > _MAX_WINDOW:
                raise ConnectionError_(FLOW_CONTROL_ERROR, "the connection's window passed 2^31-1")
        else:
            st = self._streams.get(sid)
            if st is None:
                return
            st.send_window += grow
        self._flush_blocked()

    def _on_header_frame(self, kind: int, flags: int, sid: int, payload: bytes) -> None:
        if kind == HEADERS:
            if self._block:
                raise ConnectionError_(PROTOCOL_ERROR, "HEADERS inside a header block")
            if not sid:
                raise ConnectionError_(PROTOCOL_ERROR, "HEADERS on stream 0")
            if flags & PADDED:
                pad = payload[0] if payload else 0
                if not payload or pad >= len(payload):
                    raise ConnectionError_(PROTOCOL_ERROR, "HEADERS padding exceeds the frame")
                payload = payload[1 : len(payload) - pad]
            if flags & PRIORITY_FLAG:
                payload = payload[5:]
            self._block_stream, self._block_flags, self._block_size = sid, flags, 0
        elif not self._block or sid != self._block_stream:
            raise ConnectionError_(PROTOCOL_ERROR, "CONTINUATION outside a header block")
        self._block_size += len(payload)
        if self._block_size > MAX_HEADER_BLOCK:
            raise ConnectionError_(ENHANCE_YOUR_CALM, f"a header block over {MAX_HEADER_BLOCK} bytes")
        self._block.append(payload)
        if not flags & END_HEADERS:
            return
        block, self._block = b"".join(self._block), []
        headers = self._headers.decode(block)  # always: the table must follow the client
        self._on_headers(self._block_stream, self._block_flags, headers)

    def _on_headers(self, sid: int, flags: int, headers: dict[bytes, bytes]) -> None:
        st = self._streams.get(sid)
        if st is not None:  # trailers from the client: they must end its side
            if not flags & END_STREAM:
                raise ConnectionError_(PROTOCOL_ERROR, "a second header block that does not end the stream")
            self._remote_end(st)
            return
        if sid % 2 == 0:
            raise ConnectionError_(PROTOCOL_ERROR, f"stream {sid} is not a client stream (even id)")
        if sid <= self._last_stream:
            return  # a stream already answered and closed: its block was decoded, nothing else to do
        self._last_stream = sid
        self._chatter = 0
        srv = self._server
        if self._gone_away or srv.draining:
            self._write(frame(RST_STREAM, 0, sid, struct.pack(">I", REFUSED_STREAM)))
            return
        if len(self._streams) >= MAX_CONCURRENT_STREAMS:  # a reset stream counts until its work ends
            self._write(frame(RST_STREAM, 0, sid, struct.pack(">I", REFUSED_STREAM)))
            return
        st = _Stream(sid, self._peer_initial_window)
        self._streams[sid] = st  # the idle timer stays: it finds a stream and stands down
        path = headers.get(b":path", b"")
        service, _, method = path.decode("latin-1").lstrip("/").rpartition("/")
        st.service, st.method = service, method
        rt = self._rt
        if method == "ModelInfer":
            rt.active += 1
        st.working = True
        srv.calls += 1
        if headers.get(b":method") != b"POST":
            self._refuse_now(st, Code.INVALID_ARGUMENT, "gRPC calls are POST requests")
        elif not headers.get(b"content-type", b"").startswith(b"application/grpc"):
            self._refuse_now(st, Code.INVALID_ARGUMENT, "content-type must be application/grpc")
        elif (service, method) != (SERVICE, "ModelInfer") and not calls.is_unary(service, method):
            self._refuse_now(st, Code.UNIMPLEMENTED, f"method {path.decode('latin-1')} is not implemented")
        elif srv.calls > rt.s.max_connections:
            msg = f"{rt.s.max_connections} calls in flight, the limit"
            self._refuse_now(st, Code.RESOURCE_EXHAUSTED, msg, Outcome.UNAVAILABLE)
        else:
            encoding = headers.get(b"grpc-encoding", b"identity")
            coding = _ENCODINGS.get(encoding)
            if coding is None:
                msg = f"grpc-encoding {encoding.decode('latin-1')!r} is not supported"
                self._refuse_now(st, Code.UNIMPLEMENTED, msg)
            else:
                st.coding = coding
                limit = rt.s.body_timeout_s
                timeout = headers.get(b"grpc-timeout")
                seconds = parse_timeout(timeout) if timeout else None
                if seconds is not None and seconds < limit:
                    st.deadline = True
                    st.timer = self._loop.call_later(seconds, self._late, st, Code.DEADLINE_EXCEEDED, "")
                else:
                    why = f"the message did not arrive within {limit:g} s (--body-timeout)"
                    st.timer = self._loop.call_later(limit, self._late, st, Code.DEADLINE_EXCEEDED, why)
        if flags & END_STREAM:
            self._remote_end(st)

    # --- DATA ---------------------------------------------------------------------------------
    def _data_begin(self, sid: int, flags: int, length: int) -> None:
        self._recv_window -= length
        if self._recv_window < 0:
            raise ConnectionError_(FLOW_CONTROL_ERROR, "DATA past the connection's window")
        st = self._streams.get(sid)
        if st is not None and st.answered:
            st = None  # answered or reset: what still arrives is discarded
        elif st is not None:
            if st.closed_remote:
                raise ConnectionError_(PROTOCOL_ERROR, f"DATA on stream {sid} after its END_STREAM")
            st.recv_window -= length
            if st.recv_window < 0:
                raise ConnectionError_(FLOW_CONTROL_ERROR, f"DATA past stream {sid}'s window")
            st.unreturned += length
        elif sid == 0 or sid > self._last_stream:
            raise ConnectionError_(PROTOCOL_ERROR, f"DATA on stream {sid}, which is not open")
        self._data_stream = st
        self._data_flags = flags
        self._unreturned += length

    def _data_bytes(self, chunk: memoryview) -> None:
        st = self._data_stream
        if st is None or st.answered:
            return  # a stream already answered or reset: discarded
        if st.msg is None:
            need = _PREFIX - len(st.prefix)
            st.prefix += chunk[:need]
            chunk = chunk[need:]
            if len(st.prefix) < _PREFIX:
                return
            self._message_begins(st)
            if st.msg is None:  # refused
                return
        room = len(st.msg) - st.filled
        if len(chunk) > room:
            self._refuse_now(
                st, Code.INVALID_ARGUMENT, "a unary call carries one message; more bytes followed it"
            )
            return
        st.msg[st.filled : st.filled + len(chunk)] = chunk
        st.filled += len(chunk)

    def _message_begins(self, st: _Stream) -> None:
        rt = self._rt
        flag, length = st.prefix[0], int.from_bytes(st.prefix[1:5], "big")
        limit = rt.s.max_request_bytes
        if flag > 1:
            self._refuse_now(
                st, Code.INVALID_ARGUMENT, f"a message's compressed flag is {flag}; 0 or 1 expected"
            )
        elif flag and st.coding is Coding.IDENTITY:
            self._refuse_now(st, Code.INVALID_ARGUMENT, "a compressed message without a grpc-encoding header")
        elif length > limit:
            msg = f"a message of {length} bytes is over the limit of {limit} bytes (--max-request-bytes)"
            self._refuse_now(st, Code.RESOURCE_EXHAUSTED, msg)
        else:
            reserved = rt.bodies.try_acquire(length) if length else 0  # an empty message holds nothing
            if reserved is None:
                self._fail(st, BodyMemoryFull(rt.bodies.total))  # counted as over HTTP: unavailable
                return
            st.reserved = reserved
            st.msg = np.empty(length, np.uint8).data  # not zero-filled: every byte is written
            if not flag:
                st.coding = Coding.IDENTITY

    def _data_end(self) -> None:
        st, self._data_stream = self._data_stream, None
        flags = self._data_flags
        if st is not None and not st.answered:
            if st.unreturned >= STREAM_WINDOW // 2 and not flags & END_STREAM:
                self._write(frame(WINDOW_UPDATE, 0, st.id, struct.pack(">I", st.unreturned)))
                st.recv_window += st.unreturned
                st.unreturned = 0
            if flags & END_STREAM:
                self._remote_end(st)
        if self._unreturned >= CONNECTION_WINDOW // 2:
            self._write(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", self._unreturned)))
            self._recv_window += self._unreturned
            self._unreturned = 0

    # --- a call ---------------------------------------------------------------------------------
    def _remote_end(self, st: _Stream) -> None:
        """The client's side of the stream ended: run the call on its message."""
        st.closed_remote = True
        if st.answered:
            self._maybe_done(st)
            return
        if not st.deadline and st.timer is not None:
            st.timer.cancel()
            st.timer = None
        if st.msg is None or st.filled < len(st.msg):
            got = st.filled if st.msg is not None else len(st.prefix)
            self._refuse_now(
                st, Code.INVALID_ARGUMENT, f"the stream ended inside its message ({got} bytes came)"
            )
            return
        if st.coding is not Coding.IDENTITY:
            rt = self._rt
            fut = self._loop.run_in_executor(
                rt.decode_pool, decompress, bytes(st.msg), st.coding, rt.s.max_request_bytes
            )
            st.pending = fut
            fut.add_done_callback(lambda f: self._decompressed(st, f))
            return
        self._run(st, st.msg)

    def _settled(self, st: _Stream, fut: asyncio.Future[Any]) -> bool:
        """`st`'s step in flight ended: True when its result is there to take. Otherwise the call
        is already over (cancelled: reset by the client, past its deadline, or gone) or has just
        been refused with the step's error."""
        st.pending = None
        if fut.cancelled() or st.answered:
            self._end_call(st, Outcome.ERROR)
            return False
        exc = fut.exception()
        if exc is not None:
            self._fail(st, exc)
            return False
        return True

    def _decompressed(self, st: _Stream, fut: asyncio.Future[bytes | bytearray]) -> None:
        if not self._settled(st, fut):
            return
        data = fut.result()
        more = self._rt.bodies.try_acquire(len(data))
        if more is None:
            self._fail(st, BodyMemoryFull(self._rt.bodies.total))
            return
        st.reserved += more
        self._run(st, memoryview(data))

    def _run(self, st: _Stream, data: memoryview) -> None:
        rt = self._rt
        if st.method != "ModelInfer":
            try:
                answer = calls.unary_call(rt, st.service, st.method, data)
            except CallError as e:
                self._refuse_now(st, e.code, e.message)
                return
            self._answer(st, answer)
            self._end_call(st, Outcome.SUCCESS)
            return
        try:
            planned = self._server.plans.lookup(data, rt.spec)  # a message seen before: no parse, no checks
            if planned.found is not None:
                spec, req, rows = planned.found
                self._submit(st, spec, req, rows)  # which refuses it while the runtime is not ready
                return
            spec, msg, raw = calls.admit_infer(rt, data)
            if spec.has_bytes_inputs:  # BYTES elements are Python objects: decoded off the loop
                fut = self._loop.run_in_executor(rt.decode_pool, _decode, msg, spec, raw)
                st.pending = fut
                fut.add_done_callback(lambda f: self._decoded(st, spec, f))
                return
            req = calls.decode_infer_request(msg, spec, raw)
            rows = spec.validate(req.inputs)
            if planned.key is not None:
                self._server.plans.keep(planned.key, spec, req, rows, raw)
        except Exception as e:
            self._fail(st, e)
            return
        self._submit(st, spec, req, rows)

    def _decoded(self, st: _Stream, spec: ModelSpec, fut: asyncio.Future[tuple[InferRequest, int]]) -> None:
        if self._settled(st, fut):
            self._submit(st, spec, *fut.result())

    def _submit(self, st: _Stream, spec: ModelSpec, req: InferRequest, rows: int) -> None:
        rt = self._rt
        batcher = rt.batcher
        if batcher is None or rt.state != "ready":
            self._fail(st, RequestError(503, f"model {spec.name!r} is not ready: {rt.reason}"))
            return
        try:
            fut = batcher.enqueue(req.inputs, rows)
        except Exception as e:
            self._fail(st, e)
            return
        st.pending = fut
        fut.add_done_callback(lambda f: self._executed(st, spec, req, f))

    def _executed(self, st: _Stream, spec: ModelSpec, req: InferRequest, fut: asyncio.Future[Any]) -> None:
        if not self._settled(st, fut):
            return
        try:
            answer = calls.encode_infer_response(spec, req, fut.result())
        except Exception as e:
            self._fail(st, e)
            return
        self._answer(st, answer)
        self._end_call(st, Outcome.SUCCESS)

    def _fail(self, st: _Stream, e: BaseException) -> None:
        if isinstance(e, RequestError):
            self._refuse(st, calls.code_for(e), e.message)
            self._end_call(st, outcome_for(e.status))
            return
        if isinstance(e, CallError):
            self._refuse_now(st, e.code, e.message)
        else:
            log.error("inference failed", exc_info=e)
            self._refuse(st, Code.INTERNAL, f"inference failed: {e}")
            self._end_call(st, Outcome.ERROR)

    def _end_call(self, st: _Stream, outcome: Outcome) -> None:
        """The call's work is over: give back what it held, count it (ModelInfer), and forget the
        stream once its answer is out."""
        if not st.working:
            return
        st.working = False
        outcome = st.outcome or outcome
        rt = self._rt
        rt.bodies.release(st.reserved)
        st.reserved = 0
        st.msg = None
        self._server.calls -= 1
        if st.method == "ModelInfer":
            rt.active -= 1
            rt.metrics.observe_request(outcome, time.perf_counter() - st.t0)
        self._maybe_done(st)

    # --- answers --------------------------------------------------------------------------------
    def _answer(self, st: _Stream, message: bytes) -> None:
        """Answer with `message` and status OK."""
        if st.answered:
            return
        st.answered = True
        if st.timer is not None:
            st.timer.cancel()
            st.timer = None
        head = frame(HEADERS, END_HEADERS, st.id, _RESPONSE_HEADERS)
        st.out = [memoryview(b"\x00" + len(message).to_bytes(4, "big")), memoryview(message)]
        st.trailers = _OK_TRAILERS
        self._flush(st, head)

    def _refuse(self, st: _Stream, code: Code, message: str) -> None:
        """End the call with `code` (trailers only); if the client is still sending, tell it to stop."""
        if st.answered:
            return
        st.answered = True
        if st.timer is not None:
            st.timer.cancel()
            st.timer = None
        data = frame(HEADERS, END_HEADERS | END_STREAM, st.id, status_block(code, message, True))
        if not st.closed_remote:
            data += frame(RST_STREAM, 0, st.id, struct.pack(">I", NO_ERROR))
        st.flushed = True
        self._write(data)
        self._maybe_done(st)

    def _refuse_now(self, st: _Stream, code: Code, message: str, outcome: Outcome | None = None) -> None:
        """Refuse a call that has no work in flight, and end it; counted under `outcome`, by default
        the one `code` stands for."""
        self._refuse(st, code, message)
        self._end_call(st, outcome or calls.outcome_for_code(code))

    def _late(self, st: _Stream, code: Code, message: str) -> None:
        st.timer = None
        st.outcome = Outcome.TIMEOUT
        if not st.answered:
            self._refuse(st, code, message or "the call's deadline (grpc-timeout) passed")
        if st.pending is not None:
            st.pending.cancel()  # its callback ends the call
        else:
            self._end_call(st, Outcome.TIMEOUT)

    def _reset_by_client(self, st: _Stream) -> None:
        st.answered = st.flushed = st.closed_remote = True
        st.out = []
        if st in self._blocked:
            self._blocked.remove(st)
        if st.timer is not None:
            st.timer.cancel()
            st.timer = None
        if st.pending is not None:
            st.pending.cancel()  # its callback ends the call
        else:
            self._end_call(st, Outcome.ERROR)
        self._maybe_done(st)

    def _flush(self, st: _Stream, head: bytes = b"") -> None:
        """Write what the windows let go of `st`'s answer; its trailers once the data is out."""
        parts: list[bytes | memoryview] = [head] if head else []
        while st.out:
            room = min(self._send_window, st.send_window, self._peer_frame)
            if room <= 0:
                if st not in self._blocked:
                    self._blocked.append(st)
                break
            pieces: list[memoryview] = []
            k = 0
            while st.out and k < room:  # one frame may take the ends of several parts
                mv = st.out[0]
                take = mv[: room - k]
                pieces.append(take)
                k += len(take)
                if len(take) == len(mv):
                    st.out.pop(0)
                else:
                    st.out[0] = mv[len(take) :]
            parts.append(frame_head(DATA, 0, st.id, k))
            parts.extend(pieces)
            self._send_window -= k
            st.send_window -= k
        if not st.out:
            parts.append(frame(HEADERS, END_HEADERS | END_STREAM, st.id, st.trailers))
            st.flushed = True
        if parts:
            self._write(b"".join(parts))
        if st.flushed:
            self._maybe_done(st)

    def _flush_blocked(self) -> None:
        blocked, self._blocked = self._blocked, []
        for st in blocked:
            if not st.flushed:
                self._flush(st)

    def _maybe_done(self, st: _Stream) -> None:
        """Forget `st` once its answer is out and its work is over."""
        if st.flushed and not st.working and self._streams.get(st.id) is st:
            del self._streams[st.id]
            if not self._streams:
                if self._sent_goaway:
                    self.close()
                else:
                    self._arm_idle()

    # --- the connection --------------------------------------------------------------------------
    def _arm_idle(self) -> None:
        """Start the idle clock from now. The deadline moves; the timer is not rescheduled: one
        `call_at` handle per connection, re-armed when it fires early (docs/design.md, "Runtime gRPC")."""
        if self._transport is None:
            return
        self._idle_at = self._loop.time() + self._rt.s.idle_timeout_s
        if self._idle is None:
            self._idle = self._loop.call_at(self._idle_at, self._idle_fired)

    def _idle_fired(self) -> None:
        self._idle = None
        if self._streams or self._transport is None:
            return  # busy: _maybe_done restarts the clock when the last stream ends
        if self._loop.time() < self._idle_at:
            self._idle = self._loop.call_at(self._idle_at, self._idle_fired)
            return
        self.go_away(NO_ERROR, "idle")
        self.close()

    def _write(self, data: bytes | memoryview) -> None:
        t = self._transport
        if t is not None and not t.is_closing():
            t.write(data)

    def go_away(self, code: int, why: str = "") -> None:
        """Send GOAWAY once: no stream past the last one the client opened will be served."""
        if self._sent_goaway:
            return
        self._sent_goaway = True
        self._write(frame(GOAWAY, 0, 0, struct.pack(">II", self._last_stream, code) + why.encode()[:256]))
        if not self._streams and not self._failed:
            self.close()

    def close(self) -> None:
        t = self._transport
        if t is not None and not t.is_closing():
            t.close()  # after what is buffered is written


def _decode(msg: Any, spec: ModelSpec, raw: Any) -> tuple[InferRequest, int]:
    req = calls.decode_infer_request(msg, spec, raw)
    return req, spec.validate(req.inputs)
