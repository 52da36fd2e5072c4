"""Failed quantize and tune Jobs are retried as build Jobs are (issue 66): up to `build.max_attempts`,
each after the build backoff, under the next attempt's name; a failure no retry fixes (the accuracy
gate, a bad source, a missing backend) is not retried. The pure policy (planning/llm_retry.py), then
its use by the LLM plan (plan_engine_pass)."""

from __future__ import annotations

from typing import Any

import pytest
from trtforge_operator.apply.children import job_name
from trtforge_operator.observe.views import JobView
from trtforge_operator.planning.engine import plan_engine_pass
from trtforge_operator.planning.engine_actions import RequeueAfter
from trtforge_operator.planning.llm_retry import LLM_NO_RETRY, RetryStep, retry_decision

from tests.fakes import job
from tests.unit.test_planning_engine import CFG, NOW
from tests.unit.test_planning_llm_engine import created, engine, observe, status_of
from trtforge.contract.build_result import BuildFailure

BASE = CFG.build.retry_base_seconds  # 30 s after the first failure, 60 s after the second


def _failure(reason: str) -> dict[str, Any]:
    return {"error": f"it failed ({reason})", "reason": reason, "exitCode": 1}


def _failed(manifest: dict[str, Any], at: float, reason: str | None = "BuildFailed") -> dict[str, Any]:
    return job(manifest, state="failed", at=at, result=_failure(reason) if reason else None)


def _view(attempt: int, finished_ago: float) -> JobView:
    m = {
        "metadata": {
            "name": "j",
            "namespace": "trtforge-system",
            "labels": {},
            "annotations": {"trtforge.io/attempt": str(attempt)},
        }
    }
    return JobView.from_k8s(_failed(m, NOW - finished_ago - 10, None))


@pytest.mark.parametrize(
    ("attempt", "ago", "reason", "step"),
    [
        (1, 5, "BuildFailed", RetryStep.BACKING_OFF),  # 30 s backoff, 5 s passed
        (1, 31, "BuildFailed", RetryStep.RETRY_NOW),
        (2, 31, "StoreUnavailable", RetryStep.BACKING_OFF),  # 60 s after the second
        (2, 61, None, RetryStep.RETRY_NOW),  # no report (killed, out of memory): retried
        (3, 1000, "BuildFailed", RetryStep.EXHAUSTED),  # max_attempts 3
        (1, 1000, "ValidationFailed", RetryStep.PERMANENT),  # the accuracy gate refused
        (1, 1000, "ModelIntegrity", RetryStep.PERMANENT),  # not the pinned source
        (1, 1000, "InvalidModel", RetryStep.PERMANENT),
        (1, 1000, "BackendUnavailable", RetryStep.PERMANENT),
    ],
)
def test_the_retry_policy_follows_the_build_backoff_and_stops_on_permanent_reasons(
    attempt: int, ago: float, reason: str | None, step: RetryStep
) -> None:
    reported = BuildFailure.model_validate(_failure(reason)) if reason else None
    d = retry_decision(_view(attempt, ago), reported, NOW, CFG)
    assert d.step is step and d.attempt == attempt and d.max_attempts == CFG.build.max_attempts
    if step in (RetryStep.BACKING_OFF, RetryStep.RETRY_NOW):
        assert d.retry_at == NOW - ago + BASE * 2 ** (attempt - 1)


def test_the_permanent_reasons_include_the_build_jobs_own() -> None:
    assert {"InvalidArgument", "ModelIntegrity", "InvalidModel", "ValidationFailed"} <= LLM_NO_RETRY
    assert not {"BuildFailed", "StoreUnavailable", "ModelFetchFailed", "Error", "Timeout"} & LLM_NO_RETRY


