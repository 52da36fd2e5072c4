"""Rebuilds of a TRTEngine's engines, the one owner of build Jobs: which ones, and their Jobs. No I/O.

Two causes, and the operator believes only its own records for either (docs/security.md):

- **A GPU fault the operator observed.** An InferenceDeployment records each fault it handled in its
  status (``status.faults``, written by the operator alone); a fault whose action asks for a rebuild
  and that has not recovered is a rebuild the TRTEngine it serves creates. The engine key is the one
  the TRTEngine's own status names for that target, and the nodes to avoid are the faulty nodes of
  those records that could host the target.
- **A rebuild the tenant asks for**, with an annotation on its own TRTEngine:
  ``rebuild.trtforge.io/<any name>: <target>``. The value names one of that TRTEngine's own targets and
  nothing else: the engine key comes from the TRTEngine's status and no node is avoided (the operator
  has observed no fault). Anything else there (another engine's key, nodes, a target the TRTEngine
  does not have) is refused, with the reason in the TRTEngine's status and an Event.

A fault rebuild is named by its fault (``-rb<fault id>``), an asked one by its annotation
(``-rq<hash>``): an ask can never take a fault rebuild's name, and a running asked rebuild never holds
a fault rebuild back (planning/engine.py).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from trtforge_operator.api import (
    FaultRecord,
    InferenceDeploymentStatus,
    TargetStatus,
    TRTEngineSpec,
    TRTEngineStatus,
)
from trtforge_operator.apply import children
from trtforge_operator.config import OperatorConfig
from trtforge_operator.observe.keys import key_inputs
from trtforge_operator.observe.views import JobView, NodeView, ObservedFaults
from trtforge_operator.planning import faults
from trtforge_operator.planning.keys import build_request
from trtforge_operator.planning.text import one_line

REBUILD_PREFIX = "rebuild.trtforge.io/"


class RebuildCause(StrEnum):
    FAULT = "fault"  # a GPU fault the operator observed under an InferenceDeployment's pod
    ASKED = "asked"  # the TRTEngine's own rebuild annotation


class RebuildRequest(BaseModel):
    """One rebuild of one target's engine, as the operator decided it from its own records."""

    model_config = ConfigDict(frozen=True)
    requester: str  # the InferenceDeployment (a fault) or the TRTEngine (an ask), `namespace/name`
    target: str  # GPUTarget.name
    engine_key: str  # the engine the TRTEngine's status names for the target
    fault: str  # the fault id (planning.faults.fault_id), or the ask's id
    avoid_nodes: tuple[str, ...] = ()
    cause: RebuildCause = RebuildCause.FAULT

    @property
    def job_name(self) -> str:
        return children.job_name(
            self.engine_key[:20], rebuild_of=self.fault, asked=self.cause is RebuildCause.ASKED
        )


class RefusedReason(StrEnum):
    NOT_A_TARGET = "NotATarget"  # the value names no target of this TRTEngine
    NAMES_ENGINE_KEY = "NamesEngineKey"  # a JSON request naming an engine key (and perhaps nodes)
    MALFORMED = "Malformed"  # JSON that is no request at all


@dataclass(frozen=True)
class RefusedAsk:
    annotation: str
    reason: RefusedReason
    message: str


@dataclass
class RebuildPlan:
    requests: list[RebuildRequest] = field(default_factory=list)
    refused: list[RefusedAsk] = field(default_factory=list)


def fault_rebuilds(
    requester: str,
    records: Sequence[FaultRecord],
    targets: Sequence[TargetStatus],
    nodes: Sequence[NodeView],
    now: float,
    ttl: float,
) -> list[RebuildRequest]:
    """The rebuilds an InferenceDeployment's recorded faults call for: one per unrecovered fault whose
    action asked for a rebuild, of the engine the TRTEngine's status names for its target, avoiding the
    faulty nodes that could host that target."""
    by_name = {t.name: t for t in targets}
    node_by_name = {n.name: n for n in nodes}
    avoid = faults.avoid_nodes(records, nodes, now, ttl)
    out = []
    for rec in records:
        if rec.action not in faults.REBUILD_ACTIONS or rec.recovered_seconds is not None:
            continue
        t = by_name.get(rec.target or "")
        if t is None or not t.engine_key:
            continue
        target = t.target()
        out.append(
            RebuildRequest(
                requester=requester,
                target=t.name,
                engine_key=t.engine_key,
                fault=faults.fault_id(rec),
                avoid_nodes=tuple(
                    sorted(n for n in avoid if n in node_by_name and node_by_name[n].hosts(target))
                ),
            )
        )
    return out


def holds_back(req: RebuildRequest, running: JobView) -> bool:
    """Whether the running rebuild Job `running` of the same engine holds back `req`: a fault's rebuild
    waits only for another fault's, never for one a tenant asked for; an ask waits for any rebuild."""
    if running.kind != "rebuild":
        return False
    return running.fault_rebuild or req.cause is RebuildCause.ASKED


def _expected(targets: Sequence[TargetStatus]) -> str:
    names = ", ".join(sorted(t.name for t in targets)) or "none yet"
    return (
        f"expected the name of one of this TRTEngine's targets ({names}); the engine key and the nodes "
        "to avoid come from the operator's own observation of a GPU fault"
    )


