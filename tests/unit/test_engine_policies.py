"""The TRTEngine's policy chains: a target's (planning/engine_policies.py) and proof of possession's
(planning/verify.py), each policy by name, on typed facts, answers or passes; the order decides."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from trtforge_operator.apply.children import VerifyRequest
from trtforge_operator.labels import ANNOTATION_ATTEMPT, LABEL_BUILD_ID, LABEL_BUILD_KIND
from trtforge_operator.observe.keys import KeyInputs
from trtforge_operator.observe.views import JobView
from trtforge_operator.planning import engine_policies as p
from trtforge_operator.planning import verify as v
from trtforge_operator.planning.target_state import TargetState as S
from trtforge_operator.planning.verify import VerifyOutcome

from tests.fakes import job
from tests.unit.test_planning_engine import H100, manifest_for
from trtforge.contract.build_result import BuildFailure
from trtforge.contract.gpu import GPUTarget

NOW = 1_800_000_000.0
RK = "r" * 64
KI = KeyInputs(H100, "onnxruntime", RK, {}, ("gpu-0",))
MANIFEST = manifest_for("e" * 64, H100)
BUILT = {"key": "e" * 64}  # a result the builder wrote (enough for its key)
FAILED = {"error": "out of memory", "reason": "BuildFailed"}
INVALID = {"error": "bad input shape", "reason": "InvalidArgument"}


def build(
    attempt: int = 1, state: str = "running", result: dict[str, Any] | None = None, **kw: Any
) -> JobView:
    """A build Job of RK's request, as its view."""
    manifest = {
        "metadata": {
            "name": f"trtforge-build-{RK[:20]}" + (f"-a{attempt}" if attempt > 1 else ""),
            "namespace": "trtforge-builds",
            "labels": {LABEL_BUILD_ID: RK[:20], LABEL_BUILD_KIND: "build"},
            "annotations": {ANNOTATION_ATTEMPT: str(attempt)},
        }
    }
    return JobView.from_k8s(job(manifest, state=state, at=NOW - 100, result=result, **kw))


def facts(*builds: JobView, **kw: Any) -> p.TargetFacts:
    base = p.TargetFacts(H100, NOW, 3, ki=KI, has_node=True, builds=builds, requester="team-a/resnet")
    return dataclasses.replace(base, **kw)


VERIFYING = VerifyOutcome(S.VERIFYING_MODEL, "verifying the model")
GAVE_UP = VerifyOutcome(S.MODEL_VERIFY_FAILED, "gave up", stalled=True)

# (policy, facts, the state it answers with; None: it passes)
CASES: list[tuple[Any, p.TargetFacts, S | None]] = [
    (p.model_not_proven, facts(verify=VERIFYING), S.VERIFYING_MODEL),
    (p.model_not_proven, facts(verify=GAVE_UP), S.MODEL_VERIFY_FAILED),
    (p.model_not_proven, facts(), None),
    (p.no_request_key, facts(ki=None, key_error="missing label", has_node=False), S.NO_MATCHING_NODE),
    (p.no_request_key, facts(ki=None, key_error="missing label"), S.INVALID_TARGET),
    (p.no_request_key, facts(), None),
    (p.engine_in_store, facts(manifest=MANIFEST, cache_hit=True), S.CACHE_HIT),
    (p.engine_in_store, facts(manifest=MANIFEST), S.BUILT),
    (p.engine_in_store, facts(manifest=MANIFEST, rebuilding=True, cache_hit=True), S.REBUILDING),
    (p.engine_in_store, facts(build()), None),
    (p.build_running, facts(build()), S.BUILD_RUNNING),
    (p.build_running, facts(build(), unschedulable="0/3 nodes are available"), S.WAITING_FOR_GPU),
    (p.build_running, facts(build(state="complete", result=BUILT)), None),
    (p.build_running, facts(), None),
    (p.result_not_read, facts(build(state="complete")), S.COLLECTING_RESULT),
    (p.result_not_read, facts(build(state="complete", result=BUILT)), None),
    (p.retry_cannot_help, facts(build(state="complete", result=INVALID)), S.INVALID_BUILD_INPUT),
    (p.retry_cannot_help, facts(build(state="complete", result=FAILED)), None),
    (p.retries_exhausted, facts(build(3, state="failed")), S.BUILD_RETRIES_EXHAUSTED),
    (p.retries_exhausted, facts(build(2, state="failed")), None),
    (p.backing_off, facts(build(2, state="failed"), retry_at=NOW + 60), S.BUILD_FAILED),
    (p.backing_off, facts(build(2, state="failed"), retry_at=NOW - 1), None),
    (p.backing_off, facts(build(), retry_at=NOW + 60), None),  # nothing failed
    (p.no_node_to_build_on, facts(has_node=False), S.NO_MATCHING_NODE),
    (p.no_node_to_build_on, facts(build(state="failed"), has_node=False), S.BUILD_FAILED),
    (p.no_node_to_build_on, facts(), None),
    (p.start_build, facts(), S.BUILD_STARTING),
    (p.start_build, facts(build(state="failed")), S.BUILD_RETRYING),
]


