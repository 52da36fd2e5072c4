"""LLM artefacts in the store: multi-file, content-addressed, committed by a manifest written last.

Three kinds (docs/llm.md §"Artefacts"): a quantized **checkpoint** per (source digest, recipe,
calibration), a **tuning cache** per (GPU product or MIG profile, tp x pp mapping, backend version,
checkpoint), and optional legacy **rank engines**. Each lives under ``<kind dir>/<key>/``; its
``manifest.json`` lists every file with its size and sha256 and is written last, so a folder without
one is absent. Files go under ``<kind dir>/<key>/<upload>/``, a random id per publishing attempt:
two writers racing on one key never overwrite each other's files, and the manifest that wins the
commit names the upload it describes.
"""

from __future__ import annotations

import enum
import hashlib
import json
import re
import time
from pathlib import PurePosixPath

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from trtforge.contract.gpu import FULL_GPU
from trtforge.contract.llm.recipe import Backend, Calibration, Parallelism, Recipe
from trtforge.contract.llm.tuning import TuningRecord

ARTEFACT_SCHEMA = "trtforge.io/llm-artefact/v1"
CHECKPOINT_KEY_SCHEMA = "trtforge.io/llm-checkpoint-key/v1"
TUNING_KEY_SCHEMA = "trtforge.io/llm-tuning-key/v1"
MANIFEST = "manifest.json"
HEX64 = re.compile(r"^[0-9a-f]{64}$")
UPLOAD_RE = re.compile(r"^[0-9a-f]{16}$")


class ArtefactKind(enum.StrEnum):
    CHECKPOINT = "checkpoint"
    TUNING_CACHE = "tuning-cache"
    RANK_ENGINES = "rank-engines"


# The store folder of each kind.
KIND_DIRS: dict[ArtefactKind, str] = {
    ArtefactKind.CHECKPOINT: "checkpoints",
    ArtefactKind.TUNING_CACHE: "tuning",
    ArtefactKind.RANK_ENGINES: "rank-engines",
}


class ArtefactFormat(enum.StrEnum):
    """How an artefact's files are laid out."""

    HF_SAFETENSORS = "hf-safetensors"  # ModelOpt export_hf_checkpoint: safetensors + hf_quant_config.json
    GGUF = "gguf"  # one llama.cpp GGUF file
    TUNING_RECORD = "tuning-record"  # tuning.json, plus the backend's own cache file where it has one
    TRT_ENGINES = "trt-engines"  # TensorRT-LLM <= 1.2.x: config.json + rank{N}.engine


def _check_key(key: str) -> str:
    if not HEX64.match(key):
        raise ValueError(f"artefact key {key!r} is not 64 lowercase hex characters")
    return key


def artefact_dir(kind: ArtefactKind, key: str) -> str:
    return f"{KIND_DIRS[kind]}/{_check_key(key)}"


def manifest_path(kind: ArtefactKind, key: str) -> str:
    return f"{artefact_dir(kind, key)}/{MANIFEST}"


def file_path(kind: ArtefactKind, key: str, upload: str, path: str) -> str:
    """Where one file of an artefact lives in the store."""
    if not UPLOAD_RE.match(upload):
        raise ValueError(f"upload id {upload!r} is not 16 lowercase hex characters")
    return f"{artefact_dir(kind, key)}/{upload}/{check_relative_path(path)}"


def check_relative_path(path: str) -> str:
    """A file path inside an artefact: relative, POSIX, no ``..``, not the manifest itself."""
    p = PurePosixPath(path)
    if (
        not path
        or "\\" in path
        or p.is_absolute()
        or any(part in ("", ".", "..") for part in path.split("/"))
    ):
        raise ValueError(
            f"artefact file path {path!r} must be relative, with '/' separators and no '.' or '..'"
        )
    if path == MANIFEST:
        raise ValueError(f"artefact file path {path!r} is reserved for the manifest")
    return path


class ArtefactFile(BaseModel):
    model_config = ConfigDict(defer_build=True, frozen=True)
    path: str
    size: int = Field(ge=0)
    sha256: str

    @field_validator("path")
    @classmethod
    def _path(cls, v: str) -> str:
        return check_relative_path(v)

    @field_validator("sha256")
    @classmethod
    def _sha(cls, v: str) -> str:
        if not HEX64.match(v):
            raise ValueError(f"sha256 {v!r} is not 64 lowercase hex characters")
        return v


class SourceRef(BaseModel):
    """The source model: where it came from and its digest (sha256 of the GGUF file, or of the
    checkpoint folder's sorted (path, sha256) list; see `folder_digest`)."""

    model_config = ConfigDict(defer_build=True, frozen=True)
    uri: str
    digest: str

    @field_validator("digest")
    @classmethod
    def _digest(cls, v: str) -> str:
        return _check_key(v)


class PerplexityGate(BaseModel):
    """The accuracy gate's figures: source and result perplexity on the same evaluation text."""

    model_config = ConfigDict(defer_build=True, frozen=True)
    evaluation_text: str  # its name
    evaluation_sha256: str
    context: int
    chunks: int | None = None  # chunks of `context` tokens evaluated; None: the whole text
    source: float
    result: float
    max_increase: float  # a fraction: 0.01 is 1%

    @property
    def increase(self) -> float:
        return self.result / self.source - 1.0

    @property
    def passed(self) -> bool:
        return self.increase <= self.max_increase

    def describe(self) -> str:
        return (
            f"perplexity {self.result:.4f} against the source's {self.source:.4f} "
            f"({self.increase:+.2%}; bound {self.max_increase:.2%})"
        )


class GoldenTokens(BaseModel):
    """The canary's greedy output at temperature 0: what a serving replica must reproduce before Ready."""

    model_config = ConfigDict(defer_build=True, frozen=True)
    prompt: str
    n_predict: int = Field(ge=1, le=512)
    tokens: list[int]
    text: str


