"""The engine key: equal inputs give equal keys, any input that decides the engine changes it."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from trtforge.contract.engine_key import BuildConfig, EngineKeyRecord, ShapeRange, engine_key
from trtforge.contract.gpu import GPUTarget, identity_for_target

SHA = "a" * 64


def record(**changes: object) -> EngineKeyRecord:
    base: dict[str, object] = {
        "model_sha256": SHA,
        "build": BuildConfig(),
        "backend": "tensorrt",
        "backend_version": "10.13.0",
        "cuda": "13.0",
        "gpu": identity_for_target(GPUTarget(gpu="NVIDIA-H100-80GB-HBM3")),
    }
    base.update(changes)
    return EngineKeyRecord.model_validate(base)


def test_key_is_stable_hex() -> None:
    k = engine_key(record())
    assert len(k) == 64 and int(k, 16) >= 0
    assert engine_key(record()) == k


def test_input_order_inside_a_profile_does_not_matter() -> None:
    r = ShapeRange(min=(1, 3), opt=(4, 3), max=(8, 3))
    a = BuildConfig(profiles=({"x": r, "y": r},))
    b = BuildConfig(profiles=({"y": r, "x": r},))
    assert engine_key(record(build=a)) == engine_key(record(build=b))


@pytest.mark.parametrize(
    "change",
    [
        {"model_sha256": "b" * 64},
        {"build": BuildConfig(precision="fp32")},
        {"build": BuildConfig(optimization_level=5)},
        {"build": BuildConfig(profiles=({"x": ShapeRange(min=(1,), opt=(2,), max=(4,))},))},
        {"backend_version": "10.14.0"},
        {"backend": "onnxruntime"},
        {"cuda": "12.9"},
        {"gpu": identity_for_target(GPUTarget(gpu="NVIDIA-H200"))},
        {"gpu": identity_for_target(GPUTarget(gpu="NVIDIA-H100-80GB-HBM3", mig="1g.10gb"))},
        {"gpu": identity_for_target(GPUTarget(gpu="NVIDIA-H100-80GB-HBM3"), arch="arm64")},
    ],
)
def test_every_deciding_input_changes_the_key(change: dict[str, object]) -> None:
    assert engine_key(record(**change)) != engine_key(record())


def test_shape_range_order_is_enforced_per_dimension() -> None:
    with pytest.raises(ValidationError, match="dimension 0 must satisfy min <= opt <= max"):
        ShapeRange(min=(8, 3), opt=(4, 3), max=(16, 3))
    with pytest.raises(ValidationError, match="same rank"):
        ShapeRange(min=(1,), opt=(1, 3), max=(1, 3))


def test_model_sha_must_be_hex() -> None:
    with pytest.raises(ValidationError):
        record(model_sha256="not-a-sha")
