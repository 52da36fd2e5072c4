"""The canary file: reference inputs and outputs stored beside an engine (``manifest.canary.file``).

The builder writes it after validation; the runtime replays it before it reports Ready and compares
with ``manifest.canary.atol/rtol`` (pass when ``|out - ref| <= atol + rtol * |ref|`` everywhere).

Format: an uncompressed ``.npz`` (no pickles). ``__meta__`` is a 0-d unicode array holding JSON
``{"schema", "inputs": [names], "outputs": [names], "samples": n}``; sample ``s`` has arrays
``in_<s>_<j>`` for input ``inputs[j]`` and ``out_<s>_<k>`` for output ``outputs[k]`` (tensor names
are not used as keys: they may hold ``/`` or ``:``).
"""

from __future__ import annotations

import io
import json

import numpy as np
from pydantic import BaseModel, ConfigDict

CANARY_SCHEMA = "trtforge.io/canary/v1"


class Canary(BaseModel):
    model_config = ConfigDict(arbitrary_types_allowed=True)
    input_names: list[str]
    output_names: list[str]
    inputs: list[dict[str, np.ndarray]]  # one dict per sample
    outputs: list[dict[str, np.ndarray]]

    def to_bytes(self) -> bytes:
        meta = {
            "schema": CANARY_SCHEMA,
            "inputs": self.input_names,
            "outputs": self.output_names,
            "samples": len(self.inputs),
        }
        arrays: dict[str, np.ndarray] = {"__meta__": np.array(json.dumps(meta))}
        for s, (ins, outs) in enumerate(zip(self.inputs, self.outputs, strict=True)):
            for j, name in enumerate(self.input_names):
                arrays[f"in_{s}_{j}"] = np.ascontiguousarray(ins[name])
            for k, name in enumerate(self.output_names):
                arrays[f"out_{s}_{k}"] = np.ascontiguousarray(outs[name])
        buf = io.BytesIO()
        np.savez(buf, **arrays)  # type: ignore[arg-type]
        return buf.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes) -> Canary:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            meta = json.loads(str(z["__meta__"]))
            if meta.get("schema") != CANARY_SCHEMA:
                raise ValueError(f"canary schema {meta.get('schema')!r} is not {CANARY_SCHEMA!r}")
            ins_names, out_names, n = list(meta["inputs"]), list(meta["outputs"]), int(meta["samples"])
            inputs = [{name: z[f"in_{s}_{j}"] for j, name in enumerate(ins_names)} for s in range(n)]
            outputs = [{name: z[f"out_{s}_{k}"] for k, name in enumerate(out_names)} for s in range(n)]
        return cls(input_names=ins_names, output_names=out_names, inputs=inputs, outputs=outputs)


def compare(out: np.ndarray, ref: np.ndarray, atol: float, rtol: float) -> tuple[float, float, bool]:
    """(max abs error, max rel error, within tolerance) of `out` against the reference `ref`.

    The relative error is taken where ``|ref| > atol`` (elsewhere the absolute error decides). A NaN
    or inf in `out` where `ref` is finite, or a shape mismatch, fails.
    """
    if out.shape != ref.shape:
        return float("inf"), float("inf"), False
    o = out.astype(np.float64, copy=False)
    r = ref.astype(np.float64, copy=False)
    finite = np.isfinite(r)
    if not np.array_equal(np.isfinite(o), finite) or not np.array_equal(o[~finite], r[~finite]):
        return float("inf"), float("inf"), False
    if not finite.any():
        return 0.0, 0.0, True
    diff = np.abs(o[finite] - r[finite])
    mag = np.abs(r[finite])
    max_abs = float(diff.max()) if diff.size else 0.0
    big = mag > atol
    max_rel = float((diff[big] / mag[big]).max()) if big.any() else 0.0
    passed = bool(np.all(diff <= atol + rtol * mag))
    return max_abs, max_rel, passed