def golden_request(prompt: str, n_predict: int) -> dict[str, object]:
    """The llama.cpp ``/completion`` body that yields `GoldenTokens`: greedy, fixed length, no cache
    reuse, token ids returned. The quantize step and the runtime's canary send exactly this."""
    return {
        "prompt": prompt,
        "n_predict": n_predict,
        "temperature": 0.0,
        "top_k": 1,
        "seed": 0,
        "cache_prompt": False,
        "ignore_eos": True,
        "return_tokens": True,
        "stream": False,
    }


def golden_mismatch(golden: GoldenTokens, tokens: list[int]) -> str | None:
    """None when a server's greedy tokens for the canary are the recorded ones; else where they part."""
    if tokens == golden.tokens:
        return None
    at = next((i for i, (a, b) in enumerate(zip(tokens, golden.tokens, strict=False)) if a != b), None)
    if at is None:
        return f"the canary gave {len(tokens)} tokens; the checkpoint recorded {len(golden.tokens)}"
    return (
        f"the canary's token {at} is {tokens[at]}; the checkpoint recorded {golden.tokens[at]} "
        f"(greedy, {golden.n_predict} tokens of {golden.prompt!r})"
    )


class CheckpointInfo(BaseModel):
    """What a checkpoint manifest records beyond its files."""

    model_config = ConfigDict(defer_build=True, frozen=True)
    source: SourceRef
    recipe: Recipe
    calibration: Calibration
    quantized_type: str  # what the backend wrote: a llama.cpp type ("Q8_0") or ModelOpt's quant_algo
    model_file: str  # the GGUF file, or the folder's config.json
    # The weights as written, read from the GGUF's tensor infos or the safetensors headers: the
    # operator checks each target's memory against them (docs/llm.md §"Recipes by GPU"). None: not
    # recorded (an older manifest); the operator then takes the files' total size.
    parameters: int | None = Field(default=None, ge=1)
    weight_bytes: int | None = Field(default=None, ge=0)
    accuracy: PerplexityGate | None = None
    golden: GoldenTokens | None = None


class ArtefactManifest(BaseModel):
    """The last file of every LLM artefact: its presence is the commit."""

    model_config = ConfigDict(defer_build=True, populate_by_name=True)
    schema_: str = Field(default=ARTEFACT_SCHEMA, alias="schema")
    kind: ArtefactKind
    key: str
    format: ArtefactFormat
    backend: Backend
    backend_version: str
    upload: str = Field(pattern=UPLOAD_RE.pattern)  # the folder under <kind dir>/<key>/ holding the files
    files: list[ArtefactFile]
    checkpoint: CheckpointInfo | None = None
    tuning: TuningRecord | None = None
    created_at: float = Field(default_factory=time.time)

    @field_validator("key")
    @classmethod
    def _key(cls, v: str) -> str:
        return _check_key(v)

    @model_validator(mode="after")
    def _consistent(self) -> ArtefactManifest:
        paths = [f.path for f in self.files]
        if len(set(paths)) != len(paths):
            dup = sorted({p for p in paths if paths.count(p) > 1})
            raise ValueError(f"artefact files listed twice: {', '.join(dup)}")
        if self.kind is ArtefactKind.CHECKPOINT and self.checkpoint is None:
            raise ValueError("a checkpoint manifest needs its checkpoint record")
        if self.kind is ArtefactKind.TUNING_CACHE and self.tuning is None:
            raise ValueError("a tuning-cache manifest needs its tuning record")
        return self

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def weight_bytes(self) -> int:
        """The bytes of a checkpoint's weights: as its record measured them, else all its files."""
        recorded = self.checkpoint.weight_bytes if self.checkpoint is not None else None
        return recorded if recorded is not None else self.total_bytes

    def file(self, path: str) -> ArtefactFile:
        for f in self.files:
            if f.path == path:
                return f
        raise KeyError(f"{path!r} is not a file of artefact {self.key}")

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True, indent=2)

    @classmethod
    def from_json(cls, text: str | bytes) -> ArtefactManifest:
        return cls.model_validate_json(text)


def _digest(doc: dict[str, object]) -> str:
    return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def folder_digest(files: list[ArtefactFile]) -> str:
    """The digest of a multi-file source: sha256 over its sorted (path, size, sha256) list."""
    return _digest({"files": sorted([f.path, f.size, f.sha256] for f in files)})


def checkpoint_key(
    source_digest: str,
    recipe: Recipe,
    calibration: Calibration,
    backend: Backend,
    gguf_type: str | None = None,
) -> str:
    """The checkpoint's key: the source digest, recipe, calibration and backend (a GGUF and a
    safetensors checkpoint differ), plus the llama.cpp type override where given. Not the parallelism."""
    return _digest(
        {
            "schema": CHECKPOINT_KEY_SCHEMA,
            "source": _check_key(source_digest),
            "recipe": recipe.value,
            "calibration": calibration.model_dump(mode="json"),
            "backend": backend.value,
            "gguf_type": gguf_type,
        }
    )


def tuning_key(
    gpu_product: str,
    mig_profile: str | None,
    parallelism: Parallelism,
    backend: Backend,
    backend_version: str,
    checkpoint: str,
) -> str:
    """The tuning cache's key: GPU product or MIG profile, tp x pp mapping, backend and its exact
    version, and the checkpoint it was measured with."""
    return _digest(
        {
            "schema": TUNING_KEY_SCHEMA,
            "gpu": gpu_product,
            "mig": mig_profile or FULL_GPU,
            "mapping": parallelism.mapping,
            "backend": backend.value,
            "version": backend_version,
            "checkpoint": _check_key(checkpoint),
        }
    )
