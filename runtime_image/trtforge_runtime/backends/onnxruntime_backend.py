"""ONNX Runtime: the backend of artifacts built for CPU and emulated GPU targets.

One session is shared by all instances (``InferenceSession.run`` is thread-safe); the intra-op threads
are the CPUs this process may use divided by the instances, so instances do not oversubscribe the
cores the HTTP loop also needs (:mod:`~trtforge_runtime.backends.ort_session` sizes and opens the
sessions). The pool's session is the one :mod:`trtforge_runtime.lifecycle.preload` built, when it
built one for this very artifact digest and thread count.

:meth:`OnnxRuntimeBackend.new_solo_instance` is a second session with every CPU's thread, for a request
that arrives alone (docs/design.md, "Adapting to load").
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from trtforge.contract.manifest import Manifest
from trtforge.logs import fields
from trtforge_runtime.backends import ort_session
from trtforge_runtime.errors import Refusal

log = logging.getLogger(__name__)


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
        from trtforge_runtime.lifecycle import preload

        threads, self._solo_threads = ort_session.pool_threads(instances)
        self._artifact = artifact
        session = preload.take(manifest.sha256, threads)
        self._session = session if session is not None else self._open(artifact, threads)
        got = {i.name for i in self._session.get_inputs()}
        want = {t.name for t in manifest.inputs}
        if got != want:
            raise Refusal(
                "EngineLoadFailed", f"artifact inputs {sorted(got)} differ from the manifest's {sorted(want)}"
            )
        self._outputs = [t.name for t in manifest.outputs]
        log.info(
            "onnxruntime session ready",
            extra=fields(threads=threads, instances=instances, preloaded=session is not None),
        )

    @staticmethod
    def _open(artifact: Path, threads: int) -> Any:
        try:
            return ort_session.open_session(artifact, threads)
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
