"""`trtforge build` on real models (the onnx test-data CNNs, materialised) and generated dynamic ones.

The ONNX Runtime backend builds here: for CPU targets, and for GPU targets on the test bed's emulated
GPUs (an emulated GPU file through TRTFORGE_GPU_PROBE).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from trtforge_builder.backends.base import BuildInputs, BuildOutput
from trtforge_builder.backends.ort import OnnxRuntimeBackend
from trtforge_builder.errors import BuildError
from trtforge_builder.pipeline import probe_target, run_build
from trtforge_builder.request import BuildRequest, make_build_config, parse_profiles
from trtforge_dev.modelzoo import (
    dynamic_cnn,
    dynamic_mlp,
    light_input_name,
    light_model,
    qdq_mlp,
    sha256_of,
    two_input_model,
)

from trtforge.contract import layout
from trtforge.contract.canary import Canary
from trtforge.contract.engine_key import EngineKeyRecord, RequestRecord, engine_key
from trtforge.contract.gpu import GPUTarget
from trtforge.contract.gpu_probe import EmulatedGPUFile, EmulatedGPUProbe, GPUDevice
from trtforge.contract.manifest import Manifest
from trtforge.store import open_store


@pytest.fixture(autouse=True)
def _threads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRTFORGE_ORT_THREADS", "2")
    monkeypatch.setenv("TRTFORGE_GPU_PROBE", "none")


def emulated_gpu(path: Path, name: str = "NVIDIA H100 80GB HBM3", mig: str | None = None) -> EmulatedGPUProbe:
    dev = GPUDevice(
        index=0,
        uuid="GPU-00000000-1111-2222-3333-444444444444",
        name=name,
        memory_mib=81559,
        compute_capability="9.0",
        mig_profile=mig,
        sm_count=132,
    )
    EmulatedGPUFile(node="gpu-node-1", devices=[dev]).write(path)
    return EmulatedGPUProbe(path, visible="all")


def request(
    model: Path, store: Path, gpu: str = "cpu", profiles: list[str] | None = None, **kw: Any
) -> BuildRequest:
    build = make_build_config(precision=kw.pop("precision", "fp16"), profiles=parse_profiles(profiles or []))
    return BuildRequest(
        model_uri=str(model),
        target=GPUTarget(gpu=gpu, mig=kw.pop("mig", None)),
        build=build,
        store_uri=str(store),
        **kw,
    )


def manifest_of(store: Path, key: str) -> Manifest:
    return Manifest.from_json((store / layout.manifest_path(key)).read_text())


def test_squeezenet_cpu_build_then_cache_hit(tmp_path: Path) -> None:
    model = light_model("squeezenet")
    store = tmp_path / "store"
    res = run_build(request(model, store, samples=3))
    assert not res.cache_hit and res.backend == "onnxruntime" and res.gpu == "cpu"
    m = manifest_of(store, res.key)
    assert m.key == res.key and m.sha256 == res.sha256 and m.size_bytes == res.size_bytes
    assert m.model_sha256 == sha256_of(model) and m.backend_version == OnnxRuntimeBackend().version
    assert m.gpu.product == "cpu" and m.cuda == "none" and m.build.precision == "fp16"
    assert [t.name for t in m.inputs] == ["data_0"] and m.inputs[0].shape == [1, 3, 224, 224]
    assert [t.name for t in m.outputs] == ["softmaxout_1"]
    assert m.accuracy.passed and m.accuracy.samples == 3 and m.accuracy.rtol == 1e-2
    assert m.layers.get("FusedConv", 0) + m.layers.get("Conv", 0) == 26
    engine = store / layout.engine_path(res.key, m.engine_file)
    assert sha256_of(engine) == m.sha256
    canary = Canary.from_bytes((store / layout.engine_path(res.key, m.canary.file)).read_bytes())
    assert len(canary.inputs) == 2 and canary.outputs[0]["softmaxout_1"].shape == (1, 1000, 1, 1)
    # the key is the builder's, from what it really has and probed (the manifest records it all)
    rec = EngineKeyRecord.for_identity(
        model_sha256=m.model_sha256,
        build=m.build,
        backend="onnxruntime",
        backend_version=m.backend_version,
        cuda="none",
        identity=m.gpu,
        recipe=m.recipe,
    )
    assert engine_key(rec) == res.key

    again = run_build(request(model, store, samples=3))
    assert again.cache_hit and again.key == res.key and again.sha256 == res.sha256
    rk = "7" * 64  # the operator's request key: the builder files what answered it
    pinned = run_build(
        request(tmp_path / "absent.onnx", store, samples=3, model_sha256=m.model_sha256, request_key=rk)
    )
    assert pinned.cache_hit  # pinned: no model fetch at all (the model path does not exist)
    assert pinned.request_key == rk
    filed = RequestRecord.from_json((store / layout.request_path(rk)).read_text())
    assert (filed.engine_key, filed.backend_version, filed.recipe) == (res.key, m.backend_version, m.recipe)


def test_the_builder_records_what_its_probe_reports_not_a_table(tmp_path: Path) -> None:
    """A MIG slice's SMs and memory, and a product no table knows, come from the probe as they are."""
    dev = GPUDevice(
        index=0,
        uuid="MIG-00000000-1111-2222-3333-444444444444",
        name="NVIDIA H200 MIG 1g.35gb",
        memory_mib=33280,
        compute_capability="9.0",
        mig_profile="1g.35gb",
        sm_count=26,
    )
    EmulatedGPUFile(node="n", devices=[dev]).write(tmp_path / "gpus.json")
    probe = EmulatedGPUProbe(tmp_path / "gpus.json", visible="all")
    ident, _ = probe_target(request(tmp_path / "m.onnx", tmp_path, gpu="NVIDIA-H200", mig="1g.35gb"), probe)
    assert (ident.sm_count, ident.memory_mib, ident.mig_profile) == (26, 33280, "1g.35gb")
    l40s = dev.model_copy(update={"name": "NVIDIA L40S", "mig_profile": None, "compute_capability": "8.9"})
    EmulatedGPUFile(node="n", devices=[l40s]).write(tmp_path / "gpus.json")
    ident, _ = probe_target(request(tmp_path / "m.onnx", tmp_path, gpu="NVIDIA-L40S"), probe)
    assert (ident.product, ident.compute_capability) == ("NVIDIA-L40S", "8.9")


