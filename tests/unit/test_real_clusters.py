"""What a real GPU cluster needs of the pods the operator makes: MIG under the GPU Operator's `single`
and `mixed` strategies, planned from the GFD labels each sets; tolerations and image pull secrets on
build Jobs, verify Jobs and runtime pods; the runtime image that loads the engine."""

from __future__ import annotations

from typing import Any

import pytest
from trtforge_operator.apply import children
from trtforge_operator.config import OperatorConfig
from trtforge_operator.labels import LABEL_TARGET
from trtforge_operator.observe.views import NodeView
from trtforge_operator.planning.deployment import plan_deployment
from trtforge_operator.planning.engine import plan_engine

from tests.fakes import default_nodes, gpu_node
from tests.unit.test_planning_deployment import engine as served_engine
from tests.unit.test_planning_deployment import infd
from tests.unit.test_planning_deployment import observed as observed_deployment
from tests.unit.test_planning_engine import CFG, engine, observe
from trtforge.contract.gpu import GPUTarget, MigStrategy, node_mig_strategy, single_strategy_product

B200_3G = GPUTarget(gpu="NVIDIA-B200", mig="3g.90gb")
GPU_TAINT = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def single_node(name: str, product: str, profile: str, slices: int) -> dict[str, Any]:
    """A node as GFD and the device plugin show it under mig.strategy=single."""
    n = gpu_node(name, product, slices)
    n["metadata"]["labels"] |= {
        "nvidia.com/gpu.product": f"{product}-MIG-{profile}",
        "nvidia.com/mig.strategy": "single",
        "nvidia.com/mig.config.state": "success",
    }
    return n


# --- the strategy from GFD's labels -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("label", "want"),
    [
        ("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", ("NVIDIA-A100-SXM4-40GB", "1g.5gb")),
        ("NVIDIA-B200-MIG-3g.90gb", ("NVIDIA-B200", "3g.90gb")),
        ("NVIDIA-H200-MIG-1g.18gb.me", ("NVIDIA-H200", "1g.18gb+me")),
        ("NVIDIA-H100-80GB-HBM3", None),
        ("NVIDIA-B200-MIG-", None),
    ],
)
def test_single_strategy_product_label_names_product_and_profile(
    label: str, want: tuple[str, str] | None
) -> None:
    assert single_strategy_product(label) == want


def test_a_nodes_strategy_comes_from_its_labels() -> None:
    assert node_mig_strategy(
        {"nvidia.com/mig.strategy": "single", "nvidia.com/gpu.product": "X-MIG-1g.5gb"}
    ) == (MigStrategy.SINGLE)
    # single announced but the product label names no slice (MIG off on that node): whole GPUs
    assert node_mig_strategy({"nvidia.com/mig.strategy": "single", "nvidia.com/gpu.product": "X"}) == (
        MigStrategy.NONE
    )
    assert node_mig_strategy({"nvidia.com/mig.strategy": "mixed"}) == MigStrategy.MIXED
    assert node_mig_strategy({}) == MigStrategy.NONE


def test_selector_and_resource_per_strategy() -> None:
    assert B200_3G.resource_name() == "nvidia.com/mig-3g.90gb"
    assert B200_3G.resource_name(MigStrategy.SINGLE) == "nvidia.com/gpu"
    assert B200_3G.node_selector(strategy=MigStrategy.SINGLE) == {
        "nvidia.com/gpu.product": "NVIDIA-B200-MIG-3g.90gb",
        "nvidia.com/mig.strategy": "single",
    }
    assert B200_3G.node_selector() == {
        "nvidia.com/gpu.product": "NVIDIA-B200",
        "nvidia.com/mig.config.state": "success",
    }
    whole = GPUTarget(gpu="NVIDIA-B200")  # a whole GPU is asked for alike under every strategy
    assert whole.node_selector(strategy=MigStrategy.SINGLE) == whole.node_selector()


def test_a_single_strategy_node_hosts_its_slice_only() -> None:
    v = NodeView.from_k8s(single_node("n", "NVIDIA-B200", "3g.90gb", 4))
    assert v.product == "NVIDIA-B200" and v.mig_strategy == MigStrategy.SINGLE
    assert v.targets() == [B200_3G]
    assert v.hosts(B200_3G)
    assert not v.hosts(GPUTarget(gpu="NVIDIA-B200"))
    assert not v.hosts(GPUTarget(gpu="NVIDIA-B200", mig="1g.23gb"))


# --- planned builds -------------------------------------------------------------------------------------


def build_pod(nodes: list[dict[str, Any]], target: GPUTarget, cfg: OperatorConfig = CFG) -> dict[str, Any]:
    e = engine([{"gpu": target.gpu, **({"mig": target.mig} if target.mig else {})}])
    plan = plan_engine(observe(e, nodes=nodes, cfg=cfg), cfg)
    (job,) = [j for j in plan.jobs_to_create if j["metadata"]["labels"][LABEL_TARGET] == target.name]
    return dict(job["spec"]["template"]["spec"])


