"""Issue 13's operator parts, each on its own: Job release by requester annotations, build slots,
wake-ups by key, the loop watch behind liveness, and the refusal of an invalid InferenceDeployment."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from pydantic import ValidationError
from trtforge_operator.api import InferenceDeployment, InferenceDeploymentStatus
from trtforge_operator.api.common import field_error
from trtforge_operator.build_slots import PENDING_TTL_S, BuildSlots, slot_namespace
from trtforge_operator.health import health_app
from trtforge_operator.kinds import Kind
from trtforge_operator.labels import (
    ANNOTATION_CREATED_FOR,
    ANNOTATION_RESULT,
    LABEL_BUILD_ID,
    LABEL_REQUESTER_NAMESPACE,
    requester_annotation,
)
from trtforge_operator.observe.views import JobView
from trtforge_operator.planning.cleanup import release_jobs
from trtforge_operator.planning.deployment import invalid_deployment_status
from trtforge_operator.workqueue import (
    LoopWatch,
    WorkQueue,
    engine_projection,
    jittered,
    job_projection,
    own_create_echo,
    verify_job_engine,
)


def job(name: str, *requesters: str, running: bool = True) -> JobView:
    status: dict[str, Any] = (
        {"active": 1}
        if running
        else {
            "succeeded": 1,
            "conditions": [{"type": "Complete", "status": "True"}],
        }
    )
    return JobView.from_k8s(
        {
            "metadata": {
                "name": name,
                "namespace": "build",
                "labels": {LABEL_BUILD_ID: name[-20:], LABEL_REQUESTER_NAMESPACE: "team-a"},
                "annotations": {requester_annotation(r): r for r in requesters},
            },
            "status": status,
        }
    )


# --------------------------------------------------------------------------- release by requester


def test_an_engine_deleted_while_a_second_engine_has_claimed_its_job_leaves_that_job_alone() -> None:
    """The second engine's claim is on the Job (its annotation), though its status does not show it
    yet: the Job stays, only the leaving engine's annotation goes."""
    shared = job("trtforge-build-" + "a" * 20, "team-a/first", "team-b/second")
    alone = job("trtforge-build-" + "b" * 20, "team-a/first")
    other = job("trtforge-build-" + "c" * 20, "team-b/second")
    out = release_jobs("team-a/first", [shared, alone, other, shared])
    assert [j.name for j in out.leave] == [shared.name]
    assert [j.name for j in out.delete] == [alone.name]


# ---------------------------------------------------------------------------------------- build slots


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_build_slots_admit_all_or_nothing_within_both_limits() -> None:
    slots = BuildSlots(max_total=3, max_per_namespace=2, build_namespace="build", clock=Clock())
    assert slots.admit(["j1", "j2"], "a")
    assert not slots.admit(["j3"], "a"), "namespace a is at its limit"
    assert slots.admit(["j3"], "b")
    assert not slots.admit(["j4"], "c"), "the cluster-wide limit is reached"
    assert slots.capacity("a").running_in_namespace == 2 and slots.capacity("c").running_total == 3
    assert slots.admit(["j1"], "a"), "a Job already admitted needs no second slot"


def test_build_slots_follow_job_events_and_expire_unseen_reservations() -> None:
    clock = Clock()
    slots = BuildSlots(max_total=2, max_per_namespace=2, build_namespace="build", clock=clock)
    assert slots.admit(["trtforge-build-" + "a" * 20], "team-a")
    slots.observe(job("trtforge-build-" + "a" * 20, "team-a/e"))  # created: now running
    assert slots.capacity("team-a").running_total == 1 and slots.running == 1
    slots.observe(job("trtforge-build-" + "a" * 20, "team-a/e", running=False))  # finished
    assert slots.capacity("team-a").running_total == 0
    assert slots.admit(["lost"], "team-a")  # created, but its event never comes
    clock.t += PENDING_TTL_S + 1
    assert slots.capacity("team-a").running_total == 0


def any_job(
    name: str, namespace: str, *, labels: dict[str, str] | None = None, created_for: str = ""
) -> JobView:
    annotations = {ANNOTATION_CREATED_FOR: created_for} if created_for else {}
    return JobView.from_k8s(
        {
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": labels or {},
                "annotations": annotations,
            },
            "status": {"active": 1},
        }
    )


