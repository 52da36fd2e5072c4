"""GPU targets and identities: the part of the engine key the operator and builder must agree on."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from trtforge.contract.gpu import (
    KNOWN_GPUS,
    LABEL_ARCH,
    LABEL_MIG_CONFIG_STATE,
    LABEL_PRODUCT,
    MIG_GUIDE,
    GPUTarget,
    UnknownTargetError,
    known_identity,
    mig_profile_of_resource,
    mig_resource_suffix,
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
        (GPUTarget(gpu="NVIDIA-H200", mig="1g.18gb+me"), "h200-mig-1g-18gb-plus-me"),
        (GPUTarget(gpu="NVIDIA-B200", mig="1g.23gb-me"), "b200-mig-1g-23gb-me"),
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


@pytest.mark.parametrize(
    ("profile", "resource"),
    [
        ("1g.18gb", "nvidia.com/mig-1g.18gb"),
        ("1g.18gb+me", "nvidia.com/mig-1g.18gb.me"),  # NVML's name on a real H200 (profile ID 20)
        ("1g.23gb+gfx", "nvidia.com/mig-1g.23gb.gfx"),
        ("1g.23gb-me", "nvidia.com/mig-1g.23gb-me"),
    ],
)
def test_media_extension_profiles_map_to_the_device_plugins_resource_and_back(
    profile: str, resource: str
) -> None:
    """The device plugin turns a profile's `+` into `.` (resource names allow no `+`)."""
    assert GPUTarget(gpu="NVIDIA-H200", mig=profile).resource_name() == resource
    suffix = resource.removeprefix("nvidia.com/mig-")
    assert mig_resource_suffix(profile) == suffix
    assert mig_profile_of_resource(suffix) == profile


def test_resources_and_selectors() -> None:
    full = GPUTarget(gpu="NVIDIA-H100-80GB-HBM3")
    mig = GPUTarget(gpu="NVIDIA-B200", mig="1g.23gb")
    assert full.resource_name() == "nvidia.com/gpu"
    assert mig.resource_name() == "nvidia.com/mig-1g.23gb"
    assert GPUTarget(gpu="cpu").resource_name() is None
    assert full.node_selector() == {LABEL_PRODUCT: "NVIDIA-H100-80GB-HBM3"}
    assert mig.node_selector()[LABEL_MIG_CONFIG_STATE] == "success"
    assert GPUTarget(gpu="NVIDIA-GH200-480GB").node_selector("arm64")[LABEL_ARCH] == "arm64"


def test_table_hint_uses_nvml_figures_for_h200_mig() -> None:
    """The H200 rows are what NVML reported on a real H200 (issue 11), not g x 16."""
    want = {
        "1g.18gb": 16,
        "1g.18gb+me": 16,
        "1g.35gb": 26,
        "2g.35gb": 32,
        "3g.71gb": 60,
        "4g.71gb": 64,
        "7g.141gb": 132,
    }
    h200 = KNOWN_GPUS["NVIDIA-H200"]
    assert {p: f.sm_count for p, f in h200.mig.items()} == want
    assert h200.mig["3g.71gb"].memory_mib == 71424
    ident = known_identity(GPUTarget(gpu="NVIDIA-H200", mig="1g.35gb"))
    assert (ident.sm_count, ident.memory_mib) == (26, 33280)


def test_other_rows_cite_the_mig_guide_and_claim_no_unmeasured_sm_count() -> None:
    for product, known in KNOWN_GPUS.items():
        assert known.source, product
        if product != "NVIDIA-H200":
            assert MIG_GUIDE in known.source
            assert all(f.sm_count is None for f in known.mig.values()), product
        plain = [f.sm_fraction for p, f in known.mig.items() if "+" not in p]
        assert plain == ["1/7", "1/7", "2/7", "3/7", "4/7", "7/7"]
    # unmeasured: the hint says 0 (unknown), never a formula
    assert known_identity(GPUTarget(gpu="NVIDIA-B200", mig="3g.90gb")).sm_count == 0
    assert known_identity(GPUTarget(gpu="NVIDIA-GH200-480GB")).arch == "arm64"


def test_hint_rejects_a_profile_the_product_does_not_have() -> None:
    with pytest.raises(UnknownTargetError, match=r"1g\.10gb.*B200|B200.*1g\.10gb"):
        known_identity(GPUTarget(gpu="NVIDIA-B200", mig="1g.10gb"))
    with pytest.raises(UnknownTargetError, match="known-GPU table"):
        known_identity(GPUTarget(gpu="NVIDIA-L40S"))


def test_a_node_advertising_a_media_extension_slice_hosts_that_profile() -> None:
    """What the device plugin advertises (`nvidia.com/mig-1g.18gb.me`) is read back as NVML's profile."""
    from trtforge_operator.observe.views import NodeView

    from tests.fakes import gpu_node

    node = NodeView.from_k8s(gpu_node("h200-mig", "NVIDIA-H200", 1, mig={"1g.18gb.me": 1, "1g.18gb": 5}))
    me = GPUTarget(gpu="NVIDIA-H200", mig="1g.18gb+me")
    assert node.mig_profiles() == ["1g.18gb", "1g.18gb+me"]
    assert me in node.targets() and node.hosts(me)
