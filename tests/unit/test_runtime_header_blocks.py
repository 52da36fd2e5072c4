"""HeaderBlocks: repeated HPACK blocks answered from an earlier decode, always as hpack decodes them."""

from __future__ import annotations

import random

import hpack
import pytest
from trtforge_runtime.grpc_h2 import literal
from trtforge_runtime.header_blocks import KEPT, MAX_KEPT_BLOCK, HeaderBlocks

LIST_LIMIT = 16 << 10


def _literal_indexed(name: bytes, value: bytes) -> bytes:
    """A literal field with incremental indexing and a new name (RFC 7541 §6.2.1), short strings."""
    return b"\x40" + bytes((len(name),)) + name + bytes((len(value),)) + value


DYNAMIC_62 = b"\xbe"  # the indexed field at index 62: the newest entry of the dynamic table
SIZE_ZERO = b"\x20"  # a dynamic table size update to 0: every entry is evicted


def test_a_block_seen_again_after_the_table_changed_is_decoded_again() -> None:
    """The same bytes name another field once a new entry has shifted the dynamic table."""
    blocks = HeaderBlocks(LIST_LIMIT)
    blocks.decode(_literal_indexed(b"x-a", b"1"))
    assert blocks.decode(DYNAMIC_62) == {b"x-a": b"1"}
    assert blocks.decode(DYNAMIC_62) == {b"x-a": b"1"}
    assert blocks.hits == 1
    blocks.decode(_literal_indexed(b"x-b", b"2"))
    assert blocks.decode(DYNAMIC_62) == {b"x-b": b"2"}
    assert blocks.hits == 1


def test_a_size_update_that_empties_the_table_is_seen() -> None:
    blocks = HeaderBlocks(LIST_LIMIT)
    blocks.decode(_literal_indexed(b"x-a", b"1"))
    assert blocks.decode(DYNAMIC_62) == {b"x-a": b"1"}
    blocks.decode(SIZE_ZERO + b"\x3f\xe1\x1f")  # to 0, then back to 4096: the table is empty
    with pytest.raises(hpack.HPACKError):
        blocks.decode(DYNAMIC_62)


def test_a_block_that_adds_to_the_table_is_never_answered_from_what_was_kept() -> None:
    """Decoding it again adds its entry again: hpack must see it every time."""
    blocks = HeaderBlocks(LIST_LIMIT)
    add = _literal_indexed(b"x-a", b"1")
    blocks.decode(add)
    blocks.decode(add)
    assert blocks.hits == 0
    assert blocks.decode(DYNAMIC_62 + b"\xbf") == {b"x-a": b"1"}  # 62 and 63: the entry twice


def test_errors_are_raised_every_time_and_never_kept() -> None:
    blocks = HeaderBlocks(LIST_LIMIT)
    for _ in range(2):
        with pytest.raises(hpack.HPACKError):
            blocks.decode(DYNAMIC_62)  # an empty table has no index 62
    assert blocks.hits == 0


def test_long_blocks_are_decoded_every_time_and_few_blocks_are_kept() -> None:
    blocks = HeaderBlocks(LIST_LIMIT)
    long = literal(b"n" * (MAX_KEPT_BLOCK + 8), b"v")
    assert blocks.decode(long) == {b"n" * (MAX_KEPT_BLOCK + 8): b"v"}
    blocks.decode(long)
    assert blocks.hits == 0
    static = [bytes((0x80 | i,)) for i in range(2, 2 + KEPT + 1)]  # static-table fields, one each
    for block in static:
        blocks.decode(block)
    blocks.decode(static[-1])
    assert blocks.hits == 1
    blocks.decode(static[0])  # the oldest went when the last came
    assert blocks.hits == 1


def test_an_oversized_header_list_is_refused_every_time() -> None:
    blocks = HeaderBlocks(64)
    block = b"\x00" + b"\x01n" + b"\x7f\x01" + b"v" * 128
    for _ in range(2):
        with pytest.raises(hpack.HPACKError):
            blocks.decode(block)


def test_any_encoder_sequence_decodes_as_hpack_decodes_it() -> None:
    """Blocks from hpack's own encoder (indexing, never-indexed fields, Huffman, table size
    changes, fields that repeat call after call, as gRPC clients send them) decode to what a plain
    decoder fed the same blocks decodes, block by block, and repeated blocks are answered from
    what was kept."""
    rng = random.Random(16)
    encoder = hpack.Encoder()
    plain = hpack.Decoder(max_header_list_size=LIST_LIMIT)
    blocks = HeaderBlocks(LIST_LIMIT)
    call = [
        (b":method", b"POST"),
        (b":scheme", b"http"),
        (b":path", b"/inference.GRPCInferenceService/ModelInfer"),
        (b":authority", b"127.0.0.1:8001"),
        (b"content-type", b"application/grpc"),
        (b"te", b"trailers"),
    ]
    for i in range(600):
        headers = list(call)
        if rng.random() < 0.2:
            headers.append((b"x-tenant", str(rng.randrange(40)).encode()))
        if rng.random() < 0.1:
            headers.append(hpack.NeverIndexedHeaderTuple(b"authorization", str(rng.randrange(5)).encode()))
        if rng.random() < 0.05:
            headers.append((b"grpc-timeout", f"{rng.randrange(1, 999)}m".encode()))
        if rng.random() < 0.02:
            encoder.header_table_size = rng.choice([0, 64, 256, 4096])
        block = encoder.encode(headers, huffman=rng.random() < 0.5)
        assert blocks.decode(block) == dict(plain.decode(block, raw=True)), f"block {i}"
    assert blocks.hits > 100
