"""``TRTEngine`` (trtforge.io/v1alpha1): what to build and for which GPUs.

Wire names are camelCase (``spec.builder.optimizationLevel``); Python names snake_case
(``spec.builder.optimization_level``). Parse a live object with ``TRTEngine.model_validate(body)``.

Helpers the operator uses:

- :meth:`TRTEngineSpec.build_config` -> :class:`trtforge.contract.engine_key.BuildConfig` (the
  normalised build settings hashed into the engine key; workspace quantity -> bytes).
- :meth:`TRTEngineSpec.resolved_targets` -> ``list[GPUTarget]``: the explicit targets, or, with
  ``autoTargets.enabled``, the discovered ones you pass in (MIG dropped unless ``includeMIG``).
- :meth:`AutoTargets.selects` -> whether a Node's labels match ``autoTargets.nodeSelector``.
- :attr:`TRTEngineSpec.source` -> the :class:`ModelSource` to fetch and verify: ``spec.model`` (ONNX) or
  ``spec.llm.source`` (an LLM, docs/llm.md); exactly one of the two is set.
- :meth:`TRTEngineSpec.validation_settings` -> :class:`ValidationSettings` (samples, rtol, atol), the
  tolerances defaulted per precision from :data:`DEFAULT_TOLERANCES` when the spec leaves them out.
- :class:`TRTEngineStatus` / :class:`TargetStatus` / :class:`Accuracy`: what the operator writes
  (``status.to_wire()``); :func:`trtforge_operator.api.common.set_condition` for conditions.

Static defaults live only in the CRD schema (generated from the ``Field`` defaults here); the operator
never writes ``spec``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, WithJsonSchema, model_validator
from pydantic.json_schema import JsonDict

from trtforge.contract.engine_key import BuildConfig, HardwareCompatibility, Precision, ShapeRange
from trtforge.contract.gpu import CPU, MIG_PROFILE_RE, GPUTarget
from trtforge.contract.llm.recipe import (
    Calibration,
    Parallelism,
    QuantizationSpec,
    Recipe,
    parse_parameters,
)
from trtforge.contract.quantity import NONNEGATIVE_QUANTITY_PATTERN, quantity_to_bytes
from trtforge_operator.api.common import (
    API_VERSION,
    ApiModel,
    Condition,
    LocalObjectReference,
    ObjectMeta,
    Time,
)

# A path part of a pvc:// URI: a plain name, never "", "." or ".." (RE2 has no lookahead).
_PLAIN_PART = r"([^/.][^/]*|\.[^/.][^/]*|\.\.[^/]+)"
MODEL_URI_PATTERN = (
    r"^(s3://[a-z0-9][-a-z0-9.]{1,61}[a-z0-9]/.+"
    rf"|pvc://[a-z0-9]([-a-z0-9]*[a-z0-9])?/{_PLAIN_PART}(/{_PLAIN_PART})*"
    r"|https://[^/]+/.+)$"
)
SHA256_PATTERN = r"^[0-9a-f]{64}$"
REDIRECT_HOST_PATTERN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?(:[0-9]{1,5})?$"
RedirectHost = Annotated[str, Field(max_length=259, pattern=REDIRECT_HOST_PATTERN)]
DURATION_PATTERN = r"^([0-9]{1,5}h)?([0-9]{1,6}m)?([0-9]{1,8}s)?$"
MIN_RECHECK_SECONDS = 300


def duration_seconds(text: str) -> int:
    """Seconds of a duration like ``24h``, ``90m``, ``1h30m`` or ``3600s`` (DURATION_PATTERN)."""
    import re

    m = re.fullmatch(DURATION_PATTERN, text)
    if m is None or not text:
        raise ValueError(f"{text!r} is not a duration like 24h, 90m, 1h30m or 3600s")
    h, mi, s = (int((g or "0")[:-1] or 0) for g in m.groups())
    return h * 3600 + mi * 60 + s


GPU_PRODUCT_PATTERN = r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
MIG_PROFILE_PATTERN = MIG_PROFILE_RE.pattern
MAX_RANK = 8
MAX_PROFILES = 8
MAX_TARGETS = 32

TargetPhase = Literal["Pending", "Building", "Ready", "Failed"]
Backend = Literal["tensorrt", "onnxruntime", "llama.cpp", "tensorrt-llm"]
RecipeName = Literal["bf16", "fp8", "nvfp4", "int4_awq", "w4a8_awq"]
LLMFormat = Literal["gguf", "hf-safetensors"]
PARAMETERS_PATTERN = r"^[0-9]{1,15}(\.[0-9]{1,3})?[KMBT]?$"

# Condition types of a TRTEngine.
READY = "Ready"
BUILDING = "Building"
DEGRADED = "Degraded"
STALLED = "Stalled"
CONDITION_TYPES = (READY, BUILDING, DEGRADED, STALLED)


def _check_quantity(v: int | str) -> int | str:
    quantity_to_bytes(v)  # raises on a malformed or negative quantity
    return v


NonNegativeQuantity = Annotated[
    int | str,
    AfterValidator(_check_quantity),
    WithJsonSchema(
        {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": NONNEGATIVE_QUANTITY_PATTERN,
            "x-kubernetes-int-or-string": True,
        }
    ),
]
"""A Kubernetes quantity without sign: ``4Gi``, ``512Mi``, ``1e9`` or an integer."""


def _cel(rule: str, message: str) -> JsonDict:
    return {"rule": rule, "message": message}


class ToleranceDefaults(BaseModel):
    """Default accuracy tolerances for one precision."""

    model_config = ConfigDict(frozen=True)
    rtol: float
    atol: float


DEFAULT_TOLERANCES: dict[str, ToleranceDefaults] = {
    "fp32": ToleranceDefaults(rtol=1e-4, atol=1e-5),
    "fp16": ToleranceDefaults(rtol=1e-2, atol=1e-3),
    "bf16": ToleranceDefaults(rtol=5e-2, atol=1e-2),
    "auto": ToleranceDefaults(rtol=5e-2, atol=1e-2),
    "int8": ToleranceDefaults(rtol=1e-1, atol=5e-2),
    "fp8": ToleranceDefaults(rtol=1e-1, atol=5e-2),
}
"""Per precision: max relative / absolute error against the ONNX Runtime reference."""


# ---------------------------------------------------------------------------------------------- spec


class SecretReference(LocalObjectReference):
    """A Secret in the TRTEngine's namespace holding credentials to fetch the model."""


