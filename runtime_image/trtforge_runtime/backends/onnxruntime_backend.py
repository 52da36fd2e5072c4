"""ONNX Runtime: the backend of artifacts built for CPU and emulated GPU targets.

One session is shared by all instances (``InferenceSession.run`` is thread-safe); the intra-op threads
are the CPUs this process may use divided by the instances, so instances do not oversubscribe the
cores the HTTP loop also needs. ``TRTFORGE_ORT_THREADS`` overrides the per-instance thread count and
``TRTFORGE_ORT_SPIN=1`` lets its threads spin (faster on idle machines, worse on shared ones).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np

from trtforge.contract.manifest import Manifest
from trtforge.logs import fields
from trtforge_runtime.errors import Refusal

log = logging.getLogger(__name__)


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class _OrtInstance:
    def __init__(self, session: object, output_names: list[str]) -> None:
        self._run = session.run  # type: ignore[attr-defined]
        self._output_names = output_names

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        outs = self._run(self._output_names, inputs)
        return dict(zip(self._output_names, outs, strict=True))


class OnnxRuntimeBackend:
    name = "onnxruntime"

    def __init__(self, manifest: Manifest, artifact: Path, instances: int) -> None:
        import onnxruntime as ort

        threads = int(os.environ.get("TRTFORGE_ORT_THREADS") or max(1, cpu_count() // max(1, instances)))
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        spin = "1" if os.environ.get("TRTFORGE_ORT_SPIN") == "1" else "0"
        opts.add_session_config_entry("session.intra_op.allow_spinning", spin)
        try:
            self._session = ort.InferenceSession(
                str(artifact), sess_options=opts, providers=["CPUExecutionProvider"]
            )
        except Exception as e:  # ORT raises its own exception types for any bad model
            raise Refusal("EngineLoadFailed", f"ONNX Runtime could not load {artifact.name}: {e}") from e
        got = {i.name for i in self._session.get_inputs()}
        want = {t.name for t in manifest.inputs}
        if got != want:
            raise Refusal(
                "EngineLoadFailed", f"artifact inputs {sorted(got)} differ from the manifest's {sorted(want)}"
            )
        self._outputs = [t.name for t in manifest.outputs]
        log.info(
            "onnxruntime session ready",
            extra=fields(version=ort.__version__, threads=threads, instances=instances),
        )

    def new_instance(self) -> _OrtInstance:
        return _OrtInstance(self._session, self._outputs)

    def close(self) -> None:
        pass
