"""The pre-hash: an engine on a mounted store hashed in place before the contract is imported, and
what the usual in-place verification makes of it (it checks the digest as if it made it)."""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import cast

import pytest
from trtforge_runtime.errors import Refusal
from trtforge_runtime.lifecycle import prehash
from trtforge_runtime.lifecycle.fetch import fetch_engine

from tests.unit.test_runtime import KEY, _manifest, _RemoteStore, _store
from trtforge.contract import layout
from trtforge.store import EngineStore, StoreError, open_store
from trtforge.store import local as local_store


def test_it_resolves_mounted_stores_as_the_store_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert (prehash.PVC_ROOT_ENV, prehash.DEFAULT_PVC_ROOT) == (
        local_store.PVC_ROOT_ENV,
        local_store.DEFAULT_PVC_ROOT,
    )
    monkeypatch.setenv(prehash.PVC_ROOT_ENV, str(tmp_path))
    for uri in (
        "pvc://claim",
        "pvc://claim/sub/dir/",
        f"file://{tmp_path}/s",
        str(tmp_path / "plain"),
        "rel/dir",
    ):
        assert prehash.mounted_root(uri) == local_store.local_store_for(uri).root, uri
    monkeypatch.delenv(prehash.PVC_ROOT_ENV)
    assert prehash.mounted_root("pvc://c/p") == local_store.local_store_for("pvc://c/p").root
    for uri in (
        "s3://bucket/prefix",
        "https://broker:8443",
        "pvc://",
        "pvc://c/../x",
        "file://rel",
        "",
        "gs://b",
    ):
        assert prehash.mounted_root(uri) is None, uri


def test_it_hashes_only_plain_file_names_of_the_raw_manifest() -> None:
    raw = {"engine_file": "model.onnx", "canary": {"file": "canary.npz"}}
    assert prehash.files_to_hash(raw) == ["model.onnx", "canary.npz"]
    assert prehash.files_to_hash({"engine_file": "../x", "canary": {"file": "a/b"}}) == []
    assert prehash.files_to_hash({"engine_file": "manifest.json", "canary": "c"}) == []
    assert prehash.files_to_hash({"engine_file": 3}) == []
    assert prehash.files_to_hash(["model.onnx"]) == []


def test_a_marker_vouches_only_for_the_same_file_unchanged(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_bytes(b"x")
    st = os.stat(f)
    marker = {"sha256": "s", "size": 1, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino, "dev": st.st_dev}
    assert prehash.marker_vouches(marker, st)
    assert not prehash.marker_vouches({**marker, "ino": st.st_ino + 1}, st)
    assert not prehash.marker_vouches({k: v for k, v in marker.items() if k != "dev"}, st)
    assert not prehash.marker_vouches("not a marker", st)


def test_the_in_place_check_takes_the_pre_hash_and_still_refuses_a_wrong_file(tmp_path: Path) -> None:
    artifact, canary = b"x" * 10_000, b"canary"
    root = _store(tmp_path, artifact, canary, _manifest(artifact, canary))
    cache = tmp_path / "cache"
    in_store = root / layout.engine_dir(KEY) / "model.onnx"
    t = prehash.begin(str(root), KEY, cache)
    assert t is not None
    t.join()
    got = fetch_engine(open_store(str(root)), KEY, cache)
    assert got.hashed_bytes == len(artifact) + len(canary)
    assert got.artifact.read_bytes() == artifact  # the pre-hash's own descriptor, handed on
    assert prehash.take(in_store) is None  # taken once

    # A restart: the markers vouch, so the pre-hash reads nothing and leaves it to the usual path.
    t = prehash.begin(str(root), KEY, cache)
    assert t is not None
    t.join()
    assert fetch_engine(open_store(str(root)), KEY, cache).hashed_bytes == 0

    # A file that does not match the manifest: pre-hashed, and refused as before.
    in_store.write_bytes(b"y" * 10_000)
    t = prehash.begin(str(root), KEY, tmp_path / "fresh")
    assert t is not None
    t.join()
    with pytest.raises(Refusal, match="does not match the manifest") as e:
        fetch_engine(open_store(str(root)), KEY, tmp_path / "fresh")
    assert e.value.reason == "EngineIntegrity"


def test_nothing_begins_for_a_remote_store_a_bad_key_or_an_unreadable_manifest(tmp_path: Path) -> None:
    assert prehash.begin("s3://bucket/prefix", KEY, tmp_path) is None
    assert prehash.begin(str(tmp_path), "not-a-key", tmp_path) is None
    assert prehash.begin(str(tmp_path), KEY, tmp_path) is None  # no manifest there
    d = tmp_path / layout.engine_dir(KEY)
    d.mkdir(parents=True)
    (d / layout.MANIFEST).write_text("{not json")
    assert prehash.begin(str(tmp_path), KEY, tmp_path) is None


def test_its_digest_is_the_files_sha256(tmp_path: Path) -> None:
    data = os.urandom(prehash.HASH_CHUNK + 12345)
    (tmp_path / "f").write_bytes(data)
    fd = os.open(tmp_path / "f", os.O_RDONLY)
    try:
        assert prehash.hash_fd(fd) == hashlib.sha256(data).hexdigest()
    finally:
        os.close(fd)


def test_a_file_it_cannot_map_is_hashed_in_chunks_to_the_same_digest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "empty").write_bytes(b"")  # mmap refuses an empty file
    assert prehash.hash_file(tmp_path / "empty") == hashlib.sha256(b"").hexdigest()
    data = os.urandom(2 * prehash.HASH_CHUNK + 777)
    (tmp_path / "f").write_bytes(data)

    def no_mmap(*args: object, **kwargs: object) -> None:
        raise OSError(19, "No such device")  # what a file system without mmap answers

    monkeypatch.setattr(prehash.mmap, "mmap", no_mmap)
    fd = os.open(tmp_path / "f", os.O_RDONLY)
    try:
        os.lseek(fd, 5, os.SEEK_SET)
        assert prehash.hash_fd(fd) == hashlib.sha256(data).hexdigest()  # from the start, always
        assert os.lseek(fd, 0, os.SEEK_CUR) == 5  # and the offset left alone
    finally:
        os.close(fd)


