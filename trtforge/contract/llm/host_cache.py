"""The KV cache's host tier on Grace Hopper, sized from the node's memory (docs/llm.md §"GH200"). Pure.

TensorRT-LLM offloads KV-cache blocks that leave the GPU's pool into a host pool of
``kv_cache_config.host_cache_size`` bytes (the LLM API's ``KvCacheConfig``; ``trtllm-serve --config``
YAML; unset: no host tier), allocated by each rank's server process. On a GH200 that pool is the Grace
CPU's memory, reached over NVLink-C2C. Its size here: what the node can give after the system, the
node's other pods, this pod's own needs and any weights that spill into Grace memory, times
:data:`HOST_CACHE_FRACTION`, split over the ranks (server processes) on the node.
"""

from __future__ import annotations

from dataclasses import dataclass

MIB = 1 << 20
GIB = 1 << 30
# The share of the node's remaining memory the host tier takes. The rest stays for the page cache
# (checkpoint files are read through it while the ranks load), the kernel and pinned staging buffers:
# the host pool is pinned memory, which the kernel can neither reclaim nor swap.
HOST_CACHE_FRACTION = 0.5
# Below this a host tier holds too few blocks to be worth pinning: none is configured.
MIN_HOST_CACHE_BYTES = GIB


@dataclass(frozen=True)
class NodeMemoryBudget:
    """The inputs, in bytes (counts where named)."""

    node_allocatable_bytes: int  # the Node's status.allocatable.memory: capacity less the kubelet's
    # system and kube reservations and its eviction threshold (the "system need")
    other_pods_bytes: int  # memory requests of the other pods on the node (DaemonSets and the like)
    pod_base_bytes: int  # this pod's own need besides the host tier: supervisor, server, loading
    weights_overflow_bytes: int = 0  # weights spilled into Grace memory by this node's ranks
    ranks_on_node: int = 1  # server processes on the node (one per GPU), each with its own host pool


def host_cache_bytes(b: NodeMemoryBudget, fraction: float = HOST_CACHE_FRACTION) -> int:
    """Each rank's ``host_cache_size``, a whole number of MiB; 0 (no host tier) when less than
    :data:`MIN_HOST_CACHE_BYTES` is left. ValueError naming the input that is out of range."""
    for name in ("node_allocatable_bytes", "other_pods_bytes", "pod_base_bytes", "weights_overflow_bytes"):
        if getattr(b, name) < 0:
            raise ValueError(f"{name} {getattr(b, name)}: must not be negative")
    if b.ranks_on_node < 1:
        raise ValueError(f"ranks_on_node {b.ranks_on_node}: must be at least 1")
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction {fraction}: expected a fraction in (0, 1]")
    left = b.node_allocatable_bytes - b.other_pods_bytes - b.pod_base_bytes - b.weights_overflow_bytes
    per_rank = int(max(0, left) * fraction) // b.ranks_on_node
    per_rank -= per_rank % MIB
    return per_rank if per_rank >= MIN_HOST_CACHE_BYTES else 0


def pod_memory_bytes(b: NodeMemoryBudget, per_rank_host_cache: int) -> int:
    """The memory the pod asks for so that its host tiers (pinned, charged to its cgroup) fit inside
    its own request: its base need plus every rank's pool."""
    return b.pod_base_bytes + per_rank_host_cache * b.ranks_on_node
