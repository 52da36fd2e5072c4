"""GPU fault detection, node avoidance and recovery bookkeeping for InferenceDeployments. No I/O.
Why the operator moves pods itself after an Xid: docs/design.md §"GPU faults".

Signals: a runtime container that ended with the GPU-fault exit code or a ``GPUFault`` termination
message (Xid and GPU uuid inside); a runtime that could not load its engine (``EngineLoadFailed``,
``GPUMismatch``, ``EngineIntegrity``: rebuild for that node's identity, the node is not suspect); a
Node hosting our pods whose GPUs look unhealthy (allocatable below capacity, a GPU-health taint or
condition, NotReady). Every fault is recorded once in ``status.faults``; the nodes of GPU faults are
avoided (a nodeAffinity NotIn on the pod template) while they stay unhealthy or for a TTL.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from trtforge.contract.termination import EXIT_GPU_FAULT
from trtforge_operator.api import FaultRecord
from trtforge_operator.api.inferencedeployment import NodeProblem
from trtforge_operator.apply import children
from trtforge_operator.labels import LABEL_TARGET
from trtforge_operator.observe.views import NodeView, PodView, utc

GPU_FAULT = "GPUFault"
LOAD_FAILURES = frozenset({"EngineLoadFailed", "GPUMismatch", "EngineIntegrity"})
# Node-level faults whose pod later reports the Xid itself (a NotReady node's pods never report).
ENRICHED_BY_POD = frozenset(
    {NodeProblem.GPU_HEALTH_TAINT, NodeProblem.NODE_CONDITION, NodeProblem.ALLOCATABLE_DROPPED}
)


class FaultAction(StrEnum):
    """What the operator did about a fault, as status.faults[].action records it."""

    MOVED = "PodMoved"
    MOVED_REBUILD = "PodMovedAndRebuild"
    MOVED_RATE_LIMITED = "PodMovedRebuildRateLimited"
    MOVED_REBUILD_DISABLED = "PodMovedRebuildDisabled"
    MOVED_NO_ENGINE_KEY = "PodMovedNoEngineKey"
    REBUILD = "Rebuild"
    REBUILD_RATE_LIMITED = "RebuildRateLimited"
    REBUILD_DISABLED = "RebuildDisabled"
    NO_ENGINE_KEY = "NoEngineKey"


REBUILD_ACTIONS = frozenset({FaultAction.MOVED_REBUILD, FaultAction.REBUILD})


def fault_action(
    *, node_suspect: bool, rebuild_enabled: bool, has_engine: bool, rate_limited: bool
) -> FaultAction:
    """The action for a new fault, from a table: whether its node is suspect (the pod moves), whether
    the policy allows a rebuild, whether there is an engine (key) to rebuild, and the hourly limit."""
    if not rebuild_enabled:
        return FaultAction.MOVED_REBUILD_DISABLED if node_suspect else FaultAction.REBUILD_DISABLED
    if not has_engine:
        return FaultAction.MOVED_NO_ENGINE_KEY if node_suspect else FaultAction.NO_ENGINE_KEY
    if rate_limited:
        return FaultAction.MOVED_RATE_LIMITED if node_suspect else FaultAction.REBUILD_RATE_LIMITED
    return FaultAction.MOVED_REBUILD if node_suspect else FaultAction.REBUILD


@dataclass(frozen=True)
class DetectedFault:
    record: FaultRecord
    node_suspect: bool  # a GPU fault (the node is avoided) vs. a load failure (only a rebuild)


def fault_id(rec: FaultRecord) -> str:
    """Stable id of a recorded fault; names its rebuild Job."""
    return children.short_hash(
        rec.pod or "", rec.node or "", rec.target or "", rec.time.strftime("%Y-%m-%dT%H:%M:%SZ"), n=8
    )


def is_gpu_fault(rec: FaultRecord) -> bool:
    return rec.reason is None or rec.reason not in LOAD_FAILURES


def detect_pod_faults(
    pods: Sequence[PodView], known: Sequence[FaultRecord], now: float
) -> list[DetectedFault]:
    """New faults reported by our runtime pods' terminations (one record per pod)."""
    seen = {f.pod for f in known if f.pod}
    out: list[DetectedFault] = []
    for p in pods:
        if p.name in seen:
            continue
        for t in p.terminations():
            reason = t.trtforge_reason()
            if t.exit_code == EXIT_GPU_FAULT:
                reason = GPU_FAULT
            if reason != GPU_FAULT and reason not in LOAD_FAILURES:
                continue
            msg = t.termination()
            rec = FaultRecord(
                time=utc(t.finished_at or now),
                pod=p.name,
                node=p.node,
                gpu=(msg.gpu if msg else None),
                target=p.labels.get(LABEL_TARGET),
                xid=(msg.xid if msg else None),
                reason=None if reason == GPU_FAULT and msg and msg.xid is not None else reason,
                action=FaultAction.MOVED.value,
            )
            out.append(DetectedFault(rec, node_suspect=reason == GPU_FAULT))
            seen.add(p.name)
            break
    return out


def enrich_from_pods(records: list[FaultRecord], pods: Sequence[PodView]) -> list[FaultRecord]:
    """A node-level record learns the Xid and GPU once the pod's own termination message arrives."""
    by_pod = {p.name: p for p in pods}
    out = []
    for r in records:
        p = by_pod.get(r.pod or "")
        if p is not None and r.xid is None and r.node_problem in ENRICHED_BY_POD:
            for t in p.terminations():
                msg = t.termination()
                if msg is not None and msg.reason == GPU_FAULT and msg.xid is not None:
                    r = r.model_copy(update={"xid": msg.xid, "gpu": msg.gpu, "reason": None})
                    break
        out.append(r)
    return out


def detect_node_faults(
    pods: Sequence[PodView], nodes: Sequence[NodeView], known: Sequence[FaultRecord], now: float, ttl: float
) -> list[DetectedFault]:
    """Nodes hosting our (live) pods whose GPUs look unhealthy and that no recent record names yet."""
    recent = {f.node for f in known if f.node and now - f.time.timestamp() < ttl}
    by_node = {n.name: n for n in nodes}
    out: list[DetectedFault] = []
    for p in sorted(pods, key=lambda p: p.name):
        if not p.node or p.deleting or p.node in recent:
            continue
        node = by_node.get(p.node)
        problem = node.gpu_problem() if node is not None else None
        if problem is None:
            continue
        out.append(
            DetectedFault(
                FaultRecord(
                    time=utc(now),
                    pod=p.name,
                    node=p.node,
                    target=p.labels.get(LABEL_TARGET),
                    reason=str(problem),
                    node_problem=problem.kind,
                    action=FaultAction.MOVED.value,
                ),
                node_suspect=True,
            )
        )
        recent.add(p.node)
    return out


def avoid_nodes(
    records: Iterable[FaultRecord], nodes: Sequence[NodeView], now: float, ttl: float
) -> set[str]:
    """Nodes of GPU faults, kept out while the TTL runs or while the node still looks unhealthy."""
    unhealthy = {n.name for n in nodes if n.gpu_problem() is not None}
    out = set()
    for r in records:
        if r.node and is_gpu_fault(r) and (now - r.time.timestamp() < ttl or r.node in unhealthy):
            out.add(r.node)
    return out


def rebuilds_in_last_hour(records: Iterable[FaultRecord], target: str, now: float) -> int:
    return sum(
        1
        for r in records
        if r.target == target and r.action in REBUILD_ACTIONS and now - r.time.timestamp() < 3600
    )
