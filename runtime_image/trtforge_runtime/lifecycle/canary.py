"""The canary: the manifest's reference inputs must reproduce its reference outputs before Ready.

The file format and the comparison are the contract's (:mod:`trtforge.contract.canary`). The pod
replays one sample, the one with the fewest input bytes, as one execution with the shapes it was
recorded with, and compares every output: that is a real validation input through the engine as it
is loaded on this GPU, against the reference the build recorded, which is what the canary is for
(wrong engine, wrong device, broken numerics). The build itself already checked every sample; the
larger ones would only make each pod's start slower (ResNet-50's batch-8 sample took 0.3 s of a
1.5 s start on 2 CPU cores).
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trtforge.contract.canary import Canary, compare
from trtforge_runtime.backends import Instance
from trtforge_runtime.errors import DeviceFault
from trtforge_runtime.serving.model import ModelSpec


@dataclass
class CanaryResult:
    passed: bool
    max_abs_error: float
    message: str
    seconds: float = 0.0  # the replay's time (reading the file, running, comparing)


def read_canary(path: Path) -> Canary:
    """The canary file at `path`, decoded (ValueError, KeyError or OSError if it cannot be)."""
    return Canary.from_bytes(path.read_bytes())


def run_canary(
    instance: Instance,
    path: Path,
    spec: ModelSpec,
    atol: float,
    rtol: float,
    decoded: Future[Canary] | None = None,
) -> CanaryResult:
    """Replay the canary file at `path` on `instance`. `decoded`: that file already being read by
    :func:`read_canary` (the warm start decodes it while the session builds); what it raised is
    reported as if read here."""
    t0 = time.monotonic()
    result = _replay(instance, path, spec, atol, rtol, decoded)
    result.seconds = time.monotonic() - t0
    return result


def _replay(
    instance: Instance,
    path: Path,
    spec: ModelSpec,
    atol: float,
    rtol: float,
    decoded: Future[Canary] | None,
) -> CanaryResult:
    try:
        canary = decoded.result() if decoded is not None else read_canary(path)
    except (ValueError, KeyError, OSError) as e:
        return CanaryResult(False, float("inf"), f"canary file {path.name} is not readable: {e}")
    want_in = {t.name for t in spec.inputs}
    if set(canary.input_names) != want_in or not set(canary.output_names) <= set(spec.output_names):
        return CanaryResult(
            False,
            float("inf"),
            f"canary tensors {canary.input_names} -> {canary.output_names} "
            f"do not match the model's {sorted(want_in)} -> {list(spec.output_names)}",
        )
    if not canary.inputs:
        return CanaryResult(False, float("inf"), f"canary file {path.name} holds no samples")
    s = smallest_sample(canary)
    ins, refs = canary.inputs[s], canary.outputs[s]
    feed = {k: np.ascontiguousarray(v, dtype=spec.input_by_name[k].dtype) for k, v in ins.items()}
    try:
        out = instance.run(feed)
    except DeviceFault:
        raise
    except Exception as e:
        return CanaryResult(False, float("inf"), f"canary sample {s}: inference failed: {e}")
    worst = 0.0
    for k, ref in refs.items():
        max_abs, _rel, ok = compare(out[k], ref, atol, rtol)
        worst = max(worst, max_abs)
        if not ok:
            return CanaryResult(
                False,
                max_abs,
                f"canary sample {s}, output {k!r}: outside atol {atol} / rtol "
                f"{rtol} of the reference (max abs error {max_abs:.3g})",
            )
    return CanaryResult(True, worst, f"sample {s} of {len(canary.inputs)} within atol {atol} / rtol {rtol}")


def smallest_sample(canary: Canary) -> int:
    """The index of the sample with the fewest input bytes (ties: the earlier)."""
    sizes = [sum(np.asarray(v).nbytes for v in ins.values()) for ins in canary.inputs]
    return min(range(len(sizes)), key=lambda i: (sizes[i], i))