def _ask(
    key: str, value: str, engine: str, targets: Sequence[TargetStatus], from_faults: set[tuple[str, str]]
) -> RebuildRequest | RefusedAsk | None:
    """One rebuild annotation: the rebuild it asks for, why it is refused, or None (nothing to do)."""
    by_name = {t.name: t for t in targets}
    v = value.strip()
    if v.startswith("{"):
        try:
            raw: Any = json.loads(v)
        except ValueError:
            raw = None
        if not isinstance(raw, dict):
            return RefusedAsk(
                key, RefusedReason.MALFORMED, f"annotation {key}: not a target name; {_expected(targets)}"
            )
        if (str(raw.get("requester", "")), str(raw.get("fault", ""))) in from_faults:
            return None  # an earlier version's record of a fault the operator still observes: done above
        named = str(raw.get("engine_key") or "")
        what = f"names engine key {named[:16]}" if named else "is a JSON request"
        if raw.get("avoid_nodes"):
            what += " and nodes to avoid"
        return RefusedAsk(
            key, RefusedReason.NAMES_ENGINE_KEY, f"annotation {key}: {what}; {_expected(targets)}"
        )
    t = by_name.get(v)
    if t is None:
        shown = one_line(v, 64) or '""'
        return RefusedAsk(
            key,
            RefusedReason.NOT_A_TARGET,
            f"annotation {key}: {shown} is not a target; {_expected(targets)}",
        )
    if not t.engine_key:
        return None  # no engine of that target yet: its first build is under way, nothing to rebuild
    ask_id = children.short_hash(key, t.name, t.engine_key, n=8)
    return RebuildRequest(
        requester=engine, target=t.name, engine_key=t.engine_key, fault=ask_id, cause=RebuildCause.ASKED
    )


def plan_rebuilds(
    engine: str,
    targets: Sequence[TargetStatus],
    annotations: Mapping[str, str],
    observed: Sequence[ObservedFaults],
    nodes: Sequence[NodeView],
    now: float,
    ttl: float,
) -> RebuildPlan:
    """Every rebuild the TRTEngine `engine` (`namespace/name`) wants now, from the faults its own
    namespace's InferenceDeployments recorded (`observed`, only those that serve it) and from its own
    rebuild annotations; and the annotations it refuses."""
    ns = engine.partition("/")[0]
    plan = RebuildPlan()
    for o in observed:
        if o.requester.partition("/")[0] != ns:
            continue  # faults are observed per namespace: another namespace's records never count
        plan.requests.extend(fault_rebuilds(o.requester, o.records, targets, nodes, now, ttl))
    from_faults = {(r.requester, r.fault) for r in plan.requests}
    for key, value in sorted(annotations.items()):
        if not key.startswith(REBUILD_PREFIX):
            continue
        out = _ask(key, value, engine, targets, from_faults)
        if isinstance(out, RefusedAsk):
            plan.refused.append(out)
        elif out is not None and out.job_name not in {r.job_name for r in plan.requests}:
            plan.requests.append(out)
    return plan


def legacy_requests_on(annotations: Mapping[str, str]) -> list[tuple[str, str]]:
    """(annotation, requester) of the JSON rebuild records earlier versions wrote on a TRTEngine for
    an InferenceDeployment; each InferenceDeployment removes its own (no decision reads them)."""
    out = []
    for k, v in sorted(annotations.items()):
        if not k.startswith(REBUILD_PREFIX) or not v.strip().startswith("{"):
            continue
        try:
            raw = json.loads(v)
        except ValueError:
            continue
        if isinstance(raw, dict) and isinstance(raw.get("requester"), str):
            out.append((k, raw["requester"]))
    return out


def legacy_cleanup_patch(requester: str, annotations: Mapping[str, str]) -> dict[str, str | None]:
    """The merge patch that removes `requester`'s JSON rebuild records from a TRTEngine."""
    return {k: None for k, r in legacy_requests_on(annotations) if r == requester}


def rebuild_job(
    spec: TRTEngineSpec,
    status: TRTEngineStatus,
    engine: str,
    nodes: Sequence[NodeView],
    cfg: OperatorConfig,
    req: RebuildRequest,
    *,
    cache_scope: str = "",
) -> dict[str, Any] | None:
    """The rebuild Job the TRTEngine `engine` (`namespace/name`) creates for `req`; None when its
    target is no longer resolvable.

    It reads the staged copy of the model the namespace proved it holds (status.model), keyed in the
    namespace's cache scope: no tenant credentials, as for the first build (docs/security.md)."""
    target = next((t.target() for t in status.targets if t.name == req.target), None)
    if target is None:
        return None
    verified = status.model.sha256 if status.model is not None else None
    if verified is None:  # the namespace has not proven it holds its current model: no build of it
        return None
    try:
        ki = key_inputs(spec, target, nodes, cfg, model_sha256=verified, cache_scope=cache_scope)
    except ValueError:
        return None
    build = build_request(
        spec,
        ki,
        engine,
        engine_key=req.engine_key,
        rebuild_of=req.fault,
        rebuild_asked=req.cause is RebuildCause.ASKED,
        avoid_nodes=tuple(sorted(req.avoid_nodes)),
        verified_sha256=verified,
        cache_scope=cache_scope,
    )
    return children.build_job(build, cfg)


def parse_observed(requester: str, raw_status: Mapping[str, Any]) -> ObservedFaults | None:
    """An InferenceDeployment's recorded faults, from its status as the apiserver holds it (None: none
    recorded, or a status that does not validate)."""
    try:
        recs = InferenceDeploymentStatus.model_validate(raw_status or {}).faults
    except ValidationError:
        return None
    return ObservedFaults(requester, tuple(recs)) if recs else None
