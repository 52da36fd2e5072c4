"""The canary: the manifest's reference inputs must reproduce its reference outputs before Ready.

The file format and the comparison are the contract's (:mod:`trtforge.contract.canary`); each sample
runs as one execution, with the shapes it was recorded with.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trtforge.contract.canary import Canary, compare
from trtforge_runtime.backends import Instance
from trtforge_runtime.errors import DeviceFault
from trtforge_runtime.model import ModelSpec


@dataclass
class CanaryResult:
    passed: bool
    max_abs_error: float
    message: str


def run_canary(instance: Instance, path: Path, spec: ModelSpec, atol: float, rtol: float) -> CanaryResult:
    try:
        canary = Canary.from_bytes(path.read_bytes())
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
    worst = 0.0
    for s, (ins, refs) in enumerate(zip(canary.inputs, canary.outputs, strict=True)):
        feed = {k: np.ascontiguousarray(v, dtype=spec.input_by_name[k].dtype) for k, v in ins.items()}
        try:
            out = instance.run(feed)
        except DeviceFault:
            raise
        except Exception as e:
            return CanaryResult(False, float("inf"), f"canary sample {s}: inference failed: {e}")
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
    return CanaryResult(True, worst, f"{len(canary.inputs)} sample(s) within atol {atol} / rtol {rtol}")
