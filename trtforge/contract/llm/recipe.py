"""What an LLM is quantized to, for which GPUs, and whether its weights fit (docs/llm.md).

Pure rules with typed answers: `recipe_refusal` (by compute capability) and `weights_refusal` (by
memory). Both are decided before any Job starts; the operator turns a refusal into a condition that
names the target and the reason.
"""

from __future__ import annotations

import enum
import math
import re

from pydantic import BaseModel, ConfigDict, Field, field_validator

from trtforge.contract.gpu import GPUIdentity


class Recipe(enum.StrEnum):
    """A quantization recipe, named as ModelOpt's export names them (docs/llm.md §"Recipes by GPU")."""

    BF16 = "bf16"
    FP8 = "fp8"
    NVFP4 = "nvfp4"
    INT4_AWQ = "int4_awq"
    W4A8_AWQ = "w4a8_awq"


class Backend(enum.StrEnum):
    """What quantizes, tunes and serves: TensorRT-LLM (with ModelOpt) on GPUs, llama.cpp on the test bed."""

    LLAMA_CPP = "llama.cpp"
    TENSORRT_LLM = "tensorrt-llm"


# The lowest compute capability each recipe runs on. TensorRT Model Optimizer's support matrix
# (https://nvidia.github.io/Model-Optimizer/guides/0_support_matrix.html): FP4 "Blackwell and
# Later", FP8 and W4A8 AWQ "Ada and Later", W4A16 (INT4 AWQ) "Ampere and Later". BF16 needs Ampere
# (8.0). Ada is 8.9, Hopper 9.0, Blackwell 10.0; A100 is 8.0.
MIN_COMPUTE_CAPABILITY: dict[Recipe, tuple[int, int]] = {
    Recipe.BF16: (8, 0),
    Recipe.INT4_AWQ: (8, 0),
    Recipe.FP8: (8, 9),
    Recipe.W4A8_AWQ: (8, 9),
    Recipe.NVFP4: (10, 0),
}
_ARCH_NAMES = {(8, 0): "Ampere", (8, 9): "Ada", (10, 0): "Blackwell"}

# Bytes per weight at each recipe, block scales included: NVFP4 is 4 bits plus one FP8 scale per 16
# weights; the AWQ recipes are 4 bits plus one FP16 scale per group of 128.
BYTES_PER_WEIGHT: dict[Recipe, float] = {
    Recipe.BF16: 2.0,
    Recipe.FP8: 1.0,
    Recipe.NVFP4: 0.5 + 1 / 16,
    Recipe.INT4_AWQ: 0.5 + 2 / 128,
    Recipe.W4A8_AWQ: 0.5 + 2 / 128,
}
# The stated overhead of the fit rule: weights grow by WEIGHTS_OVERHEAD (embeddings, lm_head and
# norms kept unquantized) and each GPU keeps RUNTIME_RESERVE_MIB for the CUDA context, activations
# and a minimal KV cache.
WEIGHTS_OVERHEAD = 1.10
RUNTIME_RESERVE_MIB = 2048


class Calibration(BaseModel):
    """The post-training-quantization calibration: a data set reference, how many samples, how long."""

    model_config = ConfigDict(defer_build=True, frozen=True, populate_by_name=True)
    dataset: str = Field(default="cnn_dailymail", min_length=1)  # a data set name or a store/https URI
    samples: int = Field(default=512, ge=1, le=65536)
    sequence_length: int = Field(default=512, ge=16, le=131072, alias="sequenceLength")


class Parallelism(BaseModel):
    """tensor x pipeline ranks of one replica."""

    model_config = ConfigDict(defer_build=True, frozen=True)
    tensor: int = Field(default=1, ge=1, le=64)
    pipeline: int = Field(default=1, ge=1, le=64)

    @property
    def world_size(self) -> int:
        return self.tensor * self.pipeline

    @property
    def mapping(self) -> str:
        """``tp<N>pp<M>``: a name for keys, paths and records."""
        return f"tp{self.tensor}pp{self.pipeline}"


class RefusalReason(enum.StrEnum):
    """Why a (recipe, target) pair is refused before any Job."""

    COMPUTE_CAPABILITY = "ComputeCapabilityTooLow"
    CPU_TARGET = "RecipeNeedsGPU"
    WEIGHTS_DO_NOT_FIT = "WeightsDoNotFit"
    MEMORY_UNKNOWN = "TargetMemoryUnknown"


class Refusal(BaseModel):
    """A typed refusal: the reason decides, the message explains."""

    model_config = ConfigDict(defer_build=True, frozen=True)
    reason: RefusalReason
    message: str


def _cc(value: str | tuple[int, int]) -> tuple[int, int] | None:
    if isinstance(value, tuple):
        return value
    m = re.fullmatch(r"(\d+)\.(\d+)", value.strip())
    return (int(m.group(1)), int(m.group(2))) if m else None


def recipe_refusal(
    recipe: Recipe, compute_capability: str | tuple[int, int], backend: Backend
) -> Refusal | None:
    """None when a GPU of this compute capability (``"9.0"``, or ``"none"`` for a CPU target) runs
    the recipe; else why not. A CPU target runs any recipe only with the llama.cpp backend."""
    cc = _cc(compute_capability)
    if cc is None:
        if backend is Backend.LLAMA_CPP:
            return None
        return Refusal(
            reason=RefusalReason.CPU_TARGET,
            message=f"recipe {recipe} on {backend} needs a GPU; this target has none (llama.cpp runs on CPU)",
        )
    need = MIN_COMPUTE_CAPABILITY[recipe]
    if cc >= need:
        return None
    arch = _ARCH_NAMES.get(need, "")
    return Refusal(
        reason=RefusalReason.COMPUTE_CAPABILITY,
        message=(
            f"recipe {recipe} needs compute capability {need[0]}.{need[1]} ({arch}) or later; "
            f"this GPU has {cc[0]}.{cc[1]}"
        ),
    )


