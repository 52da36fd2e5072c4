"""Wake-ups: which loops an event on a resource or a child wakes, and the counters it keeps."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import kopf

from trtforge.contract.build_result import BuildResult
from trtforge_operator.apply import children
from trtforge_operator.kinds import Kind
from trtforge_operator.labels import (
    ANNOTATION_SOURCE_FINGERPRINT,
    APP_COMPONENT,
    APP_MANAGED_BY,
    COMPONENT_BUILDER,
    COMPONENT_RUNTIME,
    COMPONENT_VERIFIER,
    GROUP,
    INFERENCEDEPLOYMENTS,
    LABEL_INFERENCEDEPLOYMENT,
    MANAGED_BY,
    TRTENGINES,
    VERSION,
)
from trtforge_operator.observe.views import JobView, NodeView, PodView
from trtforge_operator.state import State
from trtforge_operator.workqueue import (
    engine_projection,
    job_projection,
    own_create_echo,
    verify_job_engine,
)

MANAGED = {APP_MANAGED_BY: MANAGED_BY}


def build_pod_job(build_namespace: str, namespace: str, labels: Mapping[str, str]) -> str | None:
    """The Job a build pod belongs to; None outside the build namespace."""
    if namespace != build_namespace:
        return None
    return labels.get("job-name") or labels.get("batch.kubernetes.io/job-name") or None


def register_wakeups(state: State, registry: kopf.OperatorRegistry) -> None:
    """Events on the resources and their children wake the loops they concern (workqueue.py); they
    read and write nothing but the operator's own counters and caches."""
    cfg = state.cfg

    def _build_pod_job(namespace: str, labels: Mapping[str, str]) -> str | None:
        return build_pod_job(cfg.build_namespace, namespace, labels)

    # --- events on children wake the owners' loops
    @kopf.on.event("batch", "v1", "jobs", labels=MANAGED, registry=registry)
    def _job_event(**kw: Any) -> None:
        body = kw["body"]
        j = JobView.from_k8s(body)
        if j.labels.get(APP_COMPONENT) == COMPONENT_VERIFIER:  # not a build: no slot, wake its engine
            if j.done:
                fp = j.annotations.get(ANNOTATION_SOURCE_FINGERPRINT, "")
                state.store.invalidate_possession(j.namespace, fp)
            engine = verify_job_engine(j)
            if engine is not None:
                state.queue.fire(Kind.TRTENGINE, j.namespace, engine)
            return
        if j.namespace != cfg.build_namespace:
            # Our build Jobs live in the build namespace only. A Job elsewhere wearing our labels was
            # made by someone else: it holds no slot and names no requester (docs/security.md).
            return
        created_here = state.slots.awaiting_event(j.name)  # before observe() clears it
        held = state.slots.held
        if kw.get("type") == "DELETED":
            state.slots.forget(j.name)
            state.results_recorded.discard(j.name)
        else:
            state.slots.observe(j)
        state.metrics.builds_running.set(state.slots.running)
        if state.slots.held < held:
            state.queue.fire_waiting_for_slot()
        if j.recorded:
            state.results_recorded.discard(j.name)  # the Job carries it now: no pass writes it again
        if j.done:
            key = j.engine_key or ((j.result() or {}).get("key") or "")
            if key:
                state.store.invalidate(str(key))
            state.store.invalidate_request(j.request_digest)
        gone = kw.get("type") == "DELETED"
        if not state.queue.job_changed(j.name, None if gone else job_projection(j)):
            return  # only a requester annotation changed: the engine that added it knows already
        echo = not gone and own_create_echo(created_here, j)
        for r in j.requesters():
            ns, _, n = r.partition("/")
            if not echo:  # our own create coming back is no news to the engine that made it
                state.queue.fire(Kind.TRTENGINE, ns, n)
            state.queue.fire_deployments_of(ns, n)

    @kopf.on.event("v1", "pods", labels={**MANAGED, APP_COMPONENT: COMPONENT_BUILDER}, registry=registry)
    def _build_pod_event(**kw: Any) -> None:
        """A build pod that reports its result wakes the engines that use its Job: their pass reads the
        result from the pod (the index has it) and records it on the Job (apply/engine.py)."""
        job_name = _build_pod_job(kw["namespace"], kw["labels"])
        if not job_name:
            return
        pod = PodView.from_build_pod(kw["body"])
        if pod.reported is None:
            return
        bid = job_name.removeprefix(children.JOB_PREFIX)[:20]
        for j in list(kw["jobs_idx"].get(bid, ())):
            if not isinstance(j, JobView) or j.name != job_name or j.recorded:
                continue
            if isinstance(pod.reported, BuildResult):  # its engine may be in the store now
                state.store.invalidate(pod.reported.key)
            state.store.invalidate_request(j.request_digest)
            for r in j.requesters():
                ns, _, n = r.partition("/")
                state.queue.fire(Kind.TRTENGINE, ns, n)

    @kopf.on.event("v1", "pods", labels={**MANAGED, APP_COMPONENT: COMPONENT_VERIFIER}, registry=registry)
    def _verify_pod_event(**kw: Any) -> None:
        """A verify pod that cannot start (or starts) changes its engine's status: wake that engine."""
        ns, labels = kw["namespace"], kw["labels"] or {}
        job = labels.get("job-name") or labels.get("batch.kubernetes.io/job-name")
        for j in list(kw["vjobs_idx"].get(ns, [])):
            if isinstance(j, JobView) and j.name == job and (engine := verify_job_engine(j)) is not None:
                state.queue.fire(Kind.TRTENGINE, ns, engine)

    @kopf.on.event("v1", "pods", labels={**MANAGED, APP_COMPONENT: COMPONENT_RUNTIME}, registry=registry)
    def _runtime_pod_event(**kw: Any) -> None:
        namespace, labels = kw["namespace"], kw["labels"]
        state.queue.fire_label(Kind.INFERENCEDEPLOYMENT, namespace, labels.get(LABEL_INFERENCEDEPLOYMENT, ""))

    @kopf.on.event("apps", "v1", "deployments", labels=MANAGED, registry=registry)
    def _deployment_event(**kw: Any) -> None:
        namespace, labels = kw["namespace"], kw["labels"]
        state.queue.fire_label(Kind.INFERENCEDEPLOYMENT, namespace, labels.get(LABEL_INFERENCEDEPLOYMENT, ""))

    @kopf.on.event("autoscaling", "v1", "horizontalpodautoscalers", labels=MANAGED, registry=registry)
    def _autoscaler_event(**kw: Any) -> None:
        namespace, labels = kw["namespace"], kw["labels"]
        state.queue.fire_label(Kind.INFERENCEDEPLOYMENT, namespace, labels.get(LABEL_INFERENCEDEPLOYMENT, ""))

    @kopf.on.event("v1", "nodes", registry=registry)
    def _node_event(**kw: Any) -> None:
        body, name, type_ = kw["body"], kw["name"], kw.get("type")
        state.node_views = None  # the index has this event already: read it again on the next pass
        view = None if type_ == "DELETED" else NodeView.from_k8s(body)
        if state.queue.node_changed(view, name):
            state.queue.fire_every(Kind.TRTENGINE)
            state.queue.fire_every(Kind.INFERENCEDEPLOYMENT)

    @kopf.on.event(GROUP, VERSION, TRTENGINES, registry=registry)
    def _engine_event(**kw: Any) -> None:
        namespace, name = kw["namespace"], kw["name"]
        gone = kw.get("type") == "DELETED"
        changed = state.queue.engine_changed(namespace, name, None if gone else engine_projection(kw["body"]))
        if not gone and state.statuses.echoes(Kind.TRTENGINE, kw["body"]):
            return  # our own status write coming back: its loop and deployments were woken by it
        if not changed:
            return  # e.g. kopf's finalizer patch: nothing a pass plans from is new
        state.queue.fire(Kind.TRTENGINE, namespace, name)
        state.queue.fire_deployments_of(namespace, name)

    @kopf.on.event(GROUP, VERSION, INFERENCEDEPLOYMENTS, registry=registry)
    def _infd_event(**kw: Any) -> None:
        namespace, name = kw["namespace"], kw["name"]
        ref = ((kw["body"].get("spec") or {}).get("engineRef") or {}).get("name")
        gone = kw.get("type") == "DELETED"
        faults_seen = (
            None if gone else json.dumps((kw["body"].get("status") or {}).get("faults"), default=str)
        )
        if ref and state.queue.infd_faults_changed(namespace, name, faults_seen):
            # Its recorded faults (what the TRTEngine plans rebuilds from) changed, and the index has
            # them already: the engine's next pass sees them.
            state.queue.fire(Kind.TRTENGINE, namespace, str(ref))
        if not gone and state.statuses.echoes(Kind.INFERENCEDEPLOYMENT, kw["body"]):
            return  # our own status write coming back
        if not gone:
            state.queue.set_engine_ref(namespace, name, str(ref) if ref else None)
        state.queue.fire(Kind.INFERENCEDEPLOYMENT, namespace, name)
