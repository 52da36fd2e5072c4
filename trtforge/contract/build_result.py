"""What `trtforge build` reports when it ends: the result the operator reads, and the exit codes.

The builder prints one JSON object as its last stdout line and writes the same line to the
termination-message file (``$TRTFORGE_TERMINATION_LOG``, else ``/dev/termination-log`` when it
exists; see :mod:`trtforge.contract.termination`). It is either a :class:`BuildResult` (the engine
is in the store: built now, or found there) or a :class:`BuildFailure` (``{"error": ..., "reason":
...}``). Keys are camelCase, as in Kubernetes status. :func:`parse_build_message` reads either.

Exit codes of ``trtforge build`` (the reason in the message says the same, in words):

====  =======================  ==============================================================
code  reason                   meaning; what the operator should do
====  =======================  ==============================================================
0     (a BuildResult)          the engine is in the store (``cacheHit`` says whether it was built)
1     ``Error``                unexpected crash (a bug); retry with backoff
2     ``InvalidArgument``      bad command line or build settings; fix the spec, do not retry
80    ``StoreUnavailable``     the store could not be reached or refused an operation; retry
81    ``StoreIntegrity``       a stored entry is corrupt (junk manifest, engine file missing, wrong
                               size or sha256) and could not be rebuilt here; retry (a retry rebuilds)
82    ``GPUMismatch``          the GPU found is not the target (or none, or unhealthy); fix placement
90    ``ModelFetchFailed``     the model could not be downloaded or read; retry or fix the URI
91    ``ModelIntegrity``       the model's sha256 is not the pinned one; fix the pin or the model
92    ``InvalidModel``         the model is not a valid ONNX model (truncated, corrupt, unparsable)
93    ``InvalidProfile``       a shape profile does not fit the model (unknown input, rank, ranges,
                               a batch range on a model whose batch cannot be made dynamic)
94    ``BackendUnavailable``   the backend asked for is not installed in this image
95    ``BuildFailed``          the backend failed to build (e.g. an unsupported layer); see error
96    ``ValidationFailed``     the built artifact is outside tolerance of the fp32 reference;
                               nothing was published
97    ``Timeout``              the build ran past ``--timeout``; nothing was published
====  =======================  ==============================================================
"""

from __future__ import annotations

import json
from typing import Literal

from pydantic import AliasGenerator, BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from trtforge.contract.manifest import Accuracy

BUILD_RESULT_SCHEMA = "trtforge.io/build-result/v1"

FailureReason = Literal[
    "Error",
    "InvalidArgument",
    "StoreUnavailable",
    "StoreIntegrity",
    "GPUMismatch",
    "ModelFetchFailed",
    "ModelIntegrity",
    "InvalidModel",
    "InvalidProfile",
    "BackendUnavailable",
    "BuildFailed",
    "ValidationFailed",
    "Timeout",
    "ModelSourceRefused",  # a redirect the source does not allow (scheme, host, hop count)
    "UploadRefused",  # the engine broker refused a verify upload (not this Job's, not this digest)
    "ModelTooLarge",  # larger than the verification accepts
]

BUILD_EXIT_CODES: dict[FailureReason, int] = {
    "Error": 1,
    "InvalidArgument": 2,
    "StoreUnavailable": 80,
    "StoreIntegrity": 81,
    "GPUMismatch": 82,
    "ModelFetchFailed": 90,
    "ModelIntegrity": 91,
    "InvalidModel": 92,
    "InvalidProfile": 93,
    "BackendUnavailable": 94,
    "BuildFailed": 95,
    "ValidationFailed": 96,
    "Timeout": 97,
    "ModelSourceRefused": 98,
    "UploadRefused": 99,
    "ModelTooLarge": 100,
}
BUILD_REASON_BY_EXIT_CODE: dict[int, FailureReason] = {v: k for k, v in BUILD_EXIT_CODES.items()}

_CAMEL = ConfigDict(
    alias_generator=AliasGenerator(serialization_alias=to_camel, validation_alias=to_camel),
    populate_by_name=True,
    extra="ignore",
)


class BuildAccuracy(BaseModel):
    """The validation figures, as the operator shows them in ``status.targets[].accuracy``."""

    model_config = _CAMEL
    samples: int
    max_abs_error: float
    max_rel_error: float
    atol: float
    rtol: float
    passed: bool

    @classmethod
    def from_manifest(cls, a: Accuracy) -> BuildAccuracy:
        return cls(**a.model_dump())


class BuildResult(BaseModel):
    """The engine for one target is in the store."""

    model_config = _CAMEL
    schema_: str = Field(default=BUILD_RESULT_SCHEMA, alias="schema")
    key: str
    uri: str  # the engine file: `<store uri>/engines/<key>/<engine file>`
    manifest_uri: str
    sha256: str
    size_bytes: int
    backend: str
    backend_version: str  # what the builder really has: the operator learns it here, never guesses
    cuda: str = ""  # CUDA major.minor of the backend; "none" for CPU backends
    compute_capability: str  # "9.0"; "none" for CPU targets
    gpu: str  # GPU product label, or "cpu"
    mig: str | None = None
    build_seconds: float  # the build step alone (0 for a cache hit)
    total_seconds: float  # the whole run
    cache_hit: bool
    accuracy: BuildAccuracy | None = None
    # Another builder committed the same key first; this result describes the winner's engine.
    lost_race: bool = False
    request_key: str | None = None  # the operator's request this engine was filed under
    # The store held a corrupt entry under this key (why, in one line); this build replaced it.
    replaced_corrupt: str | None = None

    def to_line(self) -> str:
        return self.model_dump_json(by_alias=True, exclude_none=True)


class BuildFailure(BaseModel):
    """The build did not put an engine in the store; `error` is one line naming the cause."""

    model_config = _CAMEL
    error: str
    reason: FailureReason
    exit_code: int = 1
    key: str | None = None
    step: str | None = None  # which step failed: fetch-model, probe-gpu, build, validate, publish, ...

    def to_line(self) -> str:
        return self.model_dump_json(by_alias=True, exclude_none=True)


def parse_build_message(text: str) -> BuildResult | BuildFailure | None:
    """Read a builder's termination message (its last line); None when it is not one of ours."""
    text = text.strip()
    if not text:
        return None
    last = text.splitlines()[-1]
    try:
        data = json.loads(last)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    try:
        if "error" in data:
            return BuildFailure.model_validate(data)
        return BuildResult.model_validate(data)
    except ValueError:
        return None
