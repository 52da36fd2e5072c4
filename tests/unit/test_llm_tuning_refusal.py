"""What the LLM supervisor refuses a tuning record for, and with which termination reason
(trtforge_runtime.llm.artefacts)."""

from __future__ import annotations

import pytest
from trtforge_runtime.llm.artefacts import tuning_refusal

from trtforge.contract.gpu_probe import NoGPUProbe
from trtforge.contract.llm import Backend, TuningRecord

CKPT = "a" * 64


def _record(**kw: object) -> TuningRecord:
    base: dict[str, object] = {
        "backend": Backend.LLAMA_CPP,
        "backend_version": "b1-abc1234",
        "gpu_product": "cpu",
        "checkpoint_key": CKPT,
    }
    return TuningRecord.model_validate({**base, **kw})


def test_a_record_for_this_pod_applies() -> None:
    assert tuning_refusal(_record(), CKPT, NoGPUProbe(), "b1-abc1234", Backend.LLAMA_CPP) is None


@pytest.mark.parametrize(
    ("change", "reason", "says"),
    [
        (
            {"gpu_product": "NVIDIA-H100-80GB-HBM3"},
            "GPUMismatch",
            "made on NVIDIA-H100-80GB-HBM3; this pod's GPU is cpu",
        ),
        ({"mig_profile": "1g.10gb"}, "GPUMismatch", "MIG profile 1g.10gb"),
        (
            {"backend_version": "b2-def5678"},
            "EngineLoadFailed",
            "llama.cpp b2-def5678; this pod runs b1-abc1234",
        ),
        ({"backend": Backend.TENSORRT_LLM}, "EngineLoadFailed", "made with tensorrt-llm"),
        ({"checkpoint_key": "f" * 64}, "EngineLoadFailed", f"measured with checkpoint {'f' * 64}"),
    ],
)
def test_a_record_for_something_else_is_refused_with_its_reason(
    change: dict[str, object], reason: str, says: str
) -> None:
    refusal = tuning_refusal(_record(**change), CKPT, NoGPUProbe(), "b1-abc1234", Backend.LLAMA_CPP)
    assert refusal is not None
    assert refusal.reason == reason and says in refusal.message, refusal.message
