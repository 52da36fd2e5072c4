"""Apply: carry out a TRTEngine plan through kube.py, the one writer of build and verify Jobs
(docs/design.md §"One writer per child"); its status and Events go through apply/writes.py.

Every write of a build Job goes through here: the engine pass's creates, requester claims and
recorded results, the deletion handler's releases and the finished-Job cleanup's deletions
(planning/engine_actions.py). Builds are admitted to their slots first, in the synchronous step that
follows planning (observe/engine.py reads the capacity after its last await), so the limits always hold.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from kubernetes.client.rest import ApiException

from trtforge.contract.possession import VerifyGrant, verify_grant_path
from trtforge.logs import fields
from trtforge_operator.apply.writes import post_events, write_status
from trtforge_operator.kinds import Kind
from trtforge_operator.labels import ANNOTATION_RESULT, TRTENGINES, requester_annotation
from trtforge_operator.observe.claim_view import StoreBlockedEngine
from trtforge_operator.observe.views import EngineObserved, UnreadableEngine
from trtforge_operator.planning.engine_actions import (
    AddRequester,
    CreateJob,
    CreateVerifyJob,
    DeleteJob,
    DeleteReason,
    DropRequester,
    Emit,
    EngineAction,
    EnginePlan,
    RecordResult,
    WriteStatus,
)
from trtforge_operator.state import State

log = logging.getLogger(__name__)

VERIFY_EVENT_LAG_S = 30.0  # a verify Job created this recently may not be in the index yet


async def apply_engine(
    state: State,
    body: Mapping[str, Any],
    obs: EngineObserved | UnreadableEngine | StoreBlockedEngine,
    plan: EnginePlan,
) -> float | None:
    """Carry out one pass's plan; returns seconds until the engine wants its next pass (backoff)."""
    ns, name = obs.namespace, obs.name
    creates: list[CreateJob] = plan.of(CreateJob)
    # Before the first await: Jobs an earlier pass created whose event has not arrived get no second
    # POST (a 409), and the new ones take their slots, planned against this very count.
    known = {c.name for c in creates if state.slots.known(c.name)}
    if creates and not state.slots.admit([c.name for c in creates], ns):
        raise RuntimeError("build slots refused a plan made against their own count")
    state.metrics.builds_running.set(state.slots.running)
    state.queue.set_waiting_for_slot(ns, name, plan.waiting_for_slot)
    for refused in plan.refused:  # a planner bug: the status still shows what was observed
        log.warning("%s/%s: %s", ns, name, refused, extra=fields(namespace=ns, name=name))
        state.metrics.refused_transitions.labels(str(refused.before or "None"), refused.after).inc()
    await _create_jobs(state, [c.job for c in creates if c.name not in known], "build")
    for vj in plan.of(CreateVerifyJob):  # in the tenant's namespace, not a build slot
        if await _create_verify_job(state, vj.job, vj.grant):
            state.metrics.jobs_created.labels("verify").inc()
    await apply_job_actions(state, [a for a in plan.actions if isinstance(a, AddRequester | RecordResult)])
    changed = False
    for w in plan.of(WriteStatus):
        state.metrics.observe_engine(ns, name, w.status)
        changed = await write_status(state, Kind.TRTENGINE, TRTENGINES, body, w.old, w.status.to_wire())
        if changed:
            state.queue.fire_deployments_of(ns, name)
            hits = sum(1 for t in w.status.targets if t.cache_hit and t.phase == "Ready")
            was = sum(1 for t in obs.status.targets if t.cache_hit and t.phase == "Ready")
            if hits > was:
                state.metrics.cache_hits.inc(hits - was)
    emits: list[Emit] = plan.of(Emit)
    await post_events(state, body, [e.event for e in emits if changed or not e.on_status_change])
    return plan.requeue_after


async def apply_job_actions(state: State, actions: Sequence[EngineAction]) -> int:
    """Requester claims and releases, recorded results and deletions of build Jobs (the build
    namespace); returns how many Jobs were deleted."""
    ns = state.cfg.build_namespace
    deleted = 0
    for a in actions:
        if isinstance(a, AddRequester):
            await state.kube.annotate("Job", ns, a.job, {requester_annotation(a.requester): a.requester})
        elif isinstance(a, DropRequester):
            await state.kube.annotate("Job", ns, a.job, {requester_annotation(a.requester): None})
        elif isinstance(a, RecordResult):
            if a.job in state.results_recorded:
                continue  # written by an earlier pass; its event has not arrived yet
            line = a.result.to_line()
            await state.kube.annotate("Job", ns, a.job, {ANNOTATION_RESULT: line})
            state.results_recorded.add(a.job)
            state.metrics.observe_build_result(line)
        elif isinstance(a, DeleteJob):
            try:
                if await state.kube.delete("Job", ns, a.name):
                    deleted += 1
                    if a.reason is DeleteReason.EXPIRED:
                        state.metrics.finished_jobs_deleted.inc()
            except ApiException as e:
                log.warning("could not delete Job %s (%s): %s %s", a.name, a.reason, e.status, e.reason)
    return deleted


async def _create_jobs(state: State, jobs: list[Mapping[str, Any]], kind: str) -> int:
    """Create-if-absent, every Job at once (a pass's POSTs do not wait on each other; the client's
    thread pool bounds how many are in flight over all passes); returns how many were created now."""

    async def one(job: Mapping[str, Any]) -> bool:
        try:
            return await state.kube.create(job)
        except ApiException as e:
            state.slots.forget(job["metadata"]["name"])
            state.queue.fire_waiting_for_slot()
            log.warning("could not create Job %s: %s %s", job["metadata"]["name"], e.status, e.reason)
            return False

    created = sum(await asyncio.gather(*(one(j) for j in jobs)))
    if created:
        state.metrics.jobs_created.labels(kind).inc(created)
    return created


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
