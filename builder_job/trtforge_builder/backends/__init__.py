"""Build backends: TensorRT (production GPUs) and ONNX Runtime (CPU targets, emulated GPUs)."""

from __future__ import annotations

import importlib.util

from trtforge_builder.backends.base import BuildBackend, BuildInputs, BuildOutput, Runner
from trtforge_builder.errors import BuildError

__all__ = ["BuildBackend", "BuildInputs", "BuildOutput", "Runner", "select_backend", "tensorrt_available"]


def tensorrt_available() -> bool:
    """True when the real TensorRT builder is importable (the stubs alone do not count)."""
    try:
        spec = importlib.util.find_spec("tensorrt")
    except (ImportError, ValueError):
        return False
    if spec is None:
        return False
    try:
        import tensorrt

        return hasattr(tensorrt, "Builder")
    except Exception:
        return False


def select_backend(choice: str, *, gpu_target: bool, probe_kind: str) -> BuildBackend:
    """`auto`: TensorRT for a GPU target on a real GPU (NVML) when installed, else ONNX Runtime."""
    if choice == "auto":
        choice = "tensorrt" if gpu_target and probe_kind == "nvml" and tensorrt_available() else "onnxruntime"
    if choice == "tensorrt":
        if not gpu_target:
            raise BuildError(
                "backend tensorrt cannot build for --gpu cpu; use --backend onnxruntime or auto",
                "InvalidArgument",
                step="select-backend",
            )
        if not tensorrt_available():
            raise BuildError(
                "backend tensorrt is not installed in this image (import tensorrt failed); "
                "use the TensorRT builder image or --backend onnxruntime",
                "BackendUnavailable",
                step="select-backend",
            )
        from trtforge_builder.backends.tensorrt import TensorRTBackend

        return TensorRTBackend()
    if choice == "onnxruntime":
        try:
            from trtforge_builder.backends.ort import OnnxRuntimeBackend
        except ImportError as e:
            raise BuildError(
                f"backend onnxruntime is not installed: {e}", "BackendUnavailable", step="select-backend"
            ) from e
        return OnnxRuntimeBackend()
    raise BuildError(
        f"--backend {choice!r} is not one of auto, tensorrt, onnxruntime",
        "InvalidArgument",
        step="select-backend",
    )