class ModelSource(ApiModel):
    """Where the ONNX model comes from."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel(
                    "!has(self.secretRef) || !self.uri.startsWith('pvc://')",
                    "secretRef applies to s3:// and https:// models only",
                ),
            ]
        }
    )

    uri: str = Field(
        max_length=2048,
        pattern=MODEL_URI_PATTERN,
        description=(
            "s3://bucket/key, pvc://claim/path (a PVC in this TRTEngine's own namespace; the path is "
            "plain names, no '..') or https://host/path."
        ),
    )
    sha256: str | None = Field(
        default=None,
        max_length=64,
        pattern=SHA256_PATTERN,
        description="Pin: 64 lowercase hex digits; the build fails if the model differs.",
    )
    secret_ref: SecretReference | None = Field(
        default=None,
        description=(
            "Secret (same namespace) with credentials: AWS_* keys for s3://, "
            "TRTFORGE_MODEL_TOKEN (a bearer token) for https://."
        ),
    )
    allowed_redirect_hosts: list[RedirectHost] = Field(
        default_factory=list,
        max_length=16,
        description=(
            "Hosts an https model's redirects may lead to besides its own host and port: 'host' (port "
            "443) or 'host:port'. Redirects are followed https to https only, at most 5 hops."
        ),
    )
    recheck_interval: str | None = Field(
        default=None,
        min_length=2,
        max_length=24,
        pattern=DURATION_PATTERN,
        description=(
            "Read an unpinned model again this often (a duration: 24h, 90m, 1h30m; at least 5m) and "
            "verify it anew: a changed model becomes a new model digest (status.model.sha256) and new "
            "engines. Unset: an unpinned model is read once, and status.model.message says so. "
            "Ignored with sha256 (a pinned model cannot change)."
        ),
    )
    max_size_bytes: int | None = Field(
        default=None,
        ge=1,
        description=(
            "The largest model the verify step may upload, in bytes; the broker refuses a larger one "
            "before storing anything. Unset: the operator's broker.max_model_bytes (also the upper bound)."
        ),
    )

    @model_validator(mode="after")
    def _secret_scheme(self) -> ModelSource:
        if self.secret_ref is not None and self.uri.startswith("pvc://"):
            raise ValueError("model.secretRef applies to s3:// and https:// models only")
        if (
            self.recheck_interval is not None
            and duration_seconds(self.recheck_interval) < MIN_RECHECK_SECONDS
        ):
            raise ValueError(
                f"model.recheckInterval {self.recheck_interval!r} is shorter than "
                f"{MIN_RECHECK_SECONDS // 60}m"
            )
        return self

    @property
    def recheck_seconds(self) -> int | None:
        """How often an unpinned model is read again; None: never (or pinned)."""
        if self.sha256 or not self.recheck_interval:
            return None
        return duration_seconds(self.recheck_interval)


class ShapeRangeSpec(ApiModel):
    """min/opt/max shape of one input; every dimension must satisfy min <= opt <= max."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel(
                    "size(self.min) == size(self.opt) && size(self.opt) == size(self.max)",
                    "min, opt and max must have the same number of dimensions",
                ),
                _cel(
                    "[0, 1, 2, 3, 4, 5, 6, 7].all(i, i >= size(self.min) || i >= size(self.opt) || "
                    "i >= size(self.max) || (self.min[i] <= self.opt[i] && self.opt[i] <= self.max[i]))",
                    "every dimension must satisfy min <= opt <= max",
                ),
            ]
        }
    )

    min: list[Annotated[int, Field(ge=1)]] = Field(
        min_length=1, max_length=MAX_RANK, description="Smallest shape."
    )
    opt: list[Annotated[int, Field(ge=1)]] = Field(
        min_length=1, max_length=MAX_RANK, description="Shape TensorRT tunes for."
    )
    max: list[Annotated[int, Field(ge=1)]] = Field(
        min_length=1, max_length=MAX_RANK, description="Largest shape."
    )

    def to_contract(self) -> ShapeRange:
        """The contract's :class:`ShapeRange` (validates the same rules)."""
        return ShapeRange(min=tuple(self.min), opt=tuple(self.opt), max=tuple(self.max))

    @model_validator(mode="after")
    def _ordered(self) -> ShapeRangeSpec:
        self.to_contract()
        return self


