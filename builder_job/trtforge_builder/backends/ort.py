"""The ONNX Runtime backend: CPU targets and the test bed's emulated GPUs.

The artifact is an ORT-optimized ONNX model: inputs that one profile pins (min == max) get fixed
shapes first, weights are rounded to the requested precision (fp16/bf16: the compute stays fp32 on
the CPU execution provider, so the accuracy figures show the weight rounding), and ORT's extended
graph optimizations (constant folding, fusions; not the hardware-specific layout transforms) are
applied and saved. No timing cache.
"""

from __future__ import annotations

import collections
import logging
import os
from pathlib import Path
from typing import Any, Literal

import numpy as np

from trtforge.logs import fields
from trtforge_builder.backends.base import BuildInputs, BuildOutput, Runner
from trtforge_builder.errors import BuildError
from trtforge_builder.onnx_model import fix_static_shapes, model_io, round_float_weights, save_model

log = logging.getLogger(__name__)
THREADS_ENV = "TRTFORGE_ORT_THREADS"


def session_options(optimize: bool = True) -> Any:
    import onnxruntime as ort

    so = ort.SessionOptions()
    threads = int(os.environ.get(THREADS_ENV, "0") or 0)
    if threads:
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
    so.graph_optimization_level = (
        ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        if optimize
        else ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    )
    so.log_severity_level = 3
    return so


def open_session(path: Path | bytes, optimize: bool = True) -> Any:
    import onnxruntime as ort

    return ort.InferenceSession(
        path if isinstance(path, bytes) else str(path),
        session_options(optimize),
        providers=["CPUExecutionProvider"],
    )


class OrtRunner:
    def __init__(self, session: Any) -> None:
        self.session = session
        self.output_names = [o.name for o in session.get_outputs()]

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        outs = self.session.run(self.output_names, feeds)
        return dict(zip(self.output_names, outs, strict=True))

    def close(self) -> None:
        self.session = None


class OnnxRuntimeBackend:
    name: Literal["onnxruntime"] = "onnxruntime"
    cuda = "none"
    artifact_suffix = ".onnx"
    uses_timing_cache = False

    def __init__(self) -> None:
        import onnxruntime

        self.version = str(onnxruntime.__version__)

    def build(self, inp: BuildInputs) -> BuildOutput:
        import onnx

        precision = inp.config.precision
        if precision in ("int8", "fp8"):
            raise BuildError(
                f"precision {precision} needs a quantized (Q/DQ) model and the TensorRT backend; the "
                "onnxruntime backend builds fp32, fp16, bf16 or auto",
                "InvalidArgument",
                step="build",
            )
        model = onnx.load(str(inp.model_path))
        model, fixed = fix_static_shapes(model, inp.profiles)
        model, rounded = round_float_weights(model, "fp32" if precision == "auto" else precision)
        prepared = inp.workdir / "ort-prepared.onnx"
        save_model(model, prepared)
        artifact = inp.workdir / f"model{self.artifact_suffix}"
        so = session_options(optimize=True)
        so.optimized_model_filepath = str(artifact)
        log.info(
            "optimizing with ONNX Runtime",
            extra=fields(fixed_inputs=fixed, precision=precision, weights_rounded=rounded),
        )
        try:
            import onnxruntime as ort

            ort.InferenceSession(str(prepared), so, providers=["CPUExecutionProvider"])
        except Exception as e:
            raise BuildError(
                f"ONNX Runtime could not load model {inp.source}: {str(e).splitlines()[0][:300]}",
                "BuildFailed",
                step="build",
            ) from e
        prepared.unlink(missing_ok=True)
        optimized = onnx.load(str(artifact))
        io = model_io(optimized)
        layers = dict(sorted(collections.Counter(n.op_type for n in optimized.graph.node).items()))
        return BuildOutput(
            artifact=artifact,
            inputs=[t.spec() for t in io.inputs],
            outputs=[t.spec() for t in io.outputs],
            layers=layers,
        )

    def load(self, artifact: Path, inp: BuildInputs) -> Runner:
        try:
            return OrtRunner(open_session(artifact, optimize=False))
        except Exception as e:
            raise BuildError(
                f"ONNX Runtime could not load the built artifact: {str(e).splitlines()[0][:300]}",
                "BuildFailed",
                step="validate",
            ) from e

    def merge_timing_caches(self, ours: bytes, theirs: bytes) -> bytes:
        return ours