VERIFIER_LABELS = {
    "app.kubernetes.io/managed-by": "trtforge-operator",
    "app.kubernetes.io/component": "verifier",
}


@pytest.mark.parametrize(
    ("created_for", "woken"),
    [
        ("team-a/e", "e"),  # the operator's own verify Job: wakes its engine
        ("team-b/e", None),  # a tenant's Job in team-a naming team-b's engine
        ("team-a", None),
        ("team-a/", None),
        ("", None),
    ],
)
def test_a_verify_job_wakes_only_an_engine_of_its_own_namespace(created_for: str, woken: str | None) -> None:
    assert verify_job_engine(any_job("v", "team-a", labels=VERIFIER_LABELS, created_for=created_for)) == woken


SQUAT_LABELS = {
    "app.kubernetes.io/managed-by": "trtforge-operator",
    "app.kubernetes.io/component": "builder",
    LABEL_REQUESTER_NAMESPACE: "team-b",
}


@pytest.mark.parametrize(
    ("job_", "reserved_for", "counted_for"),
    [
        # Reserved by this process: the reservation's namespace, whatever the Job says.
        (any_job("j", "build", created_for="team-b/e", labels=SQUAT_LABELS), "team-a", "team-a"),
        # Not reserved here (a restart): the requester the operator wrote when it created it.
        (any_job("j", "build", created_for="team-a/e", labels=SQUAT_LABELS), None, "team-a"),
        # Neither: a slot of the total, counted against no tenant (never the requester label).
        (any_job("j", "build", labels=SQUAT_LABELS), None, "build"),
        (any_job("j", "build", created_for="no-slash", labels=SQUAT_LABELS), None, "build"),
    ],
)
def test_a_slot_counts_against_the_namespace_the_operator_recorded(
    job_: JobView, reserved_for: str | None, counted_for: str
) -> None:
    assert slot_namespace(job_, reserved_for) == counted_for


def test_jobs_outside_the_build_namespace_hold_no_slot_whatever_their_labels_say() -> None:
    slots = BuildSlots(max_total=8, max_per_namespace=4, build_namespace="build", clock=Clock())
    for i in range(8):  # a tenant's own Jobs, dressed as ours and naming another tenant
        slots.observe(any_job(f"squat-{i}", "team-a", labels=SQUAT_LABELS, created_for="team-b/e"))
    assert slots.held == 0 and slots.running == 0
    assert slots.capacity("team-b").running_in_namespace == 0
    assert slots.admit(
        ["trtforge-build-b1", "trtforge-build-b2", "trtforge-build-b3", "trtforge-build-b4"], "team-b"
    )


def test_build_slots_are_keyed_by_namespace_and_name() -> None:
    """A tenant's Job named like one of ours neither frees nor takes our Job's slot."""
    slots = BuildSlots(max_total=8, max_per_namespace=4, build_namespace="build", clock=Clock())
    name = "trtforge-build-" + "c" * 20
    assert slots.admit([name], "team-b")
    slots.observe(any_job(name, "build", created_for="team-b/e"))
    done_elsewhere = JobView.from_k8s(
        {
            "metadata": {"name": name, "namespace": "team-a", "labels": SQUAT_LABELS},
            "status": {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]},
        }
    )
    slots.observe(done_elsewhere)
    assert slots.held == 1 and slots.capacity("team-b").running_in_namespace == 1
    assert not slots.awaiting_event(name) and slots.known(name)


# ----------------------------------------------------------------------------------- wake-ups by key


@pytest.mark.asyncio
async def test_an_engine_event_wakes_only_the_deployments_that_serve_it() -> None:
    q = WorkQueue()
    serving = q.get(Kind.INFERENCEDEPLOYMENT, "team-a", "serve-x")
    unrelated = q.get(Kind.INFERENCEDEPLOYMENT, "team-a", "serve-y")
    other_ns = q.get(Kind.INFERENCEDEPLOYMENT, "team-b", "serve-x")
    q.set_engine_ref("team-a", "serve-x", "x")
    q.set_engine_ref("team-a", "serve-y", "y")
    q.set_engine_ref("team-b", "serve-x", "x")
    q.fire_deployments_of("team-a", "x")
    await asyncio.wait_for(serving.wait(), 5)
    assert not unrelated.is_set() and not other_ns.is_set()
    q.set_engine_ref("team-a", "serve-x", "y")  # the deployment now serves another engine
    serving.clear()
    q.fire_deployments_of("team-a", "x")
    assert not serving.is_set()
    q.drop(Kind.INFERENCEDEPLOYMENT, "team-a", "serve-y")
    assert q.deployments_of("team-a", "y") == ["serve-x"]


