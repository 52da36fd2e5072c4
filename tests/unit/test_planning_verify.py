"""The verify step's planner (issue 52): a verify pod that cannot start says why at once, a namespace
runs at most verify.max_concurrent_per_namespace verify Jobs, failures a retry cannot fix stall, and
the operator's record of each verify Job (its grant) is planned with the Job. Pure: table-driven."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from trtforge_operator.api import get_condition
from trtforge_operator.apply import children
from trtforge_operator.config import OperatorConfig
from trtforge_operator.observe.views import JobView, PodView
from trtforge_operator.planning.engine import plan_engine
from trtforge_operator.planning.target_state import TargetState
from trtforge_operator.planning.verify import plan_verify

from tests.fakes import job
from tests.unit.test_planning_engine import CFG, H100, NOW, engine, observe
from trtforge.contract.build_result import BuildFailure

LIMITED = CFG.model_copy(update={"verify": CFG.verify.model_copy(update={"max_concurrent_per_namespace": 2})})


def _first_verify_job(cfg: OperatorConfig = CFG, **model: Any) -> dict[str, Any]:
    e = engine([{"gpu": H100.gpu}], sha=None, model={"uri": "https://models.example/r.onnx", **model})
    (vj,) = plan_engine(observe(e, verified=None), cfg).verify_jobs_to_create
    return vj


def test_each_verify_job_is_planned_with_the_operators_record_of_it() -> None:
    e = engine(
        [{"gpu": H100.gpu}],
        sha=None,
        model={
            "uri": "https://models.example/r.onnx",
            "maxSizeBytes": 1000,
            "allowedRedirectHosts": ["cdn.example", "blobs.example:8443"],
        },
    )
    plan = plan_engine(observe(e, verified=None), CFG)
    (vj,) = plan.verify_jobs_to_create
    grant = plan.verify_grants[vj["metadata"]["name"]]
    (c,) = vj["spec"]["template"]["spec"]["containers"]
    assert (grant.namespace, grant.job, grant.job_uid) == ("team-a", vj["metadata"]["name"], "")
    assert (grant.image, grant.command, grant.max_bytes) == (c["image"], c["command"], 1000)
    assert grant.uri == "https://models.example/r.onnx" and grant.pin == ""
    assert c["command"][-4:] == [
        "--allow-redirect-host",
        "cdn.example",
        "--allow-redirect-host",
        "blobs.example:8443",
    ]
    assert grant.expires_at == NOW + CFG.verify.deadline_seconds + children.VERIFY_GRANT_SLACK_S


def _pod(waiting: dict[str, str] | None = None, unschedulable: str | None = None) -> PodView:
    status: dict[str, Any] = {"phase": "Pending"}
    if waiting is not None:
        status["containerStatuses"] = [{"name": "verify", "state": {"waiting": waiting}}]
    if unschedulable is not None:
        status["conditions"] = [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": unschedulable}
        ]
    return PodView.from_k8s({"metadata": {"name": "p", "namespace": "team-a"}, "status": status})


@pytest.mark.parametrize(
    ("pod", "stuck"),
    [
        (_pod({"reason": "CreateContainerConfigError", "message": 'secret "nope" not found'}), True),
        (_pod({"reason": "ImagePullBackOff", "message": "back-off pulling image"}), True),
        (_pod({"reason": "ErrImagePull", "message": "manifest unknown"}), True),
        (_pod({"reason": "ContainerCreating", "message": ""}), False),
        (_pod(), False),
    ],
)
def test_which_waiting_reasons_mean_the_pod_cannot_start(pod: PodView, stuck: bool) -> None:
    assert (pod.cannot_start() is not None) == stuck


@pytest.mark.parametrize(
    ("stuck", "says"),
    [
        ({}, "verifying that this namespace holds"),
        (
            {"J": 'CreateContainerConfigError: secret "nope" not found'},
            'cannot start its pod: CreateContainerConfigError: secret "nope" not found',
        ),
        ({"J": "Unschedulable: 0/3 nodes are available"}, "cannot start its pod: Unschedulable"),
    ],
)
def test_a_verify_pod_that_cannot_start_says_why_in_the_status(stuck: dict[str, str], says: str) -> None:
    vj = _first_verify_job()
    name = vj["metadata"]["name"]
    e = engine([{"gpu": H100.gpu}], sha=None, model={"uri": "https://models.example/r.onnx"})
    obs = observe(e, verified=None, verify_jobs=[job(vj, at=NOW - 5)])
    obs = dataclasses.replace(obs, verify_stuck={name if k == "J" else k: v for k, v in stuck.items()})
    out = plan_verify(obs, CFG)
    assert out.state == TargetState.VERIFYING_MODEL and out.create is None
    assert says in out.message
    (t,) = plan_engine(obs, CFG).status.targets
    assert says in (t.message or "")


def _other_verify_jobs(n: int) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        e = engine([{"gpu": H100.gpu}], sha=None, name=f"e{i}", model={"uri": f"https://m.example/{i}.onnx"})
        (vj,) = plan_engine(observe(e, verified=None), CFG).verify_jobs_to_create
        out.append(job(vj, at=NOW - 5))
    return out


@pytest.mark.parametrize(
    ("running", "finished", "creates"),
    [(0, 0, True), (1, 0, True), (2, 0, False), (3, 0, False), (0, 2, True), (1, 3, True)],
)
def test_a_namespace_runs_at_most_its_verify_limit(running: int, finished: int, creates: bool) -> None:
    others = _other_verify_jobs(running + finished)
    for j in others[running:]:
        j["status"] = {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]}
    e = engine([{"gpu": H100.gpu}], sha=None, model={"uri": "https://models.example/r.onnx"})
    plan = plan_engine(observe(e, verified=None, verify_jobs=others), LIMITED)
    assert bool(plan.verify_jobs_to_create) == creates
    (t,) = plan.status.targets
    assert t.reason == "VerifyingModel"
    if not creates:
        assert f"{running} verify Jobs running in this namespace, limit 2" in (t.message or "")
        assert plan.requeue_after is not None


@pytest.mark.parametrize(
    ("reason", "stalls"),
    [
        ("ModelSourceRefused", True),
        ("InvalidModel", True),
        ("ModelTooLarge", True),
        ("ModelIntegrity", True),
        ("UploadRefused", False),
        ("ModelFetchFailed", False),
        ("StoreUnavailable", False),
    ],
)
def test_failures_a_retry_cannot_fix_stall(reason: str, stalls: bool) -> None:
    vj = _first_verify_job()
    failed = job(vj, state="failed", at=NOW - 15)
    e = engine([{"gpu": H100.gpu}], sha=None, model={"uri": "https://models.example/r.onnx"})
    why = BuildFailure(error="model https://models.example/r.onnx: what happened", reason=reason)  # type: ignore[arg-type]
    plan = plan_engine(
        observe(e, verified=None, verify_jobs=[failed], verify_failures={vj["metadata"]["name"]: why}), CFG
    )
    (t,) = plan.status.targets
    assert t.reason == "ModelVerifyFailed" and "what happened" in (t.message or "")
    stalled = get_condition(plan.status.conditions, "Stalled")
    assert (stalled is not None and stalled.status == "True") == stalls


def _verified(now: float, **model: Any) -> Any:
    e = engine([{"gpu": H100.gpu}], sha=None, model={"uri": "https://models.example/r.onnx", **model})
    # observe(): the record was verified at NOW, of SHA
    return e, observe(e, verified="a" * 64, now=now)


@pytest.mark.parametrize(
    ("model", "after", "creates", "says"),
    [
        ({}, 10 * 86400, False, "recheckInterval is unset: the model was read once"),
        ({"recheckInterval": "24h"}, 3600, False, "read again at"),
        ({"recheckInterval": "24h"}, 86400, True, "reading the model again"),
        ({"recheckInterval": "1h30m"}, 5400, True, "reading the model again"),
    ],
)
def test_an_unpinned_model_is_read_again_on_its_interval(
    model: dict[str, Any], after: float, creates: bool, says: str
) -> None:
    _, obs = _verified(NOW + after, **model)
    plan = plan_engine(obs, CFG)
    assert plan.status.model is not None and says in (plan.status.model.message or "")
    assert bool(plan.verify_jobs_to_create) == creates
    if creates:
        (vj,) = plan.verify_jobs_to_create
        assert vj["metadata"]["annotations"]["trtforge.io/recheck-round"] == f"r{int(NOW):x}"
        assert vj["metadata"]["name"] in plan.verify_grants
    # The targets keep the verified model meanwhile: no target waits on a verify step.
    assert all(t.reason != "VerifyingModel" for t in plan.status.targets)


def test_a_pinned_model_is_never_read_again_and_says_nothing() -> None:
    pinned = {"uri": "https://models.example/r.onnx", "sha256": "a" * 64, "recheckInterval": "1h"}
    e = engine([{"gpu": H100.gpu}], model=pinned)
    plan = plan_engine(observe(e, now=NOW + 10 * 86400), CFG)
    assert plan.verify_jobs_to_create == []
    assert plan.status.model is not None and plan.status.model.message is None


def test_a_recheck_round_runs_once_and_the_first_verification_is_not_confused_with_it() -> None:
    _, obs = _verified(NOW + 86400, recheckInterval="24h")
    (vj,) = plan_engine(obs, CFG).verify_jobs_to_create
    running = dataclasses.replace(obs, verify_jobs=[JobView.from_k8s(job(vj, at=NOW + 86400))])
    again = plan_engine(running, CFG)
    assert again.verify_jobs_to_create == []
    assert "reading the model again" in (again.status.model.message or "")  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ("24h", True),
        ("90m", True),
        ("1h30m", True),
        ("3600s", True),
        ("4m", False),
        ("1d", False),
        ("", False),
    ],
)
def test_recheck_interval_is_a_duration_of_at_least_five_minutes(text: str, ok: bool) -> None:
    from pydantic import ValidationError

    try:
        engine(
            [{"gpu": H100.gpu}], sha=None, model={"uri": "https://m.example/r.onnx", "recheckInterval": text}
        )
    except ValidationError as e:
        assert (not ok and "recheckInterval" in str(e)) or "duration" in str(e)
    else:
        assert ok
