"""Multi-file LLM artefacts on the local store and on S3 (moto's server on loopback): atomic publish
with the manifest last, fetch with every file verified, a tampered file refused by name."""

from __future__ import annotations

import hashlib
import os
import tracemalloc
from pathlib import Path

import pytest

from tests.llm_artefacts import checkpoint_manifest
from trtforge.contract.llm import (
    ArtefactFile,
    ArtefactFormat,
    ArtefactKind,
    ArtefactManifest,
    Backend,
    Recipe,
    SourceRef,
    file_path,
    manifest_path,
)
from trtforge.store import EngineStore, IntegrityError, ObjectNotFound, StoreError, open_store
from trtforge.store import artefacts as art
from trtforge.store.local import LocalStore
from trtforge.store.s3 import S3Store, make_client, s3_settings

KEY = "c" * 64
SRC = "d" * 64
ENV = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_REGION": "us-east-1"}
KIND = ArtefactKind.CHECKPOINT


def _describe(upload: str, files: list[ArtefactFile], key: str = KEY) -> ArtefactManifest:
    return checkpoint_manifest(
        key,
        SourceRef(uri="s3://models/llama", digest=SRC),
        files,
        upload=upload,
        fmt=ArtefactFormat.HF_SAFETENSORS,
        backend=Backend.TENSORRT_LLM,
        backend_version="1.2.1",
        recipe=Recipe.FP8,
        quantized_type="FP8",
        model_file="config.json",
    )


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> EngineStore:
    if request.param == "local":
        return open_store(str(tmp_path / "store"))
    mp = pytest.MonkeyPatch()
    request.addfinalizer(mp.undo)
    endpoint = request.getfixturevalue("s3_endpoint")
    for k, v in {**ENV, "AWS_ENDPOINT_URL": endpoint}.items():
        mp.setenv(k, v)
    mp.delenv("TRTFORGE_S3_CREDENTIALS_DIR", raising=False)
    mp.delenv("TRTFORGE_S3_CONDITIONAL_WRITES", raising=False)
    bucket = "a-" + hashlib.sha256(request.node.name.encode()).hexdigest()[:12]
    make_client(s3_settings()).create_bucket(Bucket=bucket)
    return S3Store(f"s3://{bucket}/llm", part_size=5 << 20)


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    """A checkpoint folder: a multi-part-sized shard, a nested file, a config."""
    d = tmp_path / "ckpt"
    (d / "tokenizer").mkdir(parents=True)
    (d / "model-00001.safetensors").write_bytes(os.urandom(6 << 20))
    (d / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    (d / "hf_quant_config.json").write_text('{"quantization": {"quant_algo": "FP8"}}')
    (d / "tokenizer" / "tokenizer.json").write_text("{}")
    return d


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_publish_then_fetch_gives_every_file_back_verified(
    store: EngineStore, checkpoint: Path, tmp_path: Path
) -> None:
    manifest, committed = art.publish(store, KIND, KEY, checkpoint, _describe)
    assert committed
    assert [f.path for f in manifest.files] == [
        "config.json", "hf_quant_config.json", "model-00001.safetensors", "tokenizer/tokenizer.json",
    ]  # fmt: skip
    for f in manifest.files:
        assert f.sha256 == _sha(checkpoint / f.path) and f.size == (checkpoint / f.path).stat().st_size
    assert art.read_manifest(store, KIND, KEY) == manifest
    art.verify(store, manifest)
    got = art.fetch(store, KIND, KEY, tmp_path / "out")
    assert got == manifest
    for f in manifest.files:
        assert _sha(tmp_path / "out" / f.path) == f.sha256
    art.verify_folder(tmp_path / "out", manifest)


def test_an_artefact_without_a_manifest_is_absent(store: EngineStore, tmp_path: Path) -> None:
    # Files of an interrupted publish: streamed, never committed.
    store.put_bytes(file_path(KIND, KEY, "0" * 16, "config.json"), b"{}")
    assert art.read_manifest(store, KIND, KEY) is None
    with pytest.raises(ObjectNotFound, match="no manifest"):
        art.fetch(store, KIND, KEY, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_second_publish_returns_the_first_manifest(store: EngineStore, checkpoint: Path) -> None:
    first, committed = art.publish(store, KIND, KEY, checkpoint, _describe)
    (checkpoint / "config.json").write_text('{"changed": true}')
    again, committed_again = art.publish(store, KIND, KEY, checkpoint, _describe)
    assert committed and not committed_again and again == first


def test_a_replacing_publish_commits_a_new_upload_over_the_first(
    store: EngineStore, checkpoint: Path
) -> None:
    """A re-measure after a GPU fault (`trtforge tune --rebuild`) replaces the record at its key."""
    first, _ = art.publish(store, KIND, KEY, checkpoint, _describe)
    (checkpoint / "config.json").write_text('{"changed": true}')
    again, committed = art.publish(store, KIND, KEY, checkpoint, _describe, replace=True)
    assert committed and again.upload != first.upload
    assert art.read_manifest(store, KIND, KEY) == again
    assert (
        again.file("config.json").sha256
        == _sha(checkpoint / "config.json")
        != first.file("config.json").sha256
    )
    art.verify(store, again)


def test_the_loser_of_a_commit_race_reads_the_winner_and_drops_its_upload(
    store: EngineStore, checkpoint: Path
) -> None:
    """The winner commits between the loser's uploads and its commit (the loser read no manifest)."""
    winner: list[ArtefactManifest] = []

    def describe_and_race(upload: str, files: list[ArtefactFile]) -> ArtefactManifest:
        w, ok = art.publish(store, KIND, KEY, checkpoint, _describe)
        assert ok
        winner.append(w)
        return _describe(upload, files)

    got, committed = art.publish(store, KIND, KEY, checkpoint, describe_and_race)
    assert not committed and got == winner[0]
    uploads = {p.split("/")[2] for p in store.list(f"checkpoints/{KEY}/") if not p.endswith("manifest.json")}
    assert uploads == {winner[0].upload}
    art.verify(store, got)


def test_a_tampered_file_is_refused_by_name(store: EngineStore, checkpoint: Path, tmp_path: Path) -> None:
    manifest, _ = art.publish(store, KIND, KEY, checkpoint, _describe)
    shard = file_path(KIND, KEY, manifest.upload, "model-00001.safetensors")
    data = bytearray(store.read_bytes(shard))
    data[4096] ^= 0xFF
    store.put_bytes(shard, bytes(data))
    with pytest.raises(IntegrityError, match=r"file model-00001\.safetensors .*tampered or corrupt"):
        art.verify(store, manifest)
    with pytest.raises(IntegrityError, match=r"model-00001\.safetensors"):
        art.fetch(store, KIND, KEY, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.")]  # no partial folder left


def test_a_truncated_or_missing_file_is_refused(store: EngineStore, checkpoint: Path, tmp_path: Path) -> None:
    manifest, _ = art.publish(store, KIND, KEY, checkpoint, _describe)
    store.put_bytes(file_path(KIND, KEY, manifest.upload, "config.json"), b"{")
    with pytest.raises(IntegrityError, match=r"config\.json has 1 bytes"):
        art.verify(store, manifest)
    store.delete(file_path(KIND, KEY, manifest.upload, "tokenizer/tokenizer.json"))
    with pytest.raises(ObjectNotFound):
        art.verify(store, _describe(manifest.upload, [manifest.file("tokenizer/tokenizer.json")]))


def test_a_local_copy_is_checked_file_by_file(store: EngineStore, checkpoint: Path, tmp_path: Path) -> None:
    manifest, _ = art.publish(store, KIND, KEY, checkpoint, _describe)
    out = tmp_path / "out"
    art.fetch(store, KIND, KEY, out)
    (out / "tokenizer" / "tokenizer.json").write_text("{ }")
    with pytest.raises(IntegrityError, match=r"tokenizer/tokenizer\.json"):
        art.verify_folder(out, manifest)
    (out / "tokenizer" / "tokenizer.json").unlink()
    with pytest.raises(IntegrityError, match=r"tokenizer/tokenizer\.json is missing"):
        art.verify_folder(out, manifest)
    with pytest.raises(StoreError, match="exists already"):
        art.fetch(store, KIND, KEY, out)


def test_a_manifest_that_is_not_valid_is_a_clear_error(store: EngineStore) -> None:
    store.commit(manifest_path(KIND, KEY), b'{"kind": "checkpoint"}')
    with pytest.raises(StoreError, match="not a valid artefact manifest"):
        art.read_manifest(store, KIND, KEY)


def test_a_folder_with_a_link_or_hidden_file_is_refused(tmp_path: Path) -> None:
    d = tmp_path / "d"
    d.mkdir()
    (d / "a").write_text("a")
    (d / "b").symlink_to(d / "a")
    with pytest.raises(StoreError, match="b is a symbolic link"):
        art.local_files(d)
    (d / "b").unlink()
    (d / ".secret").write_text("x")
    with pytest.raises(StoreError, match="hidden name"):
        art.local_files(d)


def test_make_manifest_must_describe_what_was_uploaded(tmp_path: Path, checkpoint: Path) -> None:
    store = LocalStore(tmp_path / "s")
    with pytest.raises(ValueError, match="make_manifest"):
        art.publish(store, KIND, KEY, checkpoint, lambda upload, files: _describe(upload, files[:1]))
    assert art.read_manifest(store, KIND, KEY) is None


def test_a_large_artefact_is_streamed_not_held_in_memory(tmp_path: Path) -> None:
    """Publish and fetch 128 MiB through the local store with under 16 MiB traced at the peak."""
    src = tmp_path / "big"
    src.mkdir()
    with (src / "shard.safetensors").open("wb") as f:
        block = os.urandom(1 << 20)
        for _ in range(128):
            f.write(block)
    store = LocalStore(tmp_path / "s")
    tracemalloc.start()
    try:
        manifest, _ = art.publish(store, KIND, KEY, src, _describe)
        art.fetch(store, KIND, KEY, tmp_path / "out")
        _now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert manifest.total_bytes == 128 << 20
    assert peak < 16 << 20, f"peak {peak} bytes traced"


def test_a_pvc_artefact_is_verified_in_place(store: EngineStore, checkpoint: Path) -> None:
    manifest, _ = art.publish(store, KIND, KEY, checkpoint, _describe)
    folder = art.in_place(store, manifest)
    if not isinstance(store, LocalStore):
        assert folder is None
        return
    assert folder is not None
    art.verify_folder(folder, manifest)
    (folder / "config.json").write_text("{}")
    with pytest.raises(IntegrityError, match=r"config\.json"):
        art.verify_folder(folder, manifest)
