"""The target state machine: every allowed transition, a refused one, and what the states decide."""

from __future__ import annotations

import pytest
from trtforge_operator.api import TargetStatus, get_condition
from trtforge_operator.planning.engine_conditions import engine_conditions, stalled_reason, transition_events
from trtforge_operator.planning.target import TargetOutcome
from trtforge_operator.planning.target_state import (
    ALLOWED,
    ENTRY_EVENTS,
    KEEPS_SERVING,
    READY,
    RefusedTransition,
    TargetState,
    transition,
)

S = TargetState
# In one order in every process (pytest-xdist workers must collect the same tests in the same order).
ALLOWED_PAIRS = [
    (before, after)
    for before, afters in sorted(ALLOWED.items(), key=lambda row: "" if row[0] is None else str(row[0]))
    for after in sorted(afters)
]


def test_every_state_has_a_row_and_a_phase() -> None:
    assert set(ALLOWED) == {None, *TargetState}
    assert {s.phase for s in TargetState} == {"Pending", "Building", "Failed", "Ready"}


@pytest.mark.parametrize(("before", "after"), ALLOWED_PAIRS, ids=lambda s: str(s))
def test_every_allowed_transition_is_accepted(before: TargetState | None, after: TargetState) -> None:
    event = transition("h100", before, after)
    if before == after:
        assert event is None  # staying posts nothing
    else:
        assert event == ENTRY_EVENTS.get(after)


@pytest.mark.parametrize("before", [None, *sorted(set(TargetState) - READY)], ids=lambda s: str(s))
@pytest.mark.parametrize("after", sorted(KEEPS_SERVING), ids=str)
def test_keeping_an_engine_serving_that_never_served_is_refused(
    before: TargetState | None, after: TargetState
) -> None:
    with pytest.raises(RefusedTransition) as e:
        transition("h100", before, after)
    assert (e.value.before, e.value.after, e.value.target) == (before, after, "h100")
    assert "h100" in str(e.value) and str(after) in str(e.value)


def test_a_refused_transition_is_reported_and_the_observed_state_still_shows() -> None:
    old = [TargetStatus(name="h100", gpu="NVIDIA-H100-80GB-HBM3", phase="Pending", reason="Queued")]
    out = TargetOutcome(TargetStatus(name="h100", gpu="NVIDIA-H100-80GB-HBM3"))
    out.enter(S.UPDATING, "engine abc keeps serving")
    events, refused = transition_events(old, [out])
    assert [(r.before, r.after) for r in refused] == [(S.QUEUED, S.UPDATING)]
    assert [(e.type, e.reason) for e in events] == [("Normal", "EngineUpdating")]
    assert out.status.phase == "Ready" and out.status.reason == "Updating"


def test_an_unknown_stored_reason_counts_as_no_state() -> None:
    assert TargetState.of("SomethingAnOlderOperatorWrote") is None
    assert TargetState.of(None) is None
    assert TargetState.of("BuildRunning") is S.BUILD_RUNNING


def test_entering_a_state_sets_phase_reason_and_stall() -> None:
    out = TargetOutcome(TargetStatus(name="h100", gpu="NVIDIA-H100-80GB-HBM3"))
    out.enter(S.BUILD_RETRIES_EXHAUSTED, "attempt 3/3 failed")
    assert (out.status.phase, out.status.reason, out.stalled) == ("Failed", "BuildRetriesExhausted", True)
    verify = TargetOutcome(TargetStatus(name="h100", gpu="NVIDIA-H100-80GB-HBM3"))
    verify.enter(S.MODEL_VERIFY_FAILED, "retrying")  # stalls only when the planner says so
    assert verify.stalled is False


def test_conditions_come_from_states_not_from_messages() -> None:
    a = TargetOutcome(TargetStatus(name="a", gpu="NVIDIA-H100-80GB-HBM3"))
    a.enter(S.INVALID_BUILD_INPUT, "engine failed: InvalidModel")  # a message that reads like another state
    b = TargetOutcome(TargetStatus(name="b", gpu="NVIDIA-H100-80GB-HBM3"))
    b.enter(S.CACHE_HIT, "BuildFailed BuildRetriesExhausted")
    conds = engine_conditions([], 1, 1_800_000_000.0, [a, b])
    stalled, ready, degraded = (get_condition(conds, t) for t in ("Stalled", "Ready", "Degraded"))
    assert stalled is not None and (stalled.status, stalled.reason) == ("True", "InvalidBuildInput")
    assert ready is not None and (ready.status, ready.reason) == ("False", "TargetsNotReady")
    assert degraded is not None and degraded.reason == "BuildFailed"
    assert stalled_reason([S.BUILD_RETRIES_EXHAUSTED, S.INVALID_TARGET]) == "InvalidTarget"
    assert stalled_reason([S.MODEL_VERIFY_FAILED, S.INVALID_BUILD_INPUT]) == "ModelVerifyFailed"
    assert stalled_reason([S.BUILD_RETRIES_EXHAUSTED]) == "BuildRetriesExhausted"
