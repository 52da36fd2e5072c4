"""The one small interface every build backend implements."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from trtforge.contract.engine_key import Backend as BackendName
from trtforge.contract.engine_key import BuildConfig, ShapeRange
from trtforge.contract.manifest import TensorSpec
from trtforge_builder.onnx_model import ModelIO


@dataclass
class BuildInputs:
    model_path: Path  # the prepared fp32 ONNX model (batch made symbolic if asked)
    source: str  # the model URI, for messages
    config: BuildConfig  # as in the engine key
    profiles: tuple[dict[str, ShapeRange], ...]  # complete: every input in every profile
    io: ModelIO
    workdir: Path
    timing_cache: bytes | None = None  # from the store, when the backend uses one


@dataclass
class BuildOutput:
    artifact: Path
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    layers: dict[str, int] = field(default_factory=dict)  # layer/op type -> count
    timing_cache: bytes | None = None  # to save (merged with what was loaded)


class Runner(Protocol):
    """Runs a built artifact on one sample (inputs by name -> outputs by name)."""

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]: ...

    def close(self) -> None: ...


class BuildBackend(Protocol):
    @property
    def name(self) -> BackendName: ...

    version: str  # exact version: part of the engine key
    cuda: str  # CUDA major.minor the backend runs on; "none" for CPU
    artifact_suffix: str  # the engine file's extension (".plan", ".onnx")
    uses_timing_cache: bool

    def build(self, inp: BuildInputs) -> BuildOutput:
        """Build the artifact; BuildError(reason BuildFailed or InvalidModel) on failure."""
        ...

    def load(self, artifact: Path, inp: BuildInputs) -> Runner:
        """Load a built artifact for validation."""
        ...

    def merge_timing_caches(self, ours: bytes, theirs: bytes) -> bytes:
        """Combine our cache with one another builder saved meanwhile."""
        ...
