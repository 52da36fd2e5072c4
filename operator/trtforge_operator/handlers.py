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
import dataclasses
import json
import logging
import random
import time
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

import kopf
from kubernetes.client.rest import ApiException
from pydantic import ValidationError

from trtforge.contract.build_result import BuildFailure, parse_build_message
from trtforge.contract.possession import VerifyGrant, source_fingerprint, verify_grant_path
from trtforge.logs import fields
from trtforge_operator import children, job_cleanup
from trtforge_operator.api import (
    InferenceDeployment,
    InferenceDeploymentStatus,
    TRTEngine,
    TRTEngineStatus,
)
from trtforge_operator.api.common import field_error
from trtforge_operator.autoscaling_discovery import AutoscalingDiscovery
from trtforge_operator.build_slots import BuildSlots
from trtforge_operator.config import OperatorConfig
from trtforge_operator.deployment_applier import apply_deployment_actions
from trtforge_operator.kinds import Kind
from trtforge_operator.kube import Kube, clean_status, status_patch
from trtforge_operator.labels import (
    ANNOTATION_RESULT,
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
    requester_annotation,
)
from trtforge_operator.metrics import Metrics
from trtforge_operator.observed import AutoscalerView, DeploymentView, JobView, NodeView, PodView
from trtforge_operator.planning.autoscaling import AutoscalingApis
from trtforge_operator.planning.cleanup import release_jobs
from trtforge_operator.planning.deployment import (
    DeploymentObserved,
    invalid_deployment_status,
    plan_deployment,
)
from trtforge_operator.planning.deployment_actions import cleanup_actions
from trtforge_operator.planning.engine import model_source_problem, plan_engine
from trtforge_operator.planning.engine_conditions import EngineReason, invalid_spec_status
from trtforge_operator.planning.events import Event
from trtforge_operator.planning.observed_engine import Capacity, EngineObserved
from trtforge_operator.planning.rebuild import ObservedFaults, parse_observed
from trtforge_operator.planning.text import one_line
from trtforge_operator.status_cache import StatusCache, resource_version
from trtforge_operator.store_reader import StoreReader
from trtforge_operator.workqueue import (
    LoopWatch,
    WorkQueue,
    engine_projection,
    jittered,
    job_projection,
    own_create_echo,
    verify_job_engine,
)

log = logging.getLogger(__name__)
MANAGED = {APP_MANAGED_BY: MANAGED_BY}
DEBOUNCE_S = 0.2
V = TypeVar("V")
S = TypeVar("S", TRTEngineStatus, InferenceDeploymentStatus)
INFD_FAULTS_IDX = job_cleanup.INFD_FAULTS_IDX


@dataclasses.dataclass
class State:
    cfg: OperatorConfig
    kube: Kube
    store: StoreReader
    metrics: Metrics
    queue: WorkQueue = dataclasses.field(default_factory=WorkQueue)
    watch: LoopWatch = dataclasses.field(default_factory=lambda: LoopWatch(stuck_after=300.0))
    slots: BuildSlots = dataclasses.field(init=False)
    statuses: StatusCache = dataclasses.field(default_factory=StatusCache)
    indices: Mapping[str, Any] | None = None  # kopf's indices, once a handler has been given them
    tasks: list[asyncio.Task[None]] = dataclasses.field(default_factory=list)  # background loops
    node_views: list[NodeView] | None = None  # the Nodes index as a list; None after any Node event
    discovery: AutoscalingDiscovery = dataclasses.field(init=False)  # the served autoscaling APIs

    def nodes(self, indices: Mapping[str, Any]) -> list[NodeView]:
        """Every Node's view, read from the index once per Node event (not once per pass)."""
        if self.node_views is None:
            self.node_views = _views(indices["nodes_idx"], NodeView)
        return self.node_views

    def __post_init__(self) -> None:
        self.discovery = AutoscalingDiscovery(self.kube, self.cfg.autoscaling)
        self.slots = BuildSlots(
            self.cfg.build.max_concurrent,
            self.cfg.build.max_concurrent_per_namespace,
            self.cfg.build_namespace,
        )


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


def _plain(body: Any) -> dict[str, Any]:
    return json.loads(json.dumps(dict(body), default=str))


def _views(index: Any, cls: type[V]) -> list[V]:
    """A snapshot of every `cls` value of a kopf index (it changes under us between awaits)."""
    return [v for store in list(index.values()) for v in list(store) if isinstance(v, cls)]


