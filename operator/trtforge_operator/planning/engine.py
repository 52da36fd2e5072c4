"""TRTEngine planning: observed state in, desired build Jobs, status and Events out. No I/O.

The parts, one job each: observe/keys.py (request keys), engine_policies.py (the policy chain that
puts one target in its state), target.py (that target's status and build), target_state.py (the
states and their transition table), verify.py (proof of possession, a policy chain too),
engine_conditions.py (conditions and Events from the typed states). This module puts them together
for every target and admits new builds against the capacity.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from trtforge_operator.api import (
    TargetStatus,
    TRTEngineStatus,
    VerifiedModel,
    ready_text,
)
from trtforge_operator.api.trtengine import TRTEngine
from trtforge_operator.apply import children
from trtforge_operator.config import OperatorConfig
from trtforge_operator.labels import LABEL_BUILD_ID
from trtforge_operator.observe.claim_view import StoreBlockedEngine
from trtforge_operator.observe.keys import resolve_targets
from trtforge_operator.observe.views import (
    Capacity,
    EngineObserved,
    JobView,
    UnreadableEngine,
    jobs_by_build_id,
    obs_requester,
    utc,
)
from trtforge_operator.planning.engine_actions import (
    AddRequester,
    CreateJob,
    CreateVerifyJob,
    Emit,
    EngineAction,
    EnginePlan,
    JobPurpose,
    RecordResult,
    RequeueAfter,
    WaitForSlot,
    WriteStatus,
)
from trtforge_operator.planning.engine_conditions import (
    EngineReason,
    engine_conditions,
    invalid_spec_status,
    rebuild_requests_condition,
    transition_events,
)
from trtforge_operator.planning.events import Event, merged
from trtforge_operator.planning.llm_engine import llm_conditions, plan_llm, target_refusal
from trtforge_operator.planning.pruned import pruned_condition, pruned_fields, spec_schema
from trtforge_operator.planning.rebuild import (
    RebuildPlan,
    RebuildRequest,
    holds_back,
    plan_rebuilds,
    rebuild_job,
)
from trtforge_operator.planning.store_claim import plan_store_blocked, store_condition
from trtforge_operator.planning.target import TargetOutcome, keep_times, plan_target
from trtforge_operator.planning.target_state import TargetState
from trtforge_operator.planning.text import one_line, timestamp
from trtforge_operator.planning.verify import RecheckOutcome, VerifyOutcome, plan_recheck, plan_verify


def plan_engine_pass(
    obs: EngineObserved | UnreadableEngine | StoreBlockedEngine, cfg: OperatorConfig
) -> EnginePlan:
    """The whole pass: a spec the models refuse or a model source it may not use stalls the engine
    (and says why once), a store claim that is not bound holds it (planning/store_claim.py); anything
    else is planned by :func:`plan_engine`."""
    if isinstance(obs, UnreadableEngine):
        return spec_refused(obs)
    if isinstance(obs, StoreBlockedEngine):
        return plan_store_blocked(obs)
    if obs.spec.llm is not None:
        return model_source_refused(obs, cfg) or plan_llm_engine(obs, cfg)
    return model_source_refused(obs, cfg) or plan_engine(obs, cfg)


def spec_refused(obs: UnreadableEngine) -> EnginePlan:
    """A spec the models refuse: the status names the field; nothing else happens."""
    status = invalid_spec_status(obs.status, obs.generation, f"invalid spec: {obs.error}", obs.now)
    return EnginePlan(actions=(WriteStatus(obs.status_wire, status),))


def model_source_refused(obs: EngineObserved, cfg: OperatorConfig) -> EnginePlan | None:
    """A model source this TRTEngine may not use (:func:`model_source_problem`) stalls it, with an
    Event once; None when the source is fine."""
    problem = model_source_problem(obs.spec.source.uri, cfg.store_uri)
    if problem is None:
        return None
    reason = EngineReason.INVALID_MODEL_SOURCE
    status = invalid_spec_status(obs.status, obs.generation, problem, obs.now, reason=reason)
    return EnginePlan(
        actions=(
            WriteStatus(obs.status_wire, status),
            Emit(Event("Warning", reason, problem), on_status_change=True),
        )
    )


@dataclass
class _Admission:
    """The Jobs a pass creates, in order, with its builds admitted against the observed capacity."""

    capacity: Capacity
    creates: list[EngineAction] = field(default_factory=list)
    planned: set[str] = field(default_factory=set)  # the build Jobs admitted by this pass
    waiting_for_slot: bool = False
    requeue: float | None = None

    def admit(self, job: Mapping[str, Any], purpose: JobPurpose) -> bool:
        """Create `job` when a build slot is free (every admitted build counts against both limits)."""
        if not self.capacity.allows(len(self.planned), len(self.planned)):
            self.waiting_for_slot = True
            return False
        self.planned.add(job["metadata"]["name"])
        self.creates.append(CreateJob(job, purpose))
        return True

    def wake_in(self, seconds: float) -> None:
        self.requeue = seconds if self.requeue is None else min(self.requeue, seconds)


def plan_engine(obs: EngineObserved, cfg: OperatorConfig) -> EnginePlan:
    """The desired Jobs, status and Events of one TRTEngine, with its builds admitted against the
    observed build capacity (slot admission is part of the plan)."""
    targets = resolve_targets(obs.spec, obs.nodes)
    jobs_by_id = jobs_by_build_id(obs.jobs)
    prev = {t.name: t for t in obs.status.targets}
    admission = _Admission(obs.capacity)
    verify = plan_verify(obs, cfg) if obs.verified_sha256 is None and targets else None
    recheck = plan_recheck(obs, cfg) if obs.verified_sha256 is not None and targets else None
    _verification(obs, cfg, admission, verify or recheck)
    outcomes = [
        _admit_target(obs, cfg, admission, plan_target(obs, t, cfg, jobs_by_id, prev.get(t.name), verify))
        for t in targets
    ]
    claims = [AddRequester(o.use_job, obs_requester(obs)) for o in outcomes if o.use_job]
    rebuilds = _rebuilds(obs, cfg)
    for req in rebuilds.requests:
        _admit_rebuild(obs, cfg, admission, jobs_by_id, req)
    status = _engine_status(obs, outcomes, prev, recheck)
    refusal = _shared_conditions(status, obs, rebuilds)
    events, refused = transition_events(obs.status.targets, outcomes)
    if refusal is not None:
        events.append(refusal)
    actions: list[EngineAction] = [*admission.creates, *claims, *_record_results(jobs_by_id)]
    actions.append(WriteStatus(obs.status.to_wire() if obs.status_wire else {}, status))
    actions.extend(Emit(e) for e in merged(events))
    if admission.requeue is not None:
        actions.append(RequeueAfter(admission.requeue))
    if admission.waiting_for_slot:
        actions.append(WaitForSlot())
    return EnginePlan(actions=tuple(actions), refused=tuple(refused))


def plan_llm_engine(obs: EngineObserved, cfg: OperatorConfig) -> EnginePlan:
    """An LLM engine's pass (planning/llm_engine.py): the verify step as for ONNX models, then its
    quantize and tune Jobs admitted against the build slots like builds."""
    targets = resolve_targets(obs.spec, obs.nodes)
    jobs_by_id = jobs_by_build_id(obs.jobs)
    admission = _Admission(obs.capacity)
    forge = obs.spec.llm is not None and obs.spec.llm.source.format == "gguf"
    forge = forge and any(target_refusal(obs, cfg, t) is None for t in targets)  # else no Job at all
    verify = plan_verify(obs, cfg) if obs.verified_sha256 is None and forge else None
    recheck = plan_recheck(obs, cfg) if obs.verified_sha256 is not None and forge else None
    _verification(obs, cfg, admission, verify or recheck)
    rebuilds = _rebuilds(obs, cfg)
    plan = plan_llm(obs, cfg, targets, verify, rebuilds.requests)
    if plan.wake_at is not None:  # a failed quantize or tune Job's backoff ends
        admission.wake_in(max(0.5, plan.wake_at - obs.now))
    for c in plan.creates:
        if c.rebuild:  # a re-tune: the target keeps its status (and its record serves) meanwhile
            if not admission.admit(c.job, JobPurpose.REBUILD):
                admission.wake_in(5.0)
            continue
        if not admission.admit(c.job, JobPurpose.BUILD):
            queued = f"waiting for a build slot ({obs.capacity.running_total} running)"
            for t in plan.targets if c.target is None else [t for t in plan.targets if t.name == c.target]:
                t.phase, t.reason, t.message, t.job_name = "Pending", TargetState.QUEUED.value, queued, None
            if c.target is None and plan.checkpoint is not None:
                plan.checkpoint.phase, plan.checkpoint.job_name = "Pending", None
                plan.checkpoint.reason, plan.checkpoint.message = TargetState.QUEUED.value, queued
    prev = {t.name: t for t in obs.status.targets}
    status = TRTEngineStatus(
        observed_generation=obs.generation,
        conditions=llm_conditions(obs.status.conditions, obs.generation, obs.now, plan),
        targets=[keep_times(t, prev.get(t.name)) for t in plan.targets],
        ready_targets=ready_text(plan.ready, len(plan.targets)),
        model=_verified_model(obs, recheck),
        checkpoint=plan.checkpoint,
    )
    refusal = _shared_conditions(status, obs, rebuilds)
    actions: list[EngineAction] = [
        *admission.creates,
        *(AddRequester(j, obs_requester(obs)) for j in plan.claims),
        *_record_results(jobs_by_id),
        WriteStatus(obs.status.to_wire() if obs.status_wire else {}, status),
        *(Emit(Event("Warning", r, m), on_status_change=True) for r, m in plan.warnings),
        *([Emit(refusal)] if refusal is not None else []),
    ]
    if admission.requeue is not None:
        actions.append(RequeueAfter(admission.requeue))
    if admission.waiting_for_slot:
        actions.append(WaitForSlot())
    return EnginePlan(actions=tuple(actions))


def _rebuilds(obs: EngineObserved, cfg: OperatorConfig) -> RebuildPlan:
    """The rebuilds that runtime pods' fault reports ask of this engine (planning/faults.py)."""
    return plan_rebuilds(
        obs_requester(obs),
        obs.status.targets,
        obs.annotations,
        obs.observed_faults,
        obs.nodes,
        obs.now,
        cfg.faults.suspect_node_ttl_seconds,
    )


