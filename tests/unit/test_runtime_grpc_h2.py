"""The pure parts of the runtime's HTTP/2 gRPC front end: header encoding, grpc-message, grpc-timeout.

The connection itself is tested against a running server, frame by frame
(tests/integration/test_serve_grpc_h2.py), and with tritonclient (test_serve_grpc.py)."""

from __future__ import annotations

import hpack
import pytest
from trtforge_runtime.grpc_calls import Code
from trtforge_runtime.grpc_h2 import (
    MAX_MESSAGE_TEXT,
    frame,
    grpc_message_text,
    literal,
    parse_timeout,
    status_block,
)


@pytest.mark.parametrize("size", [0, 1, 126, 127, 128, 300, 20000])
def test_literals_decode_with_hpack_whatever_their_length(size: int) -> None:
    """HPACK integers with a 7-bit prefix: one byte under 127, continuation bytes from 127 on."""
    value = b"v" * size
    block = literal(b"grpc-message", value) + literal(b"x" * size, b"1")
    assert hpack.Decoder().decode(block, raw=True) == [(b"grpc-message", value), (b"x" * size, b"1")]


def test_status_blocks_decode_to_what_grpc_clients_read() -> None:
    d = hpack.Decoder()
    only = dict(d.decode(status_block(Code.NOT_FOUND, "unknown model 'x'", trailers_only=True)))
    assert only == {
        ":status": "200",
        "content-type": "application/grpc",
        "grpc-status": "5",
        "grpc-message": "unknown model 'x'",
    }
    assert dict(d.decode(status_block(Code.OK, "", trailers_only=False))) == {"grpc-status": "0"}
    unimplemented = dict(d.decode(status_block(Code.UNIMPLEMENTED, "no", trailers_only=False)))
    assert unimplemented["grpc-accept-encoding"] == "identity,deflate,gzip"


def test_grpc_message_is_percent_encoded_outside_printable_ascii_and_cut() -> None:
    assert grpc_message_text("shape [1, 2] 100%") == b"shape [1, 2] 100%25"
    assert grpc_message_text("a\nb\té") == b"a%0Ab%09%C3%A9"
    assert len(grpc_message_text("x" * 5000)) == MAX_MESSAGE_TEXT


@pytest.mark.parametrize(
    "value, seconds",
    [
        (b"1S", 1.0),
        (b"250m", 0.25),
        (b"2M", 120.0),
        (b"1H", 3600.0),
        (b"99999999u", 99.999999),
        (b"5n", 5e-9),
        (b"", None),
        (b"S", None),
        (b"1s", None),  # units are case-sensitive: s is not one
        (b"123456789S", None),  # at most 8 digits
        (b"-1S", None),
        (b"1.5S", None),
    ],
)
def test_grpc_timeout_is_parsed_or_refused(value: bytes, seconds: float | None) -> None:
    got = parse_timeout(value)
    assert got == (None if seconds is None else pytest.approx(seconds))


def test_frames_carry_their_length_type_flags_and_stream() -> None:
    f = frame(0x1, 0x5, 0x7FFFFFFF, b"abc")
    assert f == b"\x00\x00\x03" + b"\x01\x05" + b"\x7f\xff\xff\xff" + b"abc"
    assert frame(0x4, 0x1, 0) == b"\x00\x00\x00\x04\x01\x00\x00\x00\x00"


def test_the_serve_flag_offers_every_front_end_and_defaults_to_the_native_one() -> None:
    """`--grpc-server`'s choices are written out in the CLI (it does not import the server at
    parse time); they must be GrpcFrontEnd's values."""
    from trtforge_runtime.server import GrpcFrontEnd, Settings

    from trtforge.cli import build_parser

    parser = build_parser("serve")
    sub = next(a for a in parser._actions if a.dest == "command")
    serve = sub.choices["serve"]  # type: ignore[index]
    flag = next(a for a in serve._actions if a.dest == "grpc_server")
    assert sorted(flag.choices or ()) == sorted(f.value for f in GrpcFrontEnd)
    assert GrpcFrontEnd(flag.default) is GrpcFrontEnd.NATIVE is Settings("s", "k").grpc_server