def test_resnet50_for_an_emulated_h100_with_a_batch_range(tmp_path: Path) -> None:
    """ResNet-50 has a fixed batch of 1 and a Reshape to [1, 2048]: made symbolic, checked per sample."""
    model = light_model("resnet50")
    probe = emulated_gpu(tmp_path / "gpus.json")
    store = tmp_path / "store"
    inp = light_input_name("resnet50")
    req = request(
        model,
        store,
        gpu="NVIDIA-H100-80GB-HBM3",
        samples=2,
        profiles=[f"{inp}:1x3x224x224:2x3x224x224:2x3x224x224"],
    )
    res = run_build(req, probe=probe)
    assert res.gpu == "NVIDIA-H100-80GB-HBM3" and res.compute_capability == "9.0" and res.mig is None
    m = manifest_of(store, res.key)
    assert m.gpu.sm_count == 132 and m.gpu.mig_profile == "full"
    assert m.inputs[0].shape == [-1, 3, 224, 224] and m.outputs[0].shape == [-1, 1000]
    assert m.build.profiles[0][inp].max == (2, 3, 224, 224)
    canary = Canary.from_bytes((store / layout.engine_path(res.key, m.canary.file)).read_bytes())
    # opt and max are both batch 2 here: the canary keeps the two smallest, the first two
    assert [s[inp].shape for s in canary.inputs] == [(2, 3, 224, 224), (2, 3, 224, 224)]
    assert run_build(req, probe=probe).cache_hit


def test_densenet121_fp32(tmp_path: Path) -> None:
    res = run_build(request(light_model("densenet121"), tmp_path / "s", precision="fp32", samples=2))
    assert res.accuracy is not None and res.accuracy.passed and res.accuracy.max_abs_error < 1e-3


def test_dynamic_models_and_profiles(tmp_path: Path) -> None:
    store = tmp_path / "s"
    cnn = run_build(
        request(dynamic_cnn(), store, profiles=["images:1x3x16x16:4x3x16x16:8x3x16x16"], samples=5)
    )
    m = manifest_of(store, cnn.key)
    assert m.inputs[0].shape == [-1, 3, 16, 16] and {t.name for t in m.outputs} == {"logits", "probs"}
    canary = Canary.from_bytes((store / layout.engine_path(cnn.key, m.canary.file)).read_bytes())
    # samples at opt 4, max 8, min 1, then random batches: the canary keeps the two smallest
    batches = sorted(s["images"].shape[0] for s in canary.inputs)
    assert len(batches) == 2 and batches[0] == 1 and batches[1] <= 4  # min, then opt or a smaller draw
    # a pinned shape (min == max) is fixed in the optimized model
    fixed = run_build(request(dynamic_mlp(), store, profiles=["x:2x32:2x32:2x32"], precision="bf16"))
    assert manifest_of(store, fixed.key).inputs[0].shape == [2, 32]
    # two optimization profiles on a two-input model
    two = run_build(
        request(
            two_input_model(),
            store,
            precision="fp32",
            profiles=["a:1x16:2x16:4x16", "b_in:1x4:2x4:4x4", "a:8x16:8x16:16x16", "b_in:8x4:8x4:16x4"],
        )
    )
    m2 = manifest_of(store, two.key)
    assert len(m2.build.profiles) == 2
    assert len({cnn.key, fixed.key, two.key}) == 3
    # Validation runs samples of every profile, not only the first: the second's batches are 8..16.
    rec = RecordingBackend()
    run_build(
        request(
            two_input_model(),
            tmp_path / "store2",
            precision="fp32",
            samples=2,
            profiles=["a:1x16:2x16:4x16", "b_in:1x4:2x4:4x4", "a:8x16:8x16:16x16", "b_in:8x4:8x4:16x4"],
        ),
        backend=rec,
    )
    batches = sorted(s["a"][0] for s in rec.shapes)
    assert len(batches) == 2 and batches[0] <= 4 and 8 <= batches[1] <= 16, batches


