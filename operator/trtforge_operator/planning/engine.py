"""TRTEngine planning: observed state in, desired build Jobs, status and Events out. No I/O.

The parts, one job each: keys.py (request keys), target.py (one target's typed state, status and
build), target_state.py (the states and their transition table), verify.py (proof of possession),
engine_conditions.py (conditions and Events from the typed states). This module puts them together
for every target and admits new builds against the capacity.
"""

from __future__ import annotations

from collections.abc import Mapping

from trtforge_operator import children
from trtforge_operator.api import (
    TRTEngineStatus,
    VerifiedModel,
    ready_text,
)
from trtforge_operator.api.trtengine import TRTEngine
from trtforge_operator.config import OperatorConfig
from trtforge_operator.labels import LABEL_BUILD_ID
from trtforge_operator.observed import (
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
from trtforge_operator.planning.keys import (
    resolve_targets,
)
from trtforge_operator.planning.pruned import pruned_condition, pruned_fields, spec_schema
from trtforge_operator.planning.rebuild import RebuildCause, RebuildRequest, plan_rebuilds, rebuild_job
from trtforge_operator.planning.target import TargetOutcome, keep_times, plan_target
from trtforge_operator.planning.target_state import TargetState
from trtforge_operator.planning.text import one_line, timestamp
from trtforge_operator.planning.verify import plan_recheck, plan_verify


def plan_engine_pass(obs: EngineObserved | UnreadableEngine, cfg: OperatorConfig) -> EnginePlan:
    """The whole pass: a spec the models refuse or a model source it may not use stalls the engine
    (and says why once); anything else is planned by :func:`plan_engine`."""
    if isinstance(obs, UnreadableEngine):
        status = invalid_spec_status(obs.status, obs.generation, f"invalid spec: {obs.error}", obs.now)
        return EnginePlan(actions=(WriteStatus(obs.status_wire, status),))
    problem = model_source_problem(obs.spec.model.uri, cfg.store_uri)
    if problem is not None:
        reason = EngineReason.INVALID_MODEL_SOURCE
        status = invalid_spec_status(obs.status, obs.generation, problem, obs.now, reason=reason)
        return EnginePlan(
            actions=(
                WriteStatus(obs.status_wire, status),
                Emit(Event("Warning", reason, problem), on_status_change=True),
            )
        )
    return plan_engine(obs, cfg)


def plan_engine(obs: EngineObserved, cfg: OperatorConfig) -> EnginePlan:
    """The desired Jobs, status and Events of one TRTEngine, with its builds admitted against the
    observed build capacity (slot admission is part of the plan)."""
    targets = resolve_targets(obs.spec, obs.nodes)
    jobs_by_id = jobs_by_build_id(obs.jobs)
    prev = {t.name: t for t in obs.status.targets}
    creates: list[EngineAction] = []
    claims: list[EngineAction] = []
    requeue: float | None = None
    waiting_for_slot = False
    outcomes: list[TargetOutcome] = []
    extra_total = extra_ns = 0
    planned: set[str] = set()
    verify = plan_verify(obs, cfg) if obs.verified_sha256 is None and targets else None
    recheck = plan_recheck(obs, cfg) if obs.verified_sha256 is not None and targets else None
    for step in (verify, recheck):
        if step is None:
            continue
        if step.create is not None:
            creates.append(
                CreateVerifyJob(
                    children.verify_job(step.create, cfg), children.verify_grant(step.create, cfg, obs.now)
                )
            )
        if step.wake_at is not None:
            requeue = max(0.5, step.wake_at - obs.now)
    for target in targets:
        o = plan_target(obs, target, cfg, jobs_by_id, prev.get(target.name), verify)
        if o.create is not None and o.create.job_name in planned:
            o.create = None  # targets that ask for the same engine (hardware-compatible) share a Job
        elif o.create is not None:
            if obs.capacity.allows(extra_total, extra_ns):
                planned.add(o.create.job_name)
                extra_total += 1
                extra_ns += 1
                creates.append(CreateJob(children.build_job(o.create, cfg), JobPurpose.BUILD))
            else:
                queued = (
                    f"waiting for a build slot ({obs.capacity.running_total} running, "
                    f"limits {obs.capacity.max_total} total, "
                    f"{obs.capacity.max_per_namespace} per namespace)"
                )
                if o.updating:  # the previous engine keeps serving meanwhile
                    o.status.message = one_line(f"{o.status.message}; {queued}")
                else:
                    o.enter(TargetState.QUEUED, queued)
                o.status.job_name = None
                o.create = None
                waiting_for_slot = True
        if o.use_job:
            claims.append(AddRequester(o.use_job, obs_requester(obs)))
        if o.wake_at is not None:
            wait = max(0.5, o.wake_at - obs.now)
            requeue = wait if requeue is None else min(requeue, wait)
        outcomes.append(o)
    rebuilds = plan_rebuilds(
        obs_requester(obs),
        obs.status.targets,
        obs.annotations,
        obs.observed_faults,
        obs.nodes,
        obs.now,
        cfg.faults.suspect_node_ttl_seconds,
    )
    for req in rebuilds.requests:
        job = rebuild_job(
            obs.spec, obs.status, obs_requester(obs), obs.nodes, cfg, req, cache_scope=obs.cache_scope
        )
        if job is None:
            continue
        name = job["metadata"]["name"]
        existing = jobs_by_id.get(job["metadata"]["labels"][LABEL_BUILD_ID], [])
        if name in planned or any(j.name == name for j in existing):
            continue  # asked for already: create-if-absent
        if any(j.running and _holds_back(req, j) for j in existing):
            continue  # one rebuild of that engine at a time (a fault's is never held back by an ask)
        if obs.capacity.allows(extra_total, extra_ns):
            planned.add(name)
            extra_total += 1
            extra_ns += 1
            creates.append(CreateJob(job, JobPurpose.REBUILD))
        else:
            requeue = min(requeue or 5.0, 5.0)
            waiting_for_slot = True
    statuses = [keep_times(o.status, prev.get(o.status.name)) for o in outcomes]
    p = obs.possession
    status = TRTEngineStatus(
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
    status.conditions, refusal = rebuild_requests_condition(
        status.conditions, obs.status.conditions, obs.generation, obs.now, rebuilds.refused
    )
    status.conditions = pruned_condition(  # docs/design.md §"What a tenant can forge"
        status.conditions,
        pruned_fields(obs.annotations, spec_schema(TRTEngine)),
        obs.generation,
        timestamp(obs.now),
    )
    events, refused = transition_events(obs.status.targets, outcomes)
    if refusal is not None:
        events.append(refusal)
    actions: list[EngineAction] = [*creates, *claims, *_record_results(jobs_by_id)]
    actions.append(WriteStatus(obs.status.to_wire() if obs.status_wire else {}, status))
    actions.extend(Emit(e) for e in merged(events))
    if requeue is not None:
        actions.append(RequeueAfter(requeue))
    if waiting_for_slot:
        actions.append(WaitForSlot())
    return EnginePlan(actions=tuple(actions), refused=tuple(refused))


def _record_results(jobs_by_id: Mapping[str, list[JobView]]) -> list[RecordResult]:
    """Results a build pod reported that its Job does not carry yet: copy them onto the Job."""
    return [
        RecordResult(j.name, j.reported)
        for js in jobs_by_id.values()
        for j in js
        if j.reported is not None and not j.recorded
    ]


def _holds_back(req: RebuildRequest, running: JobView) -> bool:
    """Whether the running rebuild Job `running` of the same engine holds back `req`: a fault's rebuild
    waits only for another fault's, never for one a tenant asked for; an ask waits for any rebuild."""
    if running.kind != "rebuild":
        return False
    return running.fault_rebuild or req.cause is RebuildCause.ASKED


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
            f"spec.model.uri {uri}: pvc://{claim} is the engine store's claim; a model source is a claim "
            "of this TRTEngine's own namespace"
        )
    if not path or any(p in ("", ".", "..") for p in path.split("/")):
        return (
            f"spec.model.uri {uri}: the path inside the claim must be plain names (no '..', '.', empty "
            "parts or leading '/')"
        )
    return None
