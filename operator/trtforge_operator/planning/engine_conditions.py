"""A TRTEngine's conditions and Events, derived from its targets' typed states. Pure.

Every reason here is an enum member chosen from `TargetState`s and outcome flags; messages are for
people and no decision reads them.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum

from trtforge_operator.api import Condition, TargetStatus, TRTEngineStatus, set_condition
from trtforge_operator.api.common import ConditionStatus
from trtforge_operator.planning.events import Event
from trtforge_operator.planning.rebuild import RefusedAsk
from trtforge_operator.planning.target import TargetOutcome
from trtforge_operator.planning.target_state import (
    ENTRY_EVENTS,
    FRESH_READY,
    STALLED_REASONS,
    RefusedTransition,
    TargetState,
    transition,
)
from trtforge_operator.planning.text import one_line, timestamp


class EngineReason(StrEnum):
    """Reasons of a TRTEngine's conditions that no target state names."""

    NO_TARGETS = "NoTargets"
    ALL_TARGETS_READY = "AllTargetsReady"
    TARGETS_NOT_READY = "TargetsNotReady"
    BUILD_RUNNING = "BuildRunning"
    UPDATING = "Updating"
    REBUILDING = "Rebuilding"
    IDLE = "Idle"
    BUILD_FAILED = "BuildFailed"
    AS_EXPECTED = "AsExpected"
    INVALID_SPEC = "InvalidSpec"
    INVALID_MODEL_SOURCE = "InvalidModelSource"
    REBUILD_REQUEST_REFUSED = "RebuildRequestRefused"


REBUILD_REQUESTS = "RebuildRequests"  # condition: whether the rebuild annotations are all accepted


def stalled_reason(states: Sequence[TargetState]) -> str:
    """The Stalled condition's reason: the first stalled target's own state where it names the cause
    (InvalidTarget, InvalidBuildInput, ModelVerifyFailed), else BuildRetriesExhausted."""
    return next((s.value for s in states if s in STALLED_REASONS), TargetState.BUILD_RETRIES_EXHAUSTED.value)


def engine_conditions(
    old: Sequence[Condition], generation: int, now: float, outcomes: Sequence[TargetOutcome]
) -> list[Condition]:
    """Ready, Building, Degraded and Stalled of an engine whose targets came out as `outcomes`."""
    gen, at = generation, timestamp(now)
    conds = list(old)
    n = len(outcomes)
    ready = [o for o in outcomes if o.state.serving]
    building = [o.status.name for o in outcomes if o.state.phase == "Building"]
    failed = [o.status for o in outcomes if o.state.phase == "Failed"]
    rebuilding = [o.status.name for o in outcomes if o.rebuilding or o.updating]
    rebuild_failed = [o.rebuild_failed for o in outcomes if o.rebuild_failed]
    stalled = [o for o in outcomes if o.stalled]

    def put(type_: str, status: ConditionStatus, reason: str, message: str) -> None:
        nonlocal conds
        conds = set_condition(conds, type_, status, reason, message, observed_generation=gen, at=at)

    if n == 0:
        put(
            "Ready",
            "False",
            EngineReason.NO_TARGETS,
            "no targets: list spec.targets, or enable autoTargets on a cluster with GPU nodes",
        )
    elif len(ready) == n:
        put("Ready", "True", EngineReason.ALL_TARGETS_READY, f"{n}/{n} targets ready")
    else:
        waiting = "; ".join(f"{o.status.name}: {o.state.phase}" for o in outcomes if not o.state.serving)
        put(
            "Ready",
            "False",
            EngineReason.TARGETS_NOT_READY,
            one_line(f"{len(ready)}/{n} targets ready; {waiting}", 1000),
        )
    if building or rebuilding:
        reason = (
            EngineReason.BUILD_RUNNING
            if building
            else EngineReason.UPDATING
            if any(o.updating for o in outcomes)
            else EngineReason.REBUILDING
        )
        put("Building", "True", reason, f"building: {', '.join(building + rebuilding)}")
    else:
        put("Building", "False", EngineReason.IDLE, "no build running")
    if failed or rebuild_failed:
        msgs = [f"{s.name}: {s.message}" for s in failed] + [m for m in rebuild_failed if m]
        put("Degraded", "True", EngineReason.BUILD_FAILED, one_line("; ".join(msgs), 1000))
    else:
        put("Degraded", "False", EngineReason.AS_EXPECTED, "")
    if stalled:
        put(
            "Stalled",
            "True",
            stalled_reason([o.state for o in stalled]),
            one_line("; ".join(f"{o.status.name}: {o.status.message}" for o in stalled), 1000),
        )
    else:
        put("Stalled", "False", EngineReason.AS_EXPECTED, "")
    return conds


