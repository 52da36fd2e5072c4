"""Finished build Jobs go after their TTL, and only once every requester has recorded them."""

from __future__ import annotations

from typing import Any

from trtforge_operator.api import TRTEngine
from trtforge_operator.apply import children
from trtforge_operator.labels import LABEL_BUILD_KIND, requester_annotation
from trtforge_operator.observe.views import JobView
from trtforge_operator.planning.engine import plan_engine
from trtforge_operator.planning.finished_jobs import Requester, expired_jobs

from tests.fakes import job
from tests.unit.test_planning_engine import (
    CFG,
    H100,
    NOW,
    built,
    engine,
    key_of,
    manifest_for,
    observe,
    with_status,
)

TTL = 600.0
ME = "team-a/resnet"


def requester_of(e: TRTEngine) -> Requester:
    return Requester(targets=e.status.targets, current=e.status.observed_generation == e.metadata.generation)


def built_engine() -> tuple[TRTEngine, dict[str, Any], dict[str, Any]]:
    """An engine whose one target was built by its Job, with that result recorded in its status."""
    e = engine([{"gpu": H100.gpu}])
    (manifest,) = plan_engine(observe(e), CFG).jobs_to_create
    e = with_status(e, plan_engine(observe(e), CFG).status)
    key = key_of(e, H100)
    done = job(manifest, state="complete", at=NOW, result=built(key))
    stored = {key: manifest_for(key, H100)}
    p = plan_engine(observe(e, jobs=[done], manifests=stored, now=NOW + 20), CFG)
    assert [(t.reason, t.job_name) for t in p.status.targets] == [("Built", manifest["metadata"]["name"])]
    return with_status(e, p.status), done, stored


def expired(jobs: list[dict[str, Any]], engines: dict[str, Requester], now: float) -> list[str]:
    return [j.name for j in expired_jobs([JobView.from_k8s(j) for j in jobs], engines, now, TTL)]


def test_a_recorded_job_goes_after_its_ttl_and_the_engine_stays_built_without_churn() -> None:
    e, done, stored = built_engine()
    assert expired([done], {ME: requester_of(e)}, NOW + 10 + TTL - 1) == []  # the TTL has not run
    assert expired([done], {ME: requester_of(e)}, NOW + 10 + TTL) == [done["metadata"]["name"]]
    # With the Job gone the target keeps what it recorded: the same status, no Event.
    again = plan_engine(observe(e, jobs=[], manifests=stored, now=NOW + 2 * TTL), CFG)
    assert again.status.targets == e.status.targets and again.events == [] and again.jobs_to_create == []


def test_a_requester_that_has_not_recorded_the_job_keeps_it() -> None:
    e, done, _ = built_engine()
    other = engine([{"gpu": H100.gpu}], name="resnet-2")  # claimed the shared Job; no status written yet
    done["metadata"]["annotations"][requester_annotation("team-a/resnet-2")] = "team-a/resnet-2"
    late = NOW + 10 * TTL
    assert expired([done], {ME: requester_of(e), "team-a/resnet-2": requester_of(other)}, late) == []
    # Once it has recorded the result, or once it is gone, the Job may go.
    assert expired([done], {ME: requester_of(e), "team-a/resnet-2": requester_of(e)}, late) != []
    assert expired([done], {ME: requester_of(e)}, late) != []


def test_a_failed_job_a_stalled_target_names_stays_and_an_earlier_attempt_goes() -> None:
    cfg = CFG
    e = engine([{"gpu": H100.gpu}])
    (a1,) = plan_engine(observe(e), cfg).jobs_to_create
    f1 = job(a1, state="failed", at=NOW, result={"reason": "BuildError", "error": "boom"})
    p = plan_engine(observe(e, jobs=[f1], now=NOW + 10_000), cfg)
    (a2,) = p.jobs_to_create
    e = with_status(e, p.status)
    f2 = job(a2, state="failed", at=NOW + 10_000, result={"reason": "BuildError", "error": "boom"})
    late = NOW + 100_000
    assert expired([f1, f2], {ME: requester_of(e)}, late) == [a1["metadata"]["name"]]


def test_a_spec_the_status_has_not_caught_up_with_keeps_the_job() -> None:
    e, done, _ = built_engine()
    moved_on = requester_of(e)
    old_request = Requester(
        targets=[t.model_copy(update={"request_key": "f" * 64, "job_name": None}) for t in moved_on.targets],
        current=True,
    )
    assert expired([done], {ME: old_request}, NOW + 10 * TTL) == [done["metadata"]["name"]]
    stale = Requester(targets=old_request.targets, current=False)
    assert expired([done], {ME: stale}, NOW + 10 * TTL) == []


def test_a_rebuild_job_stays_while_a_rebuild_request_asks_for_it() -> None:
    e, done, _ = built_engine()
    name = children.job_name(key_of(e, H100)[:20], rebuild_of="f" * 16)
    rb = {**done, "metadata": {**done["metadata"], "name": name}}
    rb["metadata"]["labels"] = {**done["metadata"]["labels"], LABEL_BUILD_KIND: "rebuild"}
    asked = Requester(targets=e.status.targets, current=True, rebuild_jobs=frozenset({name}))
    assert expired([rb], {ME: asked}, NOW + 10 * TTL) == []
    assert expired([rb], {ME: requester_of(e)}, NOW + 10 * TTL) == [name]
