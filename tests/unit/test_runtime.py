"""Runtime pieces in-process: v2 codec, request validation, GPU identity check, the verified cache."""

from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, cast

import numpy as np
import pytest
from trtforge_runtime.errors import Refusal, RequestError
from trtforge_runtime.lifecycle import fetch
from trtforge_runtime.lifecycle.fetch import fetch_engine
from trtforge_runtime.lifecycle.identity import check_identity
from trtforge_runtime.lifecycle.staging import Staging
from trtforge_runtime.protocol.v2 import HEADER_LENGTH, decode_request, encode_response
from trtforge_runtime.serving.model import ModelSpec, model_spec

from trtforge.contract import layout
from trtforge.contract.engine_key import BuildConfig, ShapeRange
from trtforge.contract.gpu import GPUTarget, known_identity
from trtforge.contract.manifest import Accuracy, CanaryRef, Manifest, TensorSpec
from trtforge.contract.termination import EXIT_GPU_FAULT, TerminationMessage
from trtforge.store import EngineStore, open_store
from trtforge.store.base import PutResult, stream_to, verify

H100 = known_identity(GPUTarget(gpu="NVIDIA-H100-80GB-HBM3"))
KEY = "a" * 64


def _manifest(
    artifact: bytes = b"engine",
    canary: bytes = b"canary",
    inputs: list[TensorSpec] | None = None,
    **build: object,
) -> Manifest:
    return Manifest(
        key=KEY,
        engine_file="model.onnx",
        sha256=hashlib.sha256(artifact).hexdigest(),
        size_bytes=len(artifact),
        backend="onnxruntime",
        backend_version="1.0",
        cuda="none",
        gpu=H100,
        build=BuildConfig(
            precision="fp32",
            profiles=({"x": ShapeRange(min=(1, 4), opt=(8, 4), max=(16, 4))},),
            **build,  # type: ignore[arg-type]
        ),
        model_uri="s3://models/mlp.onnx",
        model_sha256="b" * 64,
        inputs=inputs or [TensorSpec(name="x", dtype="float32", shape=[-1, 4])],
        outputs=[
            TensorSpec(name="y", dtype="float32", shape=[-1, 2]),
            TensorSpec(name="s", dtype="str", shape=[-1]),
        ],
        build_seconds=0.0,
        accuracy=Accuracy(samples=1, max_abs_error=0, max_rel_error=0, atol=0, rtol=0, passed=True),
        canary=CanaryRef(file="canary.npz", sha256=hashlib.sha256(canary).hexdigest(), atol=1e-4, rtol=1e-3),
    )


def bytes_request() -> tuple[ModelSpec, bytes, int]:
    """A model taking one BYTES input `t`, and a binary request to it of [b"a", b"bc"]: the spec,
    the body and its JSON header's length."""
    blob = b"".join(struct.pack("<I", len(v)) + v for v in (b"a", b"bc"))
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": "t",
                    "datatype": "BYTES",
                    "shape": [2],
                    "parameters": {"binary_data_size": len(blob)},
                }
            ]
        }
    ).encode()
    text = model_spec(_manifest(inputs=[TensorSpec(name="t", dtype="str", shape=[-1])]), "text")
    return text, head + blob, len(head)


def test_spec_takes_the_max_batch_from_the_profile_and_names_the_model_after_its_file() -> None:
    spec = model_spec(_manifest(), "mlp")
    assert spec.max_batch == 16 and spec.platform == "onnxruntime_onnx"
    assert model_spec(_manifest(), "mlp", max_batch_cap=4).max_batch == 4
    assert spec.validate({"x": np.zeros((3, 4), np.float32)}) == 3
    for bad, msg in [
        ({"x": np.zeros((3, 5), np.float32)}, r"shape \[3, 5\], expected \[-1, 4\]"),
        ({"x": np.zeros((3, 4), np.float64)}, "datatype FP64, expected FP32"),
        ({"x": np.zeros((17, 4), np.float32)}, "exceeds the model's max batch size 16"),
        ({}, "missing input"),
    ]:
        with pytest.raises(RequestError, match=msg):
            spec.validate(bad)