def _current_status(state: State, kind: Kind, body: Mapping[str, Any]) -> dict[str, Any]:
    return state.statuses.current(kind, body)


async def _write_status(
    state: State,
    kind: Kind,
    plural: str,
    body: Mapping[str, Any],
    old: Mapping[str, Any],
    new: dict[str, Any],
) -> bool:
    patch = status_patch(old, new)
    if patch is None:
        return False
    meta = body["metadata"]
    res = await state.kube.patch_status(plural, meta["namespace"], meta["name"], patch)
    rv = resource_version((res or {}).get("metadata") or {})
    state.statuses.wrote(kind, meta["namespace"], meta["name"], rv, clean_status(new))
    state.metrics.status_writes.labels(kind).inc()
    return True


async def _post_events(state: State, body: Mapping[str, Any], events: Iterable[Event]) -> None:
    for ev in events:
        await state.kube.event(body, ev.type, ev.reason, ev.message)


async def _create_jobs(state: State, jobs: list[dict[str, Any]], kind: str) -> int:
    """Create-if-absent, every Job at once (a pass's POSTs do not wait on each other; the client's
    thread pool bounds how many are in flight over all passes); returns how many were created now."""

    async def one(j: dict[str, Any]) -> bool:
        try:
            return await state.kube.create(j)
        except ApiException as e:
            state.slots.forget(j["metadata"]["name"])
            state.queue.fire_waiting_for_slot()
            log.warning("could not create Job %s: %s %s", j["metadata"]["name"], e.status, e.reason)
            return False

    created = sum(await asyncio.gather(*(one(j) for j in jobs)))
    if created:
        state.metrics.jobs_created.labels(kind).inc(created)
    return created


def _job_names(jobs: list[dict[str, Any]]) -> list[str]:
    return [str(j["metadata"]["name"]) for j in jobs]


def _cache_scope(state: State, indices: Mapping[str, Any], namespace: str) -> str:
    """The cache scope of `namespace` under the configured sharing policy (its labels from the index)."""
    labels: dict[str, str] = {}
    for found in list(indices["ns_idx"].get(namespace, [])):
        labels = dict(found)
    return state.cfg.cache.scope(namespace, labels)


def _verify_failures(
    indices: Mapping[str, Any], namespace: str, jobs: list[JobView]
) -> dict[str, BuildFailure]:
    """Failed verify Jobs of `namespace` -> the failure their pod reported (termination message)."""
    out: dict[str, BuildFailure] = {}
    for j in jobs:
        for pod in list(indices["vpods_idx"].get((namespace, j.name), [])):
            if not isinstance(pod, PodView):
                continue
            for c in pod.containers:
                t = c.terminated
                if t is None or t.exit_code == 0:
                    continue
                parsed = parse_build_message(t.message)
                if isinstance(parsed, BuildFailure):
                    out[j.name] = parsed
                else:
                    tail = t.message.strip().splitlines()[-1] if t.message.strip() else t.reason
                    out[j.name] = BuildFailure(
                        error=one_line(tail or f"exit code {t.exit_code}"),
                        reason="Error",
                        exit_code=t.exit_code,
                    )
    return out


VERIFY_EVENT_LAG_S = 30.0  # a verify Job created this recently may not be in the index yet


async def _create_verify_job(state: State, job: Mapping[str, Any], grant: VerifyGrant) -> bool:
    """Create a verify Job and the operator's record of it (the broker's only proof that this Job is
    the operator's). The record is written first without the Job's uid (the broker answers its pod
    503, retry, until the uid is there), then with it. A Job that already exists keeps its record;
    one left without a uid (a kill between the two writes) is refused by the broker, fails, and the
    next attempt gets a Job and record of its own. An older record of the same name (a Job since
    deleted, with its TRTEngine) is replaced."""
    path = verify_grant_path(grant.namespace, grant.job)
    existing = await asyncio.to_thread(state.store.verify_grant, grant.namespace, grant.job)
    if (
        existing is not None
        and existing.job_uid
        and grant.issued_at - existing.issued_at < VERIFY_EVENT_LAG_S
    ):
        return False  # created by an earlier pass a moment ago; its event has not arrived yet
    await asyncio.to_thread(state.store.store.put_bytes, path, grant.to_json().encode())
    uid = await state.kube.create_job_uid(job)
    if uid is None:
        return False
    bound = grant.model_copy(update={"job_uid": uid})
    await asyncio.to_thread(state.store.store.put_bytes, path, bound.to_json().encode())
    return True


