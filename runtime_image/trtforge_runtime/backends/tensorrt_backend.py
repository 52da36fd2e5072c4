"""TensorRT 10/11: deserialize a plan and run it with ``set_input_shape`` + ``set_tensor_address`` +
``execute_async_v3`` on one CUDA stream per execution instance.

Written against the TensorRT 10/11 Python API and type-checked with ``tensorrt-stubs``; it is NOT
exercised by this repository's tests (no TensorRT and no GPU where they run) — the builder image,
based on NVIDIA's TensorRT container, is where it runs for real.

- ``deserialize_cuda_engine`` returns None on failure (it does not raise): checked, and the errors the
  TensorRT logger printed are put into the refusal (wrong TensorRT version, wrong compute capability).
- Version-compatible engines (``build.version_compatible``) load with the lean runtime
  (``tensorrt_lean``, else the full ``tensorrt`` module) with ``engine_host_code_allowed`` set, since
  such plans embed the lean runtime. The engine's sha256 was verified before this point.
- Device memory and copies go through the CUDA runtime (``libcudart``) with ctypes, so the image
  needs no extra CUDA Python package. Sticky CUDA errors during execution (illegal address, ECC,
  launch failure...) raise :class:`DeviceFault`, which ends the process as a GPU fault.
"""

from __future__ import annotations

import ctypes
import importlib
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from trtforge.contract.manifest import Manifest
from trtforge.logs import fields
from trtforge_runtime.errors import DeviceFault, Refusal

if TYPE_CHECKING:
    # tensorrt-stubs ships .pyi files without py.typed (and with two syntax errors), so plain mypy skips
    # them; tests/unit/test_build_tensorrt.py checks this module against a repaired copy of them.
    import tensorrt as trt_t  # type: ignore[import-untyped,unused-ignore]

log = logging.getLogger(__name__)

# cudaError_t values after which the CUDA context is unusable (the device cannot be trusted).
STICKY_CUDA_ERRORS = frozenset({46, 214, 220, 700, 702, 709, 710, 714, 715, 716, 717, 718, 719, 999})
_H2D, _D2H = 1, 2  # cudaMemcpyKind


class CudaError(RuntimeError):
    def __init__(self, call: str, code: int, text: str) -> None:
        super().__init__(f"{call} failed: CUDA error {code} ({text})")
        self.code = code


class CudaRuntime:
    """The few CUDA runtime calls the backend needs, through ctypes."""

    def __init__(self) -> None:
        last: OSError | None = None
        for name in ("libcudart.so", "libcudart.so.13", "libcudart.so.12"):
            try:
                self._lib = ctypes.CDLL(name)
                break
            except OSError as e:
                last = e
        else:
            raise OSError(f"the CUDA runtime (libcudart.so) was not found: {last}")
        lib = self._lib
        lib.cudaGetErrorString.restype = ctypes.c_char_p
        lib.cudaGetErrorString.argtypes = [ctypes.c_int]
        lib.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
        lib.cudaFree.argtypes = [ctypes.c_void_p]
        lib.cudaMemcpyAsync.argtypes = [
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_int,
            ctypes.c_void_p,
        ]
        lib.cudaStreamCreateWithFlags.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint]
        lib.cudaStreamSynchronize.argtypes = [ctypes.c_void_p]
        lib.cudaStreamDestroy.argtypes = [ctypes.c_void_p]
        lib.cudaGetLastError.argtypes = []

    def check(self, call: str, code: int) -> None:
        if code != 0:
            text = self._lib.cudaGetErrorString(code)
            raise CudaError(call, code, text.decode() if text else "unknown")

    def malloc(self, size: int) -> int:
        p = ctypes.c_void_p()
        self.check("cudaMalloc", self._lib.cudaMalloc(ctypes.byref(p), max(1, size)))
        return int(p.value or 0)

    def free(self, ptr: int) -> None:
        self._lib.cudaFree(ctypes.c_void_p(ptr))

    def stream(self) -> int:
        s = ctypes.c_void_p()
        self.check("cudaStreamCreateWithFlags", self._lib.cudaStreamCreateWithFlags(ctypes.byref(s), 1))
        return int(s.value or 0)

    def copy_async(self, dst: int, src: int, size: int, kind: int, stream: int) -> None:
        self.check(
            "cudaMemcpyAsync",
            self._lib.cudaMemcpyAsync(
                ctypes.c_void_p(dst), ctypes.c_void_p(src), size, kind, ctypes.c_void_p(stream)
            ),
        )

    def synchronize(self, stream: int) -> None:
        self.check("cudaStreamSynchronize", self._lib.cudaStreamSynchronize(ctypes.c_void_p(stream)))

    def last_error(self) -> int:
        return int(self._lib.cudaGetLastError())


def _import_tensorrt(lean: bool) -> tuple[Any, str]:
    """The TensorRT module to deserialize with: the lean runtime for version-compatible plans."""
    names = ("tensorrt_lean", "tensorrt") if lean else ("tensorrt",)
    errors = []
    for name in names:
        try:
            return importlib.import_module(name), name
        except ImportError as e:
            errors.append(f"{name}: {e}")
    raise Refusal("EngineLoadFailed", f"no TensorRT runtime in this image ({'; '.join(errors)})")