def test_a_failed_quantize_job_backs_off_then_is_retried_under_the_next_name_then_gives_up() -> None:
    e = engine("bf16", [{"gpu": "cpu"}])
    (q,) = created(plan_engine_pass(observe(e), CFG))
    first = _failed(q, NOW - 15)  # finished 5 s ago: 25 s of backoff left
    plan = plan_engine_pass(observe(e, jobs=[first]), CFG)
    ck = status_of(plan).checkpoint
    assert created(plan) == [] and (ck.phase, ck.reason) == ("Pending", "QuantizeRetrying")
    assert "attempt 1/3" in ck.message and "retrying at" in ck.message
    (wake,) = plan.of(RequeueAfter)
    assert wake.seconds == pytest.approx(25)
    plan = plan_engine_pass(observe(e, jobs=[_failed(q, NOW - 100)]), CFG)
    (retry,) = created(plan)
    assert retry["metadata"]["name"] == job_name(q["metadata"]["labels"]["trtforge.io/build-id"], 2)
    assert retry["metadata"]["annotations"]["trtforge.io/attempt"] == "2"
    assert (
        retry["spec"]["template"]["spec"]["containers"][0]["command"]
        == (q["spec"]["template"]["spec"]["containers"][0]["command"])
    )
    assert status_of(plan).checkpoint.phase == "Building"
    # the same pass with attempt 2 running: nothing new
    assert created(plan_engine_pass(observe(e, jobs=[_failed(q, NOW - 100), job(retry, at=NOW)]), CFG)) == []
    third = created(
        plan_engine_pass(observe(e, jobs=[_failed(q, NOW - 500), _failed(retry, NOW - 200)]), CFG)
    )
    assert [j["metadata"]["annotations"]["trtforge.io/attempt"] for j in third] == ["3"]
    jobs = [_failed(q, NOW - 500), _failed(retry, NOW - 300), _failed(third[0], NOW - 100)]
    plan = plan_engine_pass(observe(e, jobs=jobs), CFG)
    st = status_of(plan)
    assert created(plan) == [] and (st.checkpoint.phase, st.checkpoint.reason) == ("Failed", "QuantizeFailed")
    assert "attempt 3/3" in st.checkpoint.message and "giving up" in st.checkpoint.message
    assert st.conditions and any(c.type == "Stalled" and c.status == "True" for c in st.conditions)


def test_a_bad_source_is_not_retried() -> None:
    e = engine("bf16", [{"gpu": "cpu"}])
    (q,) = created(plan_engine_pass(observe(e), CFG))
    plan = plan_engine_pass(observe(e, jobs=[_failed(q, NOW - 10_000, "ModelIntegrity")]), CFG)
    ck = status_of(plan).checkpoint
    assert created(plan) == [] and (ck.phase, ck.reason) == ("Failed", "QuantizeFailed")
    assert "not retrying" in ck.message


def test_a_failed_tune_job_is_retried_and_the_target_says_so() -> None:
    e = engine("bf16", [{"gpu": "cpu"}])
    (q,) = created(plan_engine_pass(observe(e), CFG))
    done = job(
        q, state="complete", at=NOW - 500, result=_quantized(status_of(plan_engine_pass(observe(e), CFG)))
    )
    (t,) = created(plan_engine_pass(observe(e, jobs=[done]), CFG))
    plan = plan_engine_pass(observe(e, jobs=[done, _failed(t, NOW - 15)]), CFG)
    (target,) = status_of(plan).targets
    assert created(plan) == [] and (target.phase, target.reason) == ("Pending", "TuneRetrying")
    plan = plan_engine_pass(observe(e, jobs=[done, _failed(t, NOW - 100)]), CFG)
    (retry,) = created(plan)
    assert retry["metadata"]["annotations"]["trtforge.io/attempt"] == "2"
    (target,) = status_of(plan).targets
    assert (target.phase, target.attempts) == ("Building", 2)
    gone = plan_engine_pass(observe(e, jobs=[done, _failed(t, NOW - 100, "InvalidArgument")]), CFG)
    (target,) = status_of(gone).targets
    assert created(gone) == [] and (target.phase, target.reason) == ("Failed", "TuneFailed")


def _quantized(st: Any) -> dict[str, Any]:
    return {
        "schema": "trtforge.io/quantize-result/v1",
        "checkpointKey": st.checkpoint.checkpoint_key,
        "manifestUri": "m",
        "backend": "llama.cpp",
        "backendVersion": "v",
        "recipe": "bf16",
        "quantizedType": "BF16",
        "sizeBytes": 1,
        "cacheHit": False,
        "seconds": 1.0,
    }