def weights_mib(parameters: int, recipe: Recipe, parallelism: Parallelism) -> float:
    """The weights one rank holds, overhead included, in MiB."""
    total = parameters * BYTES_PER_WEIGHT[recipe] * WEIGHTS_OVERHEAD
    return total / parallelism.world_size / (1 << 20)


def weights_need_mib(parameters: int, recipe: Recipe, parallelism: Parallelism) -> float:
    """What one GPU needs before the checkpoint exists: its share of the weights plus the reserve."""
    return weights_mib(parameters, recipe, parallelism) + RUNTIME_RESERVE_MIB


def checkpoint_need_mib(weight_bytes: int, parallelism: Parallelism) -> float:
    """What one GPU needs for a published checkpoint: its share of the measured weights plus the reserve."""
    return weight_bytes / parallelism.world_size / (1 << 20) + RUNTIME_RESERVE_MIB


def weights_refusal(
    parameters: int, recipe: Recipe, parallelism: Parallelism, memory_mib: int
) -> Refusal | None:
    """None when each rank's share of the weights plus `RUNTIME_RESERVE_MIB` fits `memory_mib` (the
    GPU's, or the MIG slice's); else why not. Unknown memory (0) is a refusal of its own."""
    if memory_mib <= 0:
        return Refusal(
            reason=RefusalReason.MEMORY_UNKNOWN,
            message="the target's memory is unknown (no nvidia.com/gpu.memory label); the fit is unchecked",
        )
    need = weights_need_mib(parameters, recipe, parallelism)
    if need <= memory_mib:
        return None
    return Refusal(
        reason=RefusalReason.WEIGHTS_DO_NOT_FIT,
        message=(
            f"{format_parameters(parameters)} parameters at {recipe} over {parallelism.mapping} need "
            f"{math.ceil(need)} MiB per GPU (weights x{WEIGHTS_OVERHEAD} "
            f"+ {RUNTIME_RESERVE_MIB} MiB reserve); "
            f"the target has {memory_mib} MiB"
        ),
    )


def checkpoint_fit_refusal(weight_bytes: int, parallelism: Parallelism, memory_mib: int) -> Refusal | None:
    """The fit once the checkpoint exists: each rank's share of its measured weights (``weight_bytes``,
    the tensors as quantized, so no overhead factor) plus `RUNTIME_RESERVE_MIB` must fit `memory_mib`
    (the GPU's, or the MIG slice's). Unknown memory (0) is a refusal of its own."""
    if memory_mib <= 0:
        return Refusal(
            reason=RefusalReason.MEMORY_UNKNOWN,
            message="the target's memory is unknown (no nvidia.com/gpu.memory label); the fit is unchecked",
        )
    need = checkpoint_need_mib(weight_bytes, parallelism)
    if need <= memory_mib:
        return None
    return Refusal(
        reason=RefusalReason.WEIGHTS_DO_NOT_FIT,
        message=(
            f"the checkpoint's weights are {weight_bytes} bytes ({weight_bytes / (1 << 30):.1f} GiB); over "
            f"{parallelism.mapping} each GPU needs {math.ceil(need)} MiB (its share "
            f"+ {RUNTIME_RESERVE_MIB} MiB reserve); the target has {memory_mib} MiB"
        ),
    )


def target_refusal(
    recipe: Recipe, parameters: int | None, parallelism: Parallelism, gpu: GPUIdentity, backend: Backend
) -> Refusal | None:
    """Both rules for one target, the recipe first; the fit is skipped when the size is unknown."""
    refusal = recipe_refusal(recipe, gpu.compute_capability, backend)
    if refusal is not None or parameters is None or _cc(gpu.compute_capability) is None:
        return refusal
    return weights_refusal(parameters, recipe, parallelism, gpu.memory_mib)


_SUFFIX = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "T": 10**12}


def parse_parameters(text: str | int) -> int:
    """``"135M"``, ``"8B"``, ``"70.6B"`` or a plain count -> a parameter count."""
    if isinstance(text, int):
        value = text
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMBT]?)\s*", text.upper())
        if m is None:
            raise ValueError(f"parameter count {text!r} is not like '135M', '8B' or '70.6B'")
        value = round(float(m.group(1)) * _SUFFIX[m.group(2)])
    if value < 1:
        raise ValueError(f"parameter count {text!r} must be at least 1")
    return value


def format_parameters(count: int) -> str:
    for suffix in ("T", "B", "M", "K"):
        if count >= _SUFFIX[suffix]:
            return f"{count / _SUFFIX[suffix]:.3g}{suffix}"
    return str(count)


class QuantizationSpec(BaseModel):
    """What the quantize step makes from a source: the recipe and its calibration.

    ``gguf_type`` (llama.cpp backend only) names the llama.cpp type to write instead of the recipe's
    test-bed mapping, for example ``Q2_K`` to see the accuracy gate refuse a lossy result.
    """

    model_config = ConfigDict(defer_build=True, frozen=True, populate_by_name=True)
    recipe: Recipe
    calibration: Calibration = Field(default_factory=Calibration)
    gguf_type: str | None = Field(default=None, alias="ggufType")
    max_perplexity_increase: float = Field(default=0.01, ge=0, le=10, alias="maxPerplexityIncrease")

    @field_validator("gguf_type")
    @classmethod
    def _gguf_type(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[A-Z0-9_]{2,16}", v):
            raise ValueError(f"ggufType {v!r} is not a llama.cpp type name like 'Q8_0' or 'Q2_K'")
        return v
