"""The keys an LLM engine's pass reads by (docs/llm.md): its checkpoint key, and the build ids of
its quantize Job (one per checkpoint key and cache scope) and of each target's tune Job. Derived
from the spec, the proven source digest and the operator's configuration alone. Pure.
"""

from __future__ import annotations

import hashlib

from trtforge.contract.gpu import GPUTarget
from trtforge.contract.llm import Backend, Parallelism, checkpoint_key
from trtforge.contract.possession import scoped_key
from trtforge_operator.api import TRTEngineSpec
from trtforge_operator.config import OperatorConfig

ID_LEN = 20  # a build id's length (children.build_id)


def llm_backend(cfg: OperatorConfig, target: GPUTarget) -> Backend:
    """TensorRT-LLM where builds use TensorRT; llama.cpp where they use ONNX Runtime (the test bed)."""
    return Backend.TENSORRT_LLM if cfg.backend_for(target.gpu) == "tensorrt" else Backend.LLAMA_CPP


def checkpoint_backend(cfg: OperatorConfig, targets: list[GPUTarget]) -> Backend:
    """One checkpoint serves every target: TensorRT-LLM's when any target builds with TensorRT."""
    backends = {llm_backend(cfg, t) for t in targets}
    return Backend.TENSORRT_LLM if Backend.TENSORRT_LLM in backends else Backend.LLAMA_CPP


def engine_checkpoint_key(spec: TRTEngineSpec, source_sha256: str, backend: Backend) -> str:
    """The key `trtforge quantize` publishes the checkpoint under (the contract's checkpoint_key)."""
    assert spec.llm is not None
    q = spec.llm.quantization()
    return checkpoint_key(source_sha256, q.recipe, q.calibration, backend, q.gguf_type)


def quantize_id(ckey: str, cache_scope: str) -> str:
    """One quantize Job per checkpoint key and cache scope, shared by targets and namespaces."""
    return scoped_key(ckey, cache_scope)[:ID_LEN]


def tune_id(qid: str, target: GPUTarget, parallelism: Parallelism, backend: Backend, image: str) -> str:
    """One tune Job per checkpoint, target, mapping, backend and builder image."""
    parts = (qid, target.gpu, target.mig or "", parallelism.mapping, backend.value, image)
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:ID_LEN]
