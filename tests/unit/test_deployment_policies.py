"""The InferenceDeployment planner's policies (planning/deployment_policies.py), each by name, on
typed facts: a target's message, a fault's recovery, Ready/Progressing and Degraded."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from trtforge_operator.api import FaultRecord
from trtforge_operator.observe.views import JobView
from trtforge_operator.planning import deployment_policies as p
from trtforge_operator.planning.faults import FaultAction

from tests.fakes import job

AT = dt.datetime(2027, 1, 1, tzinfo=dt.UTC)


def rollout(**kw: Any) -> p.TargetRollout:
    base: dict[str, Any] = dict(
        engine_phase="Ready", engine_detail="", engine_key="k" * 64, rollout_stuck=False, rolled_out=True
    )
    return p.TargetRollout(**{**base, **kw})


MESSAGE_CASES: list[tuple[Any, p.TargetRollout, str | None]] = [
    (
        p.engine_not_ready,
        rollout(engine_phase="Building", engine_detail="BuildRunning"),
        "engine building: BuildRunning",
    ),
    (p.engine_not_ready, rollout(), None),
    (
        p.rollout_stuck,
        rollout(rollout_stuck=True),
        "rollout stuck: new pods are not becoming ready (the previous engine keeps serving)",
    ),
    (p.rollout_stuck, rollout(), None),
    (p.rolling_out, rollout(rolled_out=False), "rolling out engine kkkkkkkkkkkk"),
    (p.rolling_out, rollout(), None),
]


@pytest.mark.parametrize(
    ("policy", "facts", "expected"),
    MESSAGE_CASES,
    ids=[f"{c[0].__name__}-{i}" for i, c in enumerate(MESSAGE_CASES)],
)
def test_target_message_policies(policy: Any, facts: p.TargetRollout, expected: str | None) -> None:
    assert policy(facts) == expected


def test_target_message_takes_the_first_answer() -> None:
    assert p.target_message(rollout()) == "serving"
    both = rollout(engine_phase="Failed", engine_detail="x", rollout_stuck=True, rolled_out=False)
    assert p.target_message(both) == "engine failed: x"
    assert p.target_message(rollout(rollout_stuck=True, rolled_out=False)).startswith("rollout stuck")


def record(action: FaultAction = FaultAction.MOVED, recovered: float | None = None) -> FaultRecord:
    return FaultRecord(
        time=AT, pod="p", node="n", target="h100", xid=79, action=action, recovered_seconds=recovered
    )


def rebuild(state: str, sha: str | None = None) -> JobView:
    manifest = {
        "metadata": {"name": "trtforge-build-x-rb1", "namespace": "b", "labels": {}, "annotations": {}}
    }
    result = {"key": "e" * 64, "sha256": sha} if sha else None
    return JobView.from_k8s(job(manifest, state=state, result=result))


def recovery(
    rec: FaultRecord, rolled_out: bool = True, job: JobView | None = None, served: str | None = None
) -> p.FaultRecovery:
    return p.FaultRecovery(rec, rolled_out, job, served)


RB = FaultAction.MOVED_REBUILD
RECOVERY_CASES: list[tuple[Any, p.FaultRecovery, p.RecoveryWait | None]] = [
    (p.recorded_already, recovery(record(recovered=3.0)), p.RecoveryWait.RECORDED),
    (p.recorded_already, recovery(record()), None),
    (p.target_not_rolled_out, recovery(record(), rolled_out=False), p.RecoveryWait.ROLLOUT),
    (p.target_not_rolled_out, recovery(record()), None),
    (p.rebuild_not_finished, recovery(record(RB)), p.RecoveryWait.REBUILD),
    (p.rebuild_not_finished, recovery(record(RB), job=rebuild("running")), p.RecoveryWait.REBUILD),
    (p.rebuild_not_finished, recovery(record(RB), job=rebuild("complete", "s1")), None),
    (p.rebuild_not_finished, recovery(record()), None),  # a move asks for no rebuild
    (
        p.rebuilt_engine_not_served,
        recovery(record(RB), job=rebuild("complete", "s1"), served="s0"),
        p.RecoveryWait.NEW_ENGINE,
    ),
    (p.rebuilt_engine_not_served, recovery(record(RB), job=rebuild("complete", "s1"), served="s1"), None),
    (p.rebuilt_engine_not_served, recovery(record(RB), job=rebuild("failed")), None),
]


@pytest.mark.parametrize(
    ("policy", "facts", "expected"),
    RECOVERY_CASES,
    ids=[f"{c[0].__name__}-{i}" for i, c in enumerate(RECOVERY_CASES)],
)
def test_recovery_policies(policy: Any, facts: p.FaultRecovery, expected: p.RecoveryWait | None) -> None:
    assert policy(facts) == expected


def test_a_fault_recovers_when_every_policy_passes() -> None:
    assert p.recovery_wait(recovery(record())) is None
    assert p.recovery_wait(recovery(record(RB), job=rebuild("complete", "s1"), served="s1")) is None
    assert p.recovery_wait(recovery(record(RB), rolled_out=False)) is p.RecoveryWait.ROLLOUT


def serving(**kw: Any) -> p.Serving:
    base: dict[str, Any] = dict(
        engine_found=True, engine_problem="gone", engine_has_targets=True, replicas=2, targets=1
    )
    return p.Serving(**{**base, **kw})


READINESS_CASES: list[tuple[Any, p.Serving, tuple[str, str] | None]] = [
    (p.engine_missing, serving(engine_found=False), ("EngineNotFound", "WaitingForEngine")),
    (p.engine_missing, serving(), None),
    (p.no_targets, serving(targets=0), ("NoTargets", "WaitingForEngine")),
    (p.no_targets, serving(), None),
    (p.rollout_pending, serving(not_done=[("h100", "rolling out")]), ("RolloutInProgress", "RollingOut")),
    (
        p.rollout_pending,
        serving(not_done=[("h100", "x")], waiting_for_engine=True),
        ("EngineNotReady", "WaitingForEngine"),
    ),
    (p.rollout_pending, serving(), None),
    (p.all_replicas_ready, serving(), ("AllReplicasReady", "RolloutComplete")),
]


@pytest.mark.parametrize(
    ("policy", "facts", "expected"),
    READINESS_CASES,
    ids=[f"{c[0].__name__}-{i}" for i, c in enumerate(READINESS_CASES)],
)
def test_readiness_policies(policy: Any, facts: p.Serving, expected: tuple[str, str] | None) -> None:
    answer = policy(facts)
    assert ((answer.ready_reason, answer.progressing_reason) if answer is not None else None) == expected


def test_readiness_messages() -> None:
    assert p.readiness(serving(engine_found=False, targets=0)).ready_reason == "EngineNotFound"
    ready = p.readiness(serving())
    assert (ready.ready, ready.message, ready.progressing_message) == (
        "True",
        "2/2 replicas ready on 1 target(s)",
        "",
    )
    assert (
        p.no_targets(serving(targets=0, engine_has_targets=False)).message == "the engine has no targets yet"
    )  # type: ignore[union-attr]


DEGRADED_CASES: list[tuple[Any, p.Health, str | None]] = [
    (p.gpu_fault_open, p.Health([record()], []), "GPUFault"),
    (p.gpu_fault_open, p.Health([], ["d"]), None),
    (p.rollouts_stuck, p.Health([], ["d"]), "RolloutStuck"),
    (p.rollouts_stuck, p.Health([], []), None),
]


@pytest.mark.parametrize(
    ("policy", "facts", "expected"),
    DEGRADED_CASES,
    ids=[f"{c[0].__name__}-{i}" for i, c in enumerate(DEGRADED_CASES)],
)
def test_degraded_policies(policy: Any, facts: p.Health, expected: str | None) -> None:
    answer = policy(facts)
    assert (answer.reason if answer is not None else None) == expected


def test_degradation_takes_the_first_answer() -> None:
    assert (
        p.degradation(p.Health([record()], ["d"])).message
        == "1 fault(s) being handled; last: Xid 79 on n (PodMoved)"
    )
    assert p.degradation(p.Health([], [])) == p.Degradation("False", "AsExpected", "")


def test_every_policy_of_each_chain_is_named_by_a_test() -> None:
    tested = {
        c[0].__name__
        for cases in (MESSAGE_CASES, RECOVERY_CASES, READINESS_CASES, DEGRADED_CASES)
        for c in cases
    }
    chains = (*p.TARGET_MESSAGES, *p.RECOVERY_POLICIES, *p.READINESS_POLICIES, *p.DEGRADED_POLICIES)
    assert {f.__name__ for f in chains} <= tested
