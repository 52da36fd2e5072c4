"""The TensorRT backend: type-checked here against tensorrt-stubs; built and run only where TensorRT is.

The builds marked ``tensorrt`` need the real TensorRT and a GPU (the builder image); they skip here.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

import pytest
from trtforge_builder.backends import select_backend, tensorrt_available
from trtforge_builder.errors import BuildError
from trtforge_dev.modelzoo import dynamic_cnn, dynamic_mlp

ROOT = Path(__file__).resolve().parents[2]
NO_TRT = (
    "needs the real TensorRT builder and a GPU (the builder image); only tensorrt-stubs is installed here"
)


def _split_params(params: str) -> list[str]:
    out, depth, cur = [], 0, ""
    for ch in params:
        depth += 1 if ch in "[(" else -1 if ch in "])" else 0
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    return [*out, cur] if cur.strip() else out


def _fix_def(line: str) -> str:
    """Give a default to a parameter that follows one with a default (invalid syntax in the stubs)."""
    m = re.match(r"^(\s*def \w+\()(.*)(\) -> .*)$", line)
    if not m:
        return line
    params = _split_params(m.group(2))
    seen_default = False
    for i, p in enumerate(params):
        if "=" in p:
            seen_default = True
        elif seen_default and ":" in p and not p.strip().startswith("*"):
            params[i] = p + " = ..."
    return m.group(1) + ",".join(params) + m.group(3)


# Every module written against the real TensorRT API (builder and runtime).
TENSORRT_MODULES = (
    "builder_job/trtforge_builder/backends/tensorrt.py",
    "runtime_image/trtforge_runtime/backends/tensorrt_backend.py",
    "trtforge/tensorrt/engine.py",
)


def _repaired_stubs(dest: Path) -> Path:
    """A copy of the installed tensorrt-stubs that mypy can parse: a few parameters are named `in`, a
    few without defaults follow ones with defaults, and `tensorrt_libs` (a runtime package) is imported."""
    site = Path(sysconfig.get_paths()["purelib"])
    for pkg in ("tensorrt", "tensorrt_bindings"):
        (dest / pkg).mkdir(parents=True, exist_ok=True)
        for stub in (site / pkg).glob("*.pyi"):
            text = re.sub(r"\bin: ", "in_: ", stub.read_text())
            text = re.sub(r"^import tensorrt_libs.*$", "", text, flags=re.M)
            text = "\n".join(_fix_def(line) for line in text.splitlines())
            (dest / pkg / stub.name).write_text(text + "\n")
    return dest


def test_tensorrt_backend_type_checks_against_the_stubs(tmp_path: Path) -> None:
    site = Path(sysconfig.get_paths()["purelib"])
    if not (site / "tensorrt_bindings" / "tensorrt.pyi").exists():
        pytest.skip("tensorrt-stubs is not installed")
    stubs = _repaired_stubs(tmp_path / "stubs")
    # A call the stubs forbid: mypy reports it only if it really read them (an untyped or skipped
    # tensorrt would make every call pass).
    probe = tmp_path / "stubs_probe.py"
    probe.write_text("import tensorrt as trt\n\ntrt.Builder(1, 2, 3)\n")
    env = {**os.environ, "MYPYPATH": str(stubs)}
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--no-incremental",
            "--cache-dir",
            str(tmp_path / "cache"),
            "--follow-imports=silent",
            *TENSORRT_MODULES,
            str(probe),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    # The stubs have errors of their own (a module-level `bool` shadows the builtin); ours must have none.
    ours = [
        line
        for line in p.stdout.splitlines()
        if line.startswith(("builder_job/", "runtime_image/", "trtforge/"))
    ]
    assert not ours, "\n".join(ours)
    assert "[syntax]" not in p.stdout and p.returncode in (0, 1), p.stdout + p.stderr
    probed = [line for line in p.stdout.splitlines() if line.startswith(str(probe))]
    assert any("Builder" in line and "error" in line for line in probed), (
        "mypy did not check the probe against the stubs:\n" + p.stdout
    )


def test_tensorrt_asked_but_not_installed() -> None:
    if tensorrt_available():
        pytest.skip("TensorRT is installed here")
    with pytest.raises(BuildError) as e:
        select_backend("tensorrt", gpu_target=True, probe_kind="nvml")
    assert e.value.reason == "BackendUnavailable" and "not installed" in str(e.value)
    assert select_backend("auto", gpu_target=True, probe_kind="nvml").name == "onnxruntime"
    with pytest.raises(BuildError, match="cannot build for --gpu cpu"):
        select_backend("tensorrt", gpu_target=False, probe_kind="none")


def test_strongly_typed_conversion_keeps_the_interface() -> None:
    """TensorRT 11: the model computes in fp16/bf16, its inputs and outputs stay float32."""
    import onnx
    from onnx import TensorProto
    from trtforge_builder.onnx_model import convert_float_precision, model_io

    model = onnx.load(str(dynamic_cnn()))
    for precision, low in (("fp16", TensorProto.FLOAT16), ("bf16", TensorProto.BFLOAT16)):
        m = convert_float_precision(model, precision)
        onnx.checker.check_model(m)
        inferred = onnx.shape_inference.infer_shapes(m, strict_mode=True)
        io = model_io(inferred)
        assert [t.dtype for t in io.inputs] == ["float32"] and {t.dtype for t in io.outputs} == {"float32"}
        assert all(t.data_type == low for t in m.graph.initializer)
        assert m.graph.node[0].op_type == "Cast" and m.graph.node[-1].op_type == "Cast"


@pytest.mark.tensorrt
@pytest.mark.gpu
@pytest.mark.skipif(not tensorrt_available(), reason=NO_TRT)
def test_tensorrt_build_validate_publish(tmp_path: Path) -> None:  # pragma: no cover - needs TensorRT
    from trtforge_builder.pipeline import run_build
    from trtforge_builder.request import BuildRequest, make_build_config, parse_profiles

    from trtforge.contract import layout
    from trtforge.contract.gpu import GPUTarget
    from trtforge.contract.gpu_probe import probe_from_env
    from trtforge.contract.manifest import Manifest

    probe = probe_from_env("nvml")
    dev = probe.devices()[0]
    build = make_build_config(
        precision="fp16", profiles=parse_profiles(["images:1x3x16x16:4x3x16x16:8x3x16x16"])
    )
    req = BuildRequest(
        model_uri=str(dynamic_cnn()),
        target=GPUTarget(gpu=dev.product),
        build=build,
        store_uri=str(tmp_path / "s"),
        backend="tensorrt",
    )
    res = run_build(req, probe=probe)
    m = Manifest.from_json((tmp_path / "s" / layout.manifest_path(res.key)).read_text())
    assert m.backend == "tensorrt" and m.engine_file.endswith(".plan") and m.layers and m.accuracy.passed
    assert run_build(req, probe=probe).cache_hit


def test_fp16_conversion_leaves_resize_scales_float32(tmp_path: Path) -> None:
    """ONNX requires Resize scales to be float32: the TensorRT 11 cast must not touch them."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from trtforge_builder.onnx_model import convert_float_precision

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 2, 2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 4, 4])
    scales = numpy_helper.from_array(np.array([1, 1, 2, 2], dtype=np.float32), "scales")
    w = numpy_helper.from_array(np.ones((1, 1, 1, 1), dtype=np.float32), "w")
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"]),
        helper.make_node("Resize", ["c", "", "scales"], ["y"], mode="nearest"),
    ]
    model = helper.make_model(
        helper.make_graph(nodes, "g", [x], [y], [scales, w]), opset_imports=[helper.make_opsetid("", 13)]
    )
    m = convert_float_precision(model, "fp16")
    onnx.checker.check_model(m, full_check=True)
    types = {t.name: t.data_type for t in m.graph.initializer}
    assert types == {"scales": TensorProto.FLOAT, "w": TensorProto.FLOAT16}


