"""The LLM supervisor's readiness, liveness and abort decisions (trtforge_runtime.llm.probes)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from trtforge_runtime.llm.probes import (
    Action,
    Cause,
    Health,
    Observation,
    Policy,
    decide,
    next_unhealthy_since,
    ready,
)

POLICY = Policy(unavailable_grace_s=30.0, start_limit_s=600.0)
UP = Observation(
    now=100.0,
    started_at=0.0,
    process_alive=True,
    exit_code=None,
    health=Health.UP,
    unhealthy_since=None,
    ever_up=True,
    canary_passed=True,
)


def test_ready_needs_health_and_the_canary() -> None:
    assert ready(Health.UP, True)
    assert not ready(Health.UP, False)
    for h in (Health.STARTING, Health.UNAVAILABLE, Health.DOWN, Health.ERROR):
        assert not ready(h, True)


def test_up_with_a_passed_canary_is_ready_and_live() -> None:
    v = decide(UP, POLICY)
    assert (v.ready, v.live, v.action) == (True, True, Action.WAIT)


def test_a_failed_canary_keeps_the_pod_live_but_not_ready() -> None:
    v = decide(replace(UP, canary_passed=False), POLICY)
    assert (v.ready, v.live, v.action) == (False, True, Action.WAIT)


def test_starting_within_the_start_limit_waits() -> None:
    obs = replace(UP, health=Health.STARTING, ever_up=False, now=599.0)
    v = decide(obs, POLICY)
    assert (v.ready, v.live, v.action) == (False, True, Action.WAIT)


def test_never_healthy_past_the_start_limit_aborts() -> None:
    obs = replace(UP, health=Health.STARTING, ever_up=False, now=601.0)
    v = decide(obs, POLICY)
    assert (v.live, v.action, v.cause) == (False, Action.ABORT, Cause.START_TIMEOUT)
    assert "601 s" in v.detail and "starting" in v.detail


def test_a_dead_server_process_aborts_at_once() -> None:
    v = decide(replace(UP, process_alive=False, exit_code=-9), POLICY)
    assert (v.ready, v.live, v.action, v.cause) == (False, False, Action.ABORT, Cause.SERVER_EXITED)
    assert "-9" in v.detail


def test_503_after_being_up_is_tolerated_for_the_grace_period() -> None:
    obs = replace(UP, health=Health.UNAVAILABLE, unhealthy_since=80.0, now=110.0)
    v = decide(obs, POLICY)
    assert (v.ready, v.live, v.action) == (False, True, Action.WAIT)


def test_503_forever_fails_liveness_issue_18663() -> None:
    obs = replace(UP, health=Health.UNAVAILABLE, unhealthy_since=60.0, now=91.0)
    v = decide(obs, POLICY)
    assert (v.live, v.action, v.cause) == (False, Action.ABORT, Cause.STUCK_UNAVAILABLE)


def test_no_answer_past_the_grace_period_is_unreachable() -> None:
    obs = replace(UP, health=Health.DOWN, unhealthy_since=0.0, now=31.0)
    assert decide(obs, POLICY).cause is Cause.UNREACHABLE


@pytest.mark.parametrize(
    ("prev", "health", "ever_up", "want"),
    [
        (None, Health.UNAVAILABLE, True, 5.0),  # a run starts now
        (2.0, Health.UNAVAILABLE, True, 2.0),  # and keeps its start
        (2.0, Health.UP, True, None),  # an UP answer ends it
        (None, Health.STARTING, False, None),  # start-up is the start limit's business
    ],
)
def test_next_unhealthy_since(prev: float | None, health: Health, ever_up: bool, want: float | None) -> None:
    assert next_unhealthy_since(prev, health, ever_up, 5.0) == want
