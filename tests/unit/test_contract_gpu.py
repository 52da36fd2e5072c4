"""GPU targets and identities: the part of the engine key the operator and builder must agree on."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from trtforge.contract.gpu import (
    LABEL_ARCH,
    LABEL_MIG_CONFIG_STATE,
    LABEL_PRODUCT,
    GPUTarget,
    UnknownTargetError,
    identity_for_target,
    product_label,
)


def test_product_label_matches_gfd_spelling() -> None:
    assert product_label("NVIDIA H100 80GB HBM3") == "NVIDIA-H100-80GB-HBM3"
    assert product_label(" NVIDIA  H200 ") == "NVIDIA-H200"


@pytest.mark.parametrize(
    ("target", "name"),
    [
        (GPUTarget(gpu="NVIDIA-H100-80GB-HBM3"), "h100-80gb-hbm3"),
        (GPUTarget(gpu="NVIDIA-B200", mig="3g.90gb"), "b200-mig-3g-90gb"),
        (GPUTarget(gpu="cpu"), "cpu"),
    ],
)
def test_target_names_are_dns_labels(target: GPUTarget, name: str) -> None:
    assert target.name == name


def test_long_target_names_stay_short_and_distinct() -> None:
    a = GPUTarget(gpu="NVIDIA-SOME-VERY-LONG-PRODUCT-NAME-THAT-GOES-ON-AND-ON-A")
    b = GPUTarget(gpu="NVIDIA-SOME-VERY-LONG-PRODUCT-NAME-THAT-GOES-ON-AND-ON-B")
    assert len(a.name) <= 40 and len(b.name) <= 40
    assert a.name != b.name


def test_bad_mig_profile_is_refused_with_the_expected_form() -> None:
    with pytest.raises(ValidationError, match=r"1g\.10gb"):
        GPUTarget(gpu="NVIDIA-B200", mig="three-slices")


def test_resources_and_selectors() -> None:
    full = GPUTarget(gpu="NVIDIA-H100-80GB-HBM3")
    mig = GPUTarget(gpu="NVIDIA-B200", mig="1g.23gb")
    assert full.resource_name() == "nvidia.com/gpu"
    assert mig.resource_name() == "nvidia.com/mig-1g.23gb"
    assert GPUTarget(gpu="cpu").resource_name() is None
    assert full.node_selector() == {LABEL_PRODUCT: "NVIDIA-H100-80GB-HBM3"}
    assert mig.node_selector()[LABEL_MIG_CONFIG_STATE] == "success"
    assert GPUTarget(gpu="NVIDIA-GH200-480GB").node_selector("arm64")[LABEL_ARCH] == "arm64"


def test_identity_from_table() -> None:
    ident = identity_for_target(GPUTarget(gpu="NVIDIA-B200", mig="3g.90gb"))
    assert ident.compute_capability == "10.0"
    assert ident.mig_profile == "3g.90gb"
    assert 0 < ident.sm_count < 148
    gh = identity_for_target(GPUTarget(gpu="NVIDIA-GH200-480GB"))
    assert gh.arch == "arm64"
    assert gh.mig_profile == "full"


def test_identity_rejects_a_profile_the_product_does_not_have() -> None:
    with pytest.raises(UnknownTargetError, match=r"1g\.10gb.*B200|B200.*1g\.10gb"):
        identity_for_target(GPUTarget(gpu="NVIDIA-B200", mig="1g.10gb"))


def test_identity_of_unknown_product_needs_labels() -> None:
    with pytest.raises(UnknownTargetError, match="compute capability"):
        identity_for_target(GPUTarget(gpu="NVIDIA-L40S"))
    ident = identity_for_target(GPUTarget(gpu="NVIDIA-L40S"), compute_capability="8.9")
    assert ident.compute_capability == "8.9"


def test_identity_disagreeing_with_the_table_is_refused() -> None:
    with pytest.raises(UnknownTargetError, match=r"expected 9\.0"):
        identity_for_target(GPUTarget(gpu="NVIDIA-H200"), compute_capability="8.0")