# --- Real TensorRT (the builder image, with a GPU): every precision, multi-profile, full and lean.
# They skip where TensorRT is not installed; docs/design.md says which of them have run.


def _real_build(tmp_path: Path, model: Path, precision: str, profiles: list[str], **build: Any) -> Any:
    from trtforge_builder.pipeline import run_build
    from trtforge_builder.request import BuildRequest, make_build_config, parse_profiles

    from trtforge.contract import layout
    from trtforge.contract.gpu import GPUTarget
    from trtforge.contract.gpu_probe import probe_from_env
    from trtforge.contract.manifest import Manifest

    probe = probe_from_env("nvml")
    dev = probe.devices()[0]
    req = BuildRequest(
        model_uri=str(model),
        target=GPUTarget(gpu=dev.product, mig=dev.mig_profile),
        build=make_build_config(precision=precision, profiles=parse_profiles(profiles), **build),  # type: ignore[arg-type]
        store_uri=str(tmp_path / "s"),
        backend="tensorrt",
        samples=4,
    )
    res = run_build(req, probe=probe)
    m = Manifest.from_json((tmp_path / "s" / layout.manifest_path(res.key)).read_text())
    return res, m, (tmp_path / "s" / layout.engine_path(res.key, m.engine_file)).read_bytes()


