"""The thin layer over the real TensorRT: import, load, refit, run, close (docs/design.md §"TensorRT").

Decisions come from :mod:`trtforge.tensorrt.policy`; this module only applies them. Shared by the
builder (validation) and the runtime (serving). TensorRT is imported on first use, never at import.

- Import: the full runtime as ``tensorrt`` (or ``tensorrt_bindings``), the lean runtime as
  ``tensorrt_lean`` (the ``tensorrt-lean-cu13`` meta package) or ``tensorrt_lean_bindings`` (the
  ``tensorrt-lean-cu13-bindings`` wheel alone).
- Load: which runtime may deserialize a plan, and whether it may run embedded host code, is
  :func:`~trtforge.tensorrt.policy.load_plan`'s; ``deserialize_cuda_engine`` returns None rather
  than raising, so the errors TensorRT logged go into :class:`EngineLoadError`.
- Run: the optimization profile that fits the batch (one execution context per profile used),
  ``set_input_shape`` checked, shape-tensor inputs kept in host memory, outputs sized after the
  input shapes, one stream; buffers are only freed in :meth:`Execution.close`, after a sync.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trtforge.contract.engine_key import ShapeRange
from trtforge.tensorrt import policy
from trtforge.tensorrt.cuda import D2H, H2D, STICKY_CUDA_ERRORS, CudaError, CudaRuntime

log = logging.getLogger(__name__)

MODULES: dict[policy.RuntimeKind, tuple[str, ...]] = {
    "full": ("tensorrt", "tensorrt_bindings"),
    "lean": ("tensorrt_lean", "tensorrt_lean_bindings"),
}


class TensorRTUnavailable(ImportError):
    """No TensorRT module of the kind needed is installed."""


class EngineLoadError(RuntimeError):
    """The plan cannot be loaded here; the message says why (TensorRT's own errors included)."""


class ExecutionError(RuntimeError):
    """A batch could not run (bad shape, TensorRT refused); ``device_fault`` when CUDA is unusable."""

    def __init__(self, message: str, device_fault: bool = False) -> None:
        super().__init__(message)
        self.device_fault = device_fault


def import_tensorrt(kind: policy.RuntimeKind) -> tuple[Any, str]:
    """The TensorRT module of `kind` and the name it was found under."""
    errors = []
    for name in MODULES[kind]:
        try:
            return importlib.import_module(name), name
        except ImportError as e:
            errors.append(f"{name}: {e}")
    raise TensorRTUnavailable(f"no {kind} TensorRT runtime is installed ({'; '.join(errors)})")


def numpy_dtype(trt_dtype: Any) -> np.dtype[Any]:
    """The host dtype of a TensorRT DataType, bf16 and fp8 included (``trt.nptype`` raises for them)."""
    name = policy.dtype_name(str(getattr(trt_dtype, "name", trt_dtype)))
    if name in ("bfloat16", "float8_e4m3fn"):
        try:
            import ml_dtypes
        except ImportError as e:
            raise EngineLoadError(f"tensors of type {name} need the ml_dtypes package on the host") from e
        return np.dtype(getattr(ml_dtypes, name))
    return np.dtype(name)


_LOGGERS: dict[str, Any] = {}


def capturing_logger(trt: Any) -> Any:
    """One ILogger per TensorRT module for the whole process, logging through `logging` and keeping
    errors. TensorRT keeps the first logger it was given and ignores later ones (seen with 11.4:
    "The logger passed into createInferRuntime differs from one already registered"), so callers
    read the errors logged since they started (``len(logger.errors)`` before, slice after)."""
    key = getattr(trt, "__name__", "tensorrt")
    found = _LOGGERS.get(key)
    if found is not None:
        return found

    class _Logger(trt.ILogger):  # type: ignore[misc,name-defined,unused-ignore]
        def __init__(self) -> None:
            trt.ILogger.__init__(self)
            self.errors: list[str] = []

        def log(self, severity: Any, msg: str) -> None:
            sev = trt.ILogger.Severity
            if severity in (sev.INTERNAL_ERROR, sev.ERROR):
                self.errors.append(msg)
                log.error("tensorrt: %s", msg)
            elif severity == sev.WARNING:
                log.warning("tensorrt: %s", msg)
            else:
                log.debug("tensorrt: %s", msg)

    _LOGGERS[key] = _Logger()
    return _LOGGERS[key]


@dataclass(frozen=True)
class TensorInfo:
    name: str
    is_input: bool
    dtype: np.dtype[Any]
    on_host: bool  # a shape tensor: TensorRT reads it from host memory


class LoadedEngine:
    """A deserialized engine, with its IO and the shape ranges of every optimization profile."""

    def __init__(
        self,
        plan: bytes,
        *,
        kind: policy.RuntimeKind,
        version_compatible: bool,
        lean_excluded: bool,
        what: str,
        refit_from: Path | None = None,
    ) -> None:
        decision = policy.load_plan(kind, version_compatible=version_compatible, lean_excluded=lean_excluded)
        if not decision.allowed:
            raise EngineLoadError(f"{what}: {decision.reason}")
        trt, self.module = import_tensorrt(kind)
        self.trt = trt
        self.version = str(getattr(trt, "__version__", "?"))
        self.logger = capturing_logger(trt)  # lives as long as the process
        seen = len(self.logger.errors)
        runtime = trt.Runtime(self.logger)
        if runtime is None:
            raise EngineLoadError(f"{what}: TensorRT {self.version} could not create a runtime")
        runtime.engine_host_code_allowed = decision.host_code_allowed
        engine = runtime.deserialize_cuda_engine(plan)
        if engine is None:
            detail = "; ".join(self.logger.errors[seen:][-3:]) or "no error was logged"
            raise EngineLoadError(
                f"TensorRT {self.version} ({self.module}) could not deserialize {what}: {detail}"
            )
        self.runtime = runtime
        self.engine = engine
        if refit_from is not None:
            self._refit(refit_from, what)
        self.tensors: dict[str, TensorInfo] = {}
        for i in range(engine.num_io_tensors):
            name = engine.get_tensor_name(i)
            self.tensors[name] = TensorInfo(
                name=name,
                is_input=engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT,
                dtype=numpy_dtype(engine.get_tensor_dtype(name)),
                on_host=engine.get_tensor_location(name) == trt.TensorLocation.HOST,
            )
        self.profiles: list[dict[str, ShapeRange]] = []
        for p in range(engine.num_optimization_profiles):
            ranges = {}
            for t in self.inputs:
                if t.on_host:
                    continue
                lo, opt, hi = (
                    tuple(int(d) for d in dims) for dims in engine.get_tensor_profile_shape(t.name, p)
                )
                ranges[t.name] = ShapeRange(min=lo, opt=opt, max=hi)
            self.profiles.append(ranges)

    @property
    def inputs(self) -> list[TensorInfo]:
        return [t for t in self.tensors.values() if t.is_input]

    @property
    def outputs(self) -> list[TensorInfo]:
        return [t for t in self.tensors.values() if not t.is_input]

    def _refit(self, onnx_path: Path, what: str) -> None:
        """Refit a weight-stripped engine from the ONNX it was parsed from (full runtime only)."""
        trt = self.trt
        if not hasattr(trt, "Refitter") or not hasattr(trt, "OnnxParserRefitter"):
            raise EngineLoadError(f"{what}: the {self.module} runtime cannot refit engines")
        refitter = trt.Refitter(self.engine, self.logger)
        parser_refitter = trt.OnnxParserRefitter(refitter, self.logger)
        if not parser_refitter.refit_from_file(str(onnx_path)) or not refitter.refit_cuda_engine():
            detail = "; ".join(self.logger.errors[-3:]) or "no error was logged"
            raise EngineLoadError(f"{what}: refitting from {onnx_path.name} failed: {detail}")

    def close(self) -> None:
        self.engine = None
        self.runtime = None


class Execution:
    """Runs batches on one stream; one execution context per optimization profile used."""

    def __init__(self, loaded: LoadedEngine, cuda: CudaRuntime) -> None:
        self.loaded = loaded
        self.cuda = cuda
        self.stream = cuda.stream()
        self._contexts: dict[int, Any] = {}
        self._buffers: dict[tuple[int, str], tuple[int, int]] = {}  # (profile, tensor) -> (ptr, bytes)
        self._host: dict[tuple[int, str], np.ndarray] = {}  # shape-tensor values, kept alive
        self._closed = False

    def _context(self, profile: int) -> Any:
        ctx = self._contexts.get(profile)
        if ctx is None:
            ctx = self.loaded.engine.create_execution_context()
            if ctx is None:
                raise ExecutionError("TensorRT could not create an execution context (device memory?)")
            if profile:
                ctx.set_optimization_profile_async(profile, self.stream)
            self._contexts[profile] = ctx
        return ctx

    def _buffer(self, ctx: Any, profile: int, name: str, nbytes: int) -> int:
        ptr, cap = self._buffers.get((profile, name), (0, 0))
        if nbytes > cap:
            if ptr:
                self.cuda.synchronize(self.stream)  # nothing in flight may still use it
                self.cuda.free(ptr)
                del self._buffers[(profile, name)]
            ptr = self.cuda.malloc(nbytes)
            self._buffers[(profile, name)] = (ptr, nbytes)
            if not ctx.set_tensor_address(name, ptr):
                raise ExecutionError(f"TensorRT refused the address of tensor {name!r}")
        return ptr

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self._closed:
            raise ExecutionError("this execution instance is closed")
        loaded = self.loaded
        device_inputs = {n: a for n, a in inputs.items() if not loaded.tensors[n].on_host}
        try:
            profile = policy.select_profile(loaded.profiles, {n: a.shape for n, a in device_inputs.items()})
        except ValueError as e:
            raise ExecutionError(str(e)) from e
        ctx = self._context(profile)
        try:
            staged = []
            for name, arr in inputs.items():
                info = loaded.tensors[name]
                a = np.ascontiguousarray(arr, dtype=info.dtype)
                if not ctx.set_input_shape(name, tuple(a.shape)):
                    raise ExecutionError(
                        f"TensorRT refused shape {list(a.shape)} for input {name!r} (profile {profile})"
                    )
                if info.on_host:  # shape tensors stay on the host; TensorRT reads them there
                    self._host[(profile, name)] = a
                    if not ctx.set_tensor_address(name, a.ctypes.data):
                        raise ExecutionError(f"TensorRT refused the host address of shape input {name!r}")
                    continue
                staged.append(a)
                ptr = self._buffer(ctx, profile, name, a.nbytes)
                self.cuda.copy_async(ptr, a.ctypes.data, a.nbytes, H2D, self.stream)
            missing = ctx.infer_shapes() if hasattr(ctx, "infer_shapes") else []
            if missing:
                raise ExecutionError(f"inputs not fully specified: {', '.join(missing)}")
            outs: dict[str, np.ndarray] = {}
            for info in loaded.outputs:
                dims = ctx.get_tensor_shape(info.name)
                shape = tuple(int(dims[i]) for i in range(len(dims)))
                if any(d < 0 for d in shape):
                    raise ExecutionError(f"output {info.name!r} has a data-dependent shape {shape}")
                out = np.empty(shape, dtype=info.dtype)
                self._buffer(ctx, profile, info.name, out.nbytes)
                outs[info.name] = out
            if not ctx.execute_async_v3(self.stream):
                code = self.cuda.last_error()
                raise ExecutionError(
                    f"TensorRT execute_async_v3 failed (CUDA error {code}): "
                    + ("; ".join(loaded.logger.errors[-3:]) or "no error was logged"),
                    device_fault=code in STICKY_CUDA_ERRORS,
                )
            for name, out in outs.items():
                self.cuda.copy_async(
                    out.ctypes.data, self._buffers[(profile, name)][0], out.nbytes, D2H, self.stream
                )
            self.cuda.synchronize(self.stream)
            del staged
            return outs
        except CudaError as e:
            raise ExecutionError(str(e), device_fault=e.sticky) from e
        except BaseException:
            self._quiesce()
            raise

    def _quiesce(self) -> None:
        """Wait for anything still queued on the stream before buffers may be reused or freed."""
        try:
            self.cuda.synchronize(self.stream)
        except CudaError as e:
            log.warning("stream sync after an error failed: %s", e)

    def close(self) -> None:
        """Sync, then free every buffer, drop the contexts and destroy the stream. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._quiesce()
        for ptr, _ in self._buffers.values():
            self.cuda.free(ptr)
        self._buffers.clear()
        self._host.clear()
        self._contexts.clear()
        self.cuda.destroy_stream(self.stream)