@pytest.mark.parametrize(
    ("policy", "f", "expected"), CASES, ids=[f"{c[0].__name__}-{i}" for i, c in enumerate(CASES)]
)
def test_each_policy_answers_or_passes(policy: Any, f: p.TargetFacts, expected: S | None) -> None:
    verdict = policy(f)
    assert (verdict.state if verdict is not None else None) == expected


def test_every_policy_of_the_chain_is_named_by_a_test() -> None:
    tested = {c[0].__name__ for c in CASES}
    assert {f.__name__ for f in p.TARGET_POLICIES} | {"start_build"} <= tested


def test_the_verdicts_carry_what_the_status_says() -> None:
    assert p.start_build(facts()).message == f"starting build Job trtforge-build-{RK[:20]}"
    assert p.start_build(facts()).build and not p.engine_in_store(facts(manifest=MANIFEST)).build  # type: ignore[union-attr]
    retry = p.start_build(facts(build(state="failed")))
    assert retry.message.startswith("attempt 1 failed: BackoffLimitExceeded") and retry.message.endswith(
        "starting attempt 2"
    )
    backoff = p.backing_off(facts(build(2, state="failed"), retry_at=NOW + 60))
    assert backoff is not None and backoff.wake_at == NOW + 60
    assert p.model_not_proven(facts(verify=GAVE_UP)).stalled  # type: ignore[union-attr]
    no_pod = build()
    no_pod = dataclasses.replace(no_pod, active=0)
    assert p.build_running(facts(no_pod)).job_has_pod is False  # type: ignore[union-attr]


def test_the_chain_takes_the_first_answer() -> None:
    """An engine in the store wins over a failed build of the same request; a running build over a
    missing node; the verification over everything."""
    failed_then_stored = facts(build(3, state="failed"), manifest=MANIFEST)
    assert p.evaluate(failed_then_stored).state is S.BUILT
    assert p.evaluate(facts(build(), has_node=False)).state is S.BUILD_RUNNING
    assert p.evaluate(facts(build(), verify=VERIFYING, manifest=MANIFEST)).state is S.VERIFYING_MODEL
    assert p.evaluate(facts()).state is S.BUILD_STARTING
    assert p.evaluate(facts(build(state="failed"), retry_at=NOW - 1)).state is S.BUILD_RETRYING


def test_facts_have_no_key_for_an_unhosted_target_of_an_unknown_gpu() -> None:
    f = facts(ki=None, key_error="no GPU", target=GPUTarget(gpu="NVIDIA-Nothing"))
    assert p.no_request_key(f) is not None and p.no_request_key(f).message.startswith("no GPU")  # type: ignore[union-attr]


# ------------------------------------------------------------------ proof of possession (verify.py)


