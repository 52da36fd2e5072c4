"""Engine keys (docs/design.md §"Engine keys"): what the operator asks for, and what was really built.

Two keys, two owners, so they cannot disagree:

- The **request key** (:func:`request_key`) names what the operator *asked for*: the model's sha256
  (or its URI when unpinned), the normalised build config, the GPU binding it can state from the
  TRTEngine target and GFD labels, the builder image and the :data:`RECIPE_VERSION`. The operator
  computes it, names build Jobs after it and looks engines up by it. It never holds a TensorRT, CUDA
  or backend version.
- The **engine key** (:func:`engine_key`) names what a builder *really built*: the model's sha256,
  the build config, the backend and its exact version, CUDA, the recipe version, and the GPU facts
  the engine is bound to, all from the builder's own probe and imports. Only the builder computes it.

The builder files every engine it publishes (or finds) under the request key it was given
(``requests/<request key>.json`` → engine key, see :class:`RequestRecord`), so any builder version,
even one the operator has never heard of, converges in one build.
"""

from __future__ import annotations

import hashlib
import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from trtforge.contract.gpu import GPUIdentity

KEY_SCHEMA = "trtforge.io/engine-key/v2"
REQUEST_SCHEMA = "trtforge.io/request-key/v1"
# The builder recipe: how build settings become builder flags (trtforge.tensorrt.policy). Bump it
# whenever that mapping changes, so engines built by an older recipe are not reused.
RECIPE_VERSION = 2
Precision = Literal["fp32", "fp16", "bf16", "int8", "fp8", "auto"]
HardwareCompatibility = Literal["none", "sameComputeCapability", "amperePlus"]
Backend = Literal["tensorrt", "onnxruntime"]
HEX64 = r"^[0-9a-f]{64}$"


class ShapeRange(BaseModel):
    """min/opt/max shape of one input in one optimization profile."""

    model_config = ConfigDict(defer_build=True, frozen=True)
    min: tuple[int, ...]
    opt: tuple[int, ...]
    max: tuple[int, ...]

    @model_validator(mode="after")
    def _ordered(self) -> ShapeRange:
        if not (len(self.min) == len(self.opt) == len(self.max)):
            raise ValueError(
                f"min {list(self.min)}, opt {list(self.opt)} and max {list(self.max)} must have the same rank"
            )
        for i, (a, b, c) in enumerate(zip(self.min, self.opt, self.max, strict=True)):
            if a < 1:
                raise ValueError(f"dimension {i} of min {list(self.min)} must be at least 1")
            if not a <= b <= c:
                raise ValueError(f"dimension {i} must satisfy min <= opt <= max, got {a}, {b}, {c}")
        return self


class BuildConfig(BaseModel):
    """The normalised build settings that decide an engine (timeouts, validation, caching do not)."""

    model_config = ConfigDict(defer_build=True, frozen=True)
    precision: Precision = "fp16"
    # One dict per optimization profile: input name -> range. Profile order matters; input order not.
    profiles: tuple[dict[str, ShapeRange], ...] = ()
    optimization_level: int = Field(default=3, ge=0, le=5)
    workspace_bytes: int | None = Field(default=None, ge=0)
    hardware_compatibility: HardwareCompatibility = "none"
    version_compatible: bool = False
    strip_weights: bool = False

    def canonical(self) -> dict[str, object]:
        data = self.model_dump(mode="json")
        data["profiles"] = [dict(sorted(p.items())) for p in data["profiles"]]
        return data


class GPUBinding(BaseModel):
    """The GPU facts an engine is really bound to (docs/design.md §"Engine keys").

    A default engine is bound to the product, MIG profile and SM count it was timed on; a
    ``sameComputeCapability`` engine only to the compute capability; an ``amperePlus`` engine to
    any GPU of compute 8.0 or later. The CPU architecture binds every engine (plans are not portable
    across platforms). Fields that do not bind are None, so engines that differ only there share a key.
    """

    model_config = ConfigDict(defer_build=True, frozen=True)
    arch: str
    compute_capability: str | None = None
    product: str | None = None
    mig_profile: str | None = None
    sm_count: int | None = None


def gpu_binding(identity: GPUIdentity, hardware_compatibility: HardwareCompatibility) -> GPUBinding:
    """What of a probed identity binds an engine built with `hardware_compatibility`."""
    if identity.product == "cpu":
        return GPUBinding(arch=identity.arch, product="cpu")
    if hardware_compatibility == "amperePlus":
        return GPUBinding(arch=identity.arch, compute_capability="8.0+")
    if hardware_compatibility == "sameComputeCapability":
        return GPUBinding(arch=identity.arch, compute_capability=identity.compute_capability)
    return GPUBinding(
        arch=identity.arch,
        compute_capability=identity.compute_capability,
        product=identity.product,
        mig_profile=identity.mig_profile,
        sm_count=identity.sm_count,
    )


