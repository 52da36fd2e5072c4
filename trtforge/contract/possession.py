"""Proof of possession and cache scopes: what lets a namespace use an engine from the shared store.

An engine key says *which model* an engine was built from (its sha256), so knowing a key is no proof
of holding the model. A namespace proves possession by streaming the model's bytes, read with its
own source and credentials, to the engine broker, which hashes them itself. The broker then records
a :class:`PossessionRecord` at ``possession/<namespace>/<source fingerprint>.json`` and keeps the
bytes, once per digest, at ``models/<sha256>/model.onnx`` (the staging area build Jobs read).

- The operator plans builds and cache hits for a TRTEngine only once a record exists for its
  namespace and its *current* model source (:func:`source_fingerprint`: URI, Secret name, pin). A
  changed source has another fingerprint, so it is verified again.
- The broker serves an engine's files to a namespace only when a record of that namespace holds the
  engine's model digest (``Manifest.model_sha256``) through the source its TRTEngine names now.

Cache scope: the store is shared according to the operator's ``cache.sharing`` policy. The key an
engine is stored under is :func:`scoped_key` of its engine key and the requesting namespace's scope
(``""`` for one cache across all namespaces, else ``ns:<namespace>`` or ``group:<label value>``), so
two scopes never see each other's engines, while one scope still builds each engine once. See
docs/security.md (threat model, rules 6 and 7).
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from trtforge.contract.layout import KEY_RE

POSSESSION = "possession"
MODELS = "models"
GRANTS = "verify-grants"
STAGED_MODEL_FILE = "model.onnx"
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
NAMESPACE_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
SCOPE_RE = re.compile(r"^(ns|group):[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


def source_fingerprint(uri: str, secret_name: str | None, pinned_sha256: str | None) -> str:
    """What a possession record is tied to: the model source as the TRTEngine names it now."""
    rec = {"uri": uri, "secret": secret_name or "", "pin": pinned_sha256 or ""}
    return hashlib.sha256(json.dumps(rec, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def possession_path(namespace: str, fingerprint: str) -> str:
    if not NAMESPACE_RE.match(namespace) or not SHA256_RE.match(fingerprint):
        raise ValueError(f"possession record of {namespace!r}/{fingerprint!r}: not a namespace/fingerprint")
    return f"{POSSESSION}/{namespace}/{fingerprint}.json"


def verify_grant_path(namespace: str, job: str) -> str:
    """Where the operator records the verify Job it created (what the broker lets upload)."""
    if not NAMESPACE_RE.match(namespace) or not NAMESPACE_RE.match(job):
        raise ValueError(f"verify grant of {namespace!r}/{job!r}: not a namespace/Job name")
    return f"{GRANTS}/{namespace}/{job}.json"


def staged_model_path(sha256: str) -> str:
    """Where the verified bytes of a model live in the store (read by build Jobs, read-only)."""
    if not SHA256_RE.match(sha256):
        raise ValueError(f"model digest {sha256!r} is not 64 lowercase hex characters")
    return f"{MODELS}/{sha256}/{STAGED_MODEL_FILE}"


class PossessionRecord(BaseModel):
    """A namespace held a model with this digest, read through this source, at `verified_at`."""

    model_config = ConfigDict(extra="ignore")
    namespace: str
    fingerprint: str
    sha256: str
    size_bytes: int
    uri: str
    secret: str = ""
    pod: str = ""  # the verify pod that streamed the bytes (from its token)
    verified_at: float = Field(default_factory=time.time)

    def to_json(self) -> str:
        return self.model_dump_json(indent=2)

    @classmethod
    def from_json(cls, text: str | bytes) -> PossessionRecord:
        return cls.model_validate_json(text)

    def proves(self, namespace: str, fingerprint: str, sha256: str | None = None) -> bool:
        """This record is for `namespace` through `fingerprint` (and, if given, of model `sha256`)."""
        return (
            self.namespace == namespace
            and self.fingerprint == fingerprint
            and (sha256 is None or self.sha256 == sha256)
        )


class VerifyGrant(BaseModel):
    """The operator created verify Job `job` (uid `job_uid`) in `namespace` to read this source.

    Written by the operator right after it creates the Job, read by the broker: only a pod whose
    controller is that very Job (by uid) may upload, only once, at most `max_bytes`, and only the
    pinned digest when the source pins one. The possession record's source is this grant's, never
    anything the uploader says. A tenant can create Jobs with any labels in its own namespace, but
    not this record (docs/security.md)."""

    model_config = ConfigDict(extra="ignore")
    namespace: str
    job: str
    job_uid: str
    engine: str
    fingerprint: str
    uri: str
    secret: str = ""
    pin: str = ""
    max_bytes: int
    image: str  # what the Job's one container runs: the builder image and its stage-model command line
    command: list[str]
    # The rest of the verify pod as the operator rendered it (the broker matches the uploading pod's).
    env: list[dict[str, Any]] = Field(default_factory=list)
    env_from: list[dict[str, Any]] = Field(default_factory=list)
    volume_mounts: list[dict[str, Any]] = Field(default_factory=list)
    volumes: list[dict[str, Any]] = Field(default_factory=list)
    format: Literal["onnx", "safetensors", "gguf"] = "onnx"  # what the bytes must be (checked as they stream)
    issued_at: float = Field(default_factory=time.time)
    expires_at: float

    def to_json(self) -> str:
        return self.model_dump_json(indent=2)

    @classmethod
    def from_json(cls, text: str | bytes) -> VerifyGrant:
        return cls.model_validate_json(text)


def scoped_key(engine_key: str, scope: str) -> str:
    """The store key of an engine in a cache scope; the engine key itself for the shared scope ``""``."""
    if not KEY_RE.match(engine_key):
        raise ValueError(f"engine key {engine_key!r} is not 64 lowercase hex characters")
    if scope == "":
        return engine_key
    if not SCOPE_RE.match(scope):
        raise ValueError(f"cache scope {scope!r} is not '', 'ns:<namespace>' or 'group:<name>'")
    return hashlib.sha256(f"trtforge.io/cache-scope/v1\x00{scope}\x00{engine_key}".encode()).hexdigest()
