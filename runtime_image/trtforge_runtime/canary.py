"""The canary: the manifest's reference inputs must reproduce its reference outputs before Ready.

The canary ``.npz`` holds one array per IO tensor. Keys are ``input:<name>`` / ``output:<name>``
(also accepted: ``inputs/<name>``, ``outputs/<name>``, or plain tensor names). Dimension 0 holds the
samples; for a batchable model they run in batches of at most the max batch size, otherwise one by one
with the declared shapes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trtforge_runtime.backends import Instance
from trtforge_runtime.errors import DeviceFault
from trtforge_runtime.model import ModelSpec

_IN = ("input:", "inputs/", "in:")
_OUT = ("output:", "outputs/", "out:")


class CanaryError(Exception):
    pass


@dataclass
class CanaryResult:
    passed: bool
    max_abs_error: float
    message: str


def _split(
    npz: dict[str, np.ndarray], spec: ModelSpec
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    ins: dict[str, np.ndarray] = {}
    outs: dict[str, np.ndarray] = {}
    in_names = {t.name for t in spec.inputs}
    out_names = set(spec.output_names)
    for k, v in npz.items():
        for p in _IN:
            if k.startswith(p):
                ins[k[len(p) :]] = v
                break
        else:
            for p in _OUT:
                if k.startswith(p):
                    outs[k[len(p) :]] = v
                    break
            else:
                if k in in_names:
                    ins[k] = v
                elif k in out_names:
                    outs[k] = v
    if set(ins) != in_names:
        raise CanaryError(f"canary data has inputs {sorted(ins)}, the model takes {sorted(in_names)}")
    if not outs or not set(outs) <= out_names:
        raise CanaryError(f"canary data has outputs {sorted(outs)}, the model has {sorted(out_names)}")
    return ins, outs


def _chunks(ins: dict[str, np.ndarray], spec: ModelSpec) -> list[dict[str, np.ndarray]]:
    n = next(iter(ins.values())).shape[0]
    if spec.max_batch:
        step = spec.max_batch
    else:
        declared = spec.inputs[0].shape[0] if spec.inputs[0].shape else 1
        step = declared if declared > 0 else n
    return [{k: v[i : i + step] for k, v in ins.items()} for i in range(0, n, max(1, step))]


def run_canary(instance: Instance, path: Path, spec: ModelSpec, atol: float, rtol: float) -> CanaryResult:
    with np.load(path, allow_pickle=False) as f:
        data = {k: f[k] for k in f.files}
    try:
        ins, refs = _split(data, spec)
    except CanaryError as e:
        return CanaryResult(False, float("inf"), str(e))
    got: dict[str, list[np.ndarray]] = {k: [] for k in refs}
    for chunk in _chunks(ins, spec):
        try:
            out = instance.run(
                {k: np.ascontiguousarray(v, dtype=spec.input_by_name[k].dtype) for k, v in chunk.items()}
            )
        except DeviceFault:
            raise
        except Exception as e:
            return CanaryResult(False, float("inf"), f"canary inference failed: {e}")
        for k in refs:
            got[k].append(out[k])
    worst = 0.0
    for k, ref in refs.items():
        res = np.concatenate(got[k]) if len(got[k]) > 1 else got[k][0]
        if res.shape != ref.shape:
            return CanaryResult(
                False, float("inf"), f"output {k!r} has shape {list(res.shape)}, reference {list(ref.shape)}"
            )
        if res.dtype.kind in "fc":
            o, r = res.astype(np.float64), ref.astype(np.float64)
            err = np.abs(o - r)
            bad = ~(err <= atol + rtol * np.abs(r))
            max_err = float(np.nanmax(err)) if err.size else 0.0
            worst = max(worst, max_err)
            if bad.any():
                return CanaryResult(
                    False,
                    max_err,
                    f"output {k!r}: {int(bad.sum())} of {bad.size} values outside atol {atol} / "
                    f"rtol {rtol} of the reference (max abs error {max_err:.3g})",
                )
        elif not np.array_equal(res, ref):
            return CanaryResult(False, float("inf"), f"output {k!r} differs from the reference")
    return CanaryResult(True, worst, f"{len(refs)} output(s) within atol {atol} / rtol {rtol}")