def _shared_conditions(status: TRTEngineStatus, obs: EngineObserved, rebuilds: RebuildPlan) -> Event | None:
    """The conditions both kinds of engine carry (refused rebuild requests, pruned spec fields, the
    store), set on `status`; the Event of a newly refused rebuild request, if any."""
    status.conditions, refusal = rebuild_requests_condition(
        status.conditions, obs.status.conditions, obs.generation, obs.now, rebuilds.refused
    )
    status.conditions = pruned_condition(  # docs/design.md §"What a tenant can forge"
        status.conditions,
        pruned_fields(obs.annotations, spec_schema(TRTEngine)),
        obs.generation,
        timestamp(obs.now),
    )
    status.conditions = store_condition(status.conditions, None, obs.generation, obs.now)
    return refusal


def _verified_model(obs: EngineObserved, recheck: RecheckOutcome | None) -> VerifiedModel | None:
    p = obs.possession
    if p is None or obs.verified_sha256 is None:
        return None
    return VerifiedModel(
        sha256=p.sha256,
        verified_time=utc(p.verified_at),
        size_bytes=p.size_bytes,
        message=recheck.message if recheck is not None else None,
    )


def _verification(
    obs: EngineObserved,
    cfg: OperatorConfig,
    admission: _Admission,
    step: VerifyOutcome | RecheckOutcome | None,
) -> None:
    """The verify Job proof of possession needs next (not a build slot), and when to look again."""
    if step is None:
        return
    if step.create is not None:
        grant = children.verify_grant(step.create, cfg, obs.now)
        admission.creates.append(CreateVerifyJob(children.verify_job(step.create, cfg), grant))
    if step.wake_at is not None:
        admission.wake_in(max(0.5, step.wake_at - obs.now))


