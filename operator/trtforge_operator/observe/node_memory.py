"""A Node's memory as the host-cache planner reads it (planning/host_cache.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from trtforge.contract.gpu import LABEL_PRODUCT
from trtforge_operator.observe.views import NodeView, memory_bytes


@dataclass(frozen=True)
class NodeMemoryView:
    name: str
    product: str  # nvidia.com/gpu.product ("" where GFD has not labelled the node)
    allocatable_bytes: int | None  # status.allocatable.memory; None when absent or not a quantity

    @classmethod
    def from_k8s(cls, obj: Mapping[str, Any]) -> NodeMemoryView:
        meta, status = obj.get("metadata") or {}, obj.get("status") or {}
        return cls(
            name=meta.get("name", ""),
            product=(meta.get("labels") or {}).get(LABEL_PRODUCT, ""),
            allocatable_bytes=memory_bytes(status.get("allocatable")),
        )

    @classmethod
    def of(cls, node: NodeView) -> NodeMemoryView:
        """The same, from a pass's observed node (its product without a MIG suffix)."""
        return cls(
            name=node.name, product=node.product or "", allocatable_bytes=node.allocatable_memory_bytes
        )
