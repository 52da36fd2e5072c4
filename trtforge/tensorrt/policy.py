"""Pure TensorRT policies, unit-tested without TensorRT (docs/design.md §"TensorRT").

Facts these rest on (checked against NVIDIA's TensorRT sources, ``include/NvInfer.h`` of 10.13 and
11.1): TensorRT 10 has the weak-typing precision flags ``FP16``, ``BF16``, ``INT8``, ``FP8``
(deprecated in 10.12); TensorRT 11 removed them (networks are strongly typed: precision comes from
the model's types and Q/DQ nodes). ``TF32`` exists in both and is on by default, so fp32 clears it.
``VERSION_COMPATIBLE`` + ``EXCLUDE_LEAN_RUNTIME`` make a plan the lean runtime of the same version
loads; a version-compatible plan that embeds its lean runtime needs ``engine_host_code_allowed``
on a full runtime, and the lean runtime does not load plans built without ``VERSION_COMPATIBLE``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from trtforge.contract.engine_key import BuildConfig, ShapeRange

RuntimeKind = Literal["full", "lean"]

# Model Optimizer is NVIDIA's tool that inserts Q/DQ nodes (docs/design.md §"TensorRT").
QUANTIZE_HINT = (
    "quantize the model first so it carries QuantizeLinear/DequantizeLinear (Q/DQ) nodes, e.g. with "
    "NVIDIA TensorRT Model Optimizer: `python -m modelopt.onnx.quantization --onnx_path model.onnx "
    "--quantize_mode {mode} --calibration_data calib.npy --output_path model.{mode}.onnx`; then build "
    "that model with --precision {mode}, or build this one with --precision fp16, bf16 or fp32"
)


class PrecisionRefused(ValueError):
    """The precision cannot be honoured for this model; the message says how to fix it."""


@dataclass(frozen=True)
class BuilderFlags:
    """What to do to an ``IBuilderConfig`` (flag names, never enum integers)."""

    set: tuple[str, ...]
    clear: tuple[str, ...]
    convert_model_to: Literal["fp16", "bf16"] | None  # TensorRT 11: cast the ONNX before parsing
    hardware_level: str | None  # HardwareCompatibilityLevel member name


HW_LEVEL = {"amperePlus": "AMPERE_PLUS", "sameComputeCapability": "SAME_COMPUTE_CAPABILITY"}


def builder_flags(cfg: BuildConfig, trt_major: int, *, model_has_qdq: bool) -> BuilderFlags:
    """The builder flags for a build config on TensorRT `trt_major` (10 or 11).

    Raises PrecisionRefused for int8/fp8 on a model without Q/DQ nodes (TensorRT 10 would silently
    fall back to fp32 for INT8 alone, 11 would build fp32), and for strip_weights (refused until the
    runtime refits end to end; docs/design.md §"TensorRT").
    """
    if trt_major < 10:
        raise PrecisionRefused(f"TensorRT {trt_major} is not supported; use TensorRT 10 or 11")
    p = cfg.precision
    if p in ("int8", "fp8") and not model_has_qdq:
        raise PrecisionRefused(
            f"precision {p} needs a quantized model, and this one has no Q/DQ nodes: "
            + QUANTIZE_HINT.format(mode=p)
        )
    if cfg.strip_weights:
        raise PrecisionRefused(
            "strip_weights is refused: the runtime does not refit weight-stripped engines yet "
            "(docs/design.md, TensorRT); build without --strip-weights"
        )
    set_: list[str] = []
    clear: list[str] = []
    convert: Literal["fp16", "bf16"] | None = None
    if p == "fp32":
        clear.append("TF32")  # on by default: fp32 tolerances would fail on Ampere and later
    elif trt_major == 10:
        set_ += {
            "fp16": ["FP16"],
            "bf16": ["BF16"],
            "int8": ["INT8", "FP16"],
            "fp8": ["FP8", "FP16"],
            "auto": ["FP16"],
        }[p]
    elif p in ("fp16", "bf16"):
        convert = p  # strongly typed: the model carries the precision
    # TensorRT 11 int8/fp8 (with Q/DQ) and auto: the model's own types decide; no flag exists.
    if cfg.version_compatible:
        set_ += ["VERSION_COMPATIBLE", "EXCLUDE_LEAN_RUNTIME"]
    return BuilderFlags(
        set=tuple(set_),
        clear=tuple(clear),
        convert_model_to=convert,
        hardware_level=HW_LEVEL.get(cfg.hardware_compatibility),
    )


def has_qdq(op_types: Iterable[str]) -> bool:
    """Whether a model (its node op types, subgraphs included) is explicitly quantized."""
    ops = set(op_types)
    return "QuantizeLinear" in ops and "DequantizeLinear" in ops


# Recipe 2 builds version-compatible plans with EXCLUDE_LEAN_RUNTIME; recipe 1 embedded the runtime.
LEAN_EXCLUDED_SINCE_RECIPE = 2


def lean_excluded(version_compatible: bool, recipe: int) -> bool:
    """Whether a manifest's plan was built without its lean runtime (so the lean runtime loads it)."""
    return version_compatible and recipe >= LEAN_EXCLUDED_SINCE_RECIPE