def _verify_stuck(indices: Mapping[str, Any], namespace: str, jobs: list[JobView]) -> dict[str, str]:
    """Running verify Jobs of `namespace` whose pod cannot start -> the kubelet's or scheduler's reason."""
    out: dict[str, str] = {}
    for j in jobs:
        if not j.running:
            continue
        for pod in list(indices["vpods_idx"].get((namespace, j.name), [])):
            if not isinstance(pod, PodView) or pod.deleting:
                continue
            w = pod.cannot_start()
            if w is not None:
                out[j.name] = one_line(f"{w.reason}: {w.message}" if w.message else w.reason)
            elif pod.unschedulable and pod.phase == "Pending":
                out[j.name] = one_line(f"Unschedulable: {pod.unschedulable}")
    return out


# ------------------------------------------------------------------------------------------ TRTEngine


async def reconcile_engine(state: State, body: Mapping[str, Any], indices: Mapping[str, Any]) -> float | None:
    """One level-based pass over a TRTEngine; returns seconds until it wants to run again (backoff)."""
    body = _plain(body)
    meta = body["metadata"]
    ns, name, gen = meta["namespace"], meta["name"], int(meta.get("generation") or 1)
    old = _current_status(state, Kind.TRTENGINE, body)
    old_status = _parsed_status(TRTEngineStatus, old)
    try:
        obj = TRTEngine.model_validate({**body, "status": old})
    except ValidationError as e:
        status = invalid_spec_status(old_status, gen, f"invalid spec: {field_error(e)}", time.time())
        await _write_status(state, Kind.TRTENGINE, TRTENGINES, body, old, status.to_wire())
        return None
    nodes = state.nodes(indices)
    jobs_idx: Mapping[str, Any] = indices["jobs_idx"]  # by build id: looked up per target, never scanned
    # Proof of possession (docs/security.md): the broker's record for this source, the verify Jobs.
    m = obj.spec.model
    fingerprint = source_fingerprint(m.uri, m.secret_ref.name if m.secret_ref else None, m.sha256)
    possession = await asyncio.to_thread(state.store.possession, ns, fingerprint)
    verify_jobs = [j for j in list(indices["vjobs_idx"].get(ns, [])) if isinstance(j, JobView)]
    verify_failures = _verify_failures(indices, ns, verify_jobs)
    verify_stuck = _verify_stuck(indices, ns, verify_jobs)
    cache_scope = _cache_scope(state, indices, ns)
    problem = model_source_problem(m.uri, state.cfg.store_uri)
    if problem is not None:
        status = invalid_spec_status(
            old_status, gen, problem, time.time(), reason=EngineReason.INVALID_MODEL_SOURCE
        )
        if await _write_status(state, Kind.TRTENGINE, TRTENGINES, body, old, status.to_wire()):
            await state.kube.event(body, "Warning", EngineReason.INVALID_MODEL_SOURCE, problem)
        return None
    unschedulable = {
        job: p.unschedulable
        for job in {t.job_name for t in obj.status.targets if t.job_name}
        for p in list(indices["bpods_idx"].get(job, ()))
        if isinstance(p, PodView) and p.unschedulable and p.phase == "Pending"
    }

    # The faults this namespace's InferenceDeployments recorded for this engine (their status: the
    # operator's own record, never a tenant's annotation).
    observed_faults = [
        o for o in list(indices[INFD_FAULTS_IDX].get((ns, name), ())) if isinstance(o, ObservedFaults)
    ]

    def observe(capacity: Capacity) -> EngineObserved:
        return EngineObserved(
            namespace=ns,
            name=name,
            generation=gen,
            spec=obj.spec,
            status=obj.status,
            nodes=nodes,
            jobs=jobs_idx,
            manifests=state.store.manifest,
            requests=state.store.request,
            capacity=capacity,
            now=time.time(),
            unschedulable=unschedulable,
            observed_faults=observed_faults,
            annotations=dict(meta.get("annotations") or {}),
            uid=meta.get("uid", ""),
            possession=possession,
            verify_jobs=verify_jobs,
            verify_failures=verify_failures,
            verify_stuck=verify_stuck,
            cache_scope=cache_scope,
        )

    plan = await asyncio.to_thread(plan_engine, observe(state.slots.capacity(ns)), state.cfg)
    # Jobs an earlier pass created whose event has not arrived yet get no second POST (a 409); known
    # before admitting, in the same synchronous step.
    known = {n for n in _job_names(plan.jobs_to_create) if state.slots.known(n)}
    if plan.jobs_to_create and not state.slots.admit(_job_names(plan.jobs_to_create), ns):
        # Another pass took the slots meanwhile: plan again against the current count and admit in the
        # same synchronous step (no await between them), so the limits always hold.
        plan = plan_engine(observe(state.slots.capacity(ns)), state.cfg)
        known = {n for n in _job_names(plan.jobs_to_create) if state.slots.known(n)}
        if not state.slots.admit(_job_names(plan.jobs_to_create), ns):
            raise RuntimeError("build slots refused a plan made against their own count")
    state.metrics.builds_running.set(state.slots.running)
    state.queue.set_waiting_for_slot(ns, name, plan.waiting_for_slot)
    for refused in plan.refused:  # a planner bug: the status still shows what was observed
        log.warning("%s/%s: %s", ns, name, refused, extra=fields(namespace=ns, name=name))
        state.metrics.refused_transitions.labels(str(refused.before or "None"), refused.after).inc()
    await _create_jobs(state, [j for j in plan.jobs_to_create if j["metadata"]["name"] not in known], "build")
    for vj in plan.verify_jobs_to_create:  # in the tenant's namespace, not a build slot
        grant = plan.verify_grants.get(vj["metadata"]["name"])
        if grant is not None and await _create_verify_job(state, vj, grant):
            state.metrics.jobs_created.labels("verify").inc()
    requester = f"{ns}/{name}"
    by_name = {
        j.name: j
        for bid in {n.removeprefix(children.JOB_PREFIX)[:20] for n in plan.add_requester}
        for j in list(jobs_idx.get(bid, ()))
        if isinstance(j, JobView)
    }
    for jname in plan.add_requester:
        j = by_name.get(jname)
        if j is not None and requester not in j.requesters():
            await state.kube.annotate(
                "Job", state.cfg.build_namespace, jname, {requester_annotation(requester): requester}
            )
    old_norm = old_status.to_wire() if old else {}
    new = plan.status.to_wire()
    state.metrics.observe_engine(ns, name, plan.status)
    if await _write_status(state, Kind.TRTENGINE, TRTENGINES, body, old_norm, new):
        state.queue.fire_deployments_of(ns, name)
        hits = sum(1 for t in plan.status.targets if t.cache_hit and t.phase == "Ready")
        was = sum(1 for t in old_status.targets if t.cache_hit and t.phase == "Ready")
        if hits > was:
            state.metrics.cache_hits.inc(hits - was)
    await _post_events(state, body, plan.events)
    return plan.requeue_after


