"""How the ONNX Runtime backend sizes and opens its sessions, importing neither pydantic nor the contract.

:class:`~trtforge_runtime.backends.onnxruntime_backend.OnnxRuntimeBackend` opens its sessions here, and
so does :mod:`trtforge_runtime.lifecycle.preload`, which must open the same session before the contract is
imported; one function for both keeps their settings equal. ``TRTFORGE_ORT_THREADS`` overrides the
per-instance thread count and ``TRTFORGE_ORT_SPIN=1`` lets the threads spin (faster on idle machines,
worse on shared ones).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

THREADS_ENV = "TRTFORGE_ORT_THREADS"
SPIN_ENV = "TRTFORGE_ORT_SPIN"


def cpu_count() -> int:
    """The CPUs the sessions' threads are sized for (the affinity capped by the CPU limit)."""
    from trtforge_runtime.lifecycle.cpus import usable_cpus

    return usable_cpus()


def default_instances() -> int:
    """Execution instances when none are asked for: one per CPU, each with one thread (a lone
    request gets the solo session)."""
    return cpu_count()


def thread_plan(cpus: int, instances: int, override: int | None) -> tuple[int, int | None]:
    """(intra-op threads of the pool's session, threads of the solo session or None).

    The pool's instances split the CPUs (or take `override` each); a solo session is worth having only
    when it gets more threads than one pool instance has.
    """
    per = override or max(1, cpus // max(1, instances))
    return per, (cpus if cpus > per else None)


def pool_threads(instances: int | None) -> tuple[int, int | None]:
    """:func:`thread_plan` for this process: its CPUs, `instances` (None: the default) and the
    environment's override."""
    override = os.environ.get(THREADS_ENV)
    n = instances or default_instances()
    return thread_plan(cpu_count(), n, int(override) if override else None)


def open_session(artifact: Path | str, threads: int) -> Any:
    """An ``InferenceSession`` of the ONNX file at `artifact` with `threads` intra-op threads, one
    inter-op thread, sequential execution, every graph optimisation and (unless ``TRTFORGE_ORT_SPIN``
    is 1) no spinning; raises what ONNX Runtime raises."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    spin = "1" if os.environ.get(SPIN_ENV) == "1" else "0"
    opts.add_session_config_entry("session.intra_op.allow_spinning", spin)
    return ort.InferenceSession(str(artifact), sess_options=opts, providers=["CPUExecutionProvider"])
