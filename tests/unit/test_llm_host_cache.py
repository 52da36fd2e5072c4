"""The KV cache's host tier on Grace Hopper (contract.llm.host_cache, planning/host_cache.py): sized
from the node's allocatable memory less the node's other pods, this pod's own need and any weights
in Grace memory, at the stated fraction, split over the ranks; none elsewhere."""

from __future__ import annotations

import pytest
from trtforge_operator.api import LLMServer
from trtforge_operator.observe.node_memory import NodeMemoryView
from trtforge_operator.observe.views import NodeView
from trtforge_operator.planning.host_cache import (
    DEFAULT_POD_BASE_BYTES_PER_GPU,
    plan_host_cache,
    target_host_cache,
)

from tests.fakes import gpu_node
from trtforge.contract.gpu import GPUTarget
from trtforge.contract.llm.host_cache import (
    HOST_CACHE_FRACTION,
    MIN_HOST_CACHE_BYTES,
    NodeMemoryBudget,
    host_cache_bytes,
    pod_memory_bytes,
)

GiB, MiB = 1 << 30, 1 << 20


def node(allocatable: str | None, product: str = "NVIDIA-GH200-480GB") -> NodeMemoryView:
    status = {"allocatable": {"memory": allocatable, "nvidia.com/gpu": "1"}} if allocatable else {}
    labels = {"nvidia.com/gpu.product": product} if product else {}
    return NodeMemoryView.from_k8s({"metadata": {"name": "gh-0", "labels": labels}, "status": status})


def test_the_size_is_the_stated_fraction_of_what_is_left_split_over_the_ranks() -> None:
    b = NodeMemoryBudget(
        node_allocatable_bytes=450 * GiB, other_pods_bytes=10 * GiB, pod_base_bytes=40 * GiB, ranks_on_node=1
    )
    assert HOST_CACHE_FRACTION == 0.5
    assert host_cache_bytes(b) == 200 * GiB
    two = NodeMemoryBudget(450 * GiB, 10 * GiB, 40 * GiB, ranks_on_node=2)
    assert host_cache_bytes(two) == 100 * GiB
    spilled = NodeMemoryBudget(450 * GiB, 10 * GiB, 40 * GiB, weights_overflow_bytes=100 * GiB)
    assert host_cache_bytes(spilled) == 150 * GiB  # weights in Grace memory come out of the budget
    assert pod_memory_bytes(two, 100 * GiB) == 240 * GiB  # the pod's request covers both pools


def test_the_size_is_whole_mib_and_none_below_the_minimum() -> None:
    odd = NodeMemoryBudget(node_allocatable_bytes=10 * GiB + 3, other_pods_bytes=0, pod_base_bytes=0)
    assert host_cache_bytes(odd) % MiB == 0 and host_cache_bytes(odd) == 5 * GiB
    small = NodeMemoryBudget(
        node_allocatable_bytes=2 * MIN_HOST_CACHE_BYTES - 2 * MiB, other_pods_bytes=0, pod_base_bytes=0
    )
    assert host_cache_bytes(small) == 0
    full = NodeMemoryBudget(node_allocatable_bytes=8 * GiB, other_pods_bytes=6 * GiB, pod_base_bytes=6 * GiB)
    assert host_cache_bytes(full) == 0  # nothing left is none, not a negative size


