"""The state of one TRTEngine target, as a typed outcome (docs/design.md §"Target states"). Pure.

Each state fixes the target's phase and status reason, whether it stalls the engine, and the Event a
target entering it posts. `transition` checks a change against an explicit table and refuses one the
planner can never make (`RefusedTransition`). Reconciles are level-based: a pass sees the world as it
is now, not every step in between, so the table allows any state the world can jump to, and refuses
only what no observation can explain: keeping an engine serving (Updating, UpdateFailed) when there
was none serving before.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from trtforge_operator.api.trtengine import TargetPhase


class TargetState(StrEnum):
    """Where one target stands; the value is the status reason `kubectl` shows."""

    # Pending: no build for it yet
    VERIFYING_MODEL = "VerifyingModel"  # the namespace has not proven it holds the model yet
    NO_MATCHING_NODE = "NoMatchingNode"
    QUEUED = "Queued"  # waiting for a build slot
    # Building
    BUILD_STARTING = "BuildStarting"
    BUILD_RETRYING = "BuildRetrying"
    BUILD_RUNNING = "BuildRunning"
    WAITING_FOR_GPU = "WaitingForGPU"  # the build pod cannot be scheduled
    COLLECTING_RESULT = "CollectingResult"  # the Job finished; its result is not on it yet
    # Failed
    BUILD_FAILED = "BuildFailed"  # an attempt failed; the next waits for its backoff
    MODEL_VERIFY_FAILED = "ModelVerifyFailed"
    INVALID_BUILD_INPUT = "InvalidBuildInput"  # retrying cannot help
    BUILD_RETRIES_EXHAUSTED = "BuildRetriesExhausted"
    INVALID_TARGET = "InvalidTarget"
    # Ready: an engine serves
    CACHE_HIT = "CacheHit"
    BUILT = "Built"
    REBUILDING = "Rebuilding"  # a fault rebuild runs; the current engine keeps serving
    UPDATING = "Updating"  # a changed request builds; the previous engine keeps serving
    UPDATE_FAILED = "UpdateFailed"  # the changed request failed; the previous engine keeps serving

    @property
    def phase(self) -> TargetPhase:
        return PHASE[self]

    @property
    def serving(self) -> bool:
        return PHASE[self] == "Ready"

    @classmethod
    def of(cls, reason: str | None) -> TargetState | None:
        """The state a stored status reason names; None for none or one this version does not know."""
        try:
            return cls(reason) if reason else None
        except ValueError:
            return None


S = TargetState
PENDING = frozenset({S.VERIFYING_MODEL, S.NO_MATCHING_NODE, S.QUEUED})
BUILDING = frozenset(
    {S.BUILD_STARTING, S.BUILD_RETRYING, S.BUILD_RUNNING, S.WAITING_FOR_GPU, S.COLLECTING_RESULT}
)
FAILED = frozenset(
    {
        S.BUILD_FAILED,
        S.MODEL_VERIFY_FAILED,
        S.INVALID_BUILD_INPUT,
        S.BUILD_RETRIES_EXHAUSTED,
        S.INVALID_TARGET,
    }
)
FRESH_READY = frozenset({S.CACHE_HIT, S.BUILT, S.REBUILDING})  # an engine of the current request
KEEPS_SERVING = frozenset({S.UPDATING, S.UPDATE_FAILED})  # the previous request's engine
READY = FRESH_READY | KEEPS_SERVING


def _phases(states: frozenset[TargetState], phase: TargetPhase) -> dict[TargetState, TargetPhase]:
    return dict.fromkeys(states, phase)


PHASE: dict[TargetState, TargetPhase] = (
    _phases(PENDING, "Pending")
    | _phases(BUILDING, "Building")
    | _phases(FAILED, "Failed")
    | _phases(READY, "Ready")
)

# States that stop the engine until its spec changes (Stalled=True). ModelVerifyFailed stalls only
# once its retries are spent: the planner says so per outcome.
ALWAYS_STALLED = frozenset({S.INVALID_BUILD_INPUT, S.BUILD_RETRIES_EXHAUSTED, S.INVALID_TARGET})
# Stalling states that name their cause in the Stalled condition; any other is BuildRetriesExhausted.
STALLED_REASONS: tuple[TargetState, ...] = (S.INVALID_TARGET, S.INVALID_BUILD_INPUT, S.MODEL_VERIFY_FAILED)

# The transition table: from a state (None: no state recorded yet) to the states a pass may find next.
_NOT_SERVING_YET = PENDING | BUILDING | FAILED | FRESH_READY
ALLOWED: dict[TargetState | None, frozenset[TargetState]] = {
    None: _NOT_SERVING_YET,
    **{s: _NOT_SERVING_YET for s in PENDING},
    **{s: _NOT_SERVING_YET for s in BUILDING},
    **{s: _NOT_SERVING_YET for s in FAILED},
    **{s: _NOT_SERVING_YET | KEEPS_SERVING for s in READY},
}


@dataclass(frozen=True)
class EntryEvent:
    """The Event a target posts when it enters a state."""

    type: str  # Normal | Warning
    reason: str


ENTRY_EVENTS: dict[TargetState, EntryEvent] = {
    S.NO_MATCHING_NODE: EntryEvent("Normal", "NoMatchingNode"),
    S.QUEUED: EntryEvent("Normal", "Queued"),
    S.BUILD_STARTING: EntryEvent("Normal", "BuildStarted"),
    S.BUILD_RETRYING: EntryEvent("Normal", "BuildStarted"),
    **{s: EntryEvent("Warning", s.value) for s in FAILED},
    **{s: EntryEvent("Normal", "EngineReady") for s in FRESH_READY},
    S.UPDATING: EntryEvent("Normal", "EngineUpdating"),
    S.UPDATE_FAILED: EntryEvent("Warning", "UpdateFailed"),
}


class RefusedTransition(ValueError):
    """A target state change the transition table does not allow (a planner bug, never user input)."""

    def __init__(self, target: str, before: TargetState | None, after: TargetState) -> None:
        self.target, self.before, self.after = target, before, after
        allowed = ", ".join(sorted(ALLOWED[before]))
        super().__init__(
            f"target {target}: {before or 'no state'} -> {after} is not allowed (allowed: {allowed})"
        )


def transition(target: str, before: TargetState | None, after: TargetState) -> EntryEvent | None:
    """The Event of moving `target` from `before` to `after` (None when it stays); raises
    RefusedTransition when the table does not allow the move."""
    if after not in ALLOWED[before]:
        raise RefusedTransition(target, before, after)
    if before == after:
        return None
    return ENTRY_EVENTS.get(after)