def runtime_kind(version_compatible: bool, recipe: int) -> RuntimeKind:
    """The runtime a plan needs: lean for version-compatible plans without an embedded runtime."""
    return "lean" if lean_excluded(version_compatible, recipe) else "full"


@dataclass(frozen=True)
class LoadPlan:
    """How a runtime of kind `runtime` may load a plan, or why it may not."""

    allowed: bool
    host_code_allowed: bool
    reason: str


def load_plan(runtime: RuntimeKind, *, version_compatible: bool, lean_excluded: bool) -> LoadPlan:
    """Which TensorRT runtime may deserialize a plan (docs/design.md §"TensorRT").

    - A plan built without VERSION_COMPATIBLE loads only in the full runtime of its version.
    - VERSION_COMPATIBLE + EXCLUDE_LEAN_RUNTIME (what the builder makes): the lean runtime of the
      same version, no host code; the full runtime needs ``load_runtime`` for it, not done here.
    - VERSION_COMPATIBLE with the lean runtime embedded (older builds): the full runtime with
      ``engine_host_code_allowed`` (the plan carries host code; it was verified by sha256).
    """
    if not version_compatible:
        if runtime == "lean":
            return LoadPlan(
                False,
                False,
                "the lean runtime loads only version-compatible plans; this one was built without "
                "VERSION_COMPATIBLE: run it with the full tensorrt package, or rebuild with "
                "versionCompatible: true",
            )
        return LoadPlan(True, False, "full runtime, plan of this TensorRT version")
    if lean_excluded:
        if runtime == "full":
            return LoadPlan(
                False,
                False,
                "this version-compatible plan was built with EXCLUDE_LEAN_RUNTIME: load it with the "
                "lean runtime (tensorrt_lean) of the TensorRT version that built it",
            )
        return LoadPlan(True, False, "lean runtime, version-compatible plan without an embedded runtime")
    if runtime == "lean":
        return LoadPlan(
            False,
            False,
            "this version-compatible plan embeds its lean runtime (built without "
            "EXCLUDE_LEAN_RUNTIME); the lean runtime does not load such plans: use the full tensorrt "
            "package, or rebuild it",
        )
    return LoadPlan(True, True, "full runtime with engine_host_code_allowed (embedded lean runtime)")


# TensorRT DataType member name -> numpy dtype name ("bfloat16"/"float8_e4m3fn" come from ml_dtypes).
DTYPE_NAMES: dict[str, str] = {
    "FLOAT": "float32",
    "HALF": "float16",
    "BF16": "bfloat16",
    "INT8": "int8",
    "UINT8": "uint8",
    "INT32": "int32",
    "INT64": "int64",
    "BOOL": "bool",
    "FP8": "float8_e4m3fn",
}


