"""Inference backends: ONNX Runtime (runnable everywhere) and TensorRT (GPU nodes).

A backend loads one artifact; each execution instance is driven by exactly one worker thread.
This package's own module imports nothing heavy (no numpy, no pydantic), so that
:mod:`~trtforge_runtime.backends.ort_session` can be imported before the contract is.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import numpy as np

    from trtforge.contract.manifest import Manifest


class Instance(Protocol):
    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Execute one batch; raises DeviceFault on device-level errors."""
        ...


class Backend(Protocol):
    name: str

    def new_instance(self) -> Instance: ...

    def close(self) -> None: ...


def default_instances(backend: str) -> int:
    """Execution instances when none are asked for: one per CPU for ONNX Runtime (each with one
    thread; a lone request gets the solo instance), one for TensorRT."""
    if backend == "onnxruntime":
        from trtforge_runtime.backends.ort_session import default_instances as ort_default

        return ort_default()
    return 1


def load_backend(manifest: Manifest, artifact: Path, instances: int) -> Backend:
    """Load the artifact with the backend the manifest names; Refusal(EngineLoadFailed) if it cannot.
    (The runtime asks :func:`trtforge_runtime.lifecycle.warmstart.load`, which calls this only when the warm
    start loaded no backend for the same arguments.)"""
    from trtforge_runtime.errors import Refusal

    if manifest.backend == "onnxruntime":
        from trtforge_runtime.backends.onnxruntime_backend import OnnxRuntimeBackend

        return OnnxRuntimeBackend(manifest, artifact, instances)
    if manifest.backend == "tensorrt":
        from trtforge_runtime.backends.tensorrt_backend import TensorRTBackend

        return TensorRTBackend(manifest, artifact, instances)
    raise Refusal(
        "EngineLoadFailed", f"manifest backend {manifest.backend!r} is not one of onnxruntime, tensorrt"
    )
