"""Serving an LLM engine: what one target's pods run, or the typed reason they run nothing yet.

The TRTEngine's status names the quantized checkpoint (one per source digest and recipe) and each
target's tuning record; the InferenceDeployment's ``spec.llm`` names the server, its arguments and the
OpenAI port. The canary is the engine's: its golden tokens are recorded by the quantize Job for the
engine's prompt, so a deployment that pins another prompt holds its rollout rather than serve
ungated. No I/O (docs/llm.md §"Serving").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from trtforge.contract.gpu import GPUTarget
from trtforge_operator.api import LLMServer, LLMServing, TRTEngine
from trtforge_operator.apply.llm_children import LLMRuntime, default_server


class LLMProblem(StrEnum):
    """Why an LLM target gets no runtime Deployment (or keeps the one it has)."""

    NOT_AN_LLM_ENGINE = "NotAnLLMEngine"  # spec.llm on a deployment of an ONNX engine
    NO_CHECKPOINT = "CheckpointNotPublished"  # the quantize Job has not published one yet
    CANARY_PROMPT_MISMATCH = "CanaryPromptMismatch"
    SERVER_NEEDS_GPU = "ServerNeedsGPU"  # trtllm-serve on a cpu target


@dataclass(frozen=True)
class LLMEngineFacts:
    """What the TRTEngine says about its LLM: its checkpoint, each target's tuning record, its canary."""

    checkpoint_key: str | None
    canary_prompt: str | None
    tuning_keys: Mapping[str, str] = field(default_factory=dict)  # target name -> tuning key


def llm_engine_facts(engine: TRTEngine) -> LLMEngineFacts | None:
    """The LLM facts of a TRTEngine, or None for an ONNX engine (no ``spec.llm``). The checkpoint
    counts once its quantize Job published it (``status.checkpoint.phase`` Ready)."""
    llm = engine.spec.llm
    if llm is None:
        return None
    published = engine.status.checkpoint
    ready = published is not None and published.phase == "Ready"
    checkpoint = published.checkpoint_key if published is not None and ready else None
    tuning = {t.name: t.tuning_key for t in engine.status.targets if t.tuning_key}
    return LLMEngineFacts(checkpoint, llm.canary.prompt, tuning)


def llm_problem_message(problem: LLMProblem, target: GPUTarget, engine: str) -> str:
    """One line for a target's status."""
    return {
        LLMProblem.NOT_AN_LLM_ENGINE: f"spec.llm is set but TRTEngine {engine} is not an LLM engine "
        "(it has no spec.llm); remove spec.llm to serve it over the inference protocol",
        LLMProblem.NO_CHECKPOINT: f"waiting for TRTEngine {engine} to publish its quantized checkpoint",
        LLMProblem.CANARY_PROMPT_MISMATCH: "spec.llm.canaryPrompt differs from the TRTEngine's canary "
        "prompt: golden tokens exist only for the engine's (set the TRTEngine's spec.llm.canary, or "
        "unset spec.llm.canaryPrompt)",
        LLMProblem.SERVER_NEEDS_GPU: f"trtllm-serve needs a GPU; target {target.name} is a CPU target "
        "(use server llama.cpp)",
    }[problem]


def llm_runtime(
    serving: LLMServing | None, facts: LLMEngineFacts | None, target: GPUTarget
) -> LLMRuntime | LLMProblem | None:
    """What ``target``'s pods run: None for an ONNX engine served over the inference protocol, an
    :class:`LLMRuntime` for an LLM engine ready to serve, else the :class:`LLMProblem`."""
    if facts is None:
        return None if serving is None else LLMProblem.NOT_AN_LLM_ENGINE
    serving = serving or LLMServing()
    server = serving.server or default_server(target)
    if server == LLMServer.TRTLLM_SERVE and target.is_cpu:
        return LLMProblem.SERVER_NEEDS_GPU
    if serving.canary_prompt is not None and serving.canary_prompt != facts.canary_prompt:
        return LLMProblem.CANARY_PROMPT_MISMATCH
    if not facts.checkpoint_key:
        return LLMProblem.NO_CHECKPOINT
    return LLMRuntime(
        server=server,
        checkpoint_key=facts.checkpoint_key,
        tuning_key=facts.tuning_keys.get(target.name),
        openai_port=serving.port,
        server_args=tuple(serving.args),
    )
