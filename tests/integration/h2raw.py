"""A frame-level HTTP/2 client for the gRPC tests: it sends whatever frames a test names (well-formed
or not) and reads the server's frames one by one. Header blocks are encoded and decoded with
``hpack``; requests are built with tritonclient's own protobuf messages."""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass

import hpack
import numpy as np
import tritonclient.grpc.service_pb2 as triton_pb

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 0, 1, 3, 4, 6, 7, 8, 9
END_STREAM, ACK, END_HEADERS, PADDED = 0x1, 0x1, 0x4, 0x8
INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE = 0x4, 0x5
INFER = "/inference.GRPCInferenceService/ModelInfer"


@dataclass
class Frame:
    kind: int
    flags: int
    stream: int
    payload: bytes


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes((kind, flags)) + stream.to_bytes(4, "big") + payload


def grpc_message(message: bytes, compressed: bool = False) -> bytes:
    return bytes((int(compressed),)) + len(message).to_bytes(4, "big") + message


def mlp_request(x: np.ndarray) -> bytes:
    """A serialised ModelInferRequest for the MLP's input `x`, as tritonclient's messages write it."""
    msg = triton_pb.ModelInferRequest(model_name="mlp")
    t = msg.inputs.add()
    t.name, t.datatype = "x", "FP32"
    t.shape.extend(x.shape)
    msg.raw_input_contents.append(np.ascontiguousarray(x, np.float32).tobytes())
    return bytes(msg.SerializeToString())


def mlp_answer(message: bytes) -> np.ndarray:
    """The MLP's output `y` from a serialised ModelInferResponse."""
    msg = triton_pb.ModelInferResponse.FromString(message)
    out = msg.outputs[0]
    assert out.name == "y" and out.datatype == "FP32", msg
    return np.frombuffer(msg.raw_output_contents[0], np.float32).reshape(list(out.shape))


class RawH2:
    """One connection to host:port, opened with the preface and `settings` (and, with `rcvbuf`,
    that receive buffer, set before connecting)."""

    def __init__(
        self, port: int, settings: dict[int, int] | None = None, preface: bool = True, rcvbuf: int = 0
    ) -> None:
        self.sock = socket.socket()
        if rcvbuf:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(30)
        self.sock.connect(("127.0.0.1", port))
        self.encoder = hpack.Encoder()
        self.decoder = hpack.Decoder()
        self._buf = b""
        self._backlog: list[Frame] = []  # frames of other streams, read while waiting for one
        self.closed = False
        if preface:
            body = b"".join(struct.pack(">HI", k, v) for k, v in (settings or {}).items())
            self.send_raw(PREFACE + frame(SETTINGS, 0, 0, body))

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send(self, kind: int, flags: int, stream: int, payload: bytes = b"") -> None:
        self.send_raw(frame(kind, flags, stream, payload))

    def headers_block(self, path: str = INFER, **extra: str) -> bytes:
        fields = [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", path),
            (":authority", "test"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
            *((k.replace("_", "-"), v) for k, v in extra.items()),
        ]
        return bytes(self.encoder.encode(fields))

    def call(self, stream: int, message: bytes, path: str = INFER, **extra: str) -> None:
        """A whole unary call on `stream`: HEADERS, then the message in one DATA frame that ends it."""
        self.send(HEADERS, END_HEADERS, stream, self.headers_block(path, **extra))
        self.send(DATA, END_STREAM, stream, grpc_message(message))

    def read(self) -> Frame | None:
        """The next frame, or None once the server has closed the connection."""
        while True:
            if len(self._buf) >= 9:
                n = int.from_bytes(self._buf[:3], "big")
                if len(self._buf) >= 9 + n:
                    f = Frame(
                        self._buf[3],
                        self._buf[4],
                        int.from_bytes(self._buf[5:9], "big") & 0x7FFFFFFF,
                        self._buf[9 : 9 + n],
                    )
                    self._buf = self._buf[9 + n :]
                    return f
            try:
                got = self.sock.recv(1 << 16)
            except ConnectionResetError:
                got = b""
            if not got:
                self.closed = True
                return None
            self._buf += got

    def until(self, kind: int, stream: int | None = None, flags: int = 0) -> tuple[Frame | None, list[Frame]]:
        """Read frames up to the first of `kind` (on `stream`, with every bit of `flags`); it and the
        frames before it. (None, frames) if the connection closed first. PINGs and SETTINGS from the
        server are acknowledged as they come."""
        seen: list[Frame] = []
        while (f := self.read()) is not None:
            if f.kind == SETTINGS and not f.flags & ACK:
                self.send(SETTINGS, ACK, 0)
            if f.kind == kind and (stream is None or f.stream == stream) and f.flags & flags == flags:
                return f, seen
            seen.append(f)
        return None, seen

    def answer(self, stream: int) -> tuple[dict[str, str], bytes]:
        """The call on `stream` to its end: its trailers (or trailers-only headers) and its message
        bytes (without the gRPC prefix; empty when none came)."""
        data = b""
        while True:
            f, _ = self.until_stream(stream)
            assert f is not None, "the connection closed before the call ended"
            if f.kind == DATA:
                data += f.payload
                if f.payload:  # give the windows back, as a client does
                    grow = len(f.payload).to_bytes(4, "big")
                    self.send(WINDOW_UPDATE, 0, 0, grow)
                    self.send(WINDOW_UPDATE, 0, stream, grow)
            elif f.kind == HEADERS:
                fields = {k.decode(): v.decode() for k, v in self.decoder.decode(f.payload, raw=True)}
                if f.flags & END_STREAM:
                    return fields, data[5:]
            elif f.kind == RST_STREAM:
                raise AssertionError(f"stream {stream} reset: {int.from_bytes(f.payload, 'big')}")

    def until_stream(self, stream: int) -> tuple[Frame | None, list[Frame]]:
        """The next frame on `stream`, and the connection-level frames read before it. Frames of
        other streams are kept for their own calls of this method (calls on one connection may
        end in any order; the server under test never indexes its header blocks, so they decode
        in any order too)."""
        for k, f in enumerate(self._backlog):
            if f.stream == stream:
                del self._backlog[k]
                return f, []
        seen: list[Frame] = []
        while (f := self.read()) is not None:
            if f.kind == SETTINGS and not f.flags & ACK:
                self.send(SETTINGS, ACK, 0)
            if f.stream == stream:
                return f, seen
            if f.stream:
                self._backlog.append(f)
            else:
                seen.append(f)
        return None, seen

    def goaway_code(self) -> int | None:
        """Read to the server's GOAWAY: its error code (None if the connection closed without one)."""
        f, _ = self.until(GOAWAY)
        return None if f is None else int.from_bytes(f.payload[4:8], "big")

    def close(self) -> None:
        self.sock.close()