def dtype_name(trt_dtype_name: str) -> str:
    """The numpy dtype name of a TensorRT DataType (``trt.nptype`` raises for BF16 and FP8)."""
    name = trt_dtype_name.rsplit(".", 1)[-1].upper()
    if name not in DTYPE_NAMES:
        raise ValueError(
            f"TensorRT data type {name} has no host representation here (supported: {', '.join(DTYPE_NAMES)})"
        )
    return DTYPE_NAMES[name]


def select_profile(profiles: Sequence[Mapping[str, ShapeRange]], shapes: Mapping[str, Sequence[int]]) -> int:
    """The optimization profile that serves a batch: every input's shape lies within the profile's
    [min, max]; among those, the one whose opt is nearest (fewest summed dimension differences),
    then the lowest index. Raises ValueError naming the shapes and ranges when none fits."""
    best: tuple[int, int] | None = None
    for i, prof in enumerate(profiles):
        distance = 0
        fits = True
        for name, shape in shapes.items():
            r = prof.get(name)
            if r is None:
                continue  # a static input: its shape is fixed by the engine
            if len(shape) != len(r.min) or not all(
                lo <= d <= hi for d, lo, hi in zip(shape, r.min, r.max, strict=True)
            ):
                fits = False
                break
            distance += sum(abs(d - o) for d, o in zip(shape, r.opt, strict=True))
        if fits and (best is None or distance < best[1]):
            best = (i, distance)
    if best is None:
        ranges = "; ".join(
            f"profile {i}: " + ", ".join(f"{n} {list(r.min)}..{list(r.max)}" for n, r in sorted(p.items()))
            for i, p in enumerate(profiles)
        )
        got = ", ".join(f"{n} {list(s)}" for n, s in sorted(shapes.items()))
        raise ValueError(f"no optimization profile fits {got} ({ranges})")
    return best[0]


def covering_ranges(profiles: Sequence[Mapping[str, ShapeRange]]) -> dict[str, ShapeRange]:
    """Per input, the range every profile together covers (min of mins, max of maxes; opt from the
    first profile, clamped): what a server may accept. A batch between two profiles' ranges still
    has to fit one of them, which :func:`select_profile` checks."""
    out: dict[str, ShapeRange] = {}
    for name in {n for p in profiles for n in p}:
        ranges = [p[name] for p in profiles if name in p]
        lo = tuple(min(d) for d in zip(*(r.min for r in ranges), strict=True))
        hi = tuple(max(d) for d in zip(*(r.max for r in ranges), strict=True))
        opt = tuple(min(max(o, a), b) for o, a, b in zip(ranges[0].opt, lo, hi, strict=True))
        out[name] = ShapeRange(min=lo, opt=opt, max=hi)
    return out


def samples_per_profile(n: int, profiles: int) -> list[int]:
    """Validation samples for each optimization profile: `n` spread evenly, at least one each, so
    every profile is built and checked, not only the first."""
    k = max(1, profiles)
    base, extra = divmod(max(n, k), k)
    return [base + (1 if i < extra else 0) for i in range(k)]


# ONNX inputs that must stay float32 whatever the model's compute type: (op type, input index).
# Resize scales and Upsample scales are tensor(float) only; Q/DQ scales before opset 19 likewise.
FLOAT32_ONLY_INPUTS: frozenset[tuple[str, int]] = frozenset(
    {("Resize", 2), ("Upsample", 1), ("QuantizeLinear", 1), ("DequantizeLinear", 1)}
)


def float32_only(nodes: Iterable[tuple[str, Sequence[str]]]) -> set[str]:
    """Names of tensors (initializers, Constant outputs) that an fp16/bf16 conversion must leave
    float32, from each node's (op type, input names)."""
    keep: set[str] = set()
    for op, inputs in nodes:
        for i, name in enumerate(inputs):
            if name and (op, i) in FLOAT32_ONLY_INPUTS:
                keep.add(name)
    return keep