class OptimizationProfile(ApiModel):
    """One TensorRT optimization profile: a shape range per dynamic input."""

    inputs: dict[Annotated[str, Field(max_length=256)], ShapeRangeSpec] = Field(
        min_length=1,
        max_length=32,
        description="Input tensor name -> its shape range.",
    )


STRIP_WEIGHTS_REFUSED = (
    "stripWeights is not supported yet: the runtime does not refit weight-stripped engines "
    "(docs/design.md, TensorRT); leave it false"
)


class BuilderSettings(ApiModel):
    """TensorRT builder settings."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel("!has(self.stripWeights) || !self.stripWeights", STRIP_WEIGHTS_REFUSED)
            ]
        }
    )

    optimization_level: int = Field(
        default=3, ge=0, le=5, description="Builder optimization level 0-5; higher builds slower."
    )
    workspace: NonNegativeQuantity | None = Field(
        default=None,
        description="Workspace memory pool limit, a quantity like 4Gi; unset: TensorRT's default.",
    )
    hardware_compatibility: HardwareCompatibility = Field(
        default="none",
        description="none, sameComputeCapability or amperePlus.",
    )
    version_compatible: bool = Field(
        default=False, description="Build a version-compatible engine (lean runtime)."
    )
    strip_weights: bool = Field(
        default=False, description="Weight-stripped engines: refused until the runtime refits them."
    )

    @model_validator(mode="after")
    def _refused(self) -> BuilderSettings:
        if self.strip_weights:
            raise ValueError(STRIP_WEIGHTS_REFUSED)
        return self

    timing_cache: bool = Field(
        default=True, description="Use and update the shared timing cache for this GPU."
    )
    timeout_seconds: int = Field(default=3600, ge=60, le=86400, description="Deadline of one build Job.")


class GPUSelection(ApiModel):
    """A GPU type: a nvidia.com/gpu.product value (or cpu) and optionally a MIG profile."""

    gpu: str = Field(
        min_length=1,
        max_length=63,
        pattern=GPU_PRODUCT_PATTERN,
        description="nvidia.com/gpu.product label value, e.g. NVIDIA-H100-80GB-HBM3, or cpu.",
    )
    mig: str | None = Field(
        default=None,
        max_length=32,
        pattern=MIG_PROFILE_PATTERN,
        description="MIG profile like 3g.40gb; unset means the full GPU.",
    )

    def to_contract(self) -> GPUTarget:
        return GPUTarget(gpu=self.gpu, mig=self.mig)


class ParallelismSpec(ApiModel):
    """tensor x pipeline ranks of one LLM replica (1 x 1 runs on one GPU)."""

    tensor: int = Field(default=1, ge=1, le=64, description="Tensor-parallel ranks.")
    pipeline: int = Field(default=1, ge=1, le=64, description="Pipeline-parallel ranks.")

    def to_contract(self) -> Parallelism:
        return Parallelism(tensor=self.tensor, pipeline=self.pipeline)


class EngineTarget(GPUSelection):
    """A GPU type to build for: a nvidia.com/gpu.product value (or cpu) and optionally a MIG profile."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel("self.gpu != 'cpu' || !has(self.mig)", "a cpu target has no MIG profile"),
            ]
        }
    )

    parallelism: ParallelismSpec | None = Field(
        default=None,
        description="LLM engines only: tensor x pipeline ranks per replica; unset is 1 x 1.",
    )

    @model_validator(mode="after")
    def _cpu_no_mig(self) -> EngineTarget:
        if self.gpu == CPU and self.mig is not None:
            raise ValueError("a cpu target has no MIG profile")
        return self


