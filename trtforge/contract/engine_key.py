"""The engine key: sha256 of a canonical record of everything that decides an engine (docs/design.md §3).

Same key → same engine: any request, from any namespace, with the same key reuses the stored engine.
The operator computes it from a TRTEngine target and Node labels; the builder from its probe; both go
through :func:`engine_key` with an :class:`EngineKeyRecord`, so they agree by construction.
"""

from __future__ import annotations

import hashlib
import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from trtforge.contract.gpu import GPUIdentity

KEY_SCHEMA = "trtforge.io/engine-key/v1"
Precision = Literal["fp32", "fp16", "bf16", "int8", "fp8", "auto"]
HardwareCompatibility = Literal["none", "sameComputeCapability", "amperePlus"]
Backend = Literal["tensorrt", "onnxruntime"]


class ShapeRange(BaseModel):
    """min/opt/max shape of one input in one optimization profile."""

    model_config = ConfigDict(frozen=True)
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

    model_config = ConfigDict(frozen=True)
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


class EngineKeyRecord(BaseModel):
    """The canonical record hashed into the key."""

    model_config = ConfigDict(frozen=True)
    schema_: str = Field(default=KEY_SCHEMA, alias="schema")
    model_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    build: BuildConfig
    backend: Backend
    backend_version: str
    cuda: str  # CUDA major.minor the backend was built against; "none" for CPU backends
    gpu: GPUIdentity

    def canonical_json(self) -> str:
        data = self.model_dump(mode="json", by_alias=True)
        data["build"] = self.build.canonical()
        return json.dumps(data, sort_keys=True, separators=(",", ":"))


def engine_key(record: EngineKeyRecord) -> str:
    """64 hex characters; the store directory name of the engine."""
    return hashlib.sha256(record.canonical_json().encode()).hexdigest()
