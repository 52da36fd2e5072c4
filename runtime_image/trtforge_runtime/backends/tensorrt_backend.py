"""The TensorRT backend: the shared :mod:`trtforge.tensorrt` layer, with errors as runtime refusals.

Which runtime loads a plan (full ``tensorrt``, or the lean runtime for version-compatible plans
built with EXCLUDE_LEAN_RUNTIME), dtype mapping, profile selection, shape tensors on the host and
buffer lifetime are the shared layer's (docs/design.md §"TensorRT"). Here: a plan TensorRT will not
load (corrupt, foreign version or GPU) is a ``Refusal("EngineLoadFailed")`` with TensorRT's own
errors, never a crash; sticky CUDA errors while running are a ``DeviceFault`` (a GPU fault).
What of this has run on real TensorRT is in docs/gpu-probe-h200.md.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from trtforge.contract.manifest import Manifest
from trtforge.logs import fields
from trtforge.tensorrt import policy
from trtforge.tensorrt.cuda import CudaRuntime
from trtforge.tensorrt.engine import (
    EngineLoadError,
    Execution,
    ExecutionError,
    LoadedEngine,
    TensorRTUnavailable,
)
from trtforge_runtime.errors import DeviceFault, Refusal

log = logging.getLogger(__name__)


class _TrtInstance:
    """One execution stream, driven by exactly one worker thread."""

    def __init__(self, backend: TensorRTBackend) -> None:
        try:
            self._exec = Execution(backend.loaded, backend.cuda)
        except ExecutionError as e:
            raise Refusal("EngineLoadFailed", str(e)) from e
        backend.instances.append(self)

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        try:
            return self._exec.run(inputs)
        except ExecutionError as e:
            if e.device_fault:
                raise DeviceFault(str(e)) from e
            raise RuntimeError(str(e)) from e

    def close(self) -> None:
        self._exec.close()


class TensorRTBackend:
    name = "tensorrt"

    def __init__(self, manifest: Manifest, artifact: Path, instances: int) -> None:
        kind = policy.runtime_kind(manifest.build.version_compatible, manifest.recipe)
        what = f"{artifact.name} (built with TensorRT {manifest.backend_version})"
        try:
            self.loaded = LoadedEngine(
                artifact.read_bytes(),
                kind=kind,
                version_compatible=manifest.build.version_compatible,
                lean_excluded=policy.lean_excluded(manifest.build.version_compatible, manifest.recipe),
                what=what,
            )
        except (EngineLoadError, TensorRTUnavailable) as e:
            raise Refusal("EngineLoadFailed", str(e)) from e
        try:
            self.cuda = CudaRuntime()
        except OSError as e:
            raise Refusal("EngineLoadFailed", str(e)) from e
        self.instances: list[_TrtInstance] = []
        names = {t.name for t in self.loaded.inputs}, {t.name for t in self.loaded.outputs}
        want_in, want_out = {t.name for t in manifest.inputs}, {t.name for t in manifest.outputs}
        if names[0] != want_in or not want_out <= names[1]:
            raise Refusal(
                "EngineLoadFailed",
                f"engine tensors {sorted(names[0])} -> {sorted(names[1])} differ from the "
                f"manifest's {sorted(want_in)} -> {sorted(want_out)}",
            )
        log.info(
            "tensorrt engine deserialized",
            extra=fields(
                module=self.loaded.module,
                version=self.loaded.version,
                profiles=len(self.loaded.profiles),
                instances=instances,
            ),
        )

    def new_instance(self) -> _TrtInstance:
        return _TrtInstance(self)

    def close(self) -> None:
        """Close every instance (sync, free, destroy streams), then release the engine."""
        for inst in self.instances:
            inst.close()
        self.instances.clear()
        self.loaded.close()