class EngineKeyRecord(BaseModel):
    """The canonical record hashed into the engine key (the builder's, from what it really has)."""

    model_config = ConfigDict(defer_build=True, frozen=True)
    schema_: str = Field(default=KEY_SCHEMA, alias="schema")
    model_sha256: str = Field(pattern=HEX64)
    build: BuildConfig
    backend: Backend
    backend_version: str
    cuda: str  # CUDA major.minor the backend was built against; "none" for CPU backends
    gpu: GPUBinding
    recipe: int = RECIPE_VERSION

    @classmethod
    def for_identity(
        cls,
        *,
        model_sha256: str,
        build: BuildConfig,
        backend: Backend,
        backend_version: str,
        cuda: str,
        identity: GPUIdentity,
        recipe: int = RECIPE_VERSION,
    ) -> EngineKeyRecord:
        return cls(
            model_sha256=model_sha256,
            build=build,
            backend=backend,
            backend_version=backend_version,
            cuda=cuda,
            gpu=gpu_binding(identity, build.hardware_compatibility),
            recipe=recipe,
        )

    def canonical_json(self) -> str:
        data = self.model_dump(mode="json", by_alias=True)
        data["build"] = self.build.canonical()
        return json.dumps(data, sort_keys=True, separators=(",", ":"))


def engine_key(record: EngineKeyRecord) -> str:
    """64 hex characters; the store directory name of the engine."""
    return hashlib.sha256(record.canonical_json().encode()).hexdigest()


class TargetBinding(BaseModel):
    """The GPU part of a request, as the operator states it from the target and GFD Node labels.

    Default engines: the target's product and MIG profile (the builder runs on exactly that).
    ``sameComputeCapability``: the compute capability and CPU architecture (GFD labels), so every
    product of that capability asks for one engine. ``amperePlus``: the CPU architecture alone.
    """

    model_config = ConfigDict(defer_build=True, frozen=True)
    product: str | None = None
    mig_profile: str | None = None
    compute_capability: str | None = None
    arch: str | None = None


def target_binding(
    product: str,
    mig: str | None,
    hardware_compatibility: HardwareCompatibility,
    *,
    compute_capability: str | None,
    arch: str | None,
) -> TargetBinding:
    """The request's GPU part; raises ValueError when a compatible build lacks the label it needs."""
    if product == "cpu" or hardware_compatibility == "none":
        return TargetBinding(product=product, mig_profile=mig or "full")
    if arch is None:
        raise ValueError(f"a {hardware_compatibility} build needs the node label kubernetes.io/arch")
    if hardware_compatibility == "amperePlus":
        return TargetBinding(arch=arch)
    if compute_capability is None:
        raise ValueError(
            "a sameComputeCapability build needs the node labels "
            "nvidia.com/gpu.compute.major/minor (GPU Feature Discovery)"
        )
    return TargetBinding(compute_capability=compute_capability, arch=arch)


class RequestKeyRecord(BaseModel):
    """The canonical record hashed into the request key (the operator's, from what it asked for)."""

    model_config = ConfigDict(defer_build=True, frozen=True)
    schema_: str = Field(default=REQUEST_SCHEMA, alias="schema")
    model_sha256: str | None = Field(default=None, pattern=HEX64)
    model_uri: str | None = None  # only when the sha256 is not pinned
    build: BuildConfig
    gpu: TargetBinding
    backend: str  # the backend asked for: "tensorrt", "onnxruntime" or "auto"
    builder_image: str
    recipe: int = RECIPE_VERSION

    @model_validator(mode="after")
    def _model(self) -> RequestKeyRecord:
        if (self.model_sha256 is None) == (self.model_uri is None):
            raise ValueError("a request names the model by its sha256 when pinned, else by its URI")
        return self

    def canonical_json(self) -> str:
        data = self.model_dump(mode="json", by_alias=True)
        data["build"] = self.build.canonical()
        return json.dumps(data, sort_keys=True, separators=(",", ":"))


def request_key(record: RequestKeyRecord) -> str:
    """64 hex characters; names build Jobs and the store's request index entry."""
    return hashlib.sha256(record.canonical_json().encode()).hexdigest()


class RequestRecord(BaseModel):
    """``requests/<request key>.json``: which engine a request produced (written by the builder).

    The operator reads it to find the engine for what it asked for; it also learns there the real
    backend, version and CUDA of the builder that answered.
    """

    model_config = ConfigDict(defer_build=True, frozen=True, populate_by_name=True)
    schema_: str = Field(default="trtforge.io/request/v1", alias="schema")
    request_key: str = Field(pattern=HEX64, alias="requestKey")
    engine_key: str = Field(pattern=HEX64, alias="engineKey")
    backend: str
    backend_version: str = Field(alias="backendVersion")
    cuda: str
    recipe: int

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> RequestRecord:
        return cls.model_validate_json(text)
