"""Accuracy: the built artifact against an fp32 ONNX Runtime reference on seeded samples.

Samples lie within the first profile's shapes: the first at `opt`, then `max`, then `min`, then
random points between (one draw per sample, shared by all inputs so that their dims agree). Float
inputs are standard normal, integer inputs uniform in [0, 10), booleans fair coins. The build checks
every sample; the smallest `CANARY_SAMPLES` of them and their reference outputs become the canary
(:mod:`trtforge.contract.canary`) that every runtime pod replays before Ready, so its start-up does
not pay for the profile's largest shapes (a ResNet-50 canary at batch 64 took 5.9 s of a 7 s start).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from trtforge.contract.canary import Canary, compare
from trtforge.contract.engine_key import ShapeRange
from trtforge.contract.manifest import Accuracy
from trtforge.logs import fields
from trtforge_builder.backends.base import Runner
from trtforge_builder.errors import BuildError
from trtforge_builder.onnx_model import ModelIO

log = logging.getLogger(__name__)


def sample_shapes(profile: dict[str, ShapeRange], n: int, seed: int) -> list[dict[str, tuple[int, ...]]]:
    rng = np.random.default_rng(seed)
    out: list[dict[str, tuple[int, ...]]] = []
    for i in range(n):
        if i == 0:
            out.append({k: r.opt for k, r in profile.items()})
            continue
        t = 1.0 if i == 1 else 0.0 if i == 2 else float(rng.random())
        out.append(
            {
                k: tuple(lo + round(t * (hi - lo)) for lo, hi in zip(r.min, r.max, strict=True))
                for k, r in profile.items()
            }
        )
    return out


def make_samples(
    io: ModelIO, profile: dict[str, ShapeRange], n: int, seed: int
) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed + 1)
    samples = []
    for shapes in sample_shapes(profile, n, seed):
        feeds: dict[str, np.ndarray] = {}
        for t in io.inputs:
            shape = shapes[t.name]
            dtype = np.dtype(t.dtype) if not t.dtype.startswith("onnx:") else np.dtype(np.float32)
            if dtype.kind == "f":
                feeds[t.name] = rng.standard_normal(shape).astype(dtype)
            elif dtype.kind in "iu":
                feeds[t.name] = rng.integers(0, 10, size=shape).astype(dtype)
            elif dtype.kind == "b":
                feeds[t.name] = rng.random(shape) < 0.5
            else:
                raise BuildError(
                    f"input {t.name!r} has type {t.dtype}; validation cannot make samples for it",
                    "InvalidModel",
                    step="validate",
                )
        samples.append(feeds)
    return samples


CANARY_SAMPLES = 2


def canary_indices(samples: list[dict[str, np.ndarray]], n: int = CANARY_SAMPLES) -> list[int]:
    """The `n` samples with the fewest input bytes, in their original order (ties: the earlier)."""
    sizes = [sum(a.nbytes for a in s.values()) for s in samples]
    return sorted(sorted(range(len(samples)), key=lambda i: (sizes[i], i))[:n])


def reference_outputs(
    model_path: Path, samples: list[dict[str, np.ndarray]], source: str
) -> list[dict[str, Any]]:
    from trtforge_builder.backends.ort import OrtRunner, open_session

    try:
        ref = OrtRunner(open_session(model_path, optimize=False))
    except Exception as e:
        raise BuildError(
            f"model {source} does not load in the ONNX Runtime reference: {str(e).splitlines()[0][:300]}",
            "InvalidModel",
            step="validate",
        ) from e
    try:
        return [ref.run(s) for s in samples]
    except Exception as e:
        raise BuildError(
            f"model {source} fails to run in the ONNX Runtime reference: {str(e).splitlines()[0][:300]}",
            "InvalidModel",
            step="validate",
        ) from e


def validate(
    runner: Runner,
    samples: list[dict[str, np.ndarray]],
    refs: list[dict[str, np.ndarray]],
    io: ModelIO,
    rtol: float,
    atol: float,
) -> tuple[Accuracy, Canary, str]:
    """Accuracy over all samples and outputs, the canary, and a one-line account of the worst output."""
    max_abs = max_rel = 0.0
    passed = True
    worst = ""
    for i, (feeds, ref) in enumerate(zip(samples, refs, strict=True)):
        try:
            outs = runner.run(feeds)
        except BuildError:
            raise
        except Exception as e:
            raise BuildError(
                f"the built artifact fails on sample {i}: {str(e).splitlines()[0][:300]}",
                "BuildFailed",
                step="validate",
            ) from e
        for t in io.outputs:
            if t.name not in outs:
                raise BuildError(
                    f"the built artifact has no output {t.name!r}", "BuildFailed", step="validate"
                )
            a, r, ok = compare(np.asarray(outs[t.name]), np.asarray(ref[t.name]), atol, rtol)
            log.debug("compared", extra=fields(sample=i, output=t.name, max_abs=a, max_rel=r, ok=ok))
            if not ok and passed:
                shape = list(np.asarray(outs[t.name]).shape)
                worst = (
                    f"output {t.name!r} on sample {i} (shape {shape}): max abs error {a:.3g}, max rel "
                    f"error {r:.3g}, over atol {atol:g} + rtol {rtol:g}"
                )
            passed = passed and ok
            max_abs, max_rel = max(max_abs, a), max(max_rel, r)
    acc = Accuracy(
        samples=len(samples),
        max_abs_error=max_abs,
        max_rel_error=max_rel,
        atol=atol,
        rtol=rtol,
        passed=passed,
    )
    keep = canary_indices(samples)
    canary = Canary(
        input_names=[t.name for t in io.inputs],
        output_names=[t.name for t in io.outputs],
        inputs=[samples[i] for i in keep],
        outputs=[{k: np.asarray(v) for k, v in refs[i].items()} for i in keep],
    )
    return acc, canary, worst


def check_batch_equivalence(
    original: Path,
    dynamic: Path,
    io: ModelIO,
    profile: dict[str, ShapeRange],
    old_batch: int,
    source: str,
    seed: int,
) -> None:
    """Refuse a batch range unless the rewritten model gives each sample what the original gives it."""
    from trtforge_builder.backends.ort import open_session

    max_batch = min(r.max[0] for r in profile.values() if r.max)
    batch = max(2, min(4, max_batch)) if max_batch >= 2 else max_batch
    if batch % old_batch:
        raise BuildError(
            f"model {source} has a fixed batch of {old_batch}; a batch of {batch} is not a multiple",
            "InvalidProfile",
            step="check-profiles",
        )
    rng = np.random.default_rng(seed + 7)
    feeds: dict[str, np.ndarray] = {}
    for t in io.inputs:
        shape = (batch, *profile[t.name].opt[1:])
        dtype = np.dtype(t.dtype)
        feeds[t.name] = (
            rng.standard_normal(shape) if dtype.kind == "f" else rng.integers(0, 10, size=shape)
        ).astype(dtype)
    refuse = (
        f"model {source} has a fixed batch dimension of {old_batch} and the profile asks for a batch range; "
        "making the batch symbolic"
    )
    try:
        dyn_sess = open_session(dynamic)
        outs = dyn_sess.run(None, feeds)
    except Exception as e:
        raise BuildError(
            f"{refuse} breaks the model ({str(e).splitlines()[0][:200]}); re-export it with a dynamic "
            "batch, or ask for the fixed batch only",
            "InvalidProfile",
            step="check-profiles",
        ) from e
    orig_sess = open_session(original)
    names = [o.name for o in dyn_sess.get_outputs()]
    for s in range(0, batch, old_batch):
        single = orig_sess.run(None, {k: v[s : s + old_batch] for k, v in feeds.items()})
        for name, whole, one in zip(names, outs, single, strict=True):
            part = whole[s : s + old_batch] if whole.ndim and whole.shape[0] == batch else whole
            a, _rel, ok = compare(np.asarray(part), np.asarray(one), 1e-4, 1e-3)
            if not ok:
                raise BuildError(
                    f"{refuse} changes output {name!r} of sample {s} (max abs error {a:.3g}); "
                    "re-export it with a dynamic batch, or ask for the fixed batch only",
                    "InvalidProfile",
                    step="check-profiles",
                )
    log.info("batch made dynamic; per-sample outputs unchanged", extra=fields(checked_batch=batch))