class AutoTargets(ApiModel):
    """Derive targets from the GPU node types in the cluster (GPU Feature Discovery labels)."""

    enabled: bool = Field(default=False, description="Build for every GPU type found on matching nodes.")
    node_selector: dict[Annotated[str, Field(max_length=317)], Annotated[str, Field(max_length=63)]] = Field(
        default_factory=dict,
        max_length=32,
        description="Only nodes with all these labels count.",
    )
    include_mig: bool = Field(
        default=True,
        alias="includeMIG",
        description="Also build for MIG profiles on nodes with nvidia.com/mig.config.state=success.",
    )

    def selects(self, node_labels: Mapping[str, str]) -> bool:
        """Whether a Node with these labels is considered by autoTargets."""
        return all(node_labels.get(k) == v for k, v in self.node_selector.items())


class ValidationSpec(ApiModel):
    """Accuracy check of a built engine against an ONNX Runtime reference."""

    samples: int = Field(default=8, ge=1, le=1024, description="Random inputs to compare.")
    rtol: float | None = Field(
        default=None, ge=0, le=1, description="Max relative error; unset: the precision's default."
    )
    atol: float | None = Field(
        default=None, ge=0, description="Max absolute error; unset: the precision's default."
    )


class ValidationSettings(BaseModel):
    """Validation with tolerances resolved for the engine's precision."""

    model_config = ConfigDict(frozen=True)
    samples: int
    rtol: float
    atol: float


class LLMSource(ModelSource):
    """Where an LLM's weights come from: one GGUF file, or a Hugging Face checkpoint (safetensors)."""

    format: LLMFormat = Field(
        default="gguf", description="gguf (one llama.cpp file) or hf-safetensors (a Hugging Face checkpoint)."
    )


class CalibrationSpec(ApiModel):
    """Post-training-quantization calibration (ModelOpt on TensorRT-LLM; llama.cpp calibrates nothing)."""

    dataset: str = Field(
        default="cnn_dailymail", min_length=1, max_length=2048, description="A data set name or URI."
    )
    samples: int = Field(default=512, ge=1, le=65536, description="Calibration samples.")
    sequence_length: int = Field(default=512, ge=16, le=131072, description="Tokens per sample.")

    def to_contract(self) -> Calibration:
        return Calibration(dataset=self.dataset, samples=self.samples, sequence_length=self.sequence_length)


