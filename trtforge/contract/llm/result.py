"""What `trtforge quantize` and `trtforge tune` report when they end: one JSON line on stdout and in
the termination message, read by the operator. A failure is a
:class:`~trtforge.contract.build_result.BuildFailure` with the exit codes of ``trtforge build``;
an accuracy-gate refusal is ``ValidationFailed`` (96) with both perplexities in ``perplexity``.
"""

from __future__ import annotations

import json
import re

from pydantic import AliasGenerator, BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from trtforge.contract.build_result import BuildFailure
from trtforge.contract.llm.artefact import GoldenTokens
from trtforge.contract.llm.recipe import Backend, Recipe

QUANTIZE_RESULT_SCHEMA = "trtforge.io/quantize-result/v1"
TUNE_RESULT_SCHEMA = "trtforge.io/tune-result/v1"

_CAMEL = ConfigDict(
    alias_generator=AliasGenerator(serialization_alias=to_camel, validation_alias=to_camel),
    populate_by_name=True,
    extra="ignore",
)


class PerplexityFigures(BaseModel):
    """The accuracy gate's figures as the status shows them."""

    model_config = _CAMEL
    source: float
    result: float
    increase: float  # a fraction: 0.012 is +1.2%
    max_increase: float


class QuantizeResult(BaseModel):
    """The checkpoint is in the store: quantized now, or found there."""

    model_config = _CAMEL
    schema_: str = Field(default=QUANTIZE_RESULT_SCHEMA, alias="schema")
    checkpoint_key: str
    manifest_uri: str
    backend: Backend
    backend_version: str
    recipe: Recipe
    quantized_type: str
    size_bytes: int
    cache_hit: bool
    perplexity: PerplexityFigures | None = None
    golden: GoldenTokens | None = None  # the manifest's own record, field names as there
    seconds: float

    def to_line(self) -> str:
        return self.model_dump_json(by_alias=True, exclude_none=True)


class QuantizeFailure(BuildFailure):
    """A quantize run that published nothing; `perplexity` is set when the accuracy gate refused."""

    perplexity: PerplexityFigures | None = None


class TuneResult(BaseModel):
    """The tuning cache for one target is in the store."""

    model_config = _CAMEL
    schema_: str = Field(default=TUNE_RESULT_SCHEMA, alias="schema")
    tuning_key: str
    manifest_uri: str
    checkpoint_key: str
    backend: Backend
    backend_version: str
    gpu: str
    mig: str | None = None
    mapping: str
    settings: dict[str, int | float | str]
    cache_hit: bool
    seconds: float

    def to_line(self) -> str:
        return self.model_dump_json(by_alias=True, exclude_none=True)


# llama.cpp prints `version: 7260 (2fa51c19)` (older) or `version: 0.5.0-dev (build 0, commit unknown)`.
_LLAMA_VERSION_RE = re.compile(r"version:\s*(\d+)\s*\(([^)\s]+)\)")
_LLAMA_SEMVER_RE = re.compile(r"version:\s*(\S+)\s*\(build\s*(\d+),\s*commit\s*([^)\s]+)\)")


def llama_cpp_version(version_output: str) -> str:
    """The version the tuning record holds and the runtime compares, from a llama.cpp tool's
    ``--version``: ``b7260-2fa51c19`` for ``version: 7260 (2fa51c19)``, ``0.5.0-dev-b0-unknown`` for
    ``version: 0.5.0-dev (build 0, commit unknown)`` (a build from a source tree without git, such as
    the llama-cpp-python sdist, has build 0 and no commit)."""
    m = _LLAMA_SEMVER_RE.search(version_output)
    if m is not None:
        return f"{m.group(1)}-b{m.group(2)}-{m.group(3)}"
    m = _LLAMA_VERSION_RE.search(version_output)
    if m is None:
        raise ValueError(f"no 'version: ...' line in llama.cpp's output: {version_output[:200]!r}")
    return f"b{m.group(1)}-{m.group(2)}"


def parse_llm_message(text: str) -> QuantizeResult | TuneResult | QuantizeFailure | None:
    """Read a quantize or tune Job's termination message (its last line); None when not one of ours."""
    lines = text.strip().splitlines()
    if not lines:
        return None
    try:
        data = json.loads(lines[-1])
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    try:
        if "error" in data:
            return QuantizeFailure.model_validate(data)
        if data.get("schema") == QUANTIZE_RESULT_SCHEMA:
            return QuantizeResult.model_validate(data)
        if data.get("schema") == TUNE_RESULT_SCHEMA:
            return TuneResult.model_validate(data)
    except ValueError:
        return None
    return None
