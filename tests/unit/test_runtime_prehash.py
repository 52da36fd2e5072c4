"""The pre-hash: an engine on a mounted store hashed in place before the contract is imported, and
what the usual in-place verification makes of it (it checks the digest as if it made it)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from trtforge_runtime import prehash
from trtforge_runtime.errors import Refusal
from trtforge_runtime.fetch import fetch_engine

from tests.unit.test_runtime import KEY, _manifest, _store
from trtforge.contract import layout
from trtforge.store import local as local_store
from trtforge.store import open_store


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
