"""The KV cache's host tier for one LLM pod on a Grace Hopper node, pure (docs/llm.md §"GH200"):
the size each rank's server gets (`serve-llm --host-cache-bytes`) and the memory the pod then asks
for. The rule is the contract's (:mod:`trtforge.contract.llm.host_cache`); this module reads it off
the Node and the pod's shape.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trtforge.contract.gpu import GPUTarget
from trtforge.contract.llm.host_cache import (
    GIB,
    MIN_HOST_CACHE_BYTES,
    NodeMemoryBudget,
    host_cache_bytes,
    pod_memory_bytes,
)
from trtforge.contract.llm.unified_memory import is_grace_hopper
from trtforge.contract.quantity import quantity_to_bytes
from trtforge_operator.api import LLMServer
from trtforge_operator.observe.node_memory import NodeMemoryView
from trtforge_operator.observe.views import NodeView

MIB = 1 << 20
# A trtllm-serve pod's own memory per GPU besides the host tier, where spec.runtime.resources asks
# for none: the supervisor, and per rank a Python process with PyTorch, the CUDA context, NCCL's
# and MPI's buffers and the checkpoint's staging while it loads (a few GiB each, with room to spare).
DEFAULT_POD_BASE_BYTES_PER_GPU = 8 * GIB


@dataclass(frozen=True)
class HostCachePlan:
    per_rank_bytes: int  # kv_cache_config.host_cache_size of each rank; 0: no host tier
    pod_memory_bytes: int  # the pod's memory request (and limit) covering every rank's host tier
    reason: str  # one line: why this size, or why none

    def arguments(self) -> list[str]:
        """The `trtforge serve-llm` flag that carries it (none when there is no host tier)."""
        return ["--host-cache-bytes", str(self.per_rank_bytes)] if self.per_rank_bytes else []


def plan_host_cache(
    node: NodeMemoryView,
    gpus_per_pod: int,
    pod_base_bytes: int,
    other_pods_bytes: int,
    weights_overflow_mib: int | None = None,
) -> HostCachePlan:
    """The host tier of a pod with `gpus_per_pod` GPUs (one server rank each) on `node`:
    `pod_base_bytes` is its need without one, `other_pods_bytes` the memory requests of the node's
    other pods, `weights_overflow_mib` each GPU's weights in Grace memory (the TRTEngine target's
    ``weightsOverflowMiB``). Only a Grace Hopper node with a known allocatable memory gets one."""
    if not is_grace_hopper(node.product):
        return HostCachePlan(
            0, pod_base_bytes, f"node {node.name} is not Grace Hopper ({node.product or 'no GPU label'})"
        )
    if node.allocatable_bytes is None:
        return HostCachePlan(0, pod_base_bytes, f"node {node.name} reports no allocatable memory")
    budget = NodeMemoryBudget(
        node_allocatable_bytes=node.allocatable_bytes,
        other_pods_bytes=other_pods_bytes,
        pod_base_bytes=pod_base_bytes,
        weights_overflow_bytes=(weights_overflow_mib or 0) * MIB * gpus_per_pod,
        ranks_on_node=gpus_per_pod,
    )
    per_rank = host_cache_bytes(budget)
    if not per_rank:
        return HostCachePlan(
            0, pod_base_bytes, f"node {node.name} has too little memory left for a host tier"
        )
    return HostCachePlan(
        per_rank,
        pod_memory_bytes(budget, per_rank),
        f"{per_rank // MIB} MiB per rank x {gpus_per_pod} from node {node.name}'s "
        f"{node.allocatable_bytes // MIB} MiB allocatable",
    )


@dataclass(frozen=True)
class TargetHostCache:
    """What one LLM target's pods get: the `serve-llm` flags and the container's resources."""

    arguments: tuple[str, ...]
    resources: dict[str, dict[str, Any]]  # the container's requests and limits, memory set
    reason: str  # one line: why this size, or why none


def _memory(resources: Mapping[str, Mapping[str, Any]], part: str) -> int | None:
    raw = (resources.get(part) or {}).get("memory")
    return quantity_to_bytes(raw) if raw is not None else None


def target_host_cache(
    server: LLMServer,
    target: GPUTarget,
    nodes: Sequence[NodeView],
    gpus_per_pod: int,
    resources: Mapping[str, Mapping[str, Any]] | None,
    weights_overflow_mib: int | None = None,
) -> TargetHostCache:
    """The host tier of `target`'s pods (a Deployment's, or a group's rank pods), read off the Ready
    `nodes` that host it (docs/llm.md §"GH200: Grace memory").

    A pod may land on any of those nodes, so the plan is the node with the least allocatable memory's
    and the pod's memory request is what keeps it off a node without room. The node's other pods
    count 0: which pods share the node is known only after the pod is placed, and the scheduler
    already admits a pod only where allocatable less the others' requests covers its request.
    `resources` (spec.runtime.resources) give the pod's own need (the memory request; default
    :data:`DEFAULT_POD_BASE_BYTES_PER_GPU` per GPU); a memory limit of the user's below the plan wins:
    the host tier shrinks to fit under it (none under the minimum), and the limit stays the user's.
    Only trtllm-serve has a host tier; anything else keeps `resources` as they are."""
    given = {k: dict(v) for k, v in (resources or {}).items() if v}
    if server is not LLMServer.TRTLLM_SERVE:
        return TargetHostCache((), given, f"{server.value} has no KV-cache host tier")
    hosts = sorted(
        (NodeMemoryView.of(n) for n in nodes if n.ready and n.hosts(target)),
        key=lambda m: (m.allocatable_bytes is not None, m.allocatable_bytes or 0, m.name),
    )
    if not hosts:
        return TargetHostCache((), given, f"no Ready node hosts target {target.name}")
    requested, limit = _memory(given, "requests"), _memory(given, "limits")
    base = requested if requested is not None else DEFAULT_POD_BASE_BYTES_PER_GPU * gpus_per_pod
    plan = plan_host_cache(hosts[0], gpus_per_pod, base, 0, weights_overflow_mib)
    per_rank, reason = plan.per_rank_bytes, plan.reason
    if per_rank and limit is not None and plan.pod_memory_bytes > limit:
        per_rank = max(0, limit - base) // gpus_per_pod
        per_rank -= per_rank % MIB
        per_rank = per_rank if per_rank >= MIN_HOST_CACHE_BYTES else 0
        reason = (
            f"{reason}; capped to {per_rank // MIB} MiB per rank by spec.runtime.resources.limits.memory"
            if per_rank
            else f"{reason}; none: spec.runtime.resources.limits.memory leaves under "
            f"{MIN_HOST_CACHE_BYTES // MIB} MiB per rank"
        )
    if not per_rank:
        return TargetHostCache((), given, reason)
    memory = str(base + per_rank * gpus_per_pod)
    out = {**given, "requests": {**given.get("requests", {}), "memory": memory}}
    if limit is None:  # a limit of the user's stays as written
        out["limits"] = {**given.get("limits", {}), "memory": memory}
    return TargetHostCache(("--host-cache-bytes", str(per_rank)), out, reason)
