"""The engine manifest: written last into `engines/<key>/`, its presence is the commit (docs/design.md
§"Store and engine broker")."""

from __future__ import annotations

import time

from pydantic import BaseModel, ConfigDict, Field

from trtforge.contract.engine_key import Backend, BuildConfig
from trtforge.contract.gpu import GPUIdentity

MANIFEST_SCHEMA = "trtforge.io/manifest/v1"


class TensorSpec(BaseModel):
    """One IO tensor: dims are -1 where dynamic; the profile gives their ranges."""

    model_config = ConfigDict(defer_build=True)

    name: str
    dtype: str  # numpy dtype name, e.g. "float32"
    shape: list[int]


class Accuracy(BaseModel):
    """The built artifact against an fp32 ONNX Runtime reference on the same inputs."""

    model_config = ConfigDict(defer_build=True)

    samples: int
    max_abs_error: float
    max_rel_error: float
    atol: float
    rtol: float
    passed: bool


class CanaryRef(BaseModel):
    """Reference inputs and outputs (an .npz in the engine directory) the runtime replays before Ready."""

    model_config = ConfigDict(defer_build=True)

    file: str
    sha256: str
    atol: float
    rtol: float


class Manifest(BaseModel):
    model_config = ConfigDict(defer_build=True, populate_by_name=True)
    schema_: str = Field(default=MANIFEST_SCHEMA, alias="schema")
    key: str
    engine_file: str  # file name inside engines/<key>/
    sha256: str
    size_bytes: int
    backend: Backend
    backend_version: str
    cuda: str
    gpu: GPUIdentity  # the build device as the builder's probe saw it (NVML on a real GPU)
    build: BuildConfig
    model_uri: str
    model_sha256: str
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    build_seconds: float
    accuracy: Accuracy
    canary: CanaryRef
    created_at: float = Field(default_factory=time.time)
    builder_host: str = ""
    layers: dict[str, int] = Field(default_factory=dict)  # layer type -> count (TensorRT inspector)
    # The builder recipe (trtforge.contract.engine_key.RECIPE_VERSION); manifests from before it was
    # recorded count as recipe 1.
    recipe: int = 1

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True, indent=2)

    @classmethod
    def from_json(cls, text: str | bytes) -> Manifest:
        return cls.model_validate_json(text)
