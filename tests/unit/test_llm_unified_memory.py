"""Weights past HBM on Grace Hopper (contract.llm.unified_memory, planning/llm_policies.py): refused
with a condition that names the target and the opt-in, admitted with the opt-in on GH200 only, and
the overflow recorded per GPU."""

from __future__ import annotations

import math

import pytest
from trtforge_operator.planning import llm_policies as p

from trtforge.contract.gpu import GPUTarget, known_identity
from trtforge.contract.llm import Backend, Parallelism, Recipe, Refusal, RefusalReason
from trtforge.contract.llm.recipe import checkpoint_need_mib, weights_need_mib, weights_refusal
from trtforge.contract.llm.unified_memory import OPT_IN_FIELD, is_grace_hopper, weights_fit

GH200 = GPUTarget(gpu="NVIDIA-GH200-480GB")
H100 = GPUTarget(gpu="NVIDIA-H100-80GB-HBM3")
GiB = 1 << 30


@pytest.mark.parametrize(
    ("product", "grace"),
    [
        ("NVIDIA-GH200-480GB", True),
        ("NVIDIA-GH200-144G-HBM3e", True),
        ("NVIDIA-GH200-480GB-MIG-1g.12gb", True),
        ("NVIDIA-H100-80GB-HBM3", False),
        ("NVIDIA-H200", False),
        ("NVIDIA-GB200", False),  # Grace Blackwell: not a GH200 (not covered here)
        ("cpu", False),
    ],
)
def test_grace_hopper_is_named_by_the_product_label(product: str, grace: bool) -> None:
    assert is_grace_hopper(product) is grace


def facts(
    target: GPUTarget, parameters: int, allow: bool, par: Parallelism | None = None
) -> p.LLMTargetFacts:
    return p.LLMTargetFacts(
        target=target,
        recipe=Recipe.BF16,
        parallelism=par or Parallelism(),
        backend=Backend.TENSORRT_LLM,
        parameters=parameters,
        identity=known_identity(target),
        allow_unified_memory_overflow=allow,
    )


def test_70b_bf16_on_one_gh200_is_refused_naming_the_target_and_the_opt_in() -> None:
    r = p.refuse_weights(facts(GH200, 70 * 10**9, allow=False))
    assert r is not None and r.reason is RefusalReason.WEIGHTS_DO_NOT_FIT
    assert r.message.startswith(f"target {GH200}:") and f"{OPT_IN_FIELD}: true" in r.message


def test_with_the_opt_in_gh200_admits_it_and_records_each_gpus_overflow() -> None:
    f = facts(GH200, 70 * 10**9, allow=True)
    assert p.refuse_weights(f) is None
    fit = p.estimated_fit(f)
    memory = known_identity(GH200).memory_mib
    need = weights_need_mib(70 * 10**9, Recipe.BF16, Parallelism())
    assert fit.overflows and fit.overflow_mib == math.ceil(need - memory)
    # 140B: over two GH200s each share still spills, by less than on one; over four it fits HBM and
    # nothing is recorded.
    one, two, four = (
        p.estimated_fit(facts(GH200, 140 * 10**9, allow=True, par=Parallelism(tensor=n))) for n in (1, 2, 4)
    )
    assert 0 < two.overflow_mib < one.overflow_mib
    assert four.refusal is None and not four.overflows and four.overflow_mib == 0


def test_the_opt_in_does_not_help_a_gpu_without_grace_memory() -> None:
    r = p.refuse_weights(facts(H100, 70 * 10**9, allow=True))
    assert r is not None and r.reason is RefusalReason.WEIGHTS_DO_NOT_FIT
    assert "Grace Hopper (GH200) targets only" in r.message and H100.gpu in r.message
    plain = p.refuse_weights(facts(H100, 70 * 10**9, allow=False))
    assert plain is not None and OPT_IN_FIELD not in plain.message


def test_only_a_weights_refusal_can_be_admitted() -> None:
    unknown = weights_refusal(10, Recipe.BF16, Parallelism(), 0)
    assert unknown is not None and unknown.reason is RefusalReason.MEMORY_UNKNOWN
    assert weights_fit(unknown, 10.0, 0, GH200.gpu, True).refusal == unknown
    assert weights_fit(None, 1.0, 97871, GH200.gpu, True).refusal is None
    other = Refusal(reason=RefusalReason.COMPUTE_CAPABILITY, message="x")
    assert weights_fit(other, 1e9, 1, GH200.gpu, True).refusal == other


def test_the_published_checkpoint_decides_with_the_same_rule() -> None:
    identity = known_identity(GH200)
    weights = 140 * GiB
    refused = p.checkpoint_fit(GH200, identity, Parallelism(), weights)
    assert refused.refusal is not None and OPT_IN_FIELD in refused.refusal.message
    admitted = p.checkpoint_fit(GH200, identity, Parallelism(), weights, allow_unified_memory_overflow=True)
    need = checkpoint_need_mib(weights, Parallelism())
    assert admitted.refusal is None and admitted.overflow_mib == math.ceil(need - identity.memory_mib)
    assert p.checkpoint_fit(GH200, identity, Parallelism(tensor=2), weights).refusal is None