def verify_job(attempt: int = 1, state: str = "running", at: float = NOW - 100, **kw: Any) -> JobView:
    manifest = {
        "metadata": {
            "name": f"trtforge-verify-x-a{attempt}",
            "namespace": "team-a",
            "labels": {},
            "annotations": {ANNOTATION_ATTEMPT: str(attempt)},
        }
    }
    return JobView.from_k8s(job(manifest, state=state, at=at, **kw))


REQ = VerifyRequest("team-a", "resnet", "u1", "pvc://models/m.onnx", None, None, "fp")


def vfacts(latest: JobView | None = None, **kw: Any) -> v.VerifyFacts:
    attempt = latest.attempt if latest is not None else 0
    base = v.VerifyFacts("pvc://models/m.onnx", NOW, REQ, latest, attempt, max_attempts=3, limit=2)
    return dataclasses.replace(base, **kw)


REFUSED = BuildFailure(error="sha256 mismatch", reason="ModelIntegrity")
OOM = BuildFailure(error="read timed out", reason="ModelFetchFailed")
VERIFY_CASES: list[tuple[Any, v.VerifyFacts, S | None]] = [
    (v.verify_running, vfacts(verify_job()), S.VERIFYING_MODEL),
    (v.verify_running, vfacts(verify_job(), stuck="ImagePullBackOff"), S.VERIFYING_MODEL),
    (v.verify_running, vfacts(verify_job(state="failed")), None),
    (v.record_pending, vfacts(verify_job(state="complete", at=NOW - 20)), S.VERIFYING_MODEL),
    (v.record_pending, vfacts(verify_job(state="complete", at=NOW - 20), now=NOW + 60), None),
    (v.source_refused, vfacts(verify_job(state="failed"), result=REFUSED), S.MODEL_VERIFY_FAILED),
    (v.source_refused, vfacts(verify_job(state="failed"), result=OOM), None),
    (v.verify_retries_exhausted, vfacts(verify_job(3, state="failed")), S.MODEL_VERIFY_FAILED),
    (v.verify_retries_exhausted, vfacts(verify_job(2, state="failed")), None),
    (v.verify_retries_exhausted, vfacts(), None),
    (v.verify_backing_off, vfacts(verify_job(state="failed"), retry_at=NOW + 30), S.MODEL_VERIFY_FAILED),
    (v.verify_backing_off, vfacts(verify_job(state="failed"), retry_at=NOW - 1), None),
    (v.verify_slot_full, vfacts(running=2), S.VERIFYING_MODEL),
    (v.verify_slot_full, vfacts(running=1), None),
]


@pytest.mark.parametrize(
    ("policy", "f", "expected"),
    VERIFY_CASES,
    ids=[f"{c[0].__name__}-{i}" for i, c in enumerate(VERIFY_CASES)],
)
def test_each_verify_policy_answers_or_passes(policy: Any, f: v.VerifyFacts, expected: S | None) -> None:
    outcome = policy(f)
    assert (outcome.state if outcome is not None else None) == expected


def test_the_verify_chain_is_named_by_tests_and_ends_in_a_new_job() -> None:
    assert {f.__name__ for f in v.VERIFY_POLICIES} <= {c[0].__name__ for c in VERIFY_CASES}
    first = v.start_verify(vfacts())
    assert first.create == REQ and first.message.endswith(f"(Job {REQ.job_name})")
    retry = v.start_verify(vfacts(verify_job(state="failed"), result=OOM))
    assert (
        retry.message == f"verify attempt 1 failed: ModelFetchFailed: read timed out; starting {REQ.job_name}"
    )
    assert v.source_refused(vfacts(verify_job(state="failed"), result=REFUSED)).stalled  # type: ignore[union-attr]
    pending = v.record_pending(vfacts(verify_job(state="complete", at=NOW - 20)))
    assert pending is not None and pending.wake_at == NOW - 10 + v.VERIFY_RESULT_GRACE_S