@pytest.mark.parametrize(
    ("budget", "fraction", "named"),
    [
        (NodeMemoryBudget(-1, 0, 0), 0.5, "node_allocatable_bytes"),
        (NodeMemoryBudget(GiB, -1, 0), 0.5, "other_pods_bytes"),
        (NodeMemoryBudget(GiB, 0, 0, weights_overflow_bytes=-1), 0.5, "weights_overflow_bytes"),
        (NodeMemoryBudget(GiB, 0, 0, ranks_on_node=0), 0.5, "ranks_on_node"),
        (NodeMemoryBudget(GiB, 0, 0), 1.5, "fraction"),
    ],
)
def test_bad_inputs_are_refused_by_name(budget: NodeMemoryBudget, fraction: float, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        host_cache_bytes(budget, fraction)


def test_a_gh200_node_gets_a_host_tier_and_the_flag_that_carries_it() -> None:
    plan = plan_host_cache(node("471Gi"), gpus_per_pod=1, pod_base_bytes=60 * GiB, other_pods_bytes=11 * GiB)
    assert plan.per_rank_bytes == 200 * GiB and plan.pod_memory_bytes == 260 * GiB
    assert plan.arguments() == ["--host-cache-bytes", str(200 * GiB)]
    spilled = plan_host_cache(node("471Gi"), 1, 60 * GiB, 11 * GiB, weights_overflow_mib=50 * 1024)
    assert spilled.per_rank_bytes == 175 * GiB


@pytest.mark.parametrize(
    ("view", "why"),
    [
        (node("2000Gi", product="NVIDIA-H100-80GB-HBM3"), "not Grace Hopper"),
        (node("2000Gi", product=""), "no GPU label"),
        (node(None), "no allocatable memory"),
        (node("not-a-quantity"), "no allocatable memory"),
        (node("64Gi"), "too little memory"),
    ],
)
def test_no_host_tier_elsewhere_and_the_plan_says_why(view: NodeMemoryView, why: str) -> None:
    plan = plan_host_cache(view, 1, pod_base_bytes=60 * GiB, other_pods_bytes=10 * GiB)
    assert (plan.per_rank_bytes, plan.arguments(), plan.pod_memory_bytes) == (0, [], 60 * GiB)
    assert why in plan.reason


# --- one target's pods (planning/host_cache.py target_host_cache): the flag and the memory they get

GH200 = GPUTarget(gpu="NVIDIA-GH200-480GB")
H100 = GPUTarget(gpu="NVIDIA-H100-80GB-HBM3")


def gh200(name: str, memory: int | None, *, ready: bool = True) -> NodeView:
    extra = {"memory": memory} if memory is not None else {}
    return NodeView.from_k8s(gpu_node(name, GH200.gpu, 1, allocatable=extra, ready=ready))


def test_a_gh200_target_gets_the_flag_and_a_memory_request_and_limit_from_its_smallest_ready_node() -> None:
    nodes = [
        gh200("gh-big", 900 * GiB),
        gh200("gh-small", 472 * GiB),
        gh200("gh-down", 100 * GiB, ready=False),
    ]
    tier = target_host_cache(LLMServer.TRTLLM_SERVE, GH200, nodes, 1, {"requests": {"cpu": "4"}}, None)
    base = DEFAULT_POD_BASE_BYTES_PER_GPU
    per_rank = (472 * GiB - base) // 2  # other pods count 0: the scheduler keeps the pod where it fits
    assert tier.arguments == ("--host-cache-bytes", str(per_rank))
    assert tier.resources == {
        "requests": {"cpu": "4", "memory": str(base + per_rank)},
        "limits": {"memory": str(base + per_rank)},
    }
    assert "gh-small" in tier.reason


def test_the_users_memory_request_is_the_pods_base_and_spilled_weights_come_out_of_the_budget() -> None:
    nodes = [gh200("gh-0", 472 * GiB)]
    asked = {"requests": {"memory": "72Gi"}}
    tier = target_host_cache(LLMServer.TRTLLM_SERVE, GH200, nodes, 1, asked, weights_overflow_mib=100 * 1024)
    assert tier.arguments == ("--host-cache-bytes", str(150 * GiB))
    assert tier.resources["requests"]["memory"] == str(222 * GiB)
    assert tier.resources["limits"]["memory"] == str(222 * GiB)


def test_a_users_memory_limit_below_the_plan_wins_and_the_host_tier_shrinks_under_it() -> None:
    nodes = [gh200("gh-0", 472 * GiB)]
    asked = {"requests": {"memory": "72Gi"}, "limits": {"memory": "122Gi"}}
    tier = target_host_cache(LLMServer.TRTLLM_SERVE, GH200, nodes, 1, asked)
    assert tier.arguments == ("--host-cache-bytes", str(50 * GiB))
    assert tier.resources == {"requests": {"memory": str(122 * GiB)}, "limits": {"memory": "122Gi"}}
    assert "limits.memory" in tier.reason
    tight = {"requests": {"memory": "72Gi"}, "limits": {"memory": "72.5Gi"}}
    none = target_host_cache(LLMServer.TRTLLM_SERVE, GH200, nodes, 1, tight)
    assert none.arguments == () and none.resources == tight and "limits.memory" in none.reason
    roomy = {"limits": {"memory": "1Ti"}}  # above the plan: the plan stands, the limit stays the user's
    big = target_host_cache(LLMServer.TRTLLM_SERVE, GH200, nodes, 1, roomy)
    assert big.arguments and big.resources["limits"] == {"memory": "1Ti"}


def test_a_pod_of_several_gpus_gets_one_pool_per_rank() -> None:
    nodes = [NodeView.from_k8s(gpu_node("gh-4", GH200.gpu, 4, allocatable={"memory": 1800 * GiB}))]
    tier = target_host_cache(LLMServer.TRTLLM_SERVE, GH200, nodes, 4, None)
    base = 4 * DEFAULT_POD_BASE_BYTES_PER_GPU
    per_rank = (1800 * GiB - base) // 2 // 4
    assert tier.arguments == ("--host-cache-bytes", str(per_rank))
    assert tier.resources["requests"]["memory"] == str(base + 4 * per_rank)


@pytest.mark.parametrize(
    ("server", "target", "nodes", "why"),
    [
        (LLMServer.LLAMA_CPP, GH200, [gh200("gh-0", 472 * GiB)], "llama.cpp has no"),
        (
            LLMServer.TRTLLM_SERVE,
            H100,
            [NodeView.from_k8s(gpu_node("h-0", H100.gpu, 8, allocatable={"memory": 2000 * GiB}))],
            "not Grace Hopper",
        ),
        (LLMServer.TRTLLM_SERVE, GH200, [gh200("gh-0", 472 * GiB), gh200("gh-1", None)], "gh-1 reports no"),
        (LLMServer.TRTLLM_SERVE, GH200, [gh200("gh-0", 472 * GiB, ready=False)], "no Ready node"),
        (LLMServer.TRTLLM_SERVE, GH200, [gh200("gh-0", 9 * GiB)], "too little memory"),
    ],
)
def test_anything_else_keeps_the_pod_as_it_was(
    server: LLMServer, target: GPUTarget, nodes: list[NodeView], why: str
) -> None:
    asked = {"requests": {"cpu": "2"}, "limits": {}}
    tier = target_host_cache(server, target, nodes, 1, asked)
    assert tier.arguments == () and tier.resources == {"requests": {"cpu": "2"}}
    assert why in tier.reason


def test_the_observed_node_carries_its_allocatable_memory() -> None:
    assert gh200("gh-0", 472 * GiB).allocatable_memory_bytes == 472 * GiB
    assert gh200("gh-0", None).allocatable_memory_bytes is None
    bad = gpu_node("gh-0", GH200.gpu, 1)
    bad["status"]["allocatable"]["memory"] = "lots"
    assert NodeView.from_k8s(bad).allocatable_memory_bytes is None
    assert NodeMemoryView.of(gh200("gh-0", GiB)) == NodeMemoryView("gh-0", GH200.gpu, GiB)