def test_hash_file_is_hash_fd_of_a_regular_file_and_refuses_anything_else(tmp_path: Path) -> None:
    data = os.urandom(12345)
    (tmp_path / "f").write_bytes(data)
    assert prehash.hash_file(tmp_path / "f") == hashlib.sha256(data).hexdigest()
    with pytest.raises(prehash.NotRegularFile, match="is a directory, not a regular file") as e:
        prehash.hash_file(tmp_path)
    assert str(tmp_path) in str(e.value)
    with pytest.raises(prehash.NotRegularFile, match="character device"):
        prehash.hash_file("/dev/null")


@contextmanager
def _fifo(path: Path, data: bytes, spare: Path, readers: int = 1) -> Iterator[None]:
    """`path` made a FIFO whose writer hands `data` (small enough for the pipe's buffer) to each of
    the first `readers` readers that open it; on exit, what is left of them is released (through
    `spare`, a second name of the same FIFO, in case the code under test replaced `path`)."""
    os.mkfifo(spare)
    path.unlink(missing_ok=True)
    os.link(spare, path)

    def write() -> None:
        for _ in range(readers):
            fd = os.open(spare, os.O_WRONLY)  # waits for a reader
            try:
                os.write(fd, data)
            except BrokenPipeError:
                pass  # the reader looked and closed
            finally:
                os.close(fd)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        yield
    finally:
        while writer.is_alive():  # stand in for the readers that did not come
            release = os.open(spare, os.O_RDONLY | os.O_NONBLOCK)
            writer.join(0.05)
            os.close(release)


def test_a_fifo_under_a_name_the_manifest_gives_is_refused_never_read(tmp_path: Path) -> None:
    """A FIFO there would block the reader until something writes to it (and fed the right bytes,
    the pre-hash's digest would even match). The in-place check refuses it, naming it, unread."""
    artifact, canary = b"x" * 10_000, b"canary"
    root = _store(tmp_path, artifact, canary, _manifest(artifact, canary))
    in_store = root / layout.engine_dir(KEY) / "model.onnx"
    with _fifo(in_store, artifact, tmp_path / "fifo"):
        with pytest.raises(Refusal, match=r"model\.onnx in store .* is a FIFO, not a regular file") as e:
            fetch_engine(open_store(str(root)), KEY, tmp_path / "cache")
        assert e.value.reason == "EngineIntegrity"


def test_the_pre_hash_leaves_a_fifo_to_the_usual_path(tmp_path: Path) -> None:
    artifact, canary = b"x" * 10_000, b"canary"
    root = _store(tmp_path, artifact, canary, _manifest(artifact, canary))
    in_store = root / layout.engine_dir(KEY) / "model.onnx"
    with _fifo(in_store, artifact, tmp_path / "fifo"):
        t = prehash.begin(str(root), KEY, tmp_path / "cache")
        assert t is not None
        t.join()
        assert prehash.take(in_store) is None
        with pytest.raises(Refusal, match="is a FIFO, not a regular file"):
            fetch_engine(open_store(str(root)), KEY, tmp_path / "cache")


def test_the_pre_hash_does_not_read_a_fifo_manifest(tmp_path: Path) -> None:
    """It runs on the main thread before anything else: a FIFO manifest must not block it."""
    artifact, canary = b"x" * 10_000, b"canary"
    root = _store(tmp_path, artifact, canary, m := _manifest(artifact, canary))
    manifest = root / layout.engine_dir(KEY) / layout.MANIFEST
    with _fifo(manifest, m.to_json().encode(), tmp_path / "fifo"):
        assert prehash.begin(str(root), KEY, tmp_path / "cache") is None
        with pytest.raises(StoreError, match=r"manifest\.json is not a regular file"):
            open_store(str(root)).read_bytes(layout.manifest_path(KEY))


def test_a_cached_copy_that_is_not_a_regular_file_is_fetched_again(tmp_path: Path) -> None:
    artifact, canary = b"x" * 10_000, b"canary"
    root = _store(tmp_path, artifact, canary, _manifest(artifact, canary))
    store = cast(EngineStore, _RemoteStore(open_store(str(root))))
    cache = tmp_path / "cache"
    (cache / KEY).mkdir(parents=True)
    with _fifo(cache / KEY / "canary.npz", canary, tmp_path / "fifo"):  # no size to tell it apart
        got = fetch_engine(store, KEY, cache)
    assert got.downloaded_bytes == len(artifact) + len(canary)
    assert got.canary.is_file() and got.canary.read_bytes() == canary