class CanarySpec(ApiModel):
    """The prompt whose greedy tokens the quantize step records and every serving pod must repeat."""

    prompt: str = Field(
        default="The capital of France is", min_length=1, max_length=4096, description="Canary prompt."
    )
    max_tokens: int = Field(default=16, ge=1, le=256, description="Greedy tokens recorded and compared.")


class LLMSpec(ApiModel):
    """An LLM to quantize (one checkpoint per source digest and recipe) and tune per target."""

    source: LLMSource = Field(description="The source weights (GGUF or Hugging Face safetensors).")
    recipe: RecipeName = Field(description="bf16, fp8, nvfp4, int4_awq or w4a8_awq (docs/llm.md).")
    calibration: CalibrationSpec = Field(
        default_factory=CalibrationSpec,
        description="Calibration settings.",
        json_schema_extra={"default": {}},
    )
    max_perplexity_increase: float = Field(
        default=0.01,
        ge=0,
        le=10,
        description="The accuracy gate: the largest perplexity rise over the source (0.01 is 1%).",
    )
    canary: CanarySpec = Field(
        default_factory=CanarySpec, description="The canary prompt.", json_schema_extra={"default": {}}
    )
    parameters: str | None = Field(
        default=None,
        max_length=24,
        pattern=PARAMETERS_PATTERN,
        description=(
            "The parameter count (135M, 8B, 70.6B or a plain number), for the weights-fit check "
            "before any Job; unset: only the recipe is checked (the fit is not)."
        ),
    )

    allow_unified_memory_overflow: bool = Field(
        default=False,
        description=(
            "Grace Hopper (GH200) targets only: admit weights larger than a GPU's HBM at the recipe and "
            "mapping, the rest spilling into Grace memory over NVLink-C2C (slower); false refuses them."
        ),
    )

    def recipe_enum(self) -> Recipe:
        return Recipe(self.recipe)

    def parameter_count(self) -> int | None:
        return None if self.parameters is None else parse_parameters(self.parameters)

    def quantization(self) -> QuantizationSpec:
        """The contract's quantization settings (hashed into the checkpoint key)."""
        return QuantizationSpec(
            recipe=self.recipe_enum(),
            calibration=self.calibration.to_contract(),
            max_perplexity_increase=self.max_perplexity_increase,
        )


_TARGETS_XOR_AUTO = (
    "(has(self.targets) && size(self.targets) > 0) != "
    "(has(self.autoTargets) && has(self.autoTargets.enabled) && self.autoTargets.enabled)"
)
_UNIQUE_TARGETS = (
    "self.all(t, self.exists_one(u, u.gpu == t.gpu && "
    "(has(u.mig) ? u.mig : '') == (has(t.mig) ? t.mig : '')))"
)
_MODEL_XOR_LLM = "has(self.model) != has(self.llm)"
_PARALLELISM_NEEDS_LLM = "has(self.llm) || !has(self.targets) || self.targets.all(t, !has(t.parallelism))"
_SAME_INPUTS = "self.all(p, size(p.inputs) == size(self[0].inputs) && p.inputs.all(k, k in self[0].inputs))"