@pytest.mark.asyncio
async def test_a_child_event_wakes_its_owner_by_label() -> None:
    q = WorkQueue()
    owner = q.get(Kind.INFERENCEDEPLOYMENT, "team-a", "My.Model")
    bystander = q.get(Kind.INFERENCEDEPLOYMENT, "team-a", "other")
    from trtforge_operator.apply.children import dns_name

    q.fire_label(Kind.INFERENCEDEPLOYMENT, "team-a", dns_name("My.Model"))
    await asyncio.wait_for(owner.wait(), 5)
    assert not bystander.is_set()


# ------------------------------------------------------------------------------------ liveness


def test_loop_watch_reports_a_reconcile_that_never_returns() -> None:
    clock = Clock()
    watch = LoopWatch(stuck_after=60, clock=clock)
    key = (Kind.TRTENGINE, "team-a", "e")
    watch.started(key)
    clock.t += 30
    assert watch.problem() is None
    clock.t += 31
    assert watch.problem() == "trte team-a/e: one reconcile has run for 61s"
    watch.finished(key, due_in=30)
    assert watch.problem() is None


def test_loop_watch_judges_each_loop_against_its_own_resync() -> None:
    """A TRTEngine idle for its whole 300 s resync is healthy; a loop that misses its due time by
    more than `stuck_after` (nothing runs the loops) is not, whichever kind it is."""
    clock = Clock()
    watch = LoopWatch(stuck_after=60, clock=clock)
    engine, deployment = (Kind.TRTENGINE, "team-a", "e"), (Kind.INFERENCEDEPLOYMENT, "team-a", "d")
    watch.started(engine)
    watch.finished(engine, due_in=300)
    watch.started(deployment)
    watch.finished(deployment, due_in=30)
    clock.t += 80  # the deployment loop came round on time (due at 30, late 50 < 60)
    watch.started(deployment)
    watch.finished(deployment, due_in=30)
    clock.t += 280  # 360 s idle for the engine: due at 300, late 60, not more
    assert watch.problem() is not None and "infd team-a/d" in str(watch.problem())  # due 110, late 250
    watch.started(deployment)
    watch.finished(deployment, due_in=30)
    assert watch.problem() is None
    clock.t += 1
    assert watch.problem() == "trte team-a/e: its loop was due 61s ago and has not come round"
    watch.forget(engine)
    assert watch.problem() is None


def test_resync_periods_are_jittered_by_ten_percent() -> None:
    assert jittered(300, 0.0) == pytest.approx(270)
    assert jittered(300, 0.5) == pytest.approx(300)
    assert jittered(300, 0.999999) == pytest.approx(330, abs=1e-3)


@pytest.mark.asyncio
async def test_a_wedged_loop_fails_liveness() -> None:
    clock = Clock()
    watch = LoopWatch(stuck_after=60, clock=clock)
    async with TestClient(TestServer(health_app("replica-0", None, watch.problem))) as c:
        assert (await c.get("/healthz")).status == 200
        watch.started((Kind.INFERENCEDEPLOYMENT, "team-a", "d"))
        clock.t += 120
        r = await c.get("/healthz")
        assert r.status == 503
        assert "infd team-a/d" in (await r.json())["wedged"]


# -------------------------------------------------------------------------- invalid InferenceDeployment


def test_an_invalid_inferencedeployment_gets_ready_false_naming_the_field() -> None:
    body = {
        "apiVersion": "trtforge.io/v1alpha1",
        "kind": "InferenceDeployment",
        "metadata": {"name": "d", "namespace": "team-a", "generation": 3},
        "spec": {"engineRef": {"name": "e"}, "replicas": -1},
    }
    with pytest.raises(ValidationError) as refused:
        InferenceDeployment.model_validate(body)
    message = f"invalid spec: {field_error(refused.value)}"
    assert message.startswith("invalid spec: spec.replicas: ")
    status = invalid_deployment_status(InferenceDeploymentStatus(), 3, message, 1_800_000_000.0)
    ready = next(c for c in status.conditions if c.type == "Ready")
    assert (ready.status, ready.reason, ready.message) == ("False", "InvalidSpec", message)
    assert status.observed_generation == 3


