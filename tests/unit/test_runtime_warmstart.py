"""The runtime's warm start: the engine fetched and loaded on a thread, collected by the usual calls."""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import numpy as np
import pytest
from trtforge_dev.modelzoo import dynamic_mlp
from trtforge_runtime.errors import Refusal
from trtforge_runtime.lifecycle import warmstart
from trtforge_runtime.serving.model import model_spec

from trtforge.contract import layout
from trtforge.contract.engine_key import BuildConfig, ShapeRange
from trtforge.contract.gpu import GPUTarget, known_identity
from trtforge.contract.manifest import Accuracy, CanaryRef, Manifest, TensorSpec
from trtforge.store import open_store
from trtforge.store.base import PutResult

KEY = "c" * 64


def _store(tmp: Path) -> Path:
    artifact = dynamic_mlp(features=4, outputs=2).read_bytes()
    canary = b"canary"
    m = Manifest(
        key=KEY,
        engine_file="model.onnx",
        sha256=hashlib.sha256(artifact).hexdigest(),
        size_bytes=len(artifact),
        backend="onnxruntime",
        backend_version="1.0",
        cuda="none",
        gpu=known_identity(GPUTarget(gpu="NVIDIA-H100-80GB-HBM3")),
        build=BuildConfig(
            precision="fp32", profiles=({"x": ShapeRange(min=(1, 4), opt=(8, 4), max=(16, 4))},)
        ),
        model_uri="s3://models/mlp.onnx",
        model_sha256="b" * 64,
        inputs=[TensorSpec(name="x", dtype="float32", shape=[-1, 4])],
        outputs=[TensorSpec(name="y", dtype="float32", shape=[-1, 2])],
        build_seconds=0.0,
        accuracy=Accuracy(samples=1, max_abs_error=0, max_rel_error=0, atol=0, rtol=0, passed=True),
        canary=CanaryRef(file="canary.npz", sha256=hashlib.sha256(canary).hexdigest(), atol=1e-4, rtol=1e-3),
    )
    d = tmp / "store" / layout.engine_dir(KEY)
    d.mkdir(parents=True)
    (d / "model.onnx").write_bytes(artifact)
    (d / "canary.npz").write_bytes(canary)
    (d / layout.MANIFEST).write_text(m.to_json())
    return tmp / "store"


def test_the_start_up_steps_collect_what_the_warm_start_made_once(tmp_path: Path) -> None:
    store, cache = open_store(str(_store(tmp_path))), tmp_path / "cache"
    checked: list[str] = []
    warmstart.begin(store, KEY, cache, 2, check=lambda m: checked.append("warm")).join()
    local = warmstart.fetch(store, KEY, cache, check=lambda m: checked.append("runtime"))
    assert local.hashed_bytes > 0  # the warm start verified it...
    assert checked == ["warm", "runtime"]  # ...and the runtime's identity check still saw the manifest
    backend = warmstart.load(local.manifest, local.artifact, 2)
    assert warmstart.load(local.manifest, local.artifact, 2) is not backend  # collected once
    again = warmstart.fetch(store, KEY, cache)
    assert again is not local and again.hashed_bytes == 0  # a fetch of its own (markers vouch)


def test_a_warm_start_for_other_arguments_is_not_used(tmp_path: Path) -> None:
    store, cache = open_store(str(_store(tmp_path))), tmp_path / "cache"
    warmstart.begin(store, KEY, cache, 4).join()
    local = warmstart.fetch(store, KEY, cache)
    other = warmstart.load(local.manifest, local.artifact, 1)  # loaded anew; the 4-instance one closed
    assert warmstart.collect_backend(KEY, local.artifact, 4) is None
    assert other.new_instance() is not None


def test_what_the_warm_start_refused_the_runtime_refuses_itself(tmp_path: Path) -> None:
    root = _store(tmp_path)
    store, cache = open_store(str(root)), tmp_path / "cache"
    (root / layout.engine_dir(KEY) / "model.onnx").write_bytes(b"tampered")
    warmstart.begin(store, KEY, cache, 1).join()
    with pytest.raises(Refusal, match="the manifest says") as e:
        warmstart.fetch(store, KEY, cache)
    assert e.value.reason == "EngineIntegrity"


def test_the_canary_runs_on_the_warm_start_once_for_the_same_backend_and_spec(tmp_path: Path) -> None:
    store, cache = open_store(str(_store(tmp_path))), tmp_path / "cache"
    warmstart.begin(store, KEY, cache, 2, canary_for=("mlp", None)).join()
    local = warmstart.fetch(store, KEY, cache)
    backend = warmstart.load(local.manifest, local.artifact, 2)
    other = model_spec(local.manifest, "other", None)
    assert warmstart.collect_canary(KEY, backend, local.canary, other) is None  # another spec: not it
    warmstart.begin(store, KEY, cache, 2, canary_for=("mlp", None)).join()  # again: a new backend
    local = warmstart.fetch(store, KEY, cache)
    backend = warmstart.load(local.manifest, local.artifact, 2)
    got = warmstart.collect_canary(KEY, backend, local.canary, model_spec(local.manifest, "mlp", None))
    assert got is not None
    instance, result = got
    assert not result.passed and "not readable" in result.message  # this store's canary is no npz
    assert instance.run({"x": np.zeros((1, 4), np.float32)})["y"].shape == (1, 2)
    assert (
        warmstart.collect_canary(KEY, backend, local.canary, model_spec(local.manifest, "mlp", None)) is None
    )


