"""The TensorRT backend (production GPUs), written for TensorRT 10 and 11.

- ``create_network(0)``; ``OnnxParser``, with each parser error reported with its node (index,
  name, operator) and the parser's own description.
- TensorRT 11 is strongly typed: no FP16/BF16/INT8/FP8 builder flags. For fp16/bf16 the ONNX model
  is converted to that type before parsing (:func:`~trtforge_builder.onnx_model.convert_float_precision`);
  int8/fp8 need Q/DQ nodes in the model. TensorRT 10 gets the precision flags instead.
- One optimization profile per requested profile (``set_shape(name, min, opt, max)``).
- ``set_memory_pool_limit(WORKSPACE, n)``, ``builder_optimization_level``,
  ``hardware_compatibility_level``, ``VERSION_COMPATIBLE``, ``STRIP_PLAN`` (+ ``REFIT_IDENTICAL``:
  the runtime refits from the ONNX with ``OnnxParserRefitter``).
- Timing cache: ``create_timing_cache(loaded)`` / ``set_timing_cache`` / ``serialize``; merged with
  ``combine`` when another builder saved one meanwhile.
- The engine inspector's layer summary (layer type -> count) goes into ``manifest.layers``.

Flags and enums are looked up by name (``getattr(trt.BuilderFlag, "FP16")``) so the same code runs
where a name is gone, and the manifest stores names, never enum integers.
Needs a GPU and the real TensorRT; validation runs the engine through cuda-python.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from trtforge.contract.manifest import TensorSpec
from trtforge.logs import fields
from trtforge_builder.backends.base import BuildInputs, BuildOutput, Runner
from trtforge_builder.errors import BuildError
from trtforge_builder.onnx_model import convert_float_precision, save_model

if TYPE_CHECKING:
    import tensorrt as trt

log = logging.getLogger(__name__)

HW_COMPAT = {"none": "NONE", "amperePlus": "AMPERE_PLUS", "sameComputeCapability": "SAME_COMPUTE_CAPABILITY"}
PRECISION_FLAGS = {"fp16": ["FP16"], "bf16": ["BF16"], "int8": ["INT8"], "fp8": ["FP8"], "auto": ["FP16"]}


def _trt() -> Any:
    import tensorrt

    return tensorrt


def trt_version() -> str:
    return str(getattr(_trt(), "__version__", "0"))


def trt_major() -> int:
    m = re.match(r"(\d+)", trt_version())
    return int(m.group(1)) if m else 0


def cuda_version() -> str:
    """CUDA major.minor TensorRT runs on: $CUDA_VERSION (NVIDIA's containers set it), else the runtime."""
    env = os.environ.get("TRTFORGE_CUDA_VERSION") or os.environ.get("CUDA_VERSION")
    if env:
        m = re.match(r"(\d+)\.(\d+)", env)
        if m:
            return f"{m.group(1)}.{m.group(2)}"
    try:
        from cuda.bindings import runtime as cudart  # type: ignore[import-not-found,unused-ignore]

        err, v = cudart.cudaRuntimeGetVersion()
        if int(err) == 0:
            return f"{v // 1000}.{(v % 1000) // 10}"
    except Exception:
        pass
    return "unknown"


def _flag(name: str) -> trt.BuilderFlag | None:
    return getattr(_trt().BuilderFlag, name, None)


def parser_errors(parser: trt.OnnxParser, limit: int = 10) -> str:
    """Every parser error with the node it came from, one per `; `."""
    out = []
    for i in range(min(parser.num_errors, limit)):
        e = parser.get_error(i)
        node = e.node()
        where = f"node {node}" if node >= 0 else "model"
        name = getattr(e, "node_name", lambda: "")() or ""
        op = getattr(e, "node_operator", lambda: "")() or ""
        if name or op:
            where += f" ({name or '?'}: {op or '?'})"
        out.append(f"{where}: {e.desc()}")
    more = parser.num_errors - limit
    if more > 0:
        out.append(f"and {more} more")
    return "; ".join(out)


class _Logger:
    """Collects TensorRT's errors so a failed build can say why."""

    def __init__(self) -> None:
        trt_mod = _trt()
        outer = self

        class L(trt_mod.ILogger):  # type: ignore[misc,name-defined,unused-ignore]
            def __init__(self) -> None:
                trt_mod.ILogger.__init__(self)

            def log(self, severity: Any, msg: str) -> None:
                outer.on_log(severity, msg)

        self.errors: list[str] = []
        self.logger = L()

    def on_log(self, severity: Any, msg: str) -> None:
        sev = _trt().ILogger.Severity
        if severity in (sev.ERROR, sev.INTERNAL_ERROR):
            self.errors.append(msg)
            log.error("tensorrt: %s", msg)
        elif severity == sev.WARNING:
            log.warning("tensorrt: %s", msg)
        else:
            log.debug("tensorrt: %s", msg)


def layer_summary(engine: trt.ICudaEngine) -> dict[str, int]:
    """Layer type -> count, from the engine inspector (JSON; type names as TensorRT gives them)."""
    trt_mod = _trt()
    inspector: trt.EngineInspector = engine.create_engine_inspector()
    counts: collections.Counter[str] = collections.Counter()
    try:
        info = json.loads(inspector.get_engine_information(trt_mod.LayerInformationFormat.JSON))
    except (ValueError, TypeError):
        return {}
    for layer in info.get("Layers", []):
        if isinstance(layer, dict):
            counts[str(layer.get("LayerType", "Unknown"))] += 1
        else:  # names only (profiling verbosity too low)
            counts["Layer"] += 1
    return dict(sorted(counts.items()))


def _dtype_name(trt_dtype: Any) -> str:
    try:
        return np.dtype(_trt().nptype(trt_dtype)).name
    except Exception:
        return str(trt_dtype).rsplit(".", 1)[-1].lower()


def io_specs(engine: trt.ICudaEngine) -> tuple[list[TensorSpec], list[TensorSpec]]:
    trt_mod = _trt()
    ins: list[TensorSpec] = []
    outs: list[TensorSpec] = []
    for i in range(engine.num_io_tensors):
        name = engine.get_tensor_name(i)
        dims = engine.get_tensor_shape(name)
        spec = TensorSpec(
            name=name,
            dtype=_dtype_name(engine.get_tensor_dtype(name)),
            shape=[int(dims[j]) for j in range(len(dims))],
        )
        (ins if engine.get_tensor_mode(name) == trt_mod.TensorIOMode.INPUT else outs).append(spec)
    return ins, outs


class TensorRTBackend:
    name: Literal["tensorrt"] = "tensorrt"
    artifact_suffix = ".plan"
    uses_timing_cache = True

    def __init__(self) -> None:
        self.version = trt_version()
        self.cuda = cuda_version()
        self.strongly_typed = trt_major() >= 11

    def build(self, inp: BuildInputs) -> BuildOutput:
        trt_mod = _trt()
        cfg = inp.config
        tlog = _Logger()
        builder: trt.Builder = trt_mod.Builder(tlog.logger)
        network: trt.INetworkDefinition = builder.create_network(0)
        parser: trt.OnnxParser = trt_mod.OnnxParser(network, tlog.logger)
        model_path = inp.model_path
        if self.strongly_typed and cfg.precision in ("fp16", "bf16"):
            import onnx

            converted = inp.workdir / f"model-{cfg.precision}.onnx"
            save_model(convert_float_precision(onnx.load(str(model_path)), cfg.precision), converted)
            log.info("converted the model for strongly typed TensorRT", extra=fields(precision=cfg.precision))
            model_path = converted
        if not parser.parse_from_file(str(model_path)):
            raise BuildError(
                f"TensorRT could not parse model {inp.source}: {parser_errors(parser)}",
                "BuildFailed",
                step="build",
            )

        config: trt.IBuilderConfig = builder.create_builder_config()
        if not self.strongly_typed:
            for name in PRECISION_FLAGS.get(cfg.precision, []):
                flag = _flag(name)
                if flag is None:
                    raise BuildError(
                        f"TensorRT {self.version} has no builder flag {name} for precision {cfg.precision}",
                        "InvalidArgument",
                        step="build",
                    )
                config.set_flag(flag)
        elif cfg.precision in ("int8", "fp8"):
            log.info("strongly typed TensorRT: int8/fp8 precision comes from the model's Q/DQ nodes")
        if cfg.workspace_bytes is not None:
            config.set_memory_pool_limit(trt_mod.MemoryPoolType.WORKSPACE, cfg.workspace_bytes)
        config.builder_optimization_level = cfg.optimization_level
        if cfg.hardware_compatibility != "none":
            level = getattr(trt_mod.HardwareCompatibilityLevel, HW_COMPAT[cfg.hardware_compatibility], None)
            if level is None:
                raise BuildError(
                    f"TensorRT {self.version} does not support hardware compatibility "
                    f"{cfg.hardware_compatibility}",
                    "InvalidArgument",
                    step="build",
                )
            config.hardware_compatibility_level = level
        for name, wanted in (
            ("VERSION_COMPATIBLE", cfg.version_compatible),
            ("STRIP_PLAN", cfg.strip_weights),
            ("REFIT_IDENTICAL", cfg.strip_weights),
        ):
            if wanted:
                flag = _flag(name)
                if flag is None:
                    raise BuildError(
                        f"TensorRT {self.version} has no builder flag {name}", "InvalidArgument", step="build"
                    )
                config.set_flag(flag)
        config.profiling_verbosity = trt_mod.ProfilingVerbosity.DETAILED

        for prof in inp.profiles:
            p: trt.IOptimizationProfile = builder.create_optimization_profile()
            for name, rng in prof.items():
                p.set_shape(
                    name,
                    trt_mod.Dims(list(rng.min)),
                    trt_mod.Dims(list(rng.opt)),
                    trt_mod.Dims(list(rng.max)),
                )
            config.add_optimization_profile(p)

        cache: trt.ITimingCache = config.create_timing_cache(inp.timing_cache or b"")
        if not config.set_timing_cache(cache, False):
            log.warning("the stored timing cache does not match this GPU or TensorRT; starting a new one")
            cache = config.create_timing_cache(b"")
            config.set_timing_cache(cache, False)

        serialized: trt.IHostMemory | None = builder.build_serialized_network(network, config)
        if serialized is None:
            why = "; ".join(tlog.errors[-3:]) or "no error was logged"
            raise BuildError(
                f"TensorRT failed to build model {inp.source}: {why}", "BuildFailed", step="build"
            )
        artifact = inp.workdir / f"engine{self.artifact_suffix}"
        with open(artifact, "wb") as f:
            f.write(memoryview(serialized))

        runtime: trt.Runtime = trt_mod.Runtime(tlog.logger)
        engine: trt.ICudaEngine | None = runtime.deserialize_cuda_engine(memoryview(serialized))
        if engine is None:  # returns None, does not raise
            raise BuildError(
                f"TensorRT built an engine it cannot load: {'; '.join(tlog.errors[-3:])}",
                "BuildFailed",
                step="build",
            )
        ins, outs = io_specs(engine)
        return BuildOutput(
            artifact=artifact,
            inputs=ins,
            outputs=outs,
            layers=layer_summary(engine),
            timing_cache=bytes(memoryview(cache.serialize())),
        )

    def load(self, artifact: Path, inp: BuildInputs) -> Runner:
        return TensorRTRunner(artifact, inp.model_path if inp.config.strip_weights else None)

    def merge_timing_caches(self, ours: bytes, theirs: bytes) -> bytes:
        trt_mod = _trt()
        tlog = _Logger()
        config: trt.IBuilderConfig = trt_mod.Builder(tlog.logger).create_builder_config()
        mine: trt.ITimingCache = config.create_timing_cache(ours)
        other: trt.ITimingCache = config.create_timing_cache(theirs)
        if not mine.combine(other, False):
            log.warning("could not merge the timing cache another builder saved; keeping ours")
        return bytes(memoryview(mine.serialize()))


class TensorRTRunner:
    """Runs an engine on one sample through cuda-python (profile 0)."""

    def __init__(self, artifact: Path, refit_from: Path | None) -> None:
        trt_mod = _trt()
        try:
            from cuda.bindings import runtime as cudart  # type: ignore[import-not-found,unused-ignore]
        except ImportError as e:
            raise BuildError(
                "validating a TensorRT engine needs cuda-python (cuda.bindings) in the image",
                "BackendUnavailable",
                step="validate",
            ) from e
        self.cudart: Any = cudart
        self.tlog = _Logger()
        runtime: trt.Runtime = trt_mod.Runtime(self.tlog.logger)
        engine: trt.ICudaEngine | None = runtime.deserialize_cuda_engine(artifact.read_bytes())
        if engine is None:
            raise BuildError(
                f"TensorRT cannot load the engine it built: {'; '.join(self.tlog.errors[-3:])}",
                "BuildFailed",
                step="validate",
            )
        if refit_from is not None:  # a weight-stripped engine: refit from the ONNX weights
            refitter: trt.Refitter = trt_mod.Refitter(engine, self.tlog.logger)
            parser_refitter: trt.OnnxParserRefitter = trt_mod.OnnxParserRefitter(refitter, self.tlog.logger)
            if not parser_refitter.refit_from_file(str(refit_from)) or not refitter.refit_cuda_engine():
                raise BuildError(
                    "refitting the weight-stripped engine from the ONNX weights failed",
                    "BuildFailed",
                    step="validate",
                )
        self.engine: trt.ICudaEngine = engine
        self.context: trt.IExecutionContext = engine.create_execution_context()
        self.trt = trt_mod
        err, self.stream = cudart.cudaStreamCreate()
        self._check(err, "cudaStreamCreate")

    def _check(self, err: Any, what: str) -> None:
        if int(err) != 0:
            raise BuildError(f"CUDA {what} failed with error {int(err)}", "BuildFailed", step="validate")

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        cudart, engine, ctx, trt_mod = self.cudart, self.engine, self.context, self.trt
        ptrs: list[int] = []
        outputs: dict[str, np.ndarray] = {}
        try:
            names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
            inputs = [n for n in names if engine.get_tensor_mode(n) == trt_mod.TensorIOMode.INPUT]
            for n in inputs:
                arr = np.ascontiguousarray(feeds[n].astype(trt_mod.nptype(engine.get_tensor_dtype(n))))
                ctx.set_input_shape(n, arr.shape)
                err, ptr = cudart.cudaMalloc(max(arr.nbytes, 1))
                self._check(err, "cudaMalloc")
                ptrs.append(ptr)
                (err,) = cudart.cudaMemcpy(
                    ptr, arr.ctypes.data, arr.nbytes, cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
                )
                self._check(err, "cudaMemcpy")
                ctx.set_tensor_address(n, ptr)
            host: dict[str, tuple[np.ndarray, int]] = {}
            for n in names:
                if n in inputs:
                    continue
                dims = ctx.get_tensor_shape(n)
                shape = tuple(int(dims[j]) for j in range(len(dims)))
                if any(d < 0 for d in shape):
                    raise BuildError(
                        f"output {n!r} has a data-dependent shape {shape}; not supported",
                        "BuildFailed",
                        step="validate",
                    )
                out = np.empty(shape, dtype=trt_mod.nptype(engine.get_tensor_dtype(n)))
                err, ptr = cudart.cudaMalloc(max(out.nbytes, 1))
                self._check(err, "cudaMalloc")
                ptrs.append(ptr)
                ctx.set_tensor_address(n, ptr)
                host[n] = (out, ptr)
            if not ctx.execute_async_v3(self.stream):
                raise BuildError(
                    f"TensorRT execution failed: {'; '.join(self.tlog.errors[-3:])}",
                    "BuildFailed",
                    step="validate",
                )
            for n, (out, ptr) in host.items():
                (err,) = cudart.cudaMemcpyAsync(
                    out.ctypes.data,
                    ptr,
                    out.nbytes,
                    cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost,
                    self.stream,
                )
                self._check(err, "cudaMemcpyAsync")
                outputs[n] = out
            (err,) = cudart.cudaStreamSynchronize(self.stream)
            self._check(err, "cudaStreamSynchronize")
        finally:
            for p in ptrs:
                cudart.cudaFree(p)
        return outputs

    def close(self) -> None:
        self.cudart.cudaStreamDestroy(self.stream)