class TRTEngineSpec(ApiModel):
    """What to build and for which GPUs."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel(_TARGETS_XOR_AUTO, "set either targets or autoTargets.enabled: true, not both"),
                _cel(_MODEL_XOR_LLM, "set either model (an ONNX model) or llm (an LLM), not both"),
                _cel(_PARALLELISM_NEEDS_LLM, "targets[].parallelism applies to llm engines only"),
            ],
            # structural: an apiserver without CEL (the test bed's) still refuses neither and both
            "oneOf": [{"required": ["model"]}, {"required": ["llm"]}],
        }
    )

    model: ModelSource | None = Field(default=None, description="The ONNX model. Set this or llm.")
    llm: LLMSpec | None = Field(
        default=None, description="An LLM to quantize and tune instead of an ONNX model (docs/llm.md)."
    )
    precision: Precision = Field(default="fp16", description="fp32, fp16, bf16, int8, fp8 or auto.")
    profiles: list[OptimizationProfile] = Field(
        default_factory=list,
        max_length=MAX_PROFILES,
        description="Optimization profiles for dynamic inputs; empty for static shapes.",
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel(_SAME_INPUTS, "every profile must list the same inputs"),
            ]
        },
    )
    builder: BuilderSettings = Field(
        default_factory=BuilderSettings, description="Builder settings.", json_schema_extra={"default": {}}
    )
    targets: list[EngineTarget] = Field(
        default_factory=list,
        max_length=MAX_TARGETS,
        description="GPU types to build for. Set this or autoTargets.",
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel(_UNIQUE_TARGETS, "targets must be unique (gpu, mig) pairs"),
            ]
        },
    )
    auto_targets: AutoTargets | None = Field(
        default=None,
        description="Derive targets from the cluster's GPU nodes instead of listing them.",
    )
    validation: ValidationSpec = Field(
        default_factory=ValidationSpec, description="Accuracy validation.", json_schema_extra={"default": {}}
    )

    @model_validator(mode="after")
    def _rules(self) -> TRTEngineSpec:
        if (self.model is None) == (self.llm is None):
            raise ValueError("set either model (an ONNX model) or llm (an LLM), not both")
        if self.llm is None and any(t.parallelism is not None for t in self.targets):
            raise ValueError("targets[].parallelism applies to llm engines only")
        auto = self.auto_targets is not None and self.auto_targets.enabled
        if bool(self.targets) == auto:
            raise ValueError("set either targets or autoTargets.enabled: true, not both")
        seen = set()
        for t in self.targets:
            if (t.gpu, t.mig) in seen:
                raise ValueError(f"targets must be unique (gpu, mig) pairs; {t.gpu}/{t.mig} repeats")
            seen.add((t.gpu, t.mig))
        if self.profiles:
            names = set(self.profiles[0].inputs)
            for i, p in enumerate(self.profiles):
                if set(p.inputs) != names:
                    raise ValueError(
                        f"profiles[{i}] lists inputs {sorted(p.inputs)}, expected {sorted(names)}"
                        " (every profile must list the same inputs)"
                    )
        return self

    @property
    def source(self) -> ModelSource:
        """What the verify step fetches: ``model``, or ``llm.source``."""
        if self.llm is not None:
            return self.llm.source
        assert self.model is not None  # the validator keeps exactly one
        return self.model

    def parallelism_of(self, target: GPUTarget) -> Parallelism:
        """The target's tensor x pipeline mapping (1 x 1 unless listed, and for discovered targets)."""
        for t in self.targets:
            if (t.gpu, t.mig) == (target.gpu, target.mig) and t.parallelism is not None:
                return t.parallelism.to_contract()
        return Parallelism()

    def workspace_bytes(self) -> int | None:
        """``builder.workspace`` in bytes, or None when unset."""
        w = self.builder.workspace
        return None if w is None else quantity_to_bytes(w)

    def build_config(self) -> BuildConfig:
        """The normalised build settings that go into the engine key."""
        return BuildConfig(
            precision=self.precision,
            profiles=tuple({name: r.to_contract() for name, r in p.inputs.items()} for p in self.profiles),
            optimization_level=self.builder.optimization_level,
            workspace_bytes=self.workspace_bytes(),
            hardware_compatibility=self.builder.hardware_compatibility,
            version_compatible=self.builder.version_compatible,
            strip_weights=self.builder.strip_weights,
        )

    def explicit_targets(self) -> list[GPUTarget]:
        """``spec.targets`` as contract targets, in the order given."""
        return [t.to_contract() for t in self.targets]

    def resolved_targets(self, discovered: Iterable[GPUTarget] = ()) -> list[GPUTarget]:
        """The targets to build: explicit ones, or with autoTargets the ``discovered`` ones.

        ``discovered``: targets the operator found on Nodes that :meth:`AutoTargets.selects` (MIG only
        where ``nvidia.com/mig.config.state=success``). MIG targets are dropped unless ``includeMIG``;
        the result is deduplicated and sorted by target name.
        """
        if self.targets:
            return self.explicit_targets()
        auto = self.auto_targets
        if auto is None or not auto.enabled:
            return []
        found = {t for t in discovered if auto.include_mig or t.mig is None}
        return sorted(found, key=lambda t: (t.name, t.gpu, t.mig or ""))

    def validation_settings(self) -> ValidationSettings:
        """Samples and tolerances, rtol/atol defaulted from :data:`DEFAULT_TOLERANCES` by precision."""
        d = DEFAULT_TOLERANCES[self.precision]
        v = self.validation
        return ValidationSettings(
            samples=v.samples,
            rtol=d.rtol if v.rtol is None else v.rtol,
            atol=d.atol if v.atol is None else v.atol,
        )