def test_the_caller_learns_the_backend_to_import_once_the_manifest_is_checked(tmp_path: Path) -> None:
    store, cache = open_store(str(_store(tmp_path))), tmp_path / "cache"
    t = warmstart.begin(store, KEY, cache, 2)
    assert warmstart.import_backend_library(wait_s=60) == "onnxruntime"
    t.join()
    warmstart.fetch(store, KEY, cache)  # collect it (the registry is module state)


def test_no_backend_is_named_when_the_identity_check_refuses(tmp_path: Path) -> None:
    store, cache = open_store(str(_store(tmp_path))), tmp_path / "cache"

    def refuse(_: Manifest) -> None:
        raise Refusal("GPUMismatch", "wrong GPU")

    t = warmstart.begin(store, KEY, cache, 2, check=refuse)
    assert warmstart.import_backend_library(wait_s=60) is None
    t.join()
    with pytest.raises(Refusal, match="wrong GPU"):
        warmstart.fetch(store, KEY, cache, check=refuse)


def test_a_store_that_does_not_answer_does_not_hold_the_caller(tmp_path: Path) -> None:
    import threading

    answer = threading.Event()
    inner = open_store(str(_store(tmp_path)))

    class Slow:
        uri = inner.uri

        def get(self, path: str, dst: BinaryIO, expected_sha256: str | None = None) -> PutResult:
            answer.wait()
            return inner.get(path, dst, expected_sha256)

    t = warmstart.begin(Slow(), KEY, tmp_path / "cache", 2)  # type: ignore[arg-type]
    assert warmstart.import_backend_library(wait_s=0.05) is None
    answer.set()
    t.join()
    warmstart.collect_fetch(KEY, tmp_path / "cache")


class _Downloading:
    """A store that only streams (as s3:// or the broker do, so the runtime copies), each stream held
    until `go_on` is set; `done` is set once the canary (the last file fetched) has streamed."""

    def __init__(self, root: Path) -> None:
        self.inner = open_store(str(root))
        self.uri, self.read_only = f"remote+{self.inner.uri}", True
        self.started, self.go_on, self.done = threading.Event(), threading.Event(), threading.Event()

    def get(self, path: str, dst: BinaryIO, expected_sha256: str | None = None) -> PutResult:
        return self.inner.get(path, dst, expected_sha256)  # the manifest: small, not held

    def iter_chunks(self, path: str, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        self.started.set()
        self.go_on.wait()
        yield from self.inner.iter_chunks(path, chunk_size)
        if path.endswith("canary.npz"):
            self.done.set()


def test_from_a_store_that_downloads_the_caller_goes_on_only_once_the_files_are_here(
    tmp_path: Path,
) -> None:
    """A download's read loop takes the GIL per socket read: the server's imports would starve it.
    The caller imports the backend's library once the manifest is checked, then waits for the
    download before it goes on to import the server."""
    store, cache = _Downloading(_store(tmp_path)), tmp_path / "cache"
    t = warmstart.begin(store, KEY, cache, 2)  # type: ignore[arg-type]
    store.started.wait()  # the manifest is read and checked; the download has begun and is held

    def release() -> None:
        time.sleep(0.2)  # so that a caller that did not wait would return before the download ends
        store.go_on.set()

    threading.Thread(target=release).start()
    assert warmstart.import_backend_library(wait_s=60) == "onnxruntime"
    assert store.done.is_set()  # it went on only once the files were here
    t.join()
    assert warmstart.collect_fetch(KEY, cache) is not None


def test_a_download_holds_the_caller_no_longer_than_the_wait(tmp_path: Path) -> None:
    store, cache = _Downloading(_store(tmp_path)), tmp_path / "cache"
    t = warmstart.begin(store, KEY, cache, 2)  # type: ignore[arg-type]
    store.started.wait()
    assert warmstart.import_backend_library(wait_s=0.05) == "onnxruntime"  # known, and it goes on
    assert not store.done.is_set()
    store.go_on.set()
    t.join()
    assert warmstart.collect_fetch(KEY, cache) is not None


def test_a_canary_decoded_ahead_is_replayed_and_its_errors_reported_as_if_read_there(tmp_path: Path) -> None:
    from concurrent.futures import Future

    from trtforge_runtime.lifecycle.canary import read_canary, run_canary

    from trtforge.contract.canary import Canary

    store, cache = open_store(str(_store(tmp_path))), tmp_path / "cache"
    local = warmstart.fetch(store, KEY, cache)
    backend = warmstart.load(local.manifest, local.artifact, 1)
    instance, spec = backend.new_instance(), model_spec(local.manifest, "mlp", None)
    x = np.ones((1, 4), np.float32)
    path = tmp_path / "canary.npz"
    path.write_bytes(
        Canary(
            input_names=["x"], output_names=["y"], inputs=[{"x": x}], outputs=[instance.run({"x": x})]
        ).to_bytes()
    )
    decoded: Future[Canary] = Future()
    decoded.set_result(read_canary(path))
    path.write_bytes(b"not read again")  # the replay uses what was decoded
    assert run_canary(instance, path, spec, 1e-4, 1e-3, decoded).passed
    failed: Future[Canary] = Future()
    failed.set_exception(ValueError("bad zip"))
    result = run_canary(instance, path, spec, 1e-4, 1e-3, failed)
    assert not result.passed and result.message == "canary file canary.npz is not readable: bad zip"
