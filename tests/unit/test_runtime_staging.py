"""Where a downloaded engine file is verified before it loads (trtforge_runtime.lifecycle.staging): the choice
as a pure function of the facts, and the sealed memfd and its cache copy on this Linux kernel."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from trtforge_runtime.lifecycle.staging import (
    Staging,
    copy_to_cache,
    open_memfd,
    parse_available,
    parse_limit,
    seal,
    staging_for,
)

GIB = 1 << 30


def test_memory_only_for_a_lone_worker_and_a_known_size_within_a_quarter_of_the_budget() -> None:
    assert staging_for(100 << 20, 1, 8 * GIB) is Staging.MEMORY
    assert staging_for(2 * GIB, 1, 8 * GIB) is Staging.MEMORY  # exactly a quarter
    assert staging_for(2 * GIB + 1, 1, 8 * GIB) is Staging.DISK
    assert staging_for(100 << 20, 2, 8 * GIB) is Staging.DISK  # the other workers start from the cache
    assert staging_for(100 << 20, 0, 8 * GIB) is Staging.DISK  # an unreadable worker count
    assert staging_for(None, 1, 8 * GIB) is Staging.DISK  # the size is not known
    assert staging_for(100 << 20, 1, None) is Staging.DISK  # nor the memory


def test_the_memory_budget_is_read_from_cgroup_limits_and_meminfo() -> None:
    assert parse_limit("max\n") is None  # cgroup v2, no limit
    assert parse_limit("9223372036854771712\n") is None  # cgroup v1's "no limit"
    assert parse_limit("4294967296\n") == 4 * GIB
    assert parse_available("MemTotal:  24000000 kB\nMemAvailable:   1048576 kB\n") == GIB
    assert parse_available("MemTotal:  24000000 kB\n") is None
    with pytest.raises(ValueError):
        parse_limit("lots")


def _memfd_with(data: bytes) -> int:
    fd = open_memfd("test")
    os.write(fd, data)
    seal(fd)
    return fd


def test_a_sealed_memfd_cannot_be_changed() -> None:
    fd = _memfd_with(b"engine")
    try:
        with pytest.raises(PermissionError):
            os.pwrite(fd, b"E", 0)
        with pytest.raises(PermissionError):
            os.ftruncate(fd, 1)
        with pytest.raises(PermissionError):
            os.pwrite(fd, b"more", 6)
        assert os.pread(fd, 100, 0) == b"engine"
    finally:
        os.close(fd)


def test_the_cache_copy_lands_whole_then_the_descriptor_reads_the_file(tmp_path: Path) -> None:
    data = os.urandom(3 << 20)
    fd = _memfd_with(data)
    committed: list[Path] = []
    try:
        dst = tmp_path / "model.onnx"
        assert copy_to_cache(fd, len(data), dst, committed.append).result(timeout=60) == dst
        assert committed == [dst] and dst.read_bytes() == data
        assert os.fstat(fd).st_ino == dst.stat().st_ino  # the memory copy is given back
        assert Path(f"/proc/self/fd/{fd}").read_bytes() == data
        assert [p.name for p in tmp_path.iterdir()] == ["model.onnx"]  # no temporary left
    finally:
        os.close(fd)


def test_a_cache_copy_that_fails_keeps_the_memory_copy(tmp_path: Path) -> None:
    data = b"engine" * 1000
    fd = _memfd_with(data)
    try:
        dst = tmp_path / "missing-dir" / "model.onnx"
        with pytest.raises(FileNotFoundError):
            copy_to_cache(fd, len(data), dst, lambda p: None).result(timeout=60)
        assert Path(f"/proc/self/fd/{fd}").read_bytes() == data
        with pytest.raises(PermissionError):
            os.pwrite(fd, b"E", 0)  # still the sealed memfd
    finally:
        os.close(fd)
