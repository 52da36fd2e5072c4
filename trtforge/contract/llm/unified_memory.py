"""Weights larger than a GPU's HBM on Grace Hopper (GH200): refused unless the user opts in to
unified-memory overflow, which lets each GPU's share spill into the Grace CPU's memory over
NVLink-C2C (docs/llm.md §"GH200"). Pure.

The HBM rule is :func:`~trtforge.contract.llm.recipe.weights_refusal` (or the published
checkpoint's :func:`~trtforge.contract.llm.recipe.checkpoint_fit_refusal`); this module decides what
its ``WeightsDoNotFit`` verdict becomes, and records how much spills when it is admitted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trtforge.contract.llm.recipe import Refusal, RefusalReason

# The word of a GFD `nvidia.com/gpu.product` value that names a Grace Hopper superchip:
# NVIDIA-GH200-480GB (the known-GPU table), NVIDIA-GH200-144G-HBM3e, and their MIG-single forms.
GRACE_HOPPER = "GH200"
OPT_IN_FIELD = "spec.llm.allowUnifiedMemoryOverflow"


def is_grace_hopper(product: str) -> bool:
    """Whether a GPU product label names a Grace Hopper superchip (CPU and GPU memory coherent)."""
    return GRACE_HOPPER in product.upper().split("-")


@dataclass(frozen=True)
class WeightsFit:
    """The verdict on one target's weights: refused, in HBM, or admitted with `overflow_mib` of each
    GPU's share in Grace memory (only with the opt-in, only on Grace Hopper)."""

    refusal: Refusal | None
    overflow_mib: int = 0

    @property
    def overflows(self) -> bool:
        return self.refusal is None and self.overflow_mib > 0


def weights_fit(
    hbm_refusal: Refusal | None, need_mib: float, memory_mib: int, product: str, allow_overflow: bool
) -> WeightsFit:
    """What the HBM rule's verdict becomes on `product` (`need_mib`: one GPU's need, reserve included;
    `memory_mib`: its HBM). Only ``WeightsDoNotFit`` can change: admitted with the opt-in on Grace
    Hopper; otherwise refused, the message saying whether the opt-in would help here."""
    if hbm_refusal is None or hbm_refusal.reason is not RefusalReason.WEIGHTS_DO_NOT_FIT:
        return WeightsFit(hbm_refusal)
    grace = is_grace_hopper(product)
    if grace and allow_overflow:
        return WeightsFit(None, max(1, math.ceil(need_mib - memory_mib)))
    if grace:
        hint = f"; {OPT_IN_FIELD}: true lets the rest spill into Grace memory on this GH200 target"
    elif allow_overflow:
        hint = f"; {OPT_IN_FIELD} applies to Grace Hopper (GH200) targets only, and {product} is not one"
    else:
        hint = ""
    return WeightsFit(Refusal(reason=hbm_refusal.reason, message=hbm_refusal.message + hint))
