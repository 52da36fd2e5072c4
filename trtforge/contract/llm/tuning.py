"""The tuning-cache record and the check a runtime makes before it applies one (docs/llm.md
§"Tuning caches and their checks").

TensorRT-LLM's autotuner cache (``TLLM_AUTOTUNER_CACHE_PATH``) holds kernel choices for one GPU,
mapping and version, and upstream loads it without checking any of them; trtforge records them beside
the cache and refuses a mismatch. On llama.cpp the record holds the measured best settings
(threads, batch sizes from ``llama-bench``).
"""

from __future__ import annotations

import enum

from pydantic import BaseModel, ConfigDict, Field

from trtforge.contract.gpu import FULL_GPU, GPUIdentity
from trtforge.contract.llm.recipe import Backend, Parallelism

TUNING_RECORD = "tuning.json"  # the record's file inside a tuning-cache artefact


class TuningRecord(BaseModel):
    """What a tuning step measured, and for what: backend version, GPU, mapping, checkpoint."""

    model_config = ConfigDict(defer_build=True, frozen=True)
    backend: Backend
    backend_version: str
    gpu_product: str  # the GFD product label, or "cpu"
    mig_profile: str = FULL_GPU
    parallelism: Parallelism = Field(default_factory=Parallelism)
    checkpoint_key: str
    # The settings the runtime applies, e.g. {"threads": 2, "batch_size": 512, "ubatch_size": 128}.
    settings: dict[str, int | float | str] = Field(default_factory=dict)
    # The backend's own cache file inside the artefact (TensorRT-LLM's autotuner cache), if any.
    cache_file: str | None = None
    # What was measured for each candidate, for the record: e.g. {"threads=2,batch=512": 41.3} (tokens/s).
    measurements: dict[str, float] = Field(default_factory=dict)


class MismatchReason(enum.StrEnum):
    BACKEND = "TuningBackendMismatch"
    VERSION = "TuningVersionMismatch"
    GPU_PRODUCT = "TuningGPUMismatch"
    MIG_PROFILE = "TuningMIGProfileMismatch"
    MAPPING = "TuningMappingMismatch"


class TuningMismatch(BaseModel):
    """Why a runtime refuses a tuning cache: the reason decides, the message tells the user."""

    model_config = ConfigDict(defer_build=True, frozen=True)
    reason: MismatchReason
    message: str


def tuning_mismatch(
    record: TuningRecord,
    pod_gpu: GPUIdentity,
    pod_version: str,
    pod_backend: Backend | None = None,
    pod_parallelism: Parallelism | None = None,
) -> TuningMismatch | None:
    """None when the record was made for this pod's backend version, GPU product, MIG profile and
    mapping (the last two checked when given); else the first difference, in that order."""
    if pod_backend is not None and pod_backend != record.backend:
        return TuningMismatch(
            reason=MismatchReason.BACKEND,
            message=f"tuning cache made with {record.backend}; this pod runs {pod_backend}",
        )
    if record.backend_version != pod_version:
        return TuningMismatch(
            reason=MismatchReason.VERSION,
            message=(
                f"tuning cache made with {record.backend} {record.backend_version}; "
                f"this pod runs {pod_version}"
            ),
        )
    if record.gpu_product != pod_gpu.product:
        return TuningMismatch(
            reason=MismatchReason.GPU_PRODUCT,
            message=f"tuning cache made on {record.gpu_product}; this pod's GPU is {pod_gpu.product}",
        )
    if record.mig_profile != pod_gpu.mig_profile:
        return TuningMismatch(
            reason=MismatchReason.MIG_PROFILE,
            message=(
                f"tuning cache made on MIG profile {record.mig_profile}; this pod has {pod_gpu.mig_profile}"
            ),
        )
    if pod_parallelism is not None and pod_parallelism != record.parallelism:
        return TuningMismatch(
            reason=MismatchReason.MAPPING,
            message=(
                f"tuning cache made for {record.parallelism.mapping}; this pod runs {pod_parallelism.mapping}"
            ),
        )
    return None


# How each llama.cpp tuning setting is passed to llama-server.
LLAMA_SERVER_FLAGS: dict[str, str] = {
    "threads": "--threads",
    "batch_size": "--batch-size",
    "ubatch_size": "--ubatch-size",
}


def llama_server_args(record: TuningRecord) -> list[str]:
    """The llama-server flags that apply a llama.cpp tuning record, in a stable order (unknown
    settings are an error: a record from a newer tuner is not half-applied)."""
    if record.backend is not Backend.LLAMA_CPP:
        raise ValueError(f"a {record.backend} tuning record has no llama-server flags")
    unknown = sorted(set(record.settings) - set(LLAMA_SERVER_FLAGS))
    if unknown:
        raise ValueError(f"tuning settings {', '.join(unknown)} are not known to this runtime")
    args: list[str] = []
    for name, flag in LLAMA_SERVER_FLAGS.items():
        if name in record.settings:
            args += [flag, str(record.settings[name])]
    return args
