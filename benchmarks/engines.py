"""Put a benchmark model into an engine store, the way a build Job would.

``trtforge build --gpu cpu --precision fp32`` (the ONNX Runtime backend) publishes
``engines/<key>/{artifact, canary, manifest.json}``. While the builder is not in this tree, the same
layout is written here straight from the shared contract (engine key, manifest, canary data), so the
runtime can be measured; the result files say which of the two made the engine.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import time
from pathlib import Path

from benchmarks.common import TRTFORGE, log
from benchmarks.models import INPUT_SHAPE, io_names, sample_input

MAX_BATCH = 64


def builder_available() -> bool:
    try:
        return importlib.util.find_spec("trtforge_builder.cli") is not None
    except ModuleNotFoundError:
        return False


def engine_keys(store: Path) -> list[str]:
    d = store / "engines"
    if not d.is_dir():
        return []
    return sorted(p.name for p in d.iterdir() if (p / "manifest.json").exists())


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(4 << 20):
            h.update(chunk)
    return h.hexdigest()


def _build_with_builder(model: Path, store: Path) -> None:
    cmd = [
        *TRTFORGE,
        "build",
        "--model",
        str(model),
        "--gpu",
        "cpu",
        "--precision",
        "fp32",
        "--store",
        str(store),
    ]
    in_name, _ = io_names(model)
    dims = "x".join(str(d) for d in INPUT_SHAPE)
    cmd += ["--profile", f"{in_name}:1x{dims}:8x{dims}:{MAX_BATCH}x{dims}"]
    log(f"building with the builder: {' '.join(cmd[2:])}")
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        raise RuntimeError(f"trtforge build failed ({r.returncode}): {r.stdout[-2000:]} {r.stderr[-2000:]}")


def _publish_from_contract(model: Path, store: Path) -> None:
    """Write engines/<key>/ for an ONNX Runtime artifact using only the shared contract."""
    import onnxruntime as ort

    from trtforge.contract.canary import Canary
    from trtforge.contract.engine_key import BuildConfig, EngineKeyRecord, ShapeRange, engine_key
    from trtforge.contract.gpu import GPUTarget, known_identity
    from trtforge.contract.gpu_probe import host_arch
    from trtforge.contract.layout import CANARY, engine_dir
    from trtforge.contract.manifest import Accuracy, CanaryRef, Manifest, TensorSpec

    t0 = time.monotonic()
    in_name, out_name = io_names(model)
    shape = (1, *INPUT_SHAPE)
    build = BuildConfig(
        precision="fp32",
        profiles=({in_name: ShapeRange(min=shape, opt=(8, *INPUT_SHAPE), max=(MAX_BATCH, *INPUT_SHAPE))},),
    )
    gpu = known_identity(GPUTarget(gpu="cpu"), arch=host_arch())
    model_sha = _sha256(model)
    rec = EngineKeyRecord.for_identity(
        model_sha256=model_sha,
        build=build,
        backend="onnxruntime",
        backend_version=ort.__version__,
        cuda="none",
        identity=gpu,
    )
    key = engine_key(rec)
    d = store / engine_dir(key)
    d.mkdir(parents=True, exist_ok=True)
    artifact = d / "model.onnx"
    shutil.copyfile(model, artifact)
    sess = ort.InferenceSession(str(artifact), providers=["CPUExecutionProvider"])
    x = sample_input(4, seed=7)
    (y,) = sess.run([out_name], {in_name: x})
    canary = Canary(  # four samples of one row each, in the contract's format (as the builder writes)
        input_names=[in_name],
        output_names=[out_name],
        inputs=[{in_name: x[i : i + 1]} for i in range(len(x))],
        outputs=[{out_name: y[i : i + 1]} for i in range(len(y))],
    ).to_bytes()
    (d / CANARY).write_bytes(canary)
    out_shape = [-1, *list(y.shape[1:])]
    manifest = Manifest(
        key=key,
        engine_file=artifact.name,
        sha256=_sha256(artifact),
        size_bytes=artifact.stat().st_size,
        backend="onnxruntime",
        backend_version=ort.__version__,
        cuda="none",
        gpu=gpu,
        build=build,
        model_uri=f"file://{model}",
        model_sha256=model_sha,
        inputs=[TensorSpec(name=in_name, dtype="float32", shape=[-1, *INPUT_SHAPE])],
        outputs=[TensorSpec(name=out_name, dtype="float32", shape=out_shape)],
        build_seconds=round(time.monotonic() - t0, 3),
        accuracy=Accuracy(samples=4, max_abs_error=0.0, max_rel_error=0.0, atol=1e-4, rtol=1e-3, passed=True),
        canary=CanaryRef(file=CANARY, sha256=hashlib.sha256(canary).hexdigest(), atol=1e-4, rtol=1e-3),
        builder_host="benchmarks",
    )
    (d / "manifest.json").write_text(manifest.to_json())  # last: its presence is the commit


def ensure_engine(model: Path, store: Path) -> tuple[str, str]:
    """(engine key, who published it) for `model` in a store holding only that model's engine.

    ``BENCH_PUBLISHER=contract`` skips the builder (to measure the runtime alone).
    """
    keys = engine_keys(store)
    publisher_file = store / ".publisher"
    if len(keys) == 1:
        return keys[0], publisher_file.read_text().strip() if publisher_file.exists() else "unknown"
    if store.exists():
        shutil.rmtree(store)
    store.mkdir(parents=True)
    if builder_available() and os.environ.get("BENCH_PUBLISHER", "builder") != "contract":
        _build_with_builder(model, store)
        who = "trtforge build"
    else:
        log("publishing from the shared contract (trtforge build absent or BENCH_PUBLISHER=contract)")
        _publish_from_contract(model, store)
        who = "benchmarks (shared contract)"
    publisher_file.write_text(who + "\n")
    keys = engine_keys(store)
    if len(keys) != 1:
        raise RuntimeError(f"expected one engine in {store}, found {keys}")
    return keys[0], who


def store_dir(model: str) -> Path:
    """The benchmark's local store for one model (one per publisher, so both can be kept)."""
    from benchmarks.common import CACHE

    return CACHE / "stores" / os.environ.get("BENCH_PUBLISHER", "builder") / model
