"""The pure TensorRT policies shared by builder and runtime (trtforge.tensorrt.policy)."""

from __future__ import annotations

import pytest

from trtforge.contract.engine_key import BuildConfig, ShapeRange
from trtforge.tensorrt import policy
from trtforge.tensorrt.policy import PrecisionRefused, builder_flags


def flags(
    precision: str, major: int, qdq: bool = False, **cfg: object
) -> tuple[tuple[str, ...], tuple[str, ...], str | None]:
    f = builder_flags(BuildConfig(precision=precision, **cfg), major, model_has_qdq=qdq)  # type: ignore[arg-type]
    return f.set, f.clear, f.convert_model_to


@pytest.mark.parametrize(
    ("precision", "qdq", "tensorrt10", "tensorrt11"),
    [
        # precision, model has Q/DQ, (set, clear, convert) on TensorRT 10, the same on 11
        ("fp32", False, ((), ("TF32",), None), ((), ("TF32",), None)),
        ("fp16", False, (("FP16",), (), None), ((), (), "fp16")),
        ("bf16", False, (("BF16",), (), None), ((), (), "bf16")),
        ("auto", False, (("FP16",), (), None), ((), (), None)),
        ("int8", True, (("INT8", "FP16"), (), None), ((), (), None)),
        ("fp8", True, (("FP8", "FP16"), (), None), ((), (), None)),
    ],
)
def test_flags_per_precision_and_major(
    precision: str, qdq: bool, tensorrt10: tuple[object, ...], tensorrt11: tuple[object, ...]
) -> None:
    """TF32 is cleared for fp32 on both majors (it is on by default); TensorRT 11 has no precision
    flags at all: fp16/bf16 convert the model, quantized models carry their own types."""
    assert flags(precision, 10, qdq) == tensorrt10
    assert flags(precision, 11, qdq) == tensorrt11


@pytest.mark.parametrize("major", [10, 11])
@pytest.mark.parametrize("precision", ["int8", "fp8"])
def test_int8_and_fp8_without_qdq_are_refused_with_how_to_quantize(precision: str, major: int) -> None:
    with pytest.raises(PrecisionRefused) as e:
        builder_flags(BuildConfig(precision=precision), major, model_has_qdq=False)  # type: ignore[arg-type]
    msg = str(e.value)
    assert (
        "no Q/DQ nodes" in msg
        and "modelopt.onnx.quantization" in msg
        and f"--quantize_mode {precision}" in msg
    )


def test_version_compatible_plans_exclude_the_lean_runtime_and_hw_levels_are_names() -> None:
    f = builder_flags(
        BuildConfig(
            precision="fp16", version_compatible=True, hardware_compatibility="sameComputeCapability"
        ),
        10,
        model_has_qdq=False,
    )
    assert f.set == ("FP16", "VERSION_COMPATIBLE", "EXCLUDE_LEAN_RUNTIME")
    assert f.hardware_level == "SAME_COMPUTE_CAPABILITY"
    assert builder_flags(BuildConfig(), 11, model_has_qdq=False).hardware_level is None


def test_strip_weights_and_old_majors_are_refused() -> None:
    with pytest.raises(PrecisionRefused, match="strip_weights is refused"):
        builder_flags(BuildConfig(strip_weights=True), 11, model_has_qdq=False)
    with pytest.raises(PrecisionRefused, match="TensorRT 8 is not supported"):
        builder_flags(BuildConfig(), 8, model_has_qdq=False)


def test_qdq_detection_needs_both_halves() -> None:
    assert policy.has_qdq(["Conv", "QuantizeLinear", "DequantizeLinear"])
    assert not policy.has_qdq(["Conv", "DequantizeLinear"])
    assert not policy.has_qdq([])


