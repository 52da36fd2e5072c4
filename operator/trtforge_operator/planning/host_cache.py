"""The KV cache's host tier for one LLM pod on a Grace Hopper node, pure (docs/llm.md §"GH200"):
the size each rank's server gets (`serve-llm --host-cache-bytes`) and the memory the pod then asks
for. The rule is the contract's (:mod:`trtforge.contract.llm.host_cache`); this module reads it off
the Node and the pod's shape.
"""

from __future__ import annotations

from dataclasses import dataclass

from trtforge.contract.llm.host_cache import NodeMemoryBudget, host_cache_bytes, pod_memory_bytes
from trtforge.contract.llm.unified_memory import is_grace_hopper
from trtforge_operator.observe.node_memory import NodeMemoryView

MIB = 1 << 20


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