def test_a_claim_on_a_shared_job_wakes_no_other_engine() -> None:
    """N engines sharing a Job: each adding its requester annotation must not wake the other N-1."""
    q = WorkQueue()
    running = job("trtforge-build-" + "a" * 20, "team-a/e1")
    state = (running.running, running.done, running.complete, running.deleting, None)
    assert q.job_changed(running.name, state), "a new Job concerns its requesters"
    claimed = job("trtforge-build-" + "a" * 20, "team-a/e1", "team-a/e2")
    assert not q.job_changed(
        claimed.name, (claimed.running, claimed.done, claimed.complete, claimed.deleting, None)
    )
    done = job("trtforge-build-" + "a" * 20, "team-a/e1", "team-a/e2", running=False)
    assert q.job_changed(done.name, (done.running, done.done, done.complete, done.deleting, None))
    assert q.job_changed(done.name, None) and not q.job_changed(done.name, None)


def test_a_status_write_coming_back_on_the_watch_is_recognised_as_our_own() -> None:
    from trtforge_operator.kinds import Kind
    from trtforge_operator.status_cache import StatusCache

    cache = StatusCache()
    body = {"metadata": {"namespace": "ns", "name": "e", "resourceVersion": "41"}, "status": {}}
    assert not cache.echoes(Kind.TRTENGINE, body)
    cache.wrote(Kind.TRTENGINE, "ns", "e", 42, {"observedGeneration": 1})
    assert not cache.echoes(Kind.TRTENGINE, body)  # an older version: news for the loop
    assert cache.echoes(Kind.TRTENGINE, {**body, "metadata": {**body["metadata"], "resourceVersion": "42"}})
    assert not cache.echoes(
        Kind.TRTENGINE, {**body, "metadata": {**body["metadata"], "resourceVersion": "43"}}
    )


def test_build_slots_know_the_jobs_created_but_not_seen_yet() -> None:
    slots = BuildSlots(8, 4, "build")
    assert not slots.known("trtforge-build-a")
    assert slots.admit(["trtforge-build-a"], "ns")
    assert slots.known("trtforge-build-a")  # created by us; its event has not arrived
    slots.forget("trtforge-build-a")  # its create failed
    assert not slots.known("trtforge-build-a")


def fresh_job(name: str, *requesters: str, active: int = 0, result: str | None = None) -> JobView:
    """A Job as the apiserver stores it right after our POST (no status yet), or with a pod/result."""
    annotations = {requester_annotation(r): r for r in requesters}
    if result is not None:
        annotations[ANNOTATION_RESULT] = result
    return JobView.from_k8s(
        {
            "metadata": {
                "name": name,
                "namespace": "build",
                "labels": {LABEL_BUILD_ID: name[-20:], LABEL_REQUESTER_NAMESPACE: "team-a"},
                "annotations": annotations,
            },
            "status": {"active": active} if active else {},
        }
    )


def test_our_own_job_create_coming_back_wakes_no_engine_but_any_later_change_does() -> None:
    name = "trtforge-build-" + "b" * 20
    slots = BuildSlots(8, 8, "build")
    assert slots.admit([name], "team-a")
    created = fresh_job(name, "team-a/e1")
    assert slots.awaiting_event(name)
    assert own_create_echo(slots.awaiting_event(name), created)
    slots.observe(created)
    assert not slots.awaiting_event(name), "seen once: later events are news"
    assert not own_create_echo(slots.awaiting_event(name), created)
    # Made by another operator process (or before a restart): its first event is news.
    assert not own_create_echo(False, created)
    # Our Job, but it already has a pod, a result, or is going away by the time its event arrives.
    assert not own_create_echo(True, fresh_job(name, "team-a/e1", active=1))
    assert not own_create_echo(True, fresh_job(name, "team-a/e1", result='{"key": "k"}'))
    done = job(name, "team-a/e1", running=False)
    assert not own_create_echo(True, done)