def test_single_strategy_build_selects_the_slice_label_and_asks_for_a_gpu() -> None:
    nodes = [gpu_node("h100", "NVIDIA-H100-80GB-HBM3", 8), single_node("b200-s", "NVIDIA-B200", "3g.90gb", 4)]
    pod = build_pod(nodes, B200_3G)
    assert pod["nodeSelector"]["nvidia.com/gpu.product"] == "NVIDIA-B200-MIG-3g.90gb"
    assert pod["nodeSelector"]["nvidia.com/mig.strategy"] == "single"
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert not any(k.startswith("nvidia.com/mig-") for k in pod["containers"][0]["resources"]["limits"])


def test_mixed_strategy_build_is_unchanged() -> None:
    pod = build_pod(default_nodes(), B200_3G)
    assert pod["nodeSelector"]["nvidia.com/gpu.product"] == "NVIDIA-B200"
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/mig-3g.90gb"] == "1"


def test_a_target_on_both_strategies_goes_where_most_of_its_nodes_are() -> None:
    mixed = gpu_node("b200-m", "NVIDIA-B200", 1, mig={"3g.90gb": 2})
    singles = [single_node(f"b200-s{i}", "NVIDIA-B200", "3g.90gb", 2) for i in range(2)]
    assert build_pod([mixed, *singles], B200_3G)["nodeSelector"]["nvidia.com/mig.strategy"] == "single"
    assert "nvidia.com/mig.strategy" not in build_pod([mixed, singles[0]], B200_3G)["nodeSelector"]  # tie


def test_auto_targets_find_single_strategy_slices() -> None:
    e = engine(autoTargets={"enabled": True})
    nodes = [gpu_node("h100", "NVIDIA-H100-80GB-HBM3", 8), single_node("b200-s", "NVIDIA-B200", "3g.90gb", 4)]
    names = {t.name for t in plan_engine(observe(e, nodes=nodes), CFG).status.targets}
    assert names == {"h100-80gb-hbm3", "b200-mig-3g-90gb"}


# --- tolerations and pull secrets on every pod ------------------------------------------------------------


def test_build_pods_tolerate_the_gpu_taint_by_default_and_carry_pull_secrets() -> None:
    assert OperatorConfig().tolerations == [GPU_TAINT]
    cfg = CFG.model_copy(update={"image_pull_secrets": ["regcred"]})
    pod = build_pod(default_nodes(), GPUTarget(gpu="NVIDIA-H100-80GB-HBM3"), cfg)
    assert pod["tolerations"] == [GPU_TAINT]
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]


def test_verify_pods_carry_tolerations_and_pull_secrets() -> None:
    cfg = CFG.model_copy(
        update={
            "image_pull_secrets": ["regcred"],
            "tolerations": [GPU_TAINT, {"key": "pool", "operator": "Exists"}],
        }
    )
    req = children.VerifyRequest(
        namespace="team-a",
        engine="resnet",
        engine_uid="u1",
        model_uri="pvc://models/resnet.onnx",
        model_sha256=None,
        secret=None,
        fingerprint="f" * 64,
    )
    pod = children.verify_job(req, cfg)["spec"]["template"]["spec"]
    assert pod["tolerations"] == cfg.tolerations
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]


def test_no_tolerations_configured_means_none_on_the_pods() -> None:
    cfg = CFG.model_copy(update={"tolerations": []})
    assert "tolerations" not in build_pod(default_nodes(), GPUTarget(gpu="NVIDIA-H100-80GB-HBM3"), cfg)


# --- runtime pods: the image that loads the engine, tolerations, pull secrets ------------------------------


def runtime_pods(cfg: OperatorConfig, version_compatible: bool, **spec: Any) -> dict[str, dict[str, Any]]:
    e = served_engine()
    e.spec.builder.version_compatible = version_compatible
    plan = plan_deployment(observed_deployment(infd(**spec), e), cfg)
    return {
        d["metadata"]["labels"][LABEL_TARGET]: d["spec"]["template"]["spec"]
        for d in plan.apply
        if d["kind"] == "Deployment"
    }


RUNTIME_CFG = OperatorConfig(backends={"gpu": "onnxruntime"}, broker={"url": "http://broker:8081"})


@pytest.mark.parametrize(("version_compatible", "image"), [(False, "0.1.0-full"), (True, "0.1.0")])
def test_the_runtime_image_fits_the_engine(version_compatible: bool, image: str) -> None:
    for pod in runtime_pods(RUNTIME_CFG, version_compatible).values():
        assert pod["containers"][0]["image"] == f"ghcr.io/trtforge/trtforge-runtime:{image}"
    named = runtime_pods(RUNTIME_CFG, version_compatible, runtime={"image": "mine:1"})
    assert {p["containers"][0]["image"] for p in named.values()} == {"mine:1"}  # the resource's own wins


def test_runtime_pods_add_their_own_tolerations_to_the_operators() -> None:
    cfg = RUNTIME_CFG.model_copy(update={"image_pull_secrets": ["regcred"]})
    own = {"key": "dedicated", "operator": "Equal", "value": "inference", "effect": "NoSchedule"}
    for pod in runtime_pods(cfg, False, runtime={"tolerations": [own, GPU_TAINT]}).values():
        assert pod["tolerations"] == [GPU_TAINT, own]
        assert pod["imagePullSecrets"] == [{"name": "regcred"}]
