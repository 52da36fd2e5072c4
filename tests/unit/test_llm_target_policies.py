"""The LLM target policies (planning/llm_policies.py): each by name refuses or passes, the first
refusal wins, and the GPU facts come from GFD labels before the known-GPU table."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from trtforge_operator.observe.views import NodeView
from trtforge_operator.planning import llm_policies as p

from trtforge.contract.gpu import GPUTarget, known_identity
from trtforge.contract.llm import Backend, Parallelism, Recipe, RefusalReason

H100 = GPUTarget(gpu="NVIDIA-H100-80GB-HBM3")
A100 = GPUTarget(gpu="NVIDIA-A100-SXM4-80GB")
B200 = GPUTarget(gpu="NVIDIA-B200")
CPU = GPUTarget(gpu="cpu")


def facts(target: GPUTarget = H100, recipe: Recipe = Recipe.BF16, **kw: Any) -> p.LLMTargetFacts:
    base = p.LLMTargetFacts(
        target=target,
        recipe=recipe,
        parallelism=Parallelism(),
        backend=Backend.TENSORRT_LLM,
        parameters=None,
        identity=known_identity(target) if "identity" not in kw else None,
    )
    return dataclasses.replace(base, **kw)


# (policy, facts, the reason it refuses with; None: it passes)
CASES: list[tuple[Any, p.LLMTargetFacts, RefusalReason | None]] = [
    (p.refuse_unknown_gpu, facts(identity=None), RefusalReason.COMPUTE_CAPABILITY),
    (p.refuse_unknown_gpu, facts(), None),
    (p.refuse_recipe, facts(H100, Recipe.NVFP4), RefusalReason.COMPUTE_CAPABILITY),
    (p.refuse_recipe, facts(A100, Recipe.FP8), RefusalReason.COMPUTE_CAPABILITY),
    (p.refuse_recipe, facts(A100, Recipe.W4A8_AWQ), RefusalReason.COMPUTE_CAPABILITY),
    (p.refuse_recipe, facts(A100, Recipe.INT4_AWQ), None),
    (p.refuse_recipe, facts(H100, Recipe.FP8), None),
    (p.refuse_recipe, facts(B200, Recipe.NVFP4), None),
    (p.refuse_recipe, facts(CPU, Recipe.BF16), RefusalReason.CPU_TARGET),
    (p.refuse_recipe, facts(CPU, Recipe.NVFP4, backend=Backend.LLAMA_CPP), None),
    (p.refuse_weights, facts(parameters=70 * 10**9), RefusalReason.WEIGHTS_DO_NOT_FIT),
    (p.refuse_weights, facts(parameters=70 * 10**9, parallelism=Parallelism(tensor=4)), None),
    (p.refuse_weights, facts(parameters=70 * 10**9, recipe=Recipe.FP8), None),
    (p.refuse_weights, facts(), None),  # no parameter count: nothing to check yet
    (p.refuse_weights, facts(CPU, parameters=70 * 10**9, backend=Backend.LLAMA_CPP), None),
    (
        p.refuse_weights,
        facts(GPUTarget(gpu="NVIDIA-A100-SXM4-80GB", mig="1g.10gb"), parameters=8 * 10**9),
        RefusalReason.MEMORY_UNKNOWN,  # the guide's rows hold no memory figure for A100 slices
    ),
]


@pytest.mark.parametrize(("policy", "f", "reason"), CASES)
def test_each_policy_refuses_or_passes(
    policy: Any, f: p.LLMTargetFacts, reason: RefusalReason | None
) -> None:
    refusal = policy(f)
    assert (refusal.reason if refusal else None) == reason
    if refusal is not None:
        assert str(f.target) in refusal.message  # the condition names the target


def test_the_recipe_comes_before_the_fit() -> None:
    r = p.llm_target_refusal(facts(H100, Recipe.NVFP4, parameters=400 * 10**9))
    assert r is not None and r.reason is RefusalReason.COMPUTE_CAPABILITY
    assert "10.0 (Blackwell)" in r.message and "9.0" in r.message


def test_a_target_that_fits_is_not_refused() -> None:
    assert p.llm_target_refusal(facts(parameters=8 * 10**9)) is None


def _node(labels: dict[str, str]) -> NodeView:
    return NodeView(name="gpu-0", labels=labels, capacity={"nvidia.com/gpu": 1}, allocatable={})


def test_identity_from_gfd_labels_first() -> None:
    node = _node(
        {
            "nvidia.com/gpu.product": "Custom-GPU",
            "nvidia.com/gpu.compute.major": "8",
            "nvidia.com/gpu.compute.minor": "6",
            "nvidia.com/gpu.memory": "24576",
        }
    )
    ident = p.target_identity(GPUTarget(gpu="Custom-GPU"), [node])
    assert ident is not None and (ident.compute_capability, ident.memory_mib) == ("8.6", 24576)
    f = facts(GPUTarget(gpu="Custom-GPU"), Recipe.FP8, identity=ident)
    refusal = p.llm_target_refusal(f)
    assert refusal is not None and "8.6" in refusal.message


def test_identity_falls_back_to_the_known_table_and_else_none() -> None:
    ident = p.target_identity(A100, [])
    assert ident is not None and ident.compute_capability == "8.0"
    assert p.target_identity(GPUTarget(gpu="Custom-GPU"), []) is None
