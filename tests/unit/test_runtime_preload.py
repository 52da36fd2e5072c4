"""The pre-load: an ONNX Runtime session opened from the pre-hashed file while the contract imports,
taken by the backend only for the digest of the verified manifest and its own thread count."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from trtforge_runtime.backends import load_backend, ort_session
from trtforge_runtime.backends.onnxruntime_backend import OnnxRuntimeBackend
from trtforge_runtime.errors import Refusal
from trtforge_runtime.lifecycle import prehash, preload
from trtforge_runtime.lifecycle.fetch import fetch_engine

from tests.unit.test_runtime_warmstart import KEY, _store
from trtforge.contract import layout
from trtforge.store import open_store


@pytest.fixture(autouse=True)
def _nothing_left_over() -> Iterator[None]:
    preload.discard()
    yield
    preload.discard()


def _engine_dir(store: Path) -> Path:
    return store / layout.engine_dir(KEY)


def _preloaded(instances: int) -> preload.Preloaded | None:
    """Begin the pre-load and wait for what it made (without taking it)."""
    t = preload.begin(instances)
    assert t is not None
    t.join()
    assert preload._pending is not None
    return preload._pending.result()


def test_the_backend_takes_the_session_opened_from_the_verified_file(tmp_path: Path) -> None:
    store, cache = _store(tmp_path), tmp_path / "cache"
    prehash.begin(str(store), KEY, cache)
    made = _preloaded(1)
    assert made is not None
    local = fetch_engine(open_store(str(store)), KEY, cache)
    threads, _ = ort_session.pool_threads(1)
    assert made.threads == threads and made.sha256 == local.manifest.sha256
    backend = load_backend(local.manifest, local.artifact, 1)
    assert isinstance(backend, OnnxRuntimeBackend)
    assert backend._session is made.session
    # it is a real session of that file: its answer is ONNX Runtime's own
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    want = ort.InferenceSession(str(_engine_dir(store) / "model.onnx")).run(None, {"x": x})[0]
    np.testing.assert_allclose(backend.new_instance().run({"x": x})["y"], want, rtol=1e-6)
    assert preload.take(made.sha256, threads) is None  # taken once


def test_a_session_for_another_digest_or_thread_count_is_not_taken(tmp_path: Path) -> None:
    store = _store(tmp_path)
    prehash.begin(str(store), KEY, tmp_path / "cache")
    made = _preloaded(1)
    assert made is not None
    assert preload.take("0" * 64, made.threads) is None
    prehash.begin(str(store), KEY, tmp_path / "cache2")  # a fresh pre-hash: its fds are untaken
    made = _preloaded(1)
    assert made is not None
    assert preload.take(made.sha256, made.threads + 1) is None
    assert preload.take(made.sha256, made.threads) is None  # the failed take consumed it


def test_nothing_is_opened_from_a_file_that_does_not_match_the_raw_manifest(tmp_path: Path) -> None:
    store = _store(tmp_path)
    with (_engine_dir(store) / "model.onnx").open("ab") as f:
        f.write(b"\0")  # the raw manifest's sha256 no longer matches
    prehash.begin(str(store), KEY, tmp_path / "cache")
    assert _preloaded(1) is None
    with pytest.raises(Refusal) as e:  # and the usual path refuses it, as always
        fetch_engine(open_store(str(store)), KEY, tmp_path / "cache")
    assert e.value.reason == "EngineIntegrity"


def test_a_pre_load_that_fails_leaves_the_backend_to_open_its_own(tmp_path: Path) -> None:
    # Bytes the raw manifest vouches for that ONNX Runtime cannot parse: the pre-load's session
    # open raises on its thread, and a take is then None, not that error.
    store = _store(tmp_path)
    garbage = b"not an onnx model"
    (_engine_dir(store) / "model.onnx").write_bytes(garbage)
    manifest = _engine_dir(store) / layout.MANIFEST
    raw = json.loads(manifest.read_text())
    sha = hashlib.sha256(garbage).hexdigest()
    manifest.write_text(json.dumps({**raw, "sha256": sha, "size_bytes": len(garbage)}))
    prehash.begin(str(store), KEY, tmp_path / "cache")
    t = preload.begin(1)
    assert t is not None
    t.join()
    assert preload._pending is not None and preload._pending.exception() is not None
    threads, _ = ort_session.pool_threads(1)
    assert preload.take(sha, threads) is None


def test_only_an_onnx_runtime_engine_on_a_mounted_store_is_preloaded(tmp_path: Path) -> None:
    store = _store(tmp_path)
    manifest = _engine_dir(store) / layout.MANIFEST
    raw = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**raw, "backend": "tensorrt"}))
    prehash.begin(str(store), KEY, tmp_path / "cache")
    claim = prehash.claim()
    assert claim is not None and claim.backend == "tensorrt"
    assert preload.begin(1) is None  # TensorRT deserializes onto the GPU: never before the identity check
    assert preload.take(raw["sha256"], 1) is None


def test_a_store_with_nothing_to_pre_hash_leaves_no_earlier_claim_standing(tmp_path: Path) -> None:
    prehash.begin(str(_store(tmp_path)), KEY, tmp_path / "cache")
    assert prehash.claim() is not None
    prehash.begin("s3://bucket/prefix", KEY, tmp_path / "cache")
    assert prehash.claim() is None and preload.begin(1) is None


def test_the_claim_is_what_the_raw_manifest_says_of_its_artifact(tmp_path: Path) -> None:
    d = tmp_path / "e"
    raw = {"engine_file": "m.onnx", "sha256": "ab", "backend": "onnxruntime", "canary": {"file": "c"}}
    assert prehash.claim_of(d, raw) == prehash.Claim(d / "m.onnx", "ab", "onnxruntime")
    assert prehash.claim_of(d, {**raw, "engine_file": "../m.onnx"}) is None
    assert prehash.claim_of(d, {**raw, "sha256": 1}) is None
    assert prehash.claim_of(d, {**raw, "backend": None}) is None
    assert prehash.claim_of(d, ["m.onnx"]) is None


def test_a_peek_never_duplicates_a_descriptor_the_taker_already_has(tmp_path: Path) -> None:
    store = _store(tmp_path)
    prehash.begin(str(store), KEY, tmp_path / "cache")
    path = _engine_dir(store) / "model.onnx"
    peeked = prehash.peek(path)
    assert peeked is not None
    taken = prehash.take(path)
    assert taken is not None and peeked.fd != taken.fd and peeked.sha256 == taken.sha256
    assert os.fstat(peeked.fd).st_ino == os.fstat(taken.fd).st_ino  # the same open file
    os.close(peeked.fd)
    os.close(taken.fd)
    assert prehash.peek(path) is None


def test_a_digest_a_marker_vouched_for_is_not_taken_for_a_hash(tmp_path: Path) -> None:
    """A restart: the marker vouched for the file when the pre-hash opened it, so it hashed nothing.
    The file then changes in place before the verification: the verification must hash it itself."""
    store, cache = _store(tmp_path), tmp_path / "cache"
    fetch_engine(open_store(str(store)), KEY, cache)  # the first start writes the markers
    prehash.begin(str(store), KEY, cache)
    path = _engine_dir(store) / "model.onnx"
    peeked = prehash.peek(path)  # waits for the pre-hash of the artifact
    assert peeked is not None and peeked.vouched
    os.close(peeked.fd)
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    with path.open("r+b") as f:  # same inode, new bytes, new mtime
        f.write(data)
    os.utime(path, ns=(os.stat(path).st_atime_ns, os.stat(path).st_mtime_ns + 1_000_000))
    with pytest.raises(Refusal) as e:
        fetch_engine(open_store(str(store)), KEY, cache)
    assert e.value.reason == "EngineIntegrity" and "sha256" in e.value.message


def test_the_pre_load_and_the_session_opener_import_no_pydantic() -> None:
    """They run before the contract is imported: importing pydantic there would serialise them
    behind the main thread's imports (the GIL), which is what the pre-load is for."""
    code = (
        "import sys; import trtforge_runtime.lifecycle.preload, trtforge_runtime.backends.ort_session; "
        "heavy = ('pydantic', 'numpy', 'onnxruntime', 'trtforge.contract'); "
        "print(sorted(m for m in heavy if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_serve_begins_the_pre_hash_before_the_supervisors_and_the_contracts_imports(
    tmp_path: Path,
) -> None:
    """`trtforge serve` as one runtime (a worker, or a pod without --workers) reaches the pre-hash
    before what only the --workers supervisor needs (subprocess, its module) and what the pre-hash
    exists to run beside (pydantic, the contract, numpy) is imported. (tempfile is not in the list:
    the subcommand's lookup in the runtime distribution's entry points imports it.)"""
    code = (
        "import sys; import trtforge_runtime.lifecycle.prehash as p\n"
        "late = ('subprocess', 'trtforge_runtime.lifecycle.workers', 'pydantic',"
        " 'trtforge.contract', 'numpy')\n"
        "def begin(*args):\n"
        "    print(sorted(m for m in late if m in sys.modules)); raise SystemExit(0)\n"
        "p.begin = begin\n"
        "from trtforge.cli import main\n"
        f"main(['serve', '--store', {str(tmp_path)!r}, '--engine', {KEY!r}, '--workers', '1'])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
