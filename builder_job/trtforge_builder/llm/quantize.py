"""The quantize step (``trtforge quantize``): one checkpoint per (source digest, recipe, calibration),
gated on accuracy, with the canary's golden tokens, published as a multi-file artefact.

On the ``llama.cpp`` backend (the test bed): ``llama-quantize --allow-requantize`` from the source
GGUF to the recipe's test-bed type, then the accuracy gate (``llama-perplexity`` of source and result
on the evaluation text shipped in this package; published only within ``maxPerplexityIncrease``),
then the canary's greedy tokens from ``llama-server``. On ``tensorrt-llm``: ModelOpt PTQ and
``export_hf_checkpoint`` (:mod:`trtforge_builder.llm.modelopt`; not run here).
"""

from __future__ import annotations

import hashlib
import importlib.resources
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from trtforge.contract.llm.artefact import (
    ArtefactFormat,
    ArtefactKind,
    ArtefactManifest,
    CheckpointInfo,
    GoldenTokens,
    PerplexityGate,
    SourceRef,
    checkpoint_key,
    manifest_path,
)
from trtforge.contract.llm.recipe import Backend, Calibration, Recipe
from trtforge.contract.llm.result import PerplexityFigures, QuantizeResult
from trtforge.cpus import CGROUP_ROOT, available_cpus
from trtforge.store import EngineStore, join_uri
from trtforge_builder.errors import BuildError
from trtforge_builder.fetch import fetch_model
from trtforge_builder.llm.llamacpp import LlamaCppError, LlamaCppTools, gguf_type_for
from trtforge_builder.llm.store_steps import look_up, open_artefact_store, publish_folder
from trtforge_builder.llm.weights import WeightsError, checkpoint_weights

EVALUATION_TEXT = "evaluation.txt"
PERPLEXITY_CONTEXT = 128
DEFAULT_CANARY_PROMPT = "The capital of France is"
DEFAULT_CANARY_TOKENS = 16
MODEL_FILE = "model.gguf"


@dataclass(frozen=True)
class QuantizeRequest:
    source_uri: str
    store_uri: str
    recipe: Recipe
    calibration: Calibration = field(default_factory=Calibration)
    backend: Backend = Backend.LLAMA_CPP
    source_sha256: str | None = None
    gguf_type: str | None = None
    max_perplexity_increase: float = 0.01
    canary_prompt: str = DEFAULT_CANARY_PROMPT
    canary_tokens: int = DEFAULT_CANARY_TOKENS
    perplexity_chunks: int = 0  # the gate's evaluation length in chunks; 0: the whole text
    threads: int = 0  # 0: the CPUs this Job may use (affinity capped by its CPU limit)
    llama_bin_dir: Path | None = None


class AccuracyGateFailed(BuildError):
    """The quantized model's perplexity rose past the bound; nothing was published."""

    def __init__(self, gate: PerplexityGate) -> None:
        super().__init__(
            f"accuracy gate: {gate.describe()}; nothing was published",
            "ValidationFailed",
            step="accuracy-gate",
        )
        self.gate = gate


def figures(gate: PerplexityGate) -> PerplexityFigures:
    return PerplexityFigures(
        source=gate.source,
        result=gate.result,
        increase=round(gate.increase, 6),
        max_increase=gate.max_increase,
    )


def evaluation_text(workdir: Path) -> tuple[Path, str]:
    """The shipped evaluation text as a file, and its sha256."""
    data = importlib.resources.files("trtforge_builder.llm").joinpath("data", EVALUATION_TEXT).read_bytes()
    path = workdir / EVALUATION_TEXT
    path.write_bytes(data)
    return path, hashlib.sha256(data).hexdigest()


def quantize_threads(requested: int = 0, cgroup_root: Path = CGROUP_ROOT) -> int:
    """Threads for llama-quantize, llama-perplexity and the canary: `requested` (``--threads``),
    else the CPUs this Job may use, its affinity capped by its CPU limit (not the node's cores)."""
    return requested or available_cpus(cgroup_root)