def test_a_build_job_getting_its_pod_is_news_to_its_requesters() -> None:
    """BuildStarting -> BuildRunning depends on the Job having a pod: that change must wake them."""
    q = WorkQueue()
    name = "trtforge-build-" + "c" * 20
    assert q.job_changed(name, job_projection(fresh_job(name, "team-a/e1")))
    assert not q.job_changed(name, job_projection(fresh_job(name, "team-a/e1", "team-a/e2")))
    assert q.job_changed(name, job_projection(fresh_job(name, "team-a/e1", active=1)))
    assert q.job_changed(name, job_projection(fresh_job(name, "team-a/e1", active=1, result="r")))


@pytest.mark.asyncio
async def test_a_freed_build_slot_wakes_the_engines_that_were_refused_one_and_no_other() -> None:
    q = WorkQueue()
    waiting, served, deleted = (q.get(Kind.TRTENGINE, "team-a", n) for n in ("w", "s", "gone"))
    q.set_waiting_for_slot("team-a", "w", True)
    q.set_waiting_for_slot("team-a", "gone", True)
    q.drop(Kind.TRTENGINE, "team-a", "gone")
    q.fire_waiting_for_slot()
    assert waiting.is_set() and not served.is_set() and not deleted.is_set()
    waiting.clear()
    q.set_waiting_for_slot("team-a", "w", False)  # its next pass got the slot
    q.fire_waiting_for_slot()
    assert not waiting.is_set()


def test_build_slots_count_what_they_hold_so_a_freed_slot_shows() -> None:
    slots = BuildSlots(8, 8, "build")
    a, b = "trtforge-build-" + "a" * 20, "trtforge-build-" + "b" * 20
    assert slots.admit([a, b], "team-a") and slots.held == 2
    slots.observe(job(a, "team-a/e1"))
    assert slots.held == 2, "a reservation seen running still holds its slot"
    slots.observe(job(a, "team-a/e1", running=False))
    assert slots.held == 1
    slots.forget(b)
    assert slots.held == 0


def test_kopfs_finalizer_patch_is_no_news_to_an_engine_but_spec_annotations_status_and_deletion_are() -> None:
    q = WorkQueue()
    new = {"metadata": {"name": "e", "namespace": "ns", "generation": 1, "resourceVersion": "1"}}
    assert q.engine_changed("ns", "e", engine_projection(new)), "a new engine is news"
    finalized = {"metadata": {**new["metadata"], "finalizers": ["trtforge.io/x"], "resourceVersion": "2"}}
    assert not q.engine_changed("ns", "e", engine_projection(finalized))
    for changed in (
        {"metadata": {**finalized["metadata"], "generation": 2}},
        {"metadata": {**finalized["metadata"], "annotations": {"trtforge.io/rebuild-x": "{}"}}},
        {"metadata": finalized["metadata"], "status": {"readyTargets": "0/3"}},
        {"metadata": {**finalized["metadata"], "deletionTimestamp": "2026-11-30T17:00:00Z"}},
    ):
        q2 = WorkQueue()
        q2.engine_changed("ns", "e", engine_projection(finalized))
        assert q2.engine_changed("ns", "e", engine_projection(changed)), changed
    assert q.engine_changed("ns", "e", None), "gone is news"
    assert q.engine_changed("ns", "e", engine_projection(finalized)), "and seen again after, too"


def test_an_inferencedeployments_recorded_faults_changing_is_news_to_its_engine() -> None:
    """Its TRTEngine plans fault rebuilds from them (planning/rebuild.py): a change wakes it, the
    same faults again (a status write of something else) do not, and no faults ever is never news."""
    q = WorkQueue()
    assert not q.infd_faults_changed("ns", "d", "null"), "no faults recorded: nothing to plan from"
    assert q.infd_faults_changed("ns", "d", '[{"pod": "p"}]')
    assert not q.infd_faults_changed("ns", "d", '[{"pod": "p"}]')
    assert q.infd_faults_changed("ns", "d", '[{"pod": "p", "recoveredSeconds": 3.0}]')
    assert q.infd_faults_changed("ns", "d", None), "gone: its rebuilds go too"
    assert not q.infd_faults_changed("ns", "d", None)