# -------------------------------------------------------------------------------------------- status


class Accuracy(ApiModel):
    """Accuracy of the built engine against the ONNX Runtime reference."""

    max_abs_error: float | None = Field(default=None, ge=0, description="Largest absolute error seen.")
    max_rel_error: float | None = Field(default=None, ge=0, description="Largest relative error seen.")
    passed: bool | None = Field(default=None, description="Within the tolerances.")


class TargetStatus(ApiModel):
    """The engine of one GPU target."""

    name: str = Field(
        max_length=63, description="Target name (GPUTarget.name), e.g. h100-80gb-hbm3-mig-3g.40gb."
    )
    gpu: str = Field(max_length=63, description="nvidia.com/gpu.product value or cpu.")
    mig: str | None = Field(default=None, max_length=32, description="MIG profile, unset for the full GPU.")
    phase: TargetPhase = Field(default="Pending", description="Pending, Building, Ready or Failed.")
    engine_key: str | None = Field(default=None, max_length=64, description="Engine key (sha256 hex).")
    engine_uri: str | None = Field(
        default=None, alias="engineURI", max_length=2048, description="Where the engine is stored."
    )
    sha256: str | None = Field(default=None, max_length=64, description="sha256 of the engine file.")
    size_bytes: int | None = Field(default=None, ge=0, description="Engine file size.")
    backend: Backend | None = Field(default=None, description="tensorrt or onnxruntime.")
    backend_version: str | None = Field(
        default=None, max_length=64, description="Exact backend version, as the builder reported it."
    )
    cuda: str | None = Field(default=None, max_length=16, description="CUDA of the backend, as reported.")
    compute_capability: str | None = Field(
        default=None, max_length=16, description="Compute capability, e.g. 9.0."
    )
    tuning_key: str | None = Field(
        default=None,
        max_length=64,
        description="LLM engines: the tuning cache's key (sha256 hex) in the store (tuning/<key>/).",
    )
    mapping: str | None = Field(
        default=None, max_length=16, description="LLM engines: the tensor x pipeline mapping, tp1pp1."
    )
    weights_overflow_mib: int | None = Field(
        default=None,
        ge=0,
        alias="weightsOverflowMiB",
        description="LLM engines on Grace Hopper: MiB of each GPU's share of the weights admitted past "
        "its HBM into Grace memory (spec.llm.allowUnifiedMemoryOverflow); unset: they fit HBM.",
    )
    request_key: str | None = Field(
        default=None,
        max_length=64,
        description="Request key (sha256 hex) of what the served engine was asked for: model, build "
        "settings, GPU, builder image, recipe.",
    )
    build_seconds: float | None = Field(default=None, ge=0, description="Build time.")
    cache_hit: bool | None = Field(default=None, description="Reused from the store, no build.")
    accuracy: Accuracy | None = Field(default=None, description="Validation figures.")
    job_name: str | None = Field(default=None, max_length=63, description="Build Job, if one ran.")
    attempts: int | None = Field(default=None, ge=0, description="Build attempts for this engine key.")
    last_attempt_time: Time | None = Field(default=None, description="When the last build started.")
    reason: str | None = Field(default=None, max_length=128, description="CamelCase reason of the phase.")
    message: str | None = Field(default=None, max_length=4096, description="One line on the phase.")

    def target(self) -> GPUTarget:
        return GPUTarget(gpu=self.gpu, mig=self.mig)


class VerifiedModel(ApiModel):
    """The model this namespace proved it holds (its verify step streamed it to the broker)."""

    sha256: str = Field(max_length=64, description="sha256 of the model, as the broker computed it.")
    verified_time: Time | None = Field(default=None, description="When the verify step finished.")
    size_bytes: int | None = Field(default=None, ge=0, description="Model size.")
    message: str | None = Field(
        default=None,
        max_length=1024,
        description=(
            "When the model is read again (spec.model.recheckInterval), how the last re-read went, or "
            "a warning that an unpinned model without recheckInterval is never read again."
        ),
    )


