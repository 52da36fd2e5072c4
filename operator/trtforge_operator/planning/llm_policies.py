"""Whether an LLM engine's target may be forged at all: named policies decided before any Job
(docs/llm.md §"Recipes by GPU"). Pure.

The facts of a target are its recipe, mapping, the parameter count (``spec.llm.parameters``) and the
GPU it names: compute capability and memory from the GFD labels of a Node that hosts it, else the
known-GPU table (display facts, enough to refuse with). Each policy returns a
:class:`~trtforge.contract.llm.Refusal` or passes (None); the first refusal wins.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from trtforge.contract.gpu import (
    FULL_GPU,
    KNOWN_GPUS,
    LABEL_MEMORY,
    GPUIdentity,
    GPUTarget,
    UnknownTargetError,
    known_identity,
)
from trtforge.contract.llm import Backend, Parallelism, Recipe, Refusal, RefusalReason
from trtforge.contract.llm.recipe import (
    checkpoint_fit_refusal,
    checkpoint_need_mib,
    recipe_refusal,
    weights_need_mib,
    weights_refusal,
)
from trtforge.contract.llm.unified_memory import WeightsFit, weights_fit
from trtforge_operator.observe.views import NodeView


@dataclass(frozen=True)
class LLMTargetFacts:
    """What the LLM target policies look at."""

    target: GPUTarget
    recipe: Recipe
    parallelism: Parallelism
    backend: Backend
    parameters: int | None  # spec.llm.parameters; None: unknown before the quantize step
    identity: GPUIdentity | None  # None: a GPU product neither a Node nor the known table describes
    allow_unified_memory_overflow: bool = False  # spec.llm.allowUnifiedMemoryOverflow


def target_identity(target: GPUTarget, nodes: Sequence[NodeView]) -> GPUIdentity | None:
    """The target's compute capability and memory: a hosting Node's GFD labels first (a whole GPU's
    memory label; a MIG slice's memory from the known table), else the known-GPU table."""
    try:
        known: GPUIdentity | None = known_identity(target)
    except UnknownTargetError:
        known = None
    if target.is_cpu:
        return known
    for n in sorted(nodes, key=lambda n: n.name):
        cc = n.compute_capability
        if n.product != target.gpu or cc is None:
            continue
        memory = known.memory_mib if known is not None else 0
        label = n.labels.get(LABEL_MEMORY, "")
        if target.mig is None and label.isdigit():
            memory = int(label)
        return GPUIdentity(
            product=target.gpu,
            compute_capability=cc,
            mig_profile=target.mig or FULL_GPU,
            sm_count=known.sm_count if known is not None else 0,
            arch=n.arch or "amd64",
            memory_mib=memory,
        )
    return known


def refuse_unknown_gpu(f: LLMTargetFacts) -> Refusal | None:
    """A GPU product with no compute capability to check the recipe against."""
    if f.identity is not None:
        return None
    known = ", ".join(sorted(KNOWN_GPUS))
    return Refusal(
        reason=RefusalReason.COMPUTE_CAPABILITY,
        message=(
            f"target {f.target}: no Node labels nvidia.com/gpu.compute.major/minor for {f.target.gpu} "
            f"and it is not a known GPU ({known}); the recipe {f.recipe} cannot be checked"
        ),
    )


def refuse_recipe(f: LLMTargetFacts) -> Refusal | None:
    """A recipe the target's GPU cannot run (FP8 needs Ada or later, NVFP4 Blackwell)."""
    assert f.identity is not None
    r = recipe_refusal(f.recipe, f.identity.compute_capability, f.backend)
    return None if r is None else Refusal(reason=r.reason, message=f"target {f.target}: {r.message}")


def estimated_fit(f: LLMTargetFacts) -> WeightsFit:
    """The weights' fit from the parameter count (none to check without one, or on a CPU target):
    in HBM, refused, or admitted past HBM on Grace Hopper with the opt-in (contract.llm.unified_memory)."""
    assert f.identity is not None
    if f.parameters is None or f.target.is_cpu:
        return WeightsFit(None)
    memory = f.identity.memory_mib
    r = weights_refusal(f.parameters, f.recipe, f.parallelism, memory)
    need = weights_need_mib(f.parameters, f.recipe, f.parallelism)
    fit = weights_fit(r, need, memory, f.target.gpu, f.allow_unified_memory_overflow)
    if fit.refusal is None:
        return fit
    return WeightsFit(Refusal(reason=fit.refusal.reason, message=f"target {f.target}: {fit.refusal.message}"))


def refuse_weights(f: LLMTargetFacts) -> Refusal | None:
    """Weights that do not fit the target's memory at this recipe and mapping (checked when the
    parameter count is given; a CPU target has no GPU memory to fit), unless admitted into Grace
    memory on a GH200 target that opted in."""
    return estimated_fit(f).refusal


LLMPolicy = Callable[[LLMTargetFacts], Refusal | None]
LLM_TARGET_POLICIES: tuple[LLMPolicy, ...] = (refuse_unknown_gpu, refuse_recipe, refuse_weights)
"""The order is the decision: no GPU facts, then the recipe, then the fit."""


def llm_target_refusal(f: LLMTargetFacts) -> Refusal | None:
    """The first refusal of :data:`LLM_TARGET_POLICIES`; None: the target may be forged."""
    for policy in LLM_TARGET_POLICIES:
        refusal = policy(f)
        if refusal is not None:
            return refusal
    return None


def checkpoint_fit(
    target: GPUTarget,
    identity: GPUIdentity | None,
    parallelism: Parallelism,
    weight_bytes: int,
    allow_unified_memory_overflow: bool = False,
) -> WeightsFit:
    """Once the checkpoint is published: its measured weights (the manifest's record) must fit the
    target's memory at its mapping, whether or not ``spec.llm.parameters`` was given, or be admitted
    into Grace memory (GH200 with the opt-in); checked before the target's tune Job and before it
    serves. A CPU target has no GPU memory to fit."""
    if target.is_cpu or identity is None:
        return WeightsFit(None)
    r = checkpoint_fit_refusal(weight_bytes, parallelism, identity.memory_mib)
    need = checkpoint_need_mib(weight_bytes, parallelism)
    fit = weights_fit(r, need, identity.memory_mib, target.gpu, allow_unified_memory_overflow)
    if fit.refusal is None:
        return fit
    return WeightsFit(Refusal(reason=fit.refusal.reason, message=f"target {target}: {fit.refusal.message}"))