def _capturing_logger(trt: Any) -> Any:
    """A TensorRT ILogger that logs through `logging` and keeps the errors for the refusal message."""

    class CapturingLogger(trt.ILogger):
        def __init__(self) -> None:
            trt.ILogger.__init__(self)
            self.errors: list[str] = []

        def log(self, severity: Any, msg: str) -> None:
            if severity in (trt.ILogger.INTERNAL_ERROR, trt.ILogger.ERROR):
                self.errors.append(msg)
                log.error("tensorrt: %s", msg)
            elif severity == trt.ILogger.WARNING:
                log.warning("tensorrt: %s", msg)

    return CapturingLogger()


class _TrtInstance:
    """One execution context on its own stream; device buffers grow to the largest batch seen."""

    def __init__(self, backend: TensorRTBackend) -> None:
        self._b = backend
        self._cuda = backend.cuda
        ctx = backend.engine.create_execution_context()
        if ctx is None:
            raise Refusal(
                "EngineLoadFailed", "TensorRT could not create an execution context (device memory?)"
            )
        self._ctx: trt_t.IExecutionContext = ctx
        self._stream = self._cuda.stream()
        self._buffers: dict[str, tuple[int, int]] = {}  # name -> (device pointer, bytes)

    def _buffer(self, name: str, nbytes: int) -> int:
        ptr, cap = self._buffers.get(name, (0, 0))
        if nbytes > cap:
            if ptr:
                self._cuda.free(ptr)
            ptr, cap = self._cuda.malloc(nbytes), nbytes
            self._buffers[name] = (ptr, cap)
            if not self._ctx.set_tensor_address(name, ptr):
                raise RuntimeError(f"TensorRT refused the address of tensor {name!r}")
        return ptr

    def _fail(self, e: CudaError) -> Exception:
        return DeviceFault(str(e)) if e.code in STICKY_CUDA_ERRORS else RuntimeError(str(e))

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        ctx, cuda, stream = self._ctx, self._cuda, self._stream
        try:
            keep = []
            for name, arr in inputs.items():
                a = np.ascontiguousarray(arr, dtype=self._b.dtypes[name])
                keep.append(a)
                if not ctx.set_input_shape(name, tuple(a.shape)):
                    raise RuntimeError(f"TensorRT refused shape {list(a.shape)} for input {name!r}")
                ptr = self._buffer(name, a.nbytes)
                cuda.copy_async(ptr, a.ctypes.data, a.nbytes, _H2D, stream)
            outs: dict[str, np.ndarray] = {}
            for name in self._b.output_names:
                dims = ctx.get_tensor_shape(name)
                shape = tuple(dims[i] for i in range(len(dims)))
                out = np.empty(shape, dtype=self._b.dtypes[name])
                self._buffer(name, out.nbytes)
                outs[name] = out
            if not ctx.execute_async_v3(stream):
                code = cuda.last_error()
                if code in STICKY_CUDA_ERRORS:
                    raise DeviceFault(f"execute_async_v3 failed with CUDA error {code}")
                raise RuntimeError(f"TensorRT execute_async_v3 failed (CUDA error {code})")
            for name, out in outs.items():
                cuda.copy_async(out.ctypes.data, self._buffers[name][0], out.nbytes, _D2H, stream)
            cuda.synchronize(stream)
            return outs
        except CudaError as e:
            raise self._fail(e) from e


class TensorRTBackend:
    name = "tensorrt"

    def __init__(self, manifest: Manifest, artifact: Path, instances: int) -> None:
        lean = manifest.build.version_compatible
        trt, module = _import_tensorrt(lean)
        try:
            self.cuda = CudaRuntime()
        except OSError as e:
            raise Refusal("EngineLoadFailed", str(e)) from e
        self._logger = _capturing_logger(trt)  # must outlive the runtime and the engine
        runtime: trt_t.Runtime = trt.Runtime(self._logger)
        if lean:
            runtime.engine_host_code_allowed = True
        engine = runtime.deserialize_cuda_engine(artifact.read_bytes())
        if engine is None:
            detail = "; ".join(self._logger.errors) or "no error was logged"
            raise Refusal(
                "EngineLoadFailed",
                f"TensorRT {getattr(trt, '__version__', '?')} ({module}) could not deserialize "
                f"{artifact.name} (built with TensorRT {manifest.backend_version}): {detail}",
            )
        self._runtime = runtime
        self.engine: trt_t.ICudaEngine = engine
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        self.dtypes: dict[str, np.dtype] = {
            n: np.dtype(trt.nptype(engine.get_tensor_dtype(n))) for n in names
        }
        inputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self.output_names = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT]
        want_in, want_out = {t.name for t in manifest.inputs}, {t.name for t in manifest.outputs}
        if set(inputs) != want_in or not want_out <= set(self.output_names):
            raise Refusal(
                "EngineLoadFailed",
                f"engine tensors {inputs} -> {self.output_names} differ from the "
                f"manifest's {sorted(want_in)} -> {sorted(want_out)}",
            )
        self.output_names = [t.name for t in manifest.outputs]
        log.info(
            "tensorrt engine deserialized",
            extra=fields(module=module, lean=lean, io=len(names), instances=instances),
        )

    def new_instance(self) -> _TrtInstance:
        return _TrtInstance(self)

    def close(self) -> None:
        pass