class PerplexityStatus(ApiModel):
    """The accuracy gate's figures: perplexity of the source and of the quantized result."""

    source: float = Field(ge=0, description="Perplexity of the source on the evaluation text.")
    result: float = Field(ge=0, description="Perplexity of the quantized checkpoint.")
    increase: float = Field(description="(result - source) / source: 0.012 is +1.2%.")
    max_increase: float = Field(ge=0, description="The bound (spec.llm.maxPerplexityIncrease).")


class CheckpointStatus(ApiModel):
    """The quantized checkpoint of an LLM engine (one per source digest and recipe)."""

    phase: TargetPhase = Field(default="Pending", description="Pending, Building, Ready or Failed.")
    recipe: RecipeName | None = Field(default=None, description="The recipe it was quantized with.")
    checkpoint_key: str | None = Field(
        default=None, max_length=64, description="The checkpoint's key (sha256 hex): checkpoints/<key>/."
    )
    manifest_uri: str | None = Field(
        default=None, alias="manifestURI", max_length=2048, description="The checkpoint's manifest."
    )
    backend: Backend | None = Field(default=None, description="llama.cpp or tensorrt-llm.")
    backend_version: str | None = Field(default=None, max_length=64, description="Its exact version.")
    quantized_type: str | None = Field(
        default=None, max_length=32, description="What the backend wrote, e.g. BF16 or Q8_0 (llama.cpp)."
    )
    size_bytes: int | None = Field(default=None, ge=0, description="All the checkpoint's files.")
    cache_hit: bool | None = Field(default=None, description="Found in the store, not quantized again.")
    perplexity: PerplexityStatus | None = Field(default=None, description="The accuracy gate's figures.")
    job_name: str | None = Field(default=None, max_length=63, description="The quantize Job.")
    reason: str | None = Field(default=None, max_length=128, description="CamelCase reason of the phase.")
    message: str | None = Field(default=None, max_length=4096, description="One line on the phase.")


class TRTEngineStatus(ApiModel):
    """Observed state, written only by the operator."""

    observed_generation: int | None = Field(
        default=None, ge=0, description="The metadata.generation last acted on."
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=16,
        description="Ready, Building, Degraded, Stalled.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    targets: list[TargetStatus] = Field(
        default_factory=list,
        max_length=MAX_TARGETS * 4,
        description="One entry per resolved target.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    ready_targets: str | None = Field(
        default=None, max_length=16, description='Ready targets out of all, like "2/3".'
    )
    model: VerifiedModel | None = Field(
        default=None, description="The model this namespace proved it holds, for the current source."
    )
    checkpoint: CheckpointStatus | None = Field(
        default=None, description="LLM engines: the quantized checkpoint the targets' tuning caches use."
    )


# ------------------------------------------------------------------------------------------ resource


class TRTEngine(ApiModel):
    """A TensorRT engine built from one ONNX model for one or more GPU types."""

    KIND: ClassVar[str] = "TRTEngine"
    PLURAL: ClassVar[str] = "trtengines"
    SINGULAR: ClassVar[str] = "trtengine"
    SHORT_NAMES: ClassVar[list[str]] = ["trte"]
    PRINTER_COLUMNS: ClassVar[list[dict[str, Any]]] = [
        {
            "name": "Ready",
            "type": "string",
            "jsonPath": ".status.readyTargets",
            "description": "Ready targets out of all",
        },
        {"name": "Precision", "type": "string", "jsonPath": ".spec.precision"},
        {"name": "Recipe", "type": "string", "jsonPath": ".spec.llm.recipe", "description": "LLM recipe"},
        {
            "name": "Status",
            "type": "string",
            "jsonPath": '.status.conditions[?(@.type=="Ready")].reason',
            "description": "Reason of the Ready condition",
        },
        {"name": "Model", "type": "string", "jsonPath": ".spec.model.uri", "priority": 1},
        {"name": "Source", "type": "string", "jsonPath": ".spec.llm.source.uri", "priority": 1},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]

    api_version: Literal["trtforge.io/v1alpha1"] = API_VERSION
    kind: Literal["TRTEngine"] = "TRTEngine"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: TRTEngineSpec
    status: TRTEngineStatus = Field(default_factory=TRTEngineStatus)