def _admit_target(
    obs: EngineObserved, cfg: OperatorConfig, admission: _Admission, o: TargetOutcome
) -> TargetOutcome:
    """A target's build admitted, shared or queued for a slot; and when the target wakes."""
    if o.create is not None and o.create.job_name in admission.planned:
        o.create = None  # targets that ask for the same engine (hardware-compatible) share a Job
    elif o.create is not None and not admission.admit(children.build_job(o.create, cfg), JobPurpose.BUILD):
        c = obs.capacity
        queued = (
            f"waiting for a build slot ({c.running_total} running, "
            f"limits {c.max_total} total, {c.max_per_namespace} per namespace)"
        )
        if o.updating:  # the previous engine keeps serving meanwhile
            o.status.message = one_line(f"{o.status.message}; {queued}")
        else:
            o.enter(TargetState.QUEUED, queued)
        o.status.job_name = None
        o.create = None
    if o.wake_at is not None:
        admission.wake_in(max(0.5, o.wake_at - obs.now))
    return o


def _admit_rebuild(
    obs: EngineObserved,
    cfg: OperatorConfig,
    admission: _Admission,
    jobs_by_id: Mapping[str, list[JobView]],
    req: RebuildRequest,
) -> None:
    """A rebuild's Job, unless it exists, another rebuild of that engine holds it back, or no slot is
    free (then the engine looks again within 5 s)."""
    job = rebuild_job(
        obs.spec, obs.status, obs_requester(obs), obs.nodes, cfg, req, cache_scope=obs.cache_scope
    )
    if job is None:
        return
    name = job["metadata"]["name"]
    existing = jobs_by_id.get(job["metadata"]["labels"][LABEL_BUILD_ID], [])
    if name in admission.planned or any(j.name == name for j in existing):
        return  # asked for already: create-if-absent
    if any(j.running and holds_back(req, j) for j in existing):
        return  # one rebuild of that engine at a time (a fault's is never held back by an ask)
    if not admission.admit(job, JobPurpose.REBUILD):
        admission.requeue = min(admission.requeue or 5.0, 5.0)


