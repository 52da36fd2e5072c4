"""The KV cache's host tier on Grace Hopper (contract.llm.host_cache, planning/host_cache.py): sized
from the node's allocatable memory less the node's other pods, this pod's own need and any weights
in Grace memory, at the stated fraction, split over the ranks; none elsewhere."""

from __future__ import annotations

import pytest
from trtforge_operator.observe.node_memory import NodeMemoryView
from trtforge_operator.planning.host_cache import plan_host_cache

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
