"""The TRTEngine plan as typed actions, one row per decision (planning/engine_actions.py).

Each row is an observation (literal views, tests/unit/test_planning_engine.py's helpers) and the
actions the pure planner must answer with, in kind and order; the applier carries them out as given.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
from trtforge_operator.api import get_condition
from trtforge_operator.labels import ANNOTATION_RESULT, requester_annotation
from trtforge_operator.observe.views import EngineObserved, JobView, UnreadableEngine
from trtforge_operator.planning.cleanup import plan_release
from trtforge_operator.planning.engine import plan_engine_pass
from trtforge_operator.planning.engine_actions import (
    AddRequester,
    CreateJob,
    CreateVerifyJob,
    DeleteJob,
    DeleteReason,
    DropRequester,
    Emit,
    EnginePlan,
    JobPurpose,
    RecordResult,
    RequeueAfter,
    WaitForSlot,
    WriteStatus,
)
from trtforge_operator.planning.engine_conditions import EngineReason
from trtforge_operator.planning.finished_jobs import Requester, plan_finished_jobs

from tests.fakes import job
from tests.unit.test_planning_engine import CFG, H100, NOW, built, engine, key_of, manifest_for, observe
from trtforge.contract.build_result import BuildFailure, BuildResult
from trtforge.contract.gpu import GPUTarget

GH200 = GPUTarget(gpu="NVIDIA-GH200-480GB")


def first_build(e: Any) -> dict[str, Any]:
    (j,) = plan_engine_pass(observe(e), CFG).jobs_to_create
    return dict(j)


def fresh() -> EngineObserved:
    return observe(engine([{"gpu": H100.gpu}, {"gpu": GH200.gpu}]))


def no_slot() -> EngineObserved:
    return observe(engine([{"gpu": H100.gpu}]), running=CFG.build.max_concurrent)


def shared() -> EngineObserved:
    other = first_build(engine([{"gpu": H100.gpu}], namespace="team-b"))
    return observe(engine([{"gpu": H100.gpu}]), jobs=[job(other, at=NOW - 5)])


def reported_not_recorded() -> EngineObserved:
    e = engine([{"gpu": H100.gpu}])
    key = key_of(e, H100)
    done = JobView.from_k8s(job(first_build(e), state="complete", at=NOW - 30))
    result = BuildResult.model_validate(built(key))
    obs = observe(e, manifests={key: manifest_for(key, H100)}, filed={})
    return dataclasses.replace(obs, jobs=[dataclasses.replace(done, reported=result)])


def recorded() -> EngineObserved:
    e = engine([{"gpu": H100.gpu}])
    key = key_of(e, H100)
    done = job(first_build(e), state="complete", at=NOW - 30, result=built(key))
    return observe(e, jobs=[done], manifests={key: manifest_for(key, H100)}, filed={})


def failed_once() -> EngineObserved:
    e = engine([{"gpu": H100.gpu}])
    failure = BuildFailure(error="out of memory", reason="BuildFailed", exit_code=1)
    bad = job(first_build(e), state="failed", at=NOW - 15, result=failure.model_dump(exclude_none=True))
    return observe(e, jobs=[bad])


def unproven() -> EngineObserved:
    return observe(engine([{"gpu": H100.gpu}], sha=None), verified=None)


def store_claim_source() -> EngineObserved:
    cfg_claim = CFG.store_uri.removeprefix("pvc://").partition("/")[0]
    e = engine([{"gpu": H100.gpu}])
    spec = e.spec.model_copy(
        update={"model": e.spec.model.model_copy(update={"uri": f"pvc://{cfg_claim}/m.onnx"})}
    )
    return dataclasses.replace(observe(e), spec=spec)


def unreadable() -> UnreadableEngine:
    return UnreadableEngine(
        "team-a", "bad", 2, engine([{"gpu": H100.gpu}]).status, {}, "spec.model.uri: field required", NOW
    )


ROWS: list[tuple[str, Callable[[], EngineObserved | UnreadableEngine], list[type[Any]]]] = [
    ("a new engine builds every target", fresh, [CreateJob, CreateJob, WriteStatus, Emit]),
    ("no build slot: queued, woken when one frees", no_slot, [WriteStatus, Emit, WaitForSlot]),
    ("another engine's Job of the same request is claimed", shared, [AddRequester, WriteStatus]),
    ("a pod's result the Job lacks is recorded", reported_not_recorded, [RecordResult, WriteStatus, Emit]),
    ("a recorded result is not written again", recorded, [WriteStatus, Emit]),
    ("a failed attempt waits out its backoff", failed_once, [WriteStatus, Emit, RequeueAfter]),
    ("an unproven source is verified first", unproven, [CreateVerifyJob, WriteStatus]),
    ("a store claim as model source stalls", store_claim_source, [WriteStatus, Emit]),
    ("a spec the models refuse stalls", unreadable, [WriteStatus]),
]


@pytest.mark.parametrize(("why", "observed", "kinds"), ROWS, ids=[r[0] for r in ROWS])
def test_each_decision_is_its_actions(
    why: str, observed: Callable[[], EngineObserved | UnreadableEngine], kinds: list[type[Any]]
) -> None:
    plan = plan_engine_pass(observed(), CFG)
    assert isinstance(plan, EnginePlan)
    assert [type(a) for a in plan.actions] == kinds, why
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.actions = ()  # type: ignore[misc]


def test_the_actions_carry_what_the_applier_needs() -> None:
    creates = plan_engine_pass(fresh(), CFG).of(CreateJob)
    assert {c.purpose for c in creates} == {JobPurpose.BUILD}
    assert all(c.name == c.job["metadata"]["name"] for c in creates)

    (claim,) = plan_engine_pass(shared(), CFG).of(AddRequester)
    assert claim.requester == "team-a/resnet" and claim.job.startswith("trtforge-build-")

    plan = plan_engine_pass(reported_not_recorded(), CFG)
    (rec,) = plan.of(RecordResult)
    assert isinstance(rec.result, BuildResult) and rec.result.key == plan.status.targets[0].engine_key
    assert plan.status.targets[0].phase == "Ready", "the pod's result is used in the same pass"

    (w,) = plan_engine_pass(no_slot(), CFG).of(WriteStatus)
    assert w.status.targets[0].reason == "Queued"

    problem = plan_engine_pass(store_claim_source(), CFG)
    (emit,) = problem.of(Emit)
    assert emit.on_status_change and emit.event.reason == EngineReason.INVALID_MODEL_SOURCE
    stalled = get_condition(problem.status.conditions, "Stalled")
    assert stalled is not None and stalled.reason == EngineReason.INVALID_MODEL_SOURCE

    (verify,) = plan_engine_pass(unproven(), CFG).of(CreateVerifyJob)
    assert verify.grant.job == verify.name


def test_a_deleted_engine_deletes_what_only_it_used_and_leaves_the_rest() -> None:
    mine = JobView.from_k8s(job(first_build(engine([{"gpu": H100.gpu}])), at=NOW))
    both = JobView.from_k8s(job(first_build(engine([{"gpu": GH200.gpu}])), at=NOW))
    both = dataclasses.replace(
        both, annotations={**both.annotations, requester_annotation("team-b/y"): "team-b/y"}
    )
    others = JobView.from_k8s(job(first_build(engine([{"gpu": H100.gpu}], namespace="team-c")), at=NOW))
    assert plan_release("team-a/resnet", [mine, both, others]) == (
        DeleteJob(mine.name, DeleteReason.RELEASED),
        DropRequester(both.name, "team-a/resnet"),
    )


def test_finished_jobs_past_their_ttl_are_deleted_as_expired() -> None:
    e = engine([{"gpu": H100.gpu}])
    key = key_of(e, H100)
    done = JobView.from_k8s(job(first_build(e), state="complete", at=NOW - 7200, result=built(key)))
    gone = plan_finished_jobs([done], {}, NOW, 3600)  # its one requester is gone
    assert gone == (DeleteJob(done.name, DeleteReason.EXPIRED),)
    waiting = Requester(targets=[], current=False)  # it has not written its status yet
    assert plan_finished_jobs([done], {"team-a/resnet": waiting}, NOW, 3600) == ()
    assert ANNOTATION_RESULT in done.annotations