def _engine_status(
    obs: EngineObserved,
    outcomes: list[TargetOutcome],
    prev: Mapping[str, TargetStatus],
    recheck: RecheckOutcome | None,
) -> TRTEngineStatus:
    """The TRTEngine's status from its targets' outcomes (the rebuild-requests condition aside)."""
    statuses = [keep_times(o.status, prev.get(o.status.name)) for o in outcomes]
    p = obs.possession
    return TRTEngineStatus(
        observed_generation=obs.generation,
        conditions=engine_conditions(obs.status.conditions, obs.generation, obs.now, outcomes),
        targets=statuses,
        ready_targets=ready_text(sum(1 for o in outcomes if o.state.serving), len(statuses)),
        model=VerifiedModel(
            sha256=p.sha256,
            verified_time=utc(p.verified_at),
            size_bytes=p.size_bytes,
            message=recheck.message if recheck is not None else None,
        )
        if p is not None and obs.verified_sha256 is not None
        else None,
    )


def _record_results(jobs_by_id: Mapping[str, list[JobView]]) -> list[RecordResult]:
    """Results a build pod reported that its Job does not carry yet: copy them onto the Job."""
    return [
        RecordResult(j.name, j.reported)
        for js in jobs_by_id.values()
        for j in js
        if j.reported is not None and not j.recorded
    ]


def model_source_problem(uri: str, store_uri: str) -> str | None:
    """Why `spec.model.uri` may not be used as a model source, else None.

    A ``pvc://`` source is a claim of the TRTEngine's own namespace (the verify Job mounts it there,
    read-only), never the engine store's claim, and its path is plain names: no ``..``, ``.``, empty
    parts or leading ``/`` (the CRD's pattern says the same where the apiserver checks it)."""
    if not uri.startswith("pvc://"):
        return None
    claim, _, path = uri.removeprefix("pvc://").partition("/")
    store_claim = (
        store_uri.removeprefix("pvc://").partition("/")[0] if store_uri.startswith("pvc://") else None
    )
    if store_claim and claim == store_claim:
        return (
            f"spec.source.uri {uri}: pvc://{claim} is the engine store's claim; a model source is a claim "
            "of this TRTEngine's own namespace"
        )
    if not path or any(p in ("", ".", "..") for p in path.split("/")):
        return (
            f"spec.source.uri {uri}: the path inside the claim must be plain names (no '..', '.', empty "
            "parts or leading '/')"
        )
    return None
