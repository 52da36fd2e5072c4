"""The kopf layer: thin handlers that gather observed state and apply what the pure planners decide.

One level-based path per resource: a daemon per TRTEngine / InferenceDeployment loops "observe → plan →
apply → wait", woken by events on the resource and its children (Jobs, Pods, Deployments, Nodes) or by
a resync timer. Observed children come from kopf indices, looked up by key (a pass touches only its
own targets' Jobs and its own pods), so a pass costs what its own work costs, not what the cluster
holds (docs/design.md §"Scale"). An event wakes only the owners it names (workqueue.py). Build
capacity is admitted in one synchronous step (build_slots.py); no lock is held across an API call.
Status is patched only when it differs from what is there (status_cache.py). Deletion handlers (with
our finalizer) clean up children.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Mapping
from typing import Any

import kopf
from kubernetes.client.rest import ApiException
from pydantic import ValidationError

from trtforge.logs import fields
from trtforge_operator import children, job_cleanup
from trtforge_operator.api import (
    InferenceDeployment,
    InferenceDeploymentStatus,
    TRTEngine,
)
from trtforge_operator.api.common import field_error
from trtforge_operator.engine_apply import apply_engine, apply_job_actions
from trtforge_operator.kinds import Kind
from trtforge_operator.labels import (
    ANNOTATION_SOURCE_FINGERPRINT,
    APP_COMPONENT,
    APP_MANAGED_BY,
    COMPONENT_BUILDER,
    COMPONENT_RUNTIME,
    COMPONENT_VERIFIER,
    FINALIZER,
    GROUP,
    INFERENCEDEPLOYMENTS,
    LABEL_INFERENCEDEPLOYMENT,
    MANAGED_BY,
    TRTENGINES,
    VERSION,
)
from trtforge_operator.observe import INFD_FAULTS_IDX, observe_engine, observe_release
from trtforge_operator.observed import AutoscalerView, DeploymentView, JobView, NodeView, PodView
from trtforge_operator.planning.cleanup import plan_release
from trtforge_operator.planning.deployment import (
    DeploymentObserved,
    invalid_deployment_status,
    plan_deployment,
)
from trtforge_operator.planning.engine import plan_engine_pass
from trtforge_operator.planning.rebuild import legacy_cleanup_patch, parse_observed
from trtforge_operator.planning.text import one_line
from trtforge_operator.state import State, parsed_status, plain
from trtforge_operator.workqueue import (
    engine_projection,
    jittered,
    job_projection,
    own_create_echo,
    verify_job_engine,
)
from trtforge_operator.writes import post_events, write_status

log = logging.getLogger(__name__)
MANAGED = {APP_MANAGED_BY: MANAGED_BY}
DEBOUNCE_S = 0.2


class NoDiffBase(kopf.DiffBaseStorage):
    """Keep no diff-base: the only changing handlers are deletions, which need none. Kopf's default
    writes a last-handled-configuration annotation on every new object: one more write of each
    TRTEngine for nothing (docs/design.md §"Scale"). Every event then reads as a creation with no
    creation handler: nothing runs and nothing is written."""

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        """An empty essence: kopf builds one (a deep copy of the body, copied again to clear it) on
        every event of every watched kind, only to diff it for change handlers we do not have. At
        N = 1000 that was an eighth of the event loop (docs/design.md §"Scale")."""
        return kopf.BodyEssence()


_plain = plain
_parsed_status = parsed_status
_write_status = write_status
_post_events = post_events


def _current_status(state: State, kind: Kind, body: Mapping[str, Any]) -> dict[str, Any]:
    return state.statuses.current(kind, body)


# ------------------------------------------------------------------------------------------ TRTEngine


async def reconcile_engine(state: State, body: Mapping[str, Any], indices: Mapping[str, Any]) -> float | None:
    """One level-based pass over a TRTEngine: observe, plan, apply; returns seconds until it wants
    to run again (backoff). Planning and slot admission run in one synchronous step after the last
    read (docs/design.md §"Observe, plan, apply")."""
    obs = await observe_engine(state, body, indices)
    plan = plan_engine_pass(obs, state.cfg)
    return await apply_engine(state, body, obs, plan)


async def cleanup_engine(state: State, body: Mapping[str, Any], indices: Mapping[str, Any]) -> None:
    """On deletion: leave every build Job this engine requested. A Job whose requester annotations
    name no one else is deleted; one that another requester still names only loses our annotation
    (judged from the Job's own annotations, never from other engines' status). Engines stay in the
    store (a cache)."""
    requester, jobs = observe_release(body, indices)
    await apply_job_actions(state, plan_release(requester, jobs))
    meta = body["metadata"]
    _forget(state, Kind.TRTENGINE, meta["namespace"], meta["name"])


# ------------------------------------------------------------------------------- InferenceDeployment


async def reconcile_deployment(state: State, body: Mapping[str, Any], indices: Mapping[str, Any]) -> None:
    body = _plain(body)
    meta = body["metadata"]
    ns, name, gen, uid = (
        meta["namespace"],
        meta["name"],
        int(meta.get("generation") or 1),
        meta.get("uid", ""),
    )
    old = _current_status(state, Kind.INFERENCEDEPLOYMENT, body)
    old_status = _parsed_status(InferenceDeploymentStatus, old)
    try:
        obj = InferenceDeployment.model_validate({**body, "status": old})
    except ValidationError as e:
        message = f"invalid spec: {field_error(e)}"
        log.warning("InferenceDeployment %s/%s: %s", ns, name, message)
        status = invalid_deployment_status(old_status, gen, message, time.time())
        await _write_status(
            state, Kind.INFERENCEDEPLOYMENT, INFERENCEDEPLOYMENTS, body, old, status.to_wire()
        )
        return
    engine_name = obj.spec.engine_ref.name
    state.queue.set_engine_ref(ns, name, engine_name)
    engine: TRTEngine | None = None
    problem = None
    for found in list(indices["trte_idx"].get((ns, engine_name), [])):
        engine = found
    if engine is None:
        problem = f"TRTEngine {engine_name} not found in namespace {ns} (references stay in the namespace)"
    label = children.dns_name(name)
    deployments = [v for v in list(indices["deps_idx"].get((ns, label), [])) if isinstance(v, DeploymentView)]
    pods = [v for v in list(indices["rpods_idx"].get((ns, label), [])) if isinstance(v, PodView)]
    autoscalers = [v for v in list(indices["hpas_idx"].get((ns, label), [])) if isinstance(v, AutoscalerView)]
    wants_autoscaling = obj.spec.autoscaling is not None or any(t.autoscaling for t in obj.spec.targets)
    hpa_api = await state.autoscaling_api() if wants_autoscaling or autoscalers else None
    nodes = state.nodes(indices)
    # The engine's own build and rebuild Jobs, by build id (rebuilds share the engine key's id).
    ids = {t.engine_key[:20] for t in (engine.status.targets if engine is not None else []) if t.engine_key}
    jobs = [j for bid in ids for j in list(indices["jobs_idx"].get(bid, ())) if isinstance(j, JobView)]
    obs = DeploymentObserved(
        namespace=ns,
        name=name,
        uid=uid,
        generation=gen,
        spec=obj.spec,
        status=obj.status,
        engine=engine,
        deployments=deployments,
        pods=pods,
        nodes=nodes,
        jobs=jobs,
        now=time.time(),
        engine_problem=problem,
        autoscalers=autoscalers,
        hpa_api=hpa_api,
    )
    plan = plan_deployment(obs, state.cfg)
    state.metrics.observe_deployment(ns, name, plan.status)
    old_norm = old_status.to_wire() if old else {}
    new = plan.status.to_wire()
    # Record faults (and their actions) before acting on them: a crash in between repeats the actions.
    await _write_status(state, Kind.INFERENCEDEPLOYMENT, INFERENCEDEPLOYMENTS, body, old_norm, new)
    for obj_ in plan.apply:
        try:
            keep = obj_["kind"] == "Deployment" and obj_["metadata"]["name"] in plan.hpa_owned
            await state.kube.apply_owned(obj_, keep_replicas=keep)
        except ApiException as e:
            log.warning(
                "could not apply %s %s/%s: %s %s",
                obj_["kind"],
                ns,
                obj_["metadata"]["name"],
                e.status,
                e.reason,
            )
    for hpa in plan.apply_autoscalers:
        try:
            await state.kube.apply_autoscaler(hpa)
        except ApiException as e:
            log.warning(
                "could not apply HorizontalPodAutoscaler %s/%s: %s %s",
                ns,
                hpa["metadata"]["name"],
                e.status,
                e.reason,
                extra=fields(namespace=ns, name=hpa["metadata"]["name"]),
            )
    for h in plan.delete_autoscalers:
        await state.kube.delete_autoscaler(ns, h)
    for d in plan.delete_deployments:
        await state.kube.delete("Deployment", ns, d)
    for p in plan.delete_pods:
        await state.kube.delete("Pod", ns, p)
    if engine is not None:
        # The TRTEngine creates the rebuilds from this status (planning/rebuild.py); requests an
        # earlier version recorded on it as annotations go.
        patch = legacy_cleanup_patch(f"{ns}/{name}", engine.metadata.annotations)
        if patch:
            await state.kube.annotate("TRTEngine", ns, engine_name, patch)
    known = {(f.pod, f.time) for f in old_status.faults}
    for f in plan.status.faults:
        if (f.pod, f.time) not in known:
            state.metrics.faults.labels(f.action).inc()
    old_faults = {(f.pod, f.time) for f in old_status.faults if f.recovered_seconds is not None}
    for f in plan.status.faults:
        if f.recovered_seconds is not None and (f.pod, f.time) not in old_faults:
            state.metrics.recovery_seconds.observe(f.recovered_seconds)
    await _post_events(state, body, plan.events)


async def cleanup_deployment(state: State, body: Mapping[str, Any], indices: Mapping[str, Any]) -> None:
    """On deletion: delete the HPAs, the runtime Deployments and the Service (ownerRefs would too,
    eventually)."""
    meta = body["metadata"]
    ns, name = meta["namespace"], meta["name"]
    for h in list(indices["hpas_idx"].get((ns, children.dns_name(name)), [])):
        if isinstance(h, AutoscalerView):
            await state.kube.delete_autoscaler(ns, h.name)
    for d in list(indices["deps_idx"].get((ns, children.dns_name(name)), [])):
        if isinstance(d, DeploymentView):
            await state.kube.delete("Deployment", ns, d.name)
    await state.kube.delete("Service", ns, children.service_name(name))
    _forget(state, Kind.INFERENCEDEPLOYMENT, ns, name)


def _forget(state: State, kind: Kind, namespace: str, name: str) -> None:
    """Drop what the operator keeps about a deleted object (its wake-up flag, the status it wrote)."""
    state.queue.drop(kind, namespace, name)
    state.watch.forget((kind, namespace, name))
    state.statuses.forget(kind, namespace, name)
    state.metrics.forget(kind, namespace, name)


# ----------------------------------------------------------------------------------------- the loop


async def _loop(state: State, kind: Kind, body: Any, stopped: Any, kwargs: Mapping[str, Any]) -> None:
    meta = body["metadata"]
    ns, name = meta["namespace"], meta["name"]
    trigger = state.queue.get(kind, ns, name)
    if state.indices is None:  # the same index objects every handler gets (finished-Job cleanup reads them)
        state.indices = {k: kwargs[k] for k in job_cleanup.INDICES}
    fn = reconcile_engine if kind == Kind.TRTENGINE else reconcile_deployment
    key = (kind, ns, name)
    resync = state.cfg.engine_resync_seconds if kind == Kind.TRTENGINE else state.cfg.resync_seconds
    while not stopped:
        trigger.clear()
        t0 = time.monotonic()
        wait = jittered(resync, random.random())
        state.watch.started(key)
        try:
            again = await fn(state, body, kwargs)
            state.metrics.reconciles.labels(kind, "ok").inc()
            if again:
                wait = min(wait, again)
        except (ApiException, OSError) as e:
            state.metrics.reconciles.labels(kind, "error").inc()
            log.warning(
                "%s %s/%s: reconcile failed, retrying: %s",
                kind,
                ns,
                name,
                one_line(str(e), 200),
                extra=fields(kind=kind, namespace=ns, name=name),
            )
            wait = min(wait, 5.0)
        except Exception:
            state.metrics.reconciles.labels(kind, "error").inc()
            log.exception("%s %s/%s: reconcile crashed", kind, ns, name)
            wait = min(wait, 10.0)
        finally:
            state.watch.finished(key, due_in=wait)
            state.metrics.reconcile_seconds.labels(kind).observe(time.monotonic() - t0)
        await _wait_any(trigger, stopped, wait)
        await asyncio.sleep(DEBOUNCE_S)


async def _wait_any(trigger: asyncio.Event, stopped: Any, timeout: float) -> None:
    """Until woken, stopped (deletion, shutdown: exit promptly) or the resync timeout."""

    async def _stopped() -> None:
        await stopped.wait()

    tasks = [asyncio.ensure_future(trigger.wait()), asyncio.ensure_future(_stopped())]
    try:
        await asyncio.wait(tasks, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()


def register(state: State, registry: kopf.OperatorRegistry) -> None:
    """Register every handler on `registry` (no import-time side effects)."""
    cfg = state.cfg

    def _build_pod_job(namespace: str, labels: Mapping[str, str]) -> str | None:
        """The Job a build pod belongs to; None outside the build namespace."""
        if namespace != cfg.build_namespace:
            return None
        return labels.get("job-name") or labels.get("batch.kubernetes.io/job-name") or None

    @kopf.on.startup(registry=registry)
    def _settings(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.persistence.finalizer = FINALIZER
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="trtforge.io")
        settings.persistence.diffbase_storage = NoDiffBase()
        settings.watching.server_timeout = 300
        settings.watching.client_timeout = 310
        settings.watching.connect_timeout = 30
        settings.networking.request_timeout = 60
        settings.posting.level = logging.WARNING  # our own Events go through Kube.event
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)  # one line per handled event is noise

    @kopf.on.startup(registry=registry)
    async def _start_job_cleanup(**_: Any) -> None:
        if cfg.build.finished_job_ttl_seconds > 0:
            state.tasks.append(asyncio.create_task(job_cleanup.run(state)))

    @kopf.on.cleanup(registry=registry)
    async def _stop_job_cleanup(**_: Any) -> None:
        for t in state.tasks:
            t.cancel()

    # --- indices (complete before any handler runs: a restart sees every Job it made)
    @kopf.index("batch", "v1", "jobs", id="jobs_idx", labels=MANAGED, registry=registry)
    def _jobs_idx(**kw: Any) -> Any:
        body, namespace = kw["body"], kw["namespace"]
        if namespace != cfg.build_namespace:
            return None
        j = JobView.from_k8s(body)
        return {j.build_id: j}

    @kopf.index(
        "batch",
        "v1",
        "jobs",
        id="vjobs_idx",
        labels={**MANAGED, APP_COMPONENT: COMPONENT_VERIFIER},
        registry=registry,
    )
    def _vjobs_idx(**kw: Any) -> Any:
        return {kw["namespace"]: JobView.from_k8s(kw["body"])}

    @kopf.index(
        "v1",
        "pods",
        id="vpods_idx",
        labels={**MANAGED, APP_COMPONENT: COMPONENT_VERIFIER},
        registry=registry,
    )
    def _vpods_idx(**kw: Any) -> Any:
        job = kw["labels"].get("job-name") or kw["labels"].get("batch.kubernetes.io/job-name")
        return {(kw["namespace"], job): PodView.from_verify_pod(kw["body"])} if job else None

    @kopf.index("v1", "namespaces", id="ns_idx", registry=registry)
    def _ns_idx(**kw: Any) -> Any:
        return {kw["name"]: dict(kw["labels"] or {})}

    @kopf.index("v1", "nodes", id="nodes_idx", registry=registry)
    def _nodes_idx(**kw: Any) -> Any:
        body, name = kw["body"], kw["name"]
        return {name: NodeView.from_k8s(body)}

    @kopf.index(
        "v1",
        "pods",
        id="bpods_idx",
        labels={**MANAGED, APP_COMPONENT: COMPONENT_BUILDER},
        registry=registry,
    )
    def _bpods_idx(**kw: Any) -> Any:
        job = _build_pod_job(kw["namespace"], kw["labels"])
        return {job: PodView.from_build_pod(kw["body"])} if job else None

    @kopf.index(
        "v1",
        "pods",
        id="rpods_idx",
        labels={**MANAGED, APP_COMPONENT: COMPONENT_RUNTIME},
        registry=registry,
    )
    def _rpods_idx(**kw: Any) -> Any:
        body, namespace, labels = kw["body"], kw["namespace"], kw["labels"]
        return {(namespace, labels.get(LABEL_INFERENCEDEPLOYMENT, "")): PodView.from_k8s(body)}

    @kopf.index("apps", "v1", "deployments", id="deps_idx", labels=MANAGED, registry=registry)
    def _deps_idx(**kw: Any) -> Any:
        body, namespace, labels = kw["body"], kw["namespace"], kw["labels"]
        return {(namespace, labels.get(LABEL_INFERENCEDEPLOYMENT, "")): DeploymentView.from_k8s(body)}

    @kopf.index(GROUP, VERSION, INFERENCEDEPLOYMENTS, id=INFD_FAULTS_IDX, registry=registry)
    def _infd_faults_idx(**kw: Any) -> Any:
        """The faults an InferenceDeployment's status records, by the engine it serves (same namespace)."""
        namespace, name, body = kw["namespace"], kw["name"], kw["body"]
        ref = ((body.get("spec") or {}).get("engineRef") or {}).get("name")
        observed = parse_observed(f"{namespace}/{name}", _plain(body.get("status") or {}))
        return {(namespace, str(ref)): observed} if ref and observed is not None else None

    # Read through autoscaling/v1 (served by every version): metadata, target and counts are all a
    # pass needs; the operator writes them in v2 or v2beta2 (planning/autoscaling.py).
    @kopf.index(
        "autoscaling", "v1", "horizontalpodautoscalers", id="hpas_idx", labels=MANAGED, registry=registry
    )
    def _hpas_idx(**kw: Any) -> Any:
        body, namespace, labels = kw["body"], kw["namespace"], kw["labels"]
        return {(namespace, labels.get(LABEL_INFERENCEDEPLOYMENT, "")): AutoscalerView.from_k8s(body)}

    @kopf.index(GROUP, VERSION, TRTENGINES, id="trte_idx", registry=registry)
    def _trte_idx(**kw: Any) -> Any:
        body, namespace, name = kw["body"], kw["namespace"], kw["name"]
        try:
            return {(namespace, name): TRTEngine.model_validate(_plain(body))}
        except ValidationError:
            return None

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
        result from the pod (the index has it) and records it on the Job (engine_apply.py)."""
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
            key = getattr(pod.reported, "key", None)
            if key:
                state.store.invalidate(str(key))
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

    # --- the level-based loops, one per resource
    @kopf.daemon(GROUP, VERSION, TRTENGINES, id="reconcile", cancellation_timeout=1.0, registry=registry)
    async def _engine_daemon(body: Any, stopped: Any, **kwargs: Any) -> None:
        await _loop(state, Kind.TRTENGINE, body, stopped, kwargs)

    @kopf.daemon(
        GROUP,
        VERSION,
        INFERENCEDEPLOYMENTS,
        id="reconcile",
        cancellation_timeout=1.0,
        registry=registry,
    )
    async def _infd_daemon(body: Any, stopped: Any, **kwargs: Any) -> None:
        await _loop(state, Kind.INFERENCEDEPLOYMENT, body, stopped, kwargs)

    # --- deletion (our finalizer holds the object until these succeed)
    @kopf.on.delete(GROUP, VERSION, TRTENGINES, id="cleanup", registry=registry)
    async def _engine_deleted(body: Any, **kwargs: Any) -> None:
        await cleanup_engine(state, body, kwargs)

    @kopf.on.delete(GROUP, VERSION, INFERENCEDEPLOYMENTS, id="cleanup", registry=registry)
    async def _infd_deleted(body: Any, **kwargs: Any) -> None:
        await cleanup_deployment(state, body, kwargs)
