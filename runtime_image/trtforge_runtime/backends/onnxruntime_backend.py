"""ONNX Runtime: the backend of artifacts built for CPU and emulated GPU targets.

One session is shared by all instances (``InferenceSession.run`` is thread-safe); the intra-op threads
are the CPUs this process may use divided by the instances, so instances do not oversubscribe the
cores the HTTP loop also needs. ``TRTFORGE_ORT_THREADS`` overrides the per-instance thread count and
``TRTFORGE_ORT_SPIN=1`` lets its threads spin (faster on idle machines, worse on shared ones).

:meth:`OnnxRuntimeBackend.new_solo_instance` is a second session with every CPU's thread, for a request
that arrives alone (docs/design.md, "Adapting to load").
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import numpy as np

from trtforge.contract.manifest import Manifest
from trtforge.logs import fields
from trtforge_runtime.errors import Refusal

log = logging.getLogger(__name__)


def cpu_count() -> int:
    """The CPUs the sessions' threads are sized for (the affinity capped by the CPU limit)."""
    from trtforge_runtime.cpus import usable_cpus

    return usable_cpus()


class _OrtInstance:
    def __init__(self, session: object, output_names: list[str]) -> None:
        self._run = session.run  # type: ignore[attr-defined]
        self._output_names = output_names

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        outs = self._run(self._output_names, inputs)
        return dict(zip(self._output_names, outs, strict=True))


def thread_plan(cpus: int, instances: int, override: int | None) -> tuple[int, int | None]:
    """(intra-op threads of the pool's session, threads of the solo session or None).

    The pool's instances split the CPUs (or take `override` each); a solo session is worth having only
    when it gets more threads than one pool instance has.
    """
    per = override or max(1, cpus // max(1, instances))
    return per, (cpus if cpus > per else None)


class OnnxRuntimeBackend:
    name = "onnxruntime"

    def __init__(self, manifest: Manifest, artifact: Path, instances: int) -> None:
        override = os.environ.get("TRTFORGE_ORT_THREADS")
        threads, self._solo_threads = thread_plan(cpu_count(), instances, int(override) if override else None)
        self._artifact = artifact
        self._session = self._open(artifact, threads)
        got = {i.name for i in self._session.get_inputs()}
        want = {t.name for t in manifest.inputs}
        if got != want:
            raise Refusal(
                "EngineLoadFailed", f"artifact inputs {sorted(got)} differ from the manifest's {sorted(want)}"
            )
        self._outputs = [t.name for t in manifest.outputs]
        log.info("onnxruntime session ready", extra=fields(threads=threads, instances=instances))

    @staticmethod
    def _open(artifact: Path, threads: int) -> Any:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        spin = "1" if os.environ.get("TRTFORGE_ORT_SPIN") == "1" else "0"
        opts.add_session_config_entry("session.intra_op.allow_spinning", spin)
        try:
            return ort.InferenceSession(str(artifact), sess_options=opts, providers=["CPUExecutionProvider"])
        except Exception as e:  # ORT raises its own exception types for any bad model
            raise Refusal("EngineLoadFailed", f"ONNX Runtime could not load {artifact.name}: {e}") from e

    def new_instance(self) -> _OrtInstance:
        return _OrtInstance(self._session, self._outputs)

    def new_solo_instance(self) -> _OrtInstance | None:
        """A session of its own with every CPU's thread (None when that is no more than an instance has)."""
        if self._solo_threads is None:
            return None
        session = self._open(self._artifact, self._solo_threads)
        log.info("onnxruntime solo session ready", extra=fields(threads=self._solo_threads))
        return _OrtInstance(session, self._outputs)

    def close(self) -> None:
        pass
