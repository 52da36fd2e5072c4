"""The tuning step (``trtforge tune``): per target, measure what can be measured there and publish it
as a tuning-cache artefact keyed by (GPU product or MIG profile, tp x pp mapping, backend version,
checkpoint).

On ``llama.cpp`` (the test bed): ``llama-bench`` over candidate thread counts and batch sizes; the
record holds the best settings, which the runtime applies. On TensorRT-LLM the same record would sit
beside the autotuner's cache file (``TLLM_AUTOTUNER_CACHE_PATH``; not run here).
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from trtforge.contract.gpu import FULL_GPU
from trtforge.contract.llm.artefact import (
    ArtefactFormat,
    ArtefactKind,
    ArtefactManifest,
    manifest_path,
    tuning_key,
)
from trtforge.contract.llm.recipe import Backend, Parallelism
from trtforge.contract.llm.result import TuneResult
from trtforge.contract.llm.tuning import TUNING_RECORD, TuningRecord
from trtforge.cpus import CGROUP_ROOT, available_cpus
from trtforge.store import (
    EngineStore,
    IntegrityError,
    ObjectNotFound,
    StoreError,
    artefacts,
    join_uri,
    open_store,
)
from trtforge_builder.errors import BuildError
from trtforge_builder.llm.llamacpp import LlamaCppError, LlamaCppTools, best_settings
from trtforge_builder.llm.store_steps import look_up, publish_folder

BENCH_PROMPT_TOKENS = 64
BENCH_GEN_TOKENS = 16
BENCH_BATCHES = (64, 256)


def thread_candidates(cpus: int) -> list[int]:
    """1, 2, 4, ... up to `cpus`, and that count itself."""
    out, n = [], 1
    while n < cpus:
        out.append(n)
        n *= 2
    out.append(max(1, cpus))
    return sorted(set(out))


def bench_threads(requested: int = 0, cgroup_root: Path = CGROUP_ROOT) -> list[int]:
    """The thread counts llama-bench tries: up to `requested` (``--threads``), else up to the CPUs
    this Job may use, its affinity capped by its CPU limit. The affinity alone is the whole node in
    most pods: a Job limited to 1 CPU on a 64-core node would bench 64 threads under a 1-CPU quota
    and record whichever count throttling happened to favour."""
    return thread_candidates(requested or available_cpus(cgroup_root))


@dataclass(frozen=True)
class TuneRequest:
    store_uri: str
    checkpoint_key: str
    gpu: str
    mig: str | None = None
    parallelism: Parallelism = field(default_factory=Parallelism)
    backend: Backend = Backend.LLAMA_CPP
    cpus: int = 0  # 0: the CPUs this Job may use (affinity capped by its CPU limit)
    repetitions: int = 2  # llama-bench runs of each setting
    llama_bin_dir: Path | None = None
    rebuild: bool = False  # measure again and replace the stored record (after a GPU fault)


def run_tune(req: TuneRequest) -> TuneResult:
    start = time.monotonic()
    if req.backend is not Backend.LLAMA_CPP:
        raise BuildError(
            "the tensorrt-llm tuning backend needs a GPU image with TensorRT-LLM; "
            "this builder runs llama.cpp only",
            "BackendUnavailable",
            step="tune",
        )
    tools = LlamaCppTools(req.llama_bin_dir)
    try:
        store = open_store(req.store_uri)
        version = tools.version()
    except StoreError as e:
        raise BuildError(str(e), "StoreUnavailable", step="open-store") from e
    except LlamaCppError as e:
        raise BuildError(str(e), "BackendUnavailable", step="tune") from e
    key = tuning_key(req.gpu, req.mig, req.parallelism, req.backend, version, req.checkpoint_key)
    existing = look_up(store, ArtefactKind.TUNING_CACHE, key)
    if existing is not None and not req.rebuild:
        return _result(store, existing, req, cache_hit=True, start=start)
    with tempfile.TemporaryDirectory(prefix="trtforge-tune-") as tmp:
        work = Path(tmp)
        try:
            ckpt = artefacts.fetch(store, ArtefactKind.CHECKPOINT, req.checkpoint_key, work / "checkpoint")
        except ObjectNotFound as e:
            raise BuildError(str(e), "InvalidArgument", step="fetch-checkpoint") from e
        except IntegrityError as e:
            raise BuildError(str(e), "StoreIntegrity", step="fetch-checkpoint") from e
        except StoreError as e:
            raise BuildError(str(e), "StoreUnavailable", step="fetch-checkpoint") from e
        if ckpt.checkpoint is None or ckpt.format is not ArtefactFormat.GGUF:
            raise BuildError(f"checkpoint {req.checkpoint_key} is not a GGUF checkpoint", "InvalidArgument")
        model = work / "checkpoint" / ckpt.checkpoint.model_file
        try:
            rows = tools.bench(
                model,
                bench_threads(req.cpus),
                list(BENCH_BATCHES),
                BENCH_PROMPT_TOKENS,
                BENCH_GEN_TOKENS,
                req.repetitions,
            )
        except LlamaCppError as e:
            raise BuildError(str(e), "BuildFailed", step="tune") from e

        settings, measured = best_settings(rows)
        record = TuningRecord(
            backend=req.backend,
            backend_version=version,
            gpu_product=req.gpu,
            mig_profile=req.mig or FULL_GPU,
            parallelism=req.parallelism,
            checkpoint_key=req.checkpoint_key,
            settings=settings,
            measurements=measured,
        )
        out = work / "tuning"
        out.mkdir()
        (out / TUNING_RECORD).write_text(record.model_dump_json(indent=2))

        manifest, committed = publish_folder(
            store,
            ArtefactKind.TUNING_CACHE,
            key,
            out,
            ArtefactFormat.TUNING_RECORD,
            req.backend,
            version,
            replace=req.rebuild,
            tuning=record,
        )
    return _result(store, manifest, req, cache_hit=not committed, start=start)


def _result(
    store: EngineStore, m: ArtefactManifest, req: TuneRequest, *, cache_hit: bool, start: float
) -> TuneResult:
    assert m.tuning is not None  # a tuning-cache manifest always has it (ArtefactManifest checks)
    return TuneResult(
        tuning_key=m.key,
        manifest_uri=join_uri(store.uri, manifest_path(ArtefactKind.TUNING_CACHE, m.key)),
        checkpoint_key=m.tuning.checkpoint_key,
        backend=m.backend,
        backend_version=m.backend_version,
        gpu=m.tuning.gpu_product,
        mig=req.mig,
        mapping=m.tuning.parallelism.mapping,
        settings=m.tuning.settings,
        cache_hit=cache_hit,
        seconds=round(time.monotonic() - start, 3),
    )