def run_quantize(req: QuantizeRequest) -> QuantizeResult:
    start = time.monotonic()
    if req.gguf_type is not None and req.backend is not Backend.LLAMA_CPP:
        raise BuildError("--gguf-type applies to the llama.cpp backend only", "InvalidArgument")
    if req.backend is not Backend.LLAMA_CPP:
        raise BuildError(
            "the tensorrt-llm quantize backend needs a GPU image with ModelOpt "
            "(trtforge_builder.llm.modelopt); this builder runs llama.cpp only",
            "BackendUnavailable",
            step="quantize",
        )
    store = open_artefact_store(req.store_uri)
    tools = LlamaCppTools(req.llama_bin_dir)
    with tempfile.TemporaryDirectory(prefix="trtforge-quantize-") as tmp:
        work = Path(tmp)
        src = fetch_model(req.source_uri, work, req.source_sha256)
        key = checkpoint_key(src.sha256, req.recipe, req.calibration, req.backend, req.gguf_type)
        existing = look_up(store, ArtefactKind.CHECKPOINT, key)
        if existing is not None:
            return _result(store, existing, cache_hit=True, start=start)
        gguf_type = gguf_type_for(req.recipe, req.gguf_type)
        out = work / "checkpoint"
        out.mkdir()
        threads = quantize_threads(req.threads)
        try:
            version = tools.version()
            tools.quantize(src.path, out / MODEL_FILE, gguf_type, threads)
            text, text_sha = evaluation_text(work)
            gate = PerplexityGate(
                evaluation_text=EVALUATION_TEXT,
                evaluation_sha256=text_sha,
                context=PERPLEXITY_CONTEXT,
                chunks=req.perplexity_chunks or None,
                source=tools.perplexity(src.path, text, PERPLEXITY_CONTEXT, threads, req.perplexity_chunks),
                result=tools.perplexity(
                    out / MODEL_FILE, text, PERPLEXITY_CONTEXT, threads, req.perplexity_chunks
                ),
                max_increase=req.max_perplexity_increase,
            )
            if not gate.passed:
                raise AccuracyGateFailed(gate)
            golden = tools.golden(out / MODEL_FILE, req.canary_prompt, req.canary_tokens, threads)
        except LlamaCppError as e:
            raise BuildError(str(e), "BuildFailed", step="quantize") from e
        try:
            weights = checkpoint_weights(out, MODEL_FILE)
        except WeightsError as e:
            raise BuildError(str(e), "BuildFailed", step="count-weights") from e
        info = CheckpointInfo(
            source=SourceRef(uri=req.source_uri, digest=src.sha256),
            recipe=req.recipe,
            calibration=req.calibration,
            quantized_type=gguf_type,
            model_file=MODEL_FILE,
            parameters=weights.parameters,
            weight_bytes=weights.bytes,
            accuracy=gate,
            golden=golden,
        )

        manifest, committed = publish_folder(
            store,
            ArtefactKind.CHECKPOINT,
            key,
            out,
            ArtefactFormat.GGUF,
            req.backend,
            version,
            checkpoint=info,
        )
        shutil.rmtree(out, ignore_errors=True)
    return _result(store, manifest, cache_hit=not committed, start=start)


def _result(store: EngineStore, m: ArtefactManifest, *, cache_hit: bool, start: float) -> QuantizeResult:
    info = m.checkpoint
    assert info is not None  # a checkpoint manifest always has it (ArtefactManifest checks)
    golden: GoldenTokens | None = info.golden
    return QuantizeResult(
        checkpoint_key=m.key,
        manifest_uri=join_uri(store.uri, manifest_path(ArtefactKind.CHECKPOINT, m.key)),
        backend=m.backend,
        backend_version=m.backend_version,
        recipe=info.recipe,
        quantized_type=info.quantized_type,
        size_bytes=m.total_bytes,
        cache_hit=cache_hit,
        perplexity=figures(info.accuracy) if info.accuracy else None,
        golden=golden,
        seconds=round(time.monotonic() - start, 3),
    )