def rebuild_requests_condition(
    conds: list[Condition],
    old: Sequence[Condition],
    generation: int,
    now: float,
    refused: Sequence[RefusedAsk],
) -> tuple[list[Condition], Event | None]:
    """The RebuildRequests condition: False with the refused annotations and what is expected, True
    once none is refused; absent while no annotation was ever refused. A Warning Event when the set of
    refused annotations changes (not on every pass)."""
    before = next((c for c in old if c.type == REBUILD_REQUESTS), None)
    if not refused:
        if before is None:
            return conds, None
        return set_condition(
            conds,
            REBUILD_REQUESTS,
            "True",
            EngineReason.AS_EXPECTED,
            "",
            observed_generation=generation,
            at=timestamp(now),
        ), None
    message = one_line("; ".join(r.message for r in refused), 1000)
    out = set_condition(
        conds,
        REBUILD_REQUESTS,
        "False",
        EngineReason.REBUILD_REQUEST_REFUSED,
        message,
        observed_generation=generation,
        at=timestamp(now),
    )
    changed = before is None or before.status != "False" or before.message != message
    return out, Event("Warning", EngineReason.REBUILD_REQUEST_REFUSED, message) if changed else None


def transition_events(
    old: Sequence[TargetStatus], outcomes: Sequence[TargetOutcome]
) -> tuple[list[Event], list[RefusedTransition]]:
    """Events for the targets' state changes (what `kubectl describe` shows), from the transition
    table; and the changes the table refuses (the plan still shows what was observed)."""
    before = {t.name: t for t in old}
    events: list[Event] = []
    refused: list[RefusedTransition] = []
    for o in outcomes:
        t = o.status
        p = before.get(t.name)
        prev = TargetState.of(p.reason) if p is not None else None
        try:
            entry = transition(t.name, prev, o.state)
        except RefusedTransition as e:
            refused.append(e)
            entry = ENTRY_EVENTS.get(o.state)
        if entry is None and p is not None and p.sha256 != t.sha256:
            entry = ENTRY_EVENTS.get(o.state)  # the same state with another engine: say so
        if entry is None:
            continue
        if o.state in FRESH_READY:
            how = "cache hit" if t.cache_hit else f"built in {t.build_seconds}s"
            if p is not None and p.phase == "Ready" and p.sha256 != t.sha256:
                how = "rebuilt engine published"
            message = f"{t.name}: engine {(t.engine_key or '')[:12]} ready ({how})"
        else:
            message = f"{t.name}: {t.message}"
        events.append(Event(entry.type, entry.reason, message))
    return events, refused


def invalid_spec_status(
    old: TRTEngineStatus,
    generation: int,
    message: str,
    now: float,
    *,
    reason: EngineReason = EngineReason.INVALID_SPEC,
) -> TRTEngineStatus:
    """Status of a TRTEngine whose spec the models refuse (the CRD of an old cluster lets it in), or
    whose model source is not allowed (`reason` InvalidModelSource)."""
    at = timestamp(now)
    conds = list(old.conditions)
    msg = one_line(message, 1000)
    conds = set_condition(conds, "Ready", "False", reason, msg, observed_generation=generation, at=at)
    conds = set_condition(
        conds, "Building", "False", EngineReason.IDLE, "", observed_generation=generation, at=at
    )
    conds = set_condition(
        conds, "Degraded", "False", EngineReason.AS_EXPECTED, "", observed_generation=generation, at=at
    )
    conds = set_condition(conds, "Stalled", "True", reason, msg, observed_generation=generation, at=at)
    return TRTEngineStatus(
        observed_generation=generation,
        conditions=conds,
        targets=list(old.targets),
        ready_targets=old.ready_targets,
    )