def _parsed_status(cls: type[S], raw: Mapping[str, Any]) -> S:
    """A status as its model, or an empty one when what is there does not validate."""
    try:
        return cls.model_validate(raw or {})
    except ValidationError:
        return cls()


async def cleanup_engine(state: State, body: Mapping[str, Any], indices: Mapping[str, Any]) -> None:
    """On deletion: leave every build Job this engine requested. A Job whose requester annotations
    name no one else is deleted; one that another requester still names only loses our annotation
    (judged from the Job's own annotations, never from other engines' status). Engines stay in the
    store (a cache)."""
    body = _plain(body)
    meta = body["metadata"]
    me = (meta["namespace"], meta["name"])
    requester = f"{me[0]}/{me[1]}"
    status = _parsed_status(TRTEngineStatus, body.get("status") or {})
    ids = {k[:20] for t in status.targets for k in (t.engine_key, t.request_key) if k}
    ids |= {t.job_name.removeprefix(children.JOB_PREFIX)[:20] for t in status.targets if t.job_name}
    jobs_idx: Mapping[str, Any] = indices["jobs_idx"]
    candidates = [j for bid in ids for j in list(jobs_idx.get(bid, ())) if isinstance(j, JobView)]
    release = release_jobs(requester, candidates)
    for j in release.delete:
        await state.kube.delete("Job", j.namespace, j.name)
    for j in release.leave:
        await state.kube.annotate("Job", j.namespace, j.name, {requester_annotation(requester): None})
    _forget(state, Kind.TRTENGINE, *me)


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
    autoscalers = [
        v
        for idx in ("hpas_idx", "sos_idx")
        for v in list(indices[idx].get((ns, label), []))
        if isinstance(v, AutoscalerView)
    ]
    autos = [obj.spec.autoscaling, *(t.autoscaling for t in obj.spec.targets)]
    wants_autoscaling = any(a is not None for a in autos)
    apis = await state.discovery.current(autos) if wants_autoscaling or autoscalers else AutoscalingApis()
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
        apis=apis,
    )
    plan = plan_deployment(obs, state.cfg)
    state.metrics.observe_deployment(ns, name, plan.status)
    old_norm = old_status.to_wire() if old else {}

    async def write_status(new: Mapping[str, Any]) -> None:
        await _write_status(state, Kind.INFERENCEDEPLOYMENT, INFERENCEDEPLOYMENTS, body, old_norm, dict(new))

    await apply_deployment_actions(state.kube, state.discovery, body, plan.actions, write_status)
    known = {(f.pod, f.time) for f in old_status.faults}
    for f in plan.status.faults:
        if (f.pod, f.time) not in known:
            state.metrics.faults.labels(f.action).inc()
    old_faults = {(f.pod, f.time) for f in old_status.faults if f.recovered_seconds is not None}
    for f in plan.status.faults:
        if f.recovered_seconds is not None and (f.pod, f.time) not in old_faults:
            state.metrics.recovery_seconds.observe(f.recovered_seconds)