def test_binary_request_and_mixed_response_round_trip() -> None:
    spec = model_spec(_manifest(), "mlp")
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    head = json.dumps(
        {
            "id": "r1",
            "inputs": [
                {"name": "x", "datatype": "FP32", "shape": [2, 4], "parameters": {"binary_data_size": 32}}
            ],
            "outputs": [{"name": "y", "parameters": {"binary_data": True}}, {"name": "s"}],
        }
    ).encode()
    req = decode_request(head + x.tobytes(), len(head), spec)
    np.testing.assert_array_equal(req.inputs["x"], x)
    assert req.outputs == [("y", True), ("s", False)]
    y = np.array([[1.5, 2.5], [3.5, 4.5]], np.float32)
    s = np.array([b"cat", b"dog"], dtype=object)
    body, hl = encode_response(spec, req, {"y": y, "s": s})
    assert hl is not None
    header = json.loads(body[:hl])
    assert header["id"] == "r1"
    assert header["outputs"][0]["parameters"] == {"binary_data_size": 16}
    np.testing.assert_array_equal(np.frombuffer(body[hl:], np.float32).reshape(2, 2), y)
    assert header["outputs"][1] == {"name": "s", "datatype": "BYTES", "shape": [2], "data": ["cat", "dog"]}


def test_json_and_bytes_inputs_and_request_errors() -> None:
    spec = model_spec(_manifest(), "mlp")
    req = decode_request(
        json.dumps(
            {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [[1, 2, 3, 4]]}]}
        ).encode(),
        None,
        spec,
    )
    assert req.inputs["x"].dtype == np.float32 and req.outputs == [("y", False), ("s", False)]
    text, body, hl = bytes_request()
    assert list(decode_request(body, hl, text).inputs["t"]) == [b"a", b"bc"]
    bad = [
        (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2]}]}', "2 values"),
        (b'{"inputs": [{"name": "x", "datatype": "FP33", "shape": [1], "data": [1]}]}', "datatype 'FP33'"),
        (b'{"inputs": [{"name": "x", "datatype": "FP64", "shape": [1, 4], "data": [1]}]}', "expected FP32"),
        (
            b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "parameters": '
            b'{"binary_data_size": 16}}]}',
            "does not fit",
        ),
        (b'{"inputs": []}   ', None),
    ]
    for body, msg in bad[:4]:
        with pytest.raises(RequestError, match=msg):
            decode_request(body, len(body) if b"binary" in body else None, spec)
    with pytest.raises(RequestError, match="not claimed"):
        decode_request(bad[4][0] + b"xx", len(bad[4][0]), spec)
    assert HEADER_LENGTH == "Inference-Header-Content-Length"


def test_identity_check_names_what_differs() -> None:
    check_identity(_manifest(), H100)
    b200 = known_identity(GPUTarget(gpu="NVIDIA-B200"))
    with pytest.raises(Refusal, match="differs in GPU product;") as e:
        check_identity(_manifest(), known_identity(GPUTarget(gpu="NVIDIA-H200")))
    assert e.value.reason == "GPUMismatch"
    with pytest.raises(Refusal, match="compute capability"):
        check_identity(_manifest(), b200)
    with pytest.raises(Refusal, match="MIG profile"):
        check_identity(_manifest(), known_identity(GPUTarget(gpu="NVIDIA-H100-80GB-HBM3", mig="1g.10gb")))
    # sameComputeCapability engines may run on any SM 9.0 product of the same architecture.
    check_identity(
        _manifest(hardware_compatibility="sameComputeCapability"),
        known_identity(GPUTarget(gpu="NVIDIA-H200")),
    )


def _store(tmp: Path, artifact: bytes, canary: bytes, manifest: Manifest) -> Path:
    d = tmp / "store" / layout.engine_dir(KEY)
    d.mkdir(parents=True)
    (d / "model.onnx").write_bytes(artifact)
    (d / "canary.npz").write_bytes(canary)
    (d / layout.MANIFEST).write_text(manifest.to_json())
    return tmp / "store"


