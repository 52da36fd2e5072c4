"""The load generator's gRPC client: unary calls over one HTTP/2 connection, one stream at a time.

grpcio's asyncio client spent ~0.62-0.65 ms of CPU per SqueezeNet ModelInfer (a 602 KB request) in
its channel, call objects and the hops between its threads and the event loop; on the shared
2-core layout that CPU comes out of the server's share. This client does only what a closed-loop
worker needs: it writes a request whose HEADERS block and gRPC message were built once (only the
stream id changes), honours the server's flow-control windows and frame size, and reads the answer
frames, decoding header blocks with ``hpack`` (the server's encoder keeps a dynamic table, so every
block is decoded, in order). It is a test tool: a protocol error fails the call (and closes the
connection), and the next call opens a new one.

RFC 9113 (HTTP/2) and the gRPC over HTTP/2 protocol are the references; nothing here is pushed,
prioritised or padded by the client.
"""

from __future__ import annotations

import asyncio
import struct

import hpack

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 0, 1, 3, 4, 6, 7, 8, 9
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY = 0x1, 0x1, 0x4, 0x8, 0x20
SETTINGS_ENABLE_PUSH, SETTINGS_INITIAL_WINDOW_SIZE, SETTINGS_MAX_FRAME_SIZE = 0x2, 0x4, 0x5
RECEIVE_WINDOW = (1 << 31) - 1  # what the client lets the server send, per stream and in all


class GrpcCallError(Exception):
    """A call that ended without a message: a gRPC status other than OK, or a transport failure."""


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    """One HTTP/2 frame."""
    return len(payload).to_bytes(3, "big") + bytes((kind, flags)) + stream.to_bytes(4, "big") + payload


def literal(name: str, value: str) -> bytes:
    """An HPACK header field, literal and not indexed (RFC 7541 §6.2.2), names and values short."""
    n, v = name.encode(), value.encode()
    if len(n) > 126 or len(v) > 126:
        raise ValueError(f"header {name!r}: this encoder writes names and values under 127 bytes")
    return b"\x00" + bytes((len(n),)) + n + bytes((len(v),)) + v


