"""The TensorRT backend (production GPUs), written for TensorRT 10 and 11.

- ``create_network(0)``; ``OnnxParser``, with each parser error reported with its node (index,
  name, operator) and the parser's own description.
- Builder flags per precision and TensorRT major are :func:`trtforge.tensorrt.policy.builder_flags`'s
  (TF32 cleared for fp32; TensorRT 11 has no precision flags, so fp16/bf16 convert the ONNX model
  before parsing; int8/fp8 without Q/DQ nodes are refused, docs/design.md §"TensorRT").
- One optimization profile per requested profile (``set_shape(name, min, opt, max)``).
- ``set_memory_pool_limit(WORKSPACE, n)``, ``builder_optimization_level``,
  ``hardware_compatibility_level``, ``VERSION_COMPATIBLE`` + ``EXCLUDE_LEAN_RUNTIME`` (the lean
  runtime of the same version loads such plans). Weight stripping is refused until the runtime refits.
- Timing cache: ``create_timing_cache(loaded)`` / ``set_timing_cache`` / ``serialize``; merged with
  ``combine`` when another builder saved one meanwhile.
- The engine inspector's layer summary (layer type -> count) goes into ``manifest.layers``.

Flags and enums are looked up by name (``getattr(trt.BuilderFlag, "FP16")``) so the same code runs
where a name is gone, and the manifest stores names, never enum integers. Validation loads and runs
the plan through the same :mod:`trtforge.tensorrt.engine` layer as the runtime. Needs a GPU and the
real TensorRT.
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

from trtforge.contract.engine_key import RECIPE_VERSION
from trtforge.contract.manifest import TensorSpec
from trtforge.logs import fields
from trtforge.tensorrt import policy
from trtforge.tensorrt.cuda import CudaRuntime
from trtforge.tensorrt.engine import (
    EngineLoadError,
    Execution,
    ExecutionError,
    LoadedEngine,
    TensorRTUnavailable,
    capturing_logger,
    numpy_dtype,
)
from trtforge_builder.backends.base import BuildInputs, BuildOutput, Runner
from trtforge_builder.errors import BuildError
from trtforge_builder.onnx_model import convert_float_precision, op_types, save_model

if TYPE_CHECKING:
    import tensorrt as trt

log = logging.getLogger(__name__)


def _trt() -> Any:
    import tensorrt

    return tensorrt


def trt_version() -> str:
    return str(getattr(_trt(), "__version__", "0"))


def trt_major() -> int:
    m = re.match(r"(\d+)", trt_version())
    return int(m.group(1)) if m else 0


def cuda_version() -> str:
    """CUDA major.minor TensorRT runs on: the CUDA runtime's own answer, else $CUDA_VERSION (NVIDIA's
    containers set it). Part of the engine key, so it is what is really there, never a default."""
    try:
        return CudaRuntime().version()
    except Exception:  # no libcudart: fall back to what the image declares
        pass
    env = os.environ.get("CUDA_VERSION")
    if env:
        m = re.match(r"(\d+)\.(\d+)", env)
        if m:
            return f"{m.group(1)}.{m.group(2)}"
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
    """numpy name of a TensorRT type; bf16 and fp8 included (``trt.nptype`` raises for them)."""
    return policy.dtype_name(str(getattr(trt_dtype, "name", trt_dtype)))


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
        self.major = trt_major()

    def build(self, inp: BuildInputs) -> BuildOutput:
        trt_mod = _trt()
        cfg = inp.config
        tlog = capturing_logger(trt_mod)  # the process's one logger (TensorRT keeps the first)
        seen = len(tlog.errors)
        builder: trt.Builder = trt_mod.Builder(tlog)
        network: trt.INetworkDefinition = builder.create_network(0)
        parser: trt.OnnxParser = trt_mod.OnnxParser(network, tlog)
        model_path = inp.model_path
        import onnx

        try:
            plan = policy.builder_flags(
                cfg, self.major, model_has_qdq=policy.has_qdq(op_types(onnx.load(str(model_path))))
            )
        except policy.PrecisionRefused as e:
            raise BuildError(f"model {inp.source}: {e}", "InvalidArgument", step="build") from e
        if plan.convert_model_to is not None:
            converted = inp.workdir / f"model-{plan.convert_model_to}.onnx"
            save_model(convert_float_precision(onnx.load(str(model_path)), plan.convert_model_to), converted)
            log.info("converted the model for strongly typed TensorRT", extra=fields(precision=cfg.precision))
            model_path = converted
        if not parser.parse_from_file(str(model_path)):
            raise BuildError(
                f"TensorRT could not parse model {inp.source}: {parser_errors(parser)}",
                "BuildFailed",
                step="build",
            )

        config: trt.IBuilderConfig = builder.create_builder_config()
        for name in plan.set:
            flag = _flag(name)
            if flag is None:
                raise BuildError(
                    f"TensorRT {self.version} has no builder flag {name} (precision {cfg.precision})",
                    "InvalidArgument",
                    step="build",
                )
            config.set_flag(flag)
        for name in plan.clear:
            flag = _flag(name)
            if flag is not None:
                config.clear_flag(flag)
        log.info("builder flags", extra=fields(set=list(plan.set), clear=list(plan.clear), major=self.major))
        if cfg.workspace_bytes is not None:
            config.set_memory_pool_limit(trt_mod.MemoryPoolType.WORKSPACE, cfg.workspace_bytes)
        config.builder_optimization_level = cfg.optimization_level
        if plan.hardware_level is not None:
            level = getattr(trt_mod.HardwareCompatibilityLevel, plan.hardware_level, None)
            if level is None:
                raise BuildError(
                    f"TensorRT {self.version} does not support hardware compatibility "
                    f"{cfg.hardware_compatibility}",
                    "InvalidArgument",
                    step="build",
                )
            config.hardware_compatibility_level = level
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
            why = "; ".join(tlog.errors[seen:][-3:]) or "no error was logged"
            raise BuildError(
                f"TensorRT failed to build model {inp.source}: {why}", "BuildFailed", step="build"
            )
        artifact = inp.workdir / f"engine{self.artifact_suffix}"
        with open(artifact, "wb") as f:
            f.write(memoryview(serialized))

        runtime: trt.Runtime = trt_mod.Runtime(tlog)
        # A version-compatible plan is only checked here for its IO; validation loads it as the
        # runtime will (the lean runtime), see load().
        runtime.engine_host_code_allowed = cfg.version_compatible
        engine: trt.ICudaEngine | None = runtime.deserialize_cuda_engine(memoryview(serialized))
        if engine is None:  # returns None, does not raise
            raise BuildError(
                f"TensorRT built an engine it cannot load: {'; '.join(tlog.errors[seen:][-3:])}",
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
        return TensorRTRunner(artifact, inp.config.version_compatible)

    def merge_timing_caches(self, ours: bytes, theirs: bytes) -> bytes:
        trt_mod = _trt()
        config: trt.IBuilderConfig = trt_mod.Builder(capturing_logger(trt_mod)).create_builder_config()
        mine: trt.ITimingCache = config.create_timing_cache(ours)
        other: trt.ITimingCache = config.create_timing_cache(theirs)
        if not mine.combine(other, False):
            log.warning("could not merge the timing cache another builder saved; keeping ours")
        return bytes(memoryview(mine.serialize()))


class TensorRTRunner:
    """Runs the built plan the way the runtime will: the shared loader (lean runtime for
    version-compatible plans), the profile that fits each sample, buffers freed on close."""

    def __init__(self, artifact: Path, version_compatible: bool) -> None:
        kind = policy.runtime_kind(version_compatible, RECIPE_VERSION)
        try:
            self.loaded = LoadedEngine(
                artifact.read_bytes(),
                kind=kind,
                version_compatible=version_compatible,
                lean_excluded=policy.lean_excluded(version_compatible, RECIPE_VERSION),
                what=f"the engine just built ({artifact.name})",
            )
            self.exec = Execution(self.loaded, CudaRuntime())
        except (EngineLoadError, TensorRTUnavailable, ExecutionError, OSError) as e:
            raise BuildError(
                f"TensorRT cannot load the engine it built: {e}", "BuildFailed", step="validate"
            ) from e

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        try:
            return self.exec.run(feeds)
        except ExecutionError as e:
            raise BuildError(f"TensorRT execution failed: {e}", "BuildFailed", step="validate") from e

    def close(self) -> None:
        self.exec.close()
        self.loaded.close()


__all__ = ["TensorRTBackend", "TensorRTRunner", "numpy_dtype"]