class _RemoteStore:
    """A store that is not on a mounted volume (as s3:// or the broker are to the runtime): it only
    streams, so the runtime must copy. The bytes come from a real local store underneath."""

    def __init__(self, inner: EngineStore) -> None:
        self.inner, self.uri, self.read_only = inner, f"remote+{inner.uri}", True

    def get(self, path: str, dst: BinaryIO, expected_sha256: str | None = None) -> PutResult:
        return verify(stream_to(self.iter_chunks(path), dst, path), expected_sha256, self.uri)

    def iter_chunks(self, path: str, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        return self.inner.iter_chunks(path, chunk_size)


def _remote_engine(tmp: Path) -> tuple[bytes, bytes, Path, EngineStore]:
    """An engine's artifact and canary, the local store under `tmp` that holds them, and a
    :class:`_RemoteStore` over it."""
    artifact, canary = b"x" * 10_000, b"canary"
    root = _store(tmp, artifact, canary, _manifest(artifact, canary))
    return artifact, canary, root, cast(EngineStore, _RemoteStore(open_store(str(root))))


def test_fetch_copies_from_a_remote_store_and_trusts_only_an_unchanged_marked_copy(tmp_path: Path) -> None:
    artifact, canary, root, store = _remote_engine(tmp_path)
    cache = tmp_path / "cache"
    first = fetch_engine(store, KEY, cache, where=Staging.DISK)
    assert first.downloaded_bytes == len(artifact) + len(canary) and first.cache_written is None
    assert first.artifact.parent == cache / KEY and first.artifact.read_bytes() == artifact
    assert fetch_engine(store, KEY, cache).downloaded_bytes == 0  # marker + unchanged stat: no read
    first.artifact.write_bytes(b"y" * 10_000)  # the cached copy changes: re-hashed, fetched again
    again = fetch_engine(store, KEY, cache, where=Staging.DISK)
    assert again.downloaded_bytes == len(artifact) and again.artifact.read_bytes() == artifact

    (root / layout.engine_dir(KEY) / "model.onnx").write_bytes(b"x" * 9_999 + b"z")  # tampered in the store
    with pytest.raises(Refusal, match="does not match the manifest") as e:
        fetch_engine(store, KEY, tmp_path / "fresh-cache", where=Staging.DISK)
    assert e.value.reason == "EngineIntegrity"
    with pytest.raises(Refusal, match="does not exist") as e:
        fetch_engine(store, "b" * 64, cache)
    assert e.value.reason == "EngineIntegrity"


def test_fetch_stages_a_download_in_sealed_memory_and_writes_the_cache_copy_behind(tmp_path: Path) -> None:
    artifact, canary, _, store = _remote_engine(tmp_path)
    cache = tmp_path / "cache"
    first = fetch_engine(store, KEY, cache, where=Staging.MEMORY)
    assert first.downloaded_bytes == len(artifact) + len(canary)
    assert first.artifact.parent == Path("/proc/self/fd") and first.artifact.read_bytes() == artifact
    assert first.canary == cache / KEY / "canary.npz"  # its size is not in the manifest: on disk
    assert first.cache_written is not None
    cached = first.cache_written.result(timeout=60)
    assert cached == cache / KEY / "model.onnx" and cached.read_bytes() == artifact
    # The loaded path now reads the cache file (the memory is given back) and stays valid.
    assert os.stat(first.artifact).st_ino == cached.stat().st_ino
    assert first.artifact.read_bytes() == artifact
    # A container restart trusts the marked cache copy: nothing is downloaded.
    again = fetch_engine(store, KEY, cache, where=Staging.MEMORY)
    assert (again.downloaded_bytes, again.artifact, again.cache_written) == (0, cached, None)


def test_a_tampered_download_staged_in_memory_leaves_nothing_behind(tmp_path: Path) -> None:
    _, _, root, store = _remote_engine(tmp_path)
    (root / layout.engine_dir(KEY) / "model.onnx").write_bytes(b"x" * 9_999 + b"z")  # tampered in the store
    fds = len(os.listdir("/proc/self/fd"))
    with pytest.raises(Refusal, match="does not match the manifest") as e:
        fetch_engine(store, KEY, tmp_path / "fresh-cache", where=Staging.MEMORY)
    assert e.value.reason == "EngineIntegrity"
    assert not (tmp_path / "fresh-cache" / KEY / "model.onnx").exists()
    assert len(os.listdir("/proc/self/fd")) == fds  # the memfd was closed


class _Overlong(_RemoteStore):
    """A remote store that serves `path` as far more bytes than the manifest states, in chunks of
    1,000 bytes it counts as they are taken (at most 1,000 of them, so a runtime that never stops
    reading still ends)."""

    def __init__(self, inner: EngineStore, path: str) -> None:
        super().__init__(inner)
        self.path, self.taken = path, 0

    def iter_chunks(self, path: str, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        if path != self.path:
            return self.inner.iter_chunks(path, chunk_size)
        return self._endless()

    def _endless(self) -> Iterator[bytes]:
        for _ in range(1_000):
            self.taken += 1
            yield b"x" * 1_000


@pytest.mark.parametrize("where", [Staging.DISK, Staging.MEMORY])
def test_a_download_longer_than_the_manifest_says_stops_where_it_passes_it(
    tmp_path: Path, where: Staging
) -> None:
    _, _, root, _ = _remote_engine(tmp_path)  # the manifest says 10,000 bytes
    store = _Overlong(open_store(str(root)), layout.engine_path(KEY, "model.onnx"))
    fds = len(os.listdir("/proc/self/fd"))
    with pytest.raises(Refusal, match="streams more than the manifest's 10000 bytes") as e:
        fetch_engine(cast(EngineStore, store), KEY, tmp_path / "cache", where=where)
    assert e.value.reason == "EngineIntegrity"
    assert store.taken == 11  # ten chunks make the stated size; the eleventh passes it and is not kept
    left = os.listdir(tmp_path / "cache" / KEY)
    assert [n for n in left if "model.onnx" in n] == []  # no engine file, no temporary
    # the canary downloads beside the engine file, verified on its own, and is kept
    assert (tmp_path / "cache" / KEY / "canary.npz").read_bytes() == (
        root / layout.engine_path(KEY, "canary.npz")
    ).read_bytes()
    assert len(os.listdir("/proc/self/fd")) == fds  # no memfd left open


class _Ordered(_RemoteStore):
    """A remote store that records when each file's stream begins and ends, and holds the engine
    file's stream after its first chunk until the canary's has begun (at most `hold_s`)."""

    def __init__(self, inner: EngineStore, hold_s: float) -> None:
        super().__init__(inner)
        self.events: list[str] = []
        self.canary_began = threading.Event()
        self.hold_s = hold_s

    def iter_chunks(self, path: str, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        name = path.rsplit("/", 1)[-1]
        self.events.append(f"{name} began")
        if name == "canary.npz":
            self.canary_began.set()
        for i, chunk in enumerate(self.inner.iter_chunks(path, 1_000)):
            if name == "model.onnx" and i == 1:
                self.canary_began.wait(self.hold_s)
            yield chunk
        self.events.append(f"{name} ended")


def test_the_canary_downloads_beside_the_engine_file_not_after_it(tmp_path: Path) -> None:
    artifact, canary, root, _ = _remote_engine(tmp_path)
    store = _Ordered(open_store(str(root)), hold_s=60)
    local = fetch_engine(cast(EngineStore, store), KEY, tmp_path / "cache", where=Staging.MEMORY)
    # the canary's stream began while the engine file's was still open
    assert store.events.index("canary.npz began") < store.events.index("model.onnx ended")
    assert local.artifact.read_bytes() == artifact and local.canary.read_bytes() == canary
    assert local.downloaded_bytes == len(artifact) + len(canary)


def test_a_download_the_manifest_gives_no_size_for_is_bounded_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fetch, "UNSIZED_MAX_BYTES", 5_000)  # the canary's bound, small for the test
    _, _, root, _ = _remote_engine(tmp_path)
    store = _Overlong(open_store(str(root)), layout.engine_path(KEY, "canary.npz"))
    with pytest.raises(Refusal, match="streams more than 5000 bytes, the most a file the manifest") as e:
        fetch_engine(cast(EngineStore, store), KEY, tmp_path / "cache", where=Staging.DISK)
    assert e.value.reason == "EngineIntegrity" and store.taken == 6
    assert not (tmp_path / "cache" / KEY / "canary.npz").exists()


def test_a_manifest_larger_than_a_manifest_may_be_is_refused_unread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fetch, "MANIFEST_MAX_BYTES", 5_000)
    _, _, root, _ = _remote_engine(tmp_path)
    store = _Overlong(open_store(str(root)), layout.manifest_path(KEY))
    with pytest.raises(Refusal, match="is larger than 5000 bytes, the most a manifest may have") as e:
        fetch_engine(cast(EngineStore, store), KEY, tmp_path / "cache", where=Staging.DISK)
    assert e.value.reason == "EngineIntegrity" and store.taken == 6
    assert os.listdir(tmp_path / "cache" / KEY) == []


def test_stale_parts_are_the_partial_copies_no_live_process_writes() -> None:
    names = [
        "model.onnx",
        ".model.onnx.verified",
        ".model.onnx.7.part",  # a killed start's
        ".model.onnx.8.part",  # a live process's
        ".model.onnx.9.part",  # this process's own name (a reused pid): it truncates it
        ".canary.npz.7.part",  # another file's
        ".model.onnx.x7.part",
        ".model.onnx.007.part",
    ]
    assert fetch.stale_parts(names, "model.onnx", 9, lambda pid: pid == 8) == [".model.onnx.7.part"]
    assert fetch.stale_parts(names, "canary.npz", 9, lambda pid: False) == [".canary.npz.7.part"]


@pytest.mark.parametrize("where", [Staging.DISK, Staging.MEMORY])
def test_a_download_removes_the_partial_copies_killed_starts_left(tmp_path: Path, where: Staging) -> None:
    artifact, _, _, store = _remote_engine(tmp_path)
    local = tmp_path / "cache" / KEY
    local.mkdir(parents=True)
    exited = subprocess.Popen(["true"])
    exited.wait()  # reaped: its pid names no process
    dead = exited.pid
    left = local / f".model.onnx.{dead}.part"  # a start killed mid-copy
    live = local / f".model.onnx.{os.getppid()}.part"  # a process that is still writing
    left.write_bytes(b"x" * 5_000)
    live.write_bytes(b"x" * 5_000)
    got = fetch_engine(store, KEY, tmp_path / "cache", where=where)
    if got.cache_written is not None:
        got.cache_written.result(timeout=60)
    assert not left.exists() and live.exists()
    assert (local / "model.onnx").read_bytes() == artifact


def test_fetch_verifies_a_mounted_store_in_place_and_loads_the_file_it_hashed(tmp_path: Path) -> None:
    artifact, canary = b"x" * 10_000, b"canary"
    root = _store(tmp_path, artifact, canary, _manifest(artifact, canary))
    in_store = root / layout.engine_dir(KEY) / "model.onnx"
    store = open_store(str(root))
    cache = tmp_path / "cache"
    first = fetch_engine(store, KEY, cache)
    assert (first.downloaded_bytes, first.hashed_bytes) == (0, len(artifact) + len(canary))
    assert not (cache / KEY / "model.onnx").exists()  # nothing copied
    assert first.artifact.read_bytes() == artifact and first.canary.read_bytes() == canary
    # A restart in the same pod: the markers vouch for the unchanged store files, nothing is read.
    assert fetch_engine(store, KEY, cache).hashed_bytes == 0

    # A different file renamed over the store's name after the check: the path handed to the
    # backend still reads the file that was hashed.
    swapped = in_store.with_name(".swap")
    swapped.write_bytes(b"y" * 10_000)
    os.replace(swapped, in_store)
    assert first.artifact.read_bytes() == artifact
    # ... and the next start sees a changed file (new inode), hashes it and refuses it.
    with pytest.raises(Refusal, match="does not match the manifest") as e:
        fetch_engine(store, KEY, cache)
    assert e.value.reason == "EngineIntegrity"
    in_store.write_bytes(b"x" * 9_999)  # the wrong size is refused before any read
    with pytest.raises(Refusal, match="has 9999 bytes, the manifest says 10000"):
        fetch_engine(store, KEY, cache)
    with pytest.raises(Refusal, match="does not exist") as e:
        fetch_engine(store, "b" * 64, cache)
    assert e.value.reason == "EngineIntegrity"


def test_termination_message_round_trips_and_maps_to_exit_codes() -> None:
    msg = TerminationMessage(reason="GPUFault", xid=79, gpu="GPU-1", engine_key=KEY)
    assert msg.exit_code == EXIT_GPU_FAULT == 86
    line = msg.to_line()
    assert json.loads(line)["reason"] == "GPUFault" and "message" in json.loads(line)
    assert TerminationMessage.parse(f"noise\n{line}\n") == msg
    assert TerminationMessage.parse("panic: not ours") is None