@pytest.mark.parametrize(
    ("runtime", "vc", "excluded", "allowed", "host_code"),
    [
        ("full", False, False, True, False),
        ("lean", False, False, False, False),  # the lean runtime does not load non-VC plans
        ("lean", True, True, True, False),  # VC + EXCLUDE_LEAN_RUNTIME: the lean runtime, no host code
        ("full", True, True, False, False),
        ("full", True, False, True, True),  # embedded lean runtime: host code must be allowed
        ("lean", True, False, False, False),  # undocumented path, refused
    ],
)
def test_which_runtime_loads_which_plan(
    runtime: str, vc: bool, excluded: bool, allowed: bool, host_code: bool
) -> None:
    d = policy.load_plan(runtime, version_compatible=vc, lean_excluded=excluded)  # type: ignore[arg-type]
    assert (d.allowed, d.host_code_allowed) == (allowed, host_code)
    assert d.reason


def test_runtime_kind_follows_the_recipe() -> None:
    assert policy.runtime_kind(True, 2) == "lean" and policy.lean_excluded(True, 2)
    assert policy.runtime_kind(True, 1) == "full" and not policy.lean_excluded(True, 1)
    assert policy.runtime_kind(False, 2) == "full"


def test_dtype_names_cover_bf16_and_fp8() -> None:
    assert policy.dtype_name("DataType.BF16") == "bfloat16"
    assert policy.dtype_name("FP8") == "float8_e4m3fn"
    assert policy.dtype_name("HALF") == "float16" and policy.dtype_name("FLOAT") == "float32"
    with pytest.raises(ValueError, match="FP4 has no host representation"):
        policy.dtype_name("FP4")


R = ShapeRange


def test_profile_that_fits_the_batch_is_chosen() -> None:
    profiles = [
        {"x": R(min=(1, 3), opt=(4, 3), max=(8, 3))},
        {"x": R(min=(8, 3), opt=(16, 3), max=(32, 3))},
    ]
    assert policy.select_profile(profiles, {"x": (2, 3)}) == 0
    assert policy.select_profile(profiles, {"x": (20, 3)}) == 1
    assert policy.select_profile(profiles, {"x": (8, 3)}) == 0  # both fit; opt 4 is nearer than 16
    assert policy.select_profile(profiles, {"x": (12, 3)}) == 1
    with pytest.raises(
        ValueError, match=r"no optimization profile fits x \[64, 3\].*profile 1: x \[8, 3\]\.\.\[32, 3\]"
    ):
        policy.select_profile(profiles, {"x": (64, 3)})
    with pytest.raises(ValueError, match="no optimization profile fits"):
        policy.select_profile(profiles, {"x": (2, 3, 1)})  # wrong rank


def test_static_engines_have_one_profile_with_no_ranges() -> None:
    assert policy.select_profile([{}], {"x": (1, 3)}) == 0


def test_only_allowed_initializers_are_cast() -> None:
    nodes = [
        ("Conv", ["x", "w", "b"]),
        ("Resize", ["y", "roi", "scales"]),
        ("Upsample", ["z", "up_scales"]),
        ("DequantizeLinear", ["q", "dq_scale", "dq_zero"]),
    ]
    assert policy.float32_only(nodes) == {"scales", "up_scales", "dq_scale"}


def test_a_server_accepts_what_all_profiles_together_cover() -> None:
    profiles = [
        {"x": R(min=(1, 3), opt=(4, 3), max=(8, 3))},
        {"x": R(min=(8, 3), opt=(16, 3), max=(32, 3))},
    ]
    assert policy.covering_ranges(profiles) == {"x": R(min=(1, 3), opt=(4, 3), max=(32, 3))}
    assert policy.covering_ranges([]) == {}


def test_every_profile_gets_validation_samples() -> None:
    assert policy.samples_per_profile(4, 1) == [4]
    assert policy.samples_per_profile(5, 2) == [3, 2]
    assert policy.samples_per_profile(1, 3) == [1, 1, 1]  # at least one each
    assert policy.samples_per_profile(4, 0) == [4]
