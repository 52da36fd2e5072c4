"""The hostile-client suite's own pure helpers: the gzip bomb is the gzip stream it claims to be, the
HTTP/1.1 answer parser counts pipelined answers, and the HPACK index reference decodes to the header."""

from __future__ import annotations

import gzip

import hpack
from trtforge_dev.hostile import parse_responses
from trtforge_dev.hostile_h2 import _index, grpc_message, gzip_bomb


def test_gzip_bomb_inflates_to_the_zeros_it_claims() -> None:
    bomb = gzip_bomb(3)
    assert len(bomb) < 10_000
    assert gzip.decompress(bomb) == bytes(3 << 20)  # gzip checks the CRC and the length too


def test_parse_responses_counts_pipelined_answers_and_leaves_out_a_partial_one() -> None:
    one = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"
    two = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 3\r\nConnection: close\r\n\r\nbad"
    assert parse_responses(one + two) == [200, 400]
    assert parse_responses(one + two[:20]) == [200]
    assert parse_responses(b"") == []


def test_index_reference_decodes_to_the_header_in_the_table() -> None:
    enc, dec = hpack.Encoder(), hpack.Decoder()
    big = ("x-amplify", "a" * 4000)
    dec.decode(enc.encode([big]))
    assert dec.decode(_index(enc, big) * 3) == [big] * 3


def test_grpc_message_prefix() -> None:
    assert grpc_message(b"abc") == b"\x00\x00\x00\x00\x03abc"
    assert grpc_message(b"", compressed=True) == b"\x01\x00\x00\x00\x00"
