"""Fault rebuilds asked for through the TRTEngine, the one owner of build Jobs. No I/O.

An InferenceDeployment that lost a GPU records a :class:`RebuildRequest` on the TRTEngine it serves
(one annotation per request, like a cert-manager Certificate asking through a CertificateRequest);
the TRTEngine's planner turns each into a rebuild Job, create-if-absent by its derived name. The
deployment never creates a Job itself, and takes its request back once the fault has recovered.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from trtforge_operator import children
from trtforge_operator.api import TRTEngine
from trtforge_operator.config import OperatorConfig
from trtforge_operator.observed import NodeView
from trtforge_operator.planning.keys import build_request, key_inputs

REBUILD_PREFIX = "rebuild.trtforge.io/"


class RebuildRequest(BaseModel):
    """One rebuild of one target's engine, asked for by one InferenceDeployment after one fault."""

    model_config = ConfigDict(frozen=True)
    requester: str  # the InferenceDeployment, `namespace/name`
    target: str  # GPUTarget.name
    engine_key: str  # the engine the fault made suspect
    fault: str  # the fault id (planning.faults.fault_id)
    avoid_nodes: tuple[str, ...] = ()

    def annotation(self) -> str:
        digest = hashlib.sha256(f"{self.requester}\n{self.fault}".encode()).hexdigest()[:16]
        return REBUILD_PREFIX + digest

    def value(self) -> str:
        return json.dumps(self.model_dump(mode="json"), sort_keys=True)


def requests_on(annotations: Mapping[str, str]) -> list[RebuildRequest]:
    """The rebuild requests recorded on a TRTEngine (malformed ones are ignored)."""
    out = []
    for k, v in sorted(annotations.items()):
        if not k.startswith(REBUILD_PREFIX):
            continue
        try:
            out.append(RebuildRequest.model_validate(json.loads(v)))
        except (ValueError, ValidationError):
            continue
    return out


def annotation_patch(
    requester: str, wanted: Sequence[RebuildRequest], annotations: Mapping[str, str]
) -> dict[str, str | None]:
    """The merge patch that makes `requester`'s requests on the engine exactly `wanted` (empty: none)."""
    patch: dict[str, str | None] = {r.annotation(): r.value() for r in wanted}
    for r in requests_on(annotations):
        if r.requester == requester and r.annotation() not in patch:
            patch[r.annotation()] = None
    return {k: v for k, v in patch.items() if annotations.get(k) != v}


def rebuild_job(
    engine: TRTEngine,
    nodes: Sequence[NodeView],
    cfg: OperatorConfig,
    req: RebuildRequest,
    *,
    cache_scope: str = "",
) -> dict[str, Any] | None:
    """The rebuild Job the TRTEngine creates for `req`; None when its target is no longer resolvable.

    It reads the staged copy of the model the namespace proved it holds (status.model), keyed in the
    namespace's cache scope: no tenant credentials, as for the first build (docs/security.md)."""
    target = next((t.target() for t in engine.status.targets if t.name == req.target), None)
    if target is None:
        return None
    verified = engine.status.model.sha256 if engine.status.model is not None else None
    if verified is None:  # the namespace has not proven it holds its current model: no build of it
        return None
    try:
        ki = key_inputs(engine.spec, target, nodes, cfg, model_sha256=verified, cache_scope=cache_scope)
    except ValueError:
        return None
    ns = engine.metadata.namespace or req.requester.split("/", 1)[0]
    build = build_request(
        engine.spec,
        ki,
        f"{ns}/{engine.metadata.name}",
        engine_key=req.engine_key,
        rebuild_of=req.fault,
        avoid_nodes=tuple(sorted(req.avoid_nodes)),
        verified_sha256=verified,
        cache_scope=cache_scope,
    )
    return children.build_job(build, cfg)