async def cleanup_deployment(state: State, body: Mapping[str, Any], indices: Mapping[str, Any]) -> None:
    """On deletion: delete the HPAs, the runtime Deployments and the Service (ownerRefs would too,
    eventually)."""
    meta = body["metadata"]
    ns, name = meta["namespace"], meta["name"]
    label = (ns, children.dns_name(name))
    autoscalers = [
        h
        for idx in ("hpas_idx", "sos_idx")
        for h in list(indices[idx].get(label, []))
        if isinstance(h, AutoscalerView)
    ]
    deployments = [d.name for d in list(indices["deps_idx"].get(label, [])) if isinstance(d, DeploymentView)]
    actions = cleanup_actions(deployments, autoscalers, children.service_name(name))
    await apply_deployment_actions(state.kube, state.discovery, body, actions)
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


def _build_pod_result(pod: PodView) -> str | None:
    """The result line a finished build pod left (its termination message), as the Job annotation holds it."""
    for c in pod.containers:
        t = c.terminated
        if t is None:
            continue
        parsed = parse_build_message(t.message)
        if parsed is not None:
            return parsed.to_line()
        if t.exit_code != 0:
            tail = t.message.strip().splitlines()[-1] if t.message.strip() else t.reason
            return BuildFailure(
                error=one_line(tail or f"exit code {t.exit_code}"), reason="Error", exit_code=t.exit_code
            ).to_line()
    return None


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
            state.tasks.append(
                asyncio.create_task(job_cleanup.run(cfg, state.kube, state.metrics, lambda: state.indices))
            )

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
        return {(kw["namespace"], job): PodView.from_k8s(kw["body"])} if job else None

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
        return {job: PodView.from_k8s(kw["body"])} if job else None

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

    # KEDA's ScaledObjects (provider: KEDA). Where KEDA's CRDs are not installed kopf serves nothing
    # here and starts watching once they are.
    @kopf.index("keda.sh", "v1alpha1", "scaledobjects", id="sos_idx", labels=MANAGED, registry=registry)
    def _sos_idx(**kw: Any) -> Any:
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
        else:
            state.slots.observe(j)
        state.metrics.builds_running.set(state.slots.running)
        if state.slots.held < held:
            state.queue.fire_waiting_for_slot()
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
    async def _build_pod_event(**kw: Any) -> None:
        body, namespace = kw["body"], kw["namespace"]
        job_name = _build_pod_job(namespace, kw["labels"])
        if not job_name:
            return
        result = _build_pod_result(PodView.from_k8s(body))
        if result is None:
            return
        job = await state.kube.job_annotations(namespace, job_name)
        if job is not None and ANNOTATION_RESULT not in job:
            await state.kube.annotate("Job", namespace, job_name, {ANNOTATION_RESULT: result})
            state.metrics.observe_build_result(result)

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

    @kopf.on.event("keda.sh", "v1alpha1", "scaledobjects", labels=MANAGED, registry=registry)
    def _scaled_object_event(**kw: Any) -> None:
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
