"""Engine and request keys: equal inputs give equal keys, any input that decides the engine changes
them, and hardware-compatible engines are keyed only by what they are bound to."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from trtforge.contract.engine_key import (
    RECIPE_VERSION,
    BuildConfig,
    EngineKeyRecord,
    RequestKeyRecord,
    ShapeRange,
    engine_key,
    gpu_binding,
    request_key,
    target_binding,
)
from trtforge.contract.gpu import GPUIdentity

SHA = "a" * 64
H100 = GPUIdentity(
    product="NVIDIA-H100-80GB-HBM3",
    compute_capability="9.0",
    mig_profile="full",
    sm_count=132,
    arch="amd64",
    memory_mib=81559,
)
H200 = GPUIdentity(
    product="NVIDIA-H200",
    compute_capability="9.0",
    mig_profile="full",
    sm_count=132,
    arch="amd64",
    memory_mib=143771,
)
H200_1G35 = GPUIdentity(
    product="NVIDIA-H200",
    compute_capability="9.0",
    mig_profile="1g.35gb",
    sm_count=26,
    arch="amd64",
    memory_mib=33280,
)
B200 = GPUIdentity(
    product="NVIDIA-B200", compute_capability="10.0", mig_profile="full", sm_count=148, arch="amd64"
)


def record(identity: GPUIdentity = H100, **changes: object) -> EngineKeyRecord:
    base: dict[str, object] = {
        "model_sha256": SHA,
        "build": BuildConfig(),
        "backend": "tensorrt",
        "backend_version": "10.13.3.9",
        "cuda": "13.0",
        "identity": identity,
    }
    base.update(changes)
    return EngineKeyRecord.for_identity(**base)  # type: ignore[arg-type]


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
        {"backend_version": "10.14.1.48"},
        {"backend": "onnxruntime"},
        {"cuda": "12.9"},
        {"recipe": RECIPE_VERSION + 1},
        {"identity": H200},
        {"identity": H200_1G35},
        {"identity": H100.model_copy(update={"arch": "arm64"})},
        {"identity": H100.model_copy(update={"sm_count": 114})},
    ],
)
def test_every_deciding_input_changes_the_key(change: dict[str, object]) -> None:
    assert engine_key(record(**change)) != engine_key(record())  # type: ignore[arg-type]


def test_memory_alone_does_not_change_the_key() -> None:
    """The key binds what TensorRT binds; a driver reporting a few MiB more is the same engine."""
    assert engine_key(record(identity=H100.model_copy(update={"memory_mib": 81000}))) == engine_key(record())


def test_same_compute_capability_engines_share_one_key_across_products() -> None:
    cfg = BuildConfig(hardware_compatibility="sameComputeCapability")
    h100, h200 = record(H100, build=cfg), record(H200, build=cfg)
    assert engine_key(h100) == engine_key(h200)
    assert engine_key(record(H200_1G35, build=cfg)) == engine_key(h100)
    assert engine_key(record(B200, build=cfg)) != engine_key(h100)  # 10.0 is another capability
    assert h100.gpu.product is None and h100.gpu.compute_capability == "9.0"


def test_ampere_plus_engines_are_bound_to_the_platform_only() -> None:
    cfg = BuildConfig(hardware_compatibility="amperePlus")
    assert engine_key(record(H100, build=cfg)) == engine_key(record(B200, build=cfg))
    arm = H100.model_copy(update={"arch": "arm64"})
    assert engine_key(record(arm, build=cfg)) != engine_key(record(H100, build=cfg))
    assert gpu_binding(H100, "amperePlus").compute_capability == "8.0+"


def test_version_compatible_engines_keep_the_builder_version() -> None:
    """A VC plan runs on later runtimes but its content is what its builder made."""
    cfg = BuildConfig(version_compatible=True)
    assert engine_key(record(build=cfg, backend_version="10.13.3.9")) != engine_key(
        record(build=cfg, backend_version="10.14.1.48")
    )


def test_shape_range_order_is_enforced_per_dimension() -> None:
    with pytest.raises(ValidationError, match="dimension 0 must satisfy min <= opt <= max"):
        ShapeRange(min=(8, 3), opt=(4, 3), max=(16, 3))
    with pytest.raises(ValidationError, match="same rank"):
        ShapeRange(min=(1,), opt=(1, 3), max=(1, 3))


def test_model_sha_must_be_hex() -> None:
    with pytest.raises(ValidationError):
        record(model_sha256="not-a-sha")


# --- request keys: what the operator asked for


def request(**changes: object) -> RequestKeyRecord:
    base: dict[str, object] = {
        "model_sha256": SHA,
        "build": BuildConfig(),
        "gpu": target_binding("NVIDIA-H200", None, "none", compute_capability="9.0", arch="amd64"),
        "backend": "tensorrt",
        "builder_image": "ghcr.io/trtforge/builder:0.1.0",
    }
    base.update(changes)
    return RequestKeyRecord.model_validate(base)


@pytest.mark.parametrize(
    "change",
    [
        {"model_sha256": "b" * 64},
        {"build": BuildConfig(precision="fp32")},
        {"gpu": target_binding("NVIDIA-H200", "1g.35gb", "none", compute_capability="9.0", arch="amd64")},
        {"gpu": target_binding("NVIDIA-B200", None, "none", compute_capability="10.0", arch="amd64")},
        {"backend": "onnxruntime"},
        {"builder_image": "ghcr.io/trtforge/builder:0.2.0"},
        {"recipe": RECIPE_VERSION + 1},
    ],
)
def test_every_asked_for_input_changes_the_request_key(change: dict[str, object]) -> None:
    assert request_key(request(**change)) != request_key(request())


def test_request_key_holds_no_backend_version() -> None:
    """The operator cannot state a TensorRT/CUDA version: the record has no field for one."""
    fields = set(RequestKeyRecord.model_fields)
    assert not {"backend_version", "cuda"} & fields
    assert "builder_image" in fields and "recipe" in fields


def test_compatible_requests_ignore_the_product() -> None:
    for hw in ("sameComputeCapability", "amperePlus"):
        a = target_binding("NVIDIA-H100-80GB-HBM3", None, hw, compute_capability="9.0", arch="amd64")  # type: ignore[arg-type]
        b = target_binding("NVIDIA-H200", "1g.35gb", hw, compute_capability="9.0", arch="amd64")  # type: ignore[arg-type]
        assert a == b
    with pytest.raises(ValueError, match=r"gpu\.compute\.major"):
        target_binding("NVIDIA-H200", None, "sameComputeCapability", compute_capability=None, arch="amd64")


def test_unpinned_requests_name_the_model_by_uri() -> None:
    r = request(model_sha256=None, model_uri="s3://models/a.onnx")
    assert request_key(r) != request_key(request(model_sha256=None, model_uri="s3://models/b.onnx"))
    with pytest.raises(ValidationError, match="sha256 when pinned"):
        request(model_uri="s3://models/a.onnx")