def request_block(authority: str, path: str) -> bytes:
    """The HEADERS block of a gRPC unary call to `path`, the same for every call (no dynamic table)."""
    fields = [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", authority),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]
    return b"".join(literal(k, v) for k, v in fields)


class H2Connection(asyncio.Protocol):
    """One HTTP/2 connection that carries one gRPC call at a time (:meth:`call`)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, block: bytes) -> None:
        self._loop = loop
        self._block = block
        self._transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self._decoder = hpack.Decoder()
        self._header_frags: list[bytes] = []
        self._header_flags = 0
        self._stream = -1  # the stream of the call in flight; ids are odd and grow
        self._next_stream = 1
        self._frame_max = 16384  # the server's SETTINGS_MAX_FRAME_SIZE
        self._stream_window_initial = 65535  # the server's SETTINGS_INITIAL_WINDOW_SIZE
        self._conn_window = 65535
        self._stream_window = 0
        self._window_waiter: asyncio.Future[None] | None = None  # a call waiting for a window
        self._unreturned = 0  # DATA bytes received and not yet given back to the connection window
        self._data: list[bytes] = []
        self._status: str | None = None
        self._message = ""
        self._done: asyncio.Future[bytes] | None = None
        self.open = False
        self.window_waits = 0  # times a call waited for the server to open a window

    # -- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        settings = struct.pack(">HI", SETTINGS_ENABLE_PUSH, 0)
        settings += struct.pack(">HI", SETTINGS_INITIAL_WINDOW_SIZE, RECEIVE_WINDOW)
        grow = struct.pack(">I", RECEIVE_WINDOW - 65535)
        transport.write(PREFACE + frame(SETTINGS, 0, 0, settings) + frame(WINDOW_UPDATE, 0, 0, grow))  # type: ignore[attr-defined]
        self.open = True

    def connection_lost(self, exc: Exception | None) -> None:
        self.open = False
        self._fail(f"the connection closed: {exc}" if exc else "the connection closed")

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        pos = 0
        try:
            while len(buf) - pos >= 9:
                length = int.from_bytes(buf[pos : pos + 3], "big")
                if len(buf) - pos < 9 + length:
                    break
                kind, flags = buf[pos + 3], buf[pos + 4]
                stream = int.from_bytes(buf[pos + 5 : pos + 9], "big") & 0x7FFFFFFF
                payload = bytes(buf[pos + 9 : pos + 9 + length])
                pos += 9 + length
                self._on_frame(kind, flags, stream, payload)
        except (ValueError, IndexError, hpack.HPACKError) as e:
            self._fail(f"protocol error: {type(e).__name__}: {e}")
            self.close()
        del buf[:pos]

    # -- frames
    def _on_frame(self, kind: int, flags: int, stream: int, payload: bytes) -> None:
        if kind == DATA:
            self._unreturned += len(payload)
            if flags & PADDED:
                payload = payload[1 : len(payload) - payload[0]]
            if stream == self._stream:
                self._data.append(payload)
                if flags & END_STREAM:
                    self._finish()
        elif kind in (HEADERS, CONTINUATION):
            if kind == HEADERS:
                if flags & PADDED:
                    payload = payload[1 : len(payload) - payload[0]]
                if flags & PRIORITY:
                    payload = payload[5:]
                self._header_frags, self._header_flags = [], flags
            self._header_frags.append(payload)
            if flags & END_HEADERS:
                headers = self._decoder.decode(b"".join(self._header_frags), raw=True)
                if stream == self._stream:
                    for name, value in headers:
                        if name == b"grpc-status":
                            self._status = bytes(value).decode()
                        elif name == b"grpc-message":
                            self._message = bytes(value).decode(errors="replace")
                    if self._header_flags & END_STREAM:
                        self._finish()
        elif kind == SETTINGS:
            if not flags & ACK:
                for i in range(0, len(payload) - 5, 6):
                    key, value = struct.unpack_from(">HI", payload, i)
                    if key == SETTINGS_MAX_FRAME_SIZE:
                        self._frame_max = value
                    elif key == SETTINGS_INITIAL_WINDOW_SIZE:
                        self._stream_window += value - self._stream_window_initial
                        self._stream_window_initial = value
                        self._wake()
                self._write(frame(SETTINGS, ACK, 0))
        elif kind == WINDOW_UPDATE:
            grow = int.from_bytes(payload[:4], "big") & 0x7FFFFFFF
            if stream == 0:
                self._conn_window += grow
            elif stream == self._stream:
                self._stream_window += grow
            self._wake()
        elif kind == PING:
            if not flags & ACK:
                self._write(frame(PING, ACK, 0, payload))
        elif kind == RST_STREAM:
            if stream == self._stream:
                self._fail(f"the server reset the stream (error {int.from_bytes(payload[:4], 'big')})")
        elif kind == GOAWAY:
            self.open = False  # no new calls here; the one in flight may still finish

    def _finish(self) -> None:
        done, self._stream = self._done, -1
        if self._unreturned:  # give the connection window back
            self._write(frame(WINDOW_UPDATE, 0, 0, self._unreturned.to_bytes(4, "big")))
            self._unreturned = 0
        if done is None or done.done():
            return
        if self._status != "0":
            done.set_exception(GrpcCallError(f"grpc-status {self._status}: {self._message}"))
            return
        body = b"".join(self._data)
        n = len(body)
        if n < 5 or body[0] or int.from_bytes(body[1:5], "big") != n - 5:
            done.set_exception(GrpcCallError(f"a malformed or compressed gRPC message of {n} bytes"))
        else:
            done.set_result(body[5:])

    def _fail(self, why: str) -> None:
        if self._done is not None and not self._done.done():
            self._done.set_exception(GrpcCallError(why))
        self._wake()

    def _wake(self) -> None:
        if self._window_waiter is not None and not self._window_waiter.done():
            self._window_waiter.set_result(None)

    def _write(self, data: bytes | memoryview) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(data)

    def close(self) -> None:
        self.open = False
        if self._transport is not None:
            self._transport.close()

    # -- a call
    async def call(self, framed: bytes, timeout: float) -> bytes:
        """One unary call with `framed`, a serialised request with its gRPC prefix
        (:func:`grpc_message`); the serialised answer, or GrpcCallError (a non-OK status, a reset,
        a closed connection, no answer within `timeout` seconds). The message is written as it is,
        never copied, where the windows let it go in one frame."""
        stream, self._next_stream = self._next_stream, self._next_stream + 2
        self._stream, self._data, self._status, self._message = stream, [], None, ""
        self._stream_window = self._stream_window_initial
        self._done = done = self._loop.create_future()
        late = self._loop.call_later(timeout, self._fail, f"no answer in {timeout} s")
        try:
            body = memoryview(framed)
            small = frame(HEADERS, END_HEADERS, stream, self._block)
            sent = 0
            while sent < len(body) and not done.done():
                room = min(self._conn_window, self._stream_window, self._frame_max, len(body) - sent)
                if room <= 0:  # wait for the server to open a window (or for the call to fail)
                    self._write(small)
                    small = b""
                    self._window_waiter = self._loop.create_future()
                    self.window_waits += 1
                    await self._window_waiter
                    continue
                flags = END_STREAM if sent + room == len(body) else 0
                self._write(
                    small + room.to_bytes(3, "big") + bytes((DATA, flags)) + stream.to_bytes(4, "big")
                )
                self._write(body[sent : sent + room])
                small = b""
                sent += room
                self._conn_window -= room
                self._stream_window -= room
            return await done
        finally:
            late.cancel()


def grpc_message(message: bytes) -> bytes:
    """`message` as a gRPC length-prefixed message, uncompressed: what :meth:`H2Connection.call`
    sends."""
    return b"\x00" + len(message).to_bytes(4, "big") + message