@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16", "auto"])
@pytest.mark.tensorrt
@pytest.mark.gpu
@pytest.mark.skipif(not tensorrt_available(), reason=NO_TRT)
def test_every_precision_builds_validates_and_records_its_flags(
    tmp_path: Path, precision: str
) -> None:  # pragma: no cover - needs TensorRT
    _, m, _ = _real_build(tmp_path, dynamic_mlp(), precision, ["x:1x32:4x32:8x32"])
    assert m.accuracy.passed and m.build.precision == precision and m.recipe >= 2


@pytest.mark.tensorrt
@pytest.mark.gpu
@pytest.mark.skipif(not tensorrt_available(), reason=NO_TRT)
def test_int8_on_a_quantized_model(tmp_path: Path) -> None:  # pragma: no cover - needs TensorRT
    from trtforge_dev.modelzoo import qdq_mlp

    _, m, _ = _real_build(tmp_path, qdq_mlp(), "int8", ["x:1x32:4x32:8x32"])
    assert m.accuracy.passed


@pytest.mark.tensorrt
@pytest.mark.gpu
@pytest.mark.skipif(not tensorrt_available(), reason=NO_TRT)
def test_two_profiles_each_serve_their_batches(tmp_path: Path) -> None:  # pragma: no cover
    import numpy as np
    import onnxruntime as ort
    from trtforge_dev.modelzoo import two_input_model

    from trtforge.tensorrt.cuda import CudaRuntime
    from trtforge.tensorrt.engine import Execution, LoadedEngine

    profiles = ["a:1x16:2x16:4x16", "b_in:1x4:2x4:4x4", "a:8x16:8x16:16x16", "b_in:8x4:8x4:16x4"]
    _, _, plan = _real_build(tmp_path, two_input_model(), "fp32", profiles)
    loaded = LoadedEngine(plan, kind="full", version_compatible=False, lean_excluded=False, what="test")
    assert len(loaded.profiles) == 2
    ex = Execution(loaded, CudaRuntime())
    ref = ort.InferenceSession(str(two_input_model()), providers=["CPUExecutionProvider"])
    try:
        rng = np.random.default_rng(0)
        for batch in (1, 3, 8, 16):  # profile 0, 0, 1, 1
            feeds = {
                "a": rng.standard_normal((batch, 16)).astype(np.float32),
                "b_in": rng.standard_normal((batch, 4)).astype(np.float32),
            }
            got = ex.run(feeds)
            want = dict(zip([o.name for o in ref.get_outputs()], ref.run(None, feeds), strict=True))
            for name, arr in want.items():
                np.testing.assert_allclose(got[name], arr, rtol=1e-4, atol=1e-5)
        with pytest.raises(Exception, match="no optimization profile fits"):
            ex.run({"a": np.zeros((6, 16), np.float32), "b_in": np.zeros((6, 4), np.float32)})
    finally:
        ex.close()
        ex.close()  # idempotent


@pytest.mark.tensorrt
@pytest.mark.gpu
@pytest.mark.skipif(not tensorrt_available(), reason=NO_TRT)
def test_version_compatible_plans_load_in_the_lean_runtime_only(tmp_path: Path) -> None:  # pragma: no cover
    import importlib.util

    from trtforge.tensorrt.engine import EngineLoadError, LoadedEngine

    _, m, plan = _real_build(tmp_path, dynamic_mlp(), "fp16", ["x:1x32:4x32:8x32"], version_compatible=True)
    assert m.build.version_compatible
    with pytest.raises(EngineLoadError, match="EXCLUDE_LEAN_RUNTIME"):
        LoadedEngine(plan, kind="full", version_compatible=True, lean_excluded=True, what="vc plan")
    if importlib.util.find_spec("tensorrt_lean") or importlib.util.find_spec("tensorrt_lean_bindings"):
        loaded = LoadedEngine(plan, kind="lean", version_compatible=True, lean_excluded=True, what="vc plan")
        assert [t.name for t in loaded.inputs] == ["x"]