def test_the_qdq_check_reads_real_models() -> None:
    """The int8/fp8 refusal is about models without Q/DQ: an explicitly quantized one passes it."""
    import onnx
    from trtforge_builder.onnx_model import op_types

    from trtforge.tensorrt.policy import has_qdq

    assert has_qdq(op_types(onnx.load(str(qdq_mlp()))))
    assert not has_qdq(op_types(onnx.load(str(dynamic_mlp()))))


class RecordingBackend(OnnxRuntimeBackend):
    """ONNX Runtime, recording the input shapes validation runs the built artifact with."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[dict[str, tuple[int, ...]]] = []

    def load(self, artifact: Path, inp: BuildInputs) -> Any:
        runner = super().load(artifact, inp)
        outer = self

        class Recording:
            def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
                outer.shapes.append({k: v.shape for k, v in feeds.items()})
                return runner.run(feeds)

            def close(self) -> None:
                runner.close()

        return Recording()


class WrongBackend(OnnxRuntimeBackend):
    """Builds, then corrupts one weight of the artifact (what a miscompiled engine would look like)."""

    def build(self, inp: BuildInputs) -> BuildOutput:
        import onnx
        from onnx import numpy_helper

        out = super().build(inp)
        model = onnx.load(str(out.artifact))
        t = max(model.graph.initializer, key=lambda t: int(np.prod(t.dims)))
        arr = numpy_helper.to_array(t).copy()
        arr *= -1.5
        t.CopyFrom(numpy_helper.from_array(arr, t.name))
        onnx.save(model, str(out.artifact))
        return out


def test_a_wrong_artifact_is_caught_and_nothing_published(tmp_path: Path) -> None:
    store = tmp_path / "s"
    with pytest.raises(BuildError) as e:
        run_build(
            request(dynamic_cnn(), store, profiles=["images:1x3x16x16:2x3x16x16:4x3x16x16"]),
            backend=WrongBackend(),
        )
    assert e.value.reason == "ValidationFailed" and e.value.exit_code == 96
    assert "validation failed: output" in str(e.value) and "nothing was published" in str(e.value)
    assert open_store(str(store)).list("") == []


def test_two_builders_racing_on_one_key(tmp_path: Path) -> None:
    """Both build; one commits, the other reports the winner's engine and removes its own files."""
    model = dynamic_mlp()
    store = tmp_path / "s"
    args = [
        sys.executable,
        "-m",
        "trtforge.cli",
        "--log-format",
        "json",
        "build",
        "--model",
        str(model),
        "--gpu",
        "cpu",
        "--profile",
        "x:1x32:4x32:8x32",
        "--store",
        str(store),
    ]
    procs = [
        subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) for _ in range(2)
    ]
    outs = [json.loads(p.communicate(timeout=120)[0].strip().splitlines()[-1]) for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    assert outs[0]["key"] == outs[1]["key"] and outs[0]["sha256"] == outs[1]["sha256"]
    files = open_store(str(store)).list("engines/")
    m = manifest_of(store, outs[0]["key"])
    assert sorted(files) == sorted(
        layout.engine_path(m.key, f) for f in (m.engine_file, m.canary.file, "manifest.json")
    )


def test_cli_second_build_of_the_same_request_is_a_cache_hit_that_builds_nothing(tmp_path: Path) -> None:
    """How fast a cache hit is belongs to benchmarks; here: it is a hit and writes no engine."""
    model = tmp_path / "m.onnx"
    shutil.copy(dynamic_cnn(), model)
    base = [
        sys.executable,
        "-m",
        "trtforge.cli",
        "build",
        "--model",
        str(model),
        "--gpu",
        "cpu",
        "--profile",
        "images:1x3x16x16:2x3x16x16:4x3x16x16",
        "--store",
        str(tmp_path / "s"),
    ]
    first = subprocess.run(base, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    built = json.loads(first.stdout.strip().splitlines()[-1])
    engines = tmp_path / "s" / "engines"
    before = {p: p.stat().st_mtime_ns for p in engines.rglob("*") if p.is_file()}
    assert before, "the first build published nothing"
    second = subprocess.run(base, capture_output=True, text=True, timeout=120)
    assert second.returncode == 0, second.stderr
    res = json.loads(second.stdout.strip().splitlines()[-1])
    assert res["cacheHit"] is True and res["key"] == built["key"]
    assert {p: p.stat().st_mtime_ns for p in engines.rglob("*") if p.is_file()} == before


def test_canary_keeps_the_smallest_samples_in_order() -> None:
    from trtforge_builder.validate import canary_indices

    def sample(batch: int) -> dict[str, np.ndarray]:
        return {"x": np.zeros((batch, 4), np.float32)}

    samples = [sample(b) for b in (4, 8, 1, 3, 1)]
    assert canary_indices(samples) == [2, 4]
    assert canary_indices(samples, n=3) == [2, 3, 4]
    assert canary_indices(samples[:1]) == [0]
