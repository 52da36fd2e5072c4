"""Fetching from a store that streams (s3://, the broker): received on one thread, hashed and
written on another (trtforge_runtime.lifecycle.fetch.hash_and_write)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from trtforge_runtime.lifecycle.fetch import hash_and_write


def test_a_fetched_stream_is_hashed_and_written_whole_on_two_threads(tmp_path: Path) -> None:
    chunks = [os.urandom(n) for n in (1, 4096, 1 << 20, 7)]
    with open(tmp_path / "out", "wb") as f:
        got = hash_and_write(iter(chunks), f, depth=1)
    data = b"".join(chunks)
    assert got == (hashlib.sha256(data).hexdigest(), len(data))
    assert (tmp_path / "out").read_bytes() == data


def test_a_failed_write_stops_the_stream_and_is_raised(tmp_path: Path) -> None:
    closed: list[bool] = []

    def stream():  # type: ignore[no-untyped-def]
        try:
            while True:
                yield b"x" * 1000
        finally:
            closed.append(True)

    class Full:
        def write(self, _: bytes) -> int:
            raise OSError(28, "No space left on device")

    chunks = stream()
    with pytest.raises(OSError, match="No space left"):
        hash_and_write(chunks, Full())  # type: ignore[arg-type]
    assert closed == [True]  # closed by the fetch, not left to the garbage collector

    def broken():  # type: ignore[no-untyped-def]
        yield b"x"
        raise ConnectionResetError("peer went away")

    with open(tmp_path / "out", "wb") as f, pytest.raises(ConnectionResetError):
        hash_and_write(broken(), f)
