"""Which finished build Jobs may go: a TTL after they finish, aware of their requesters. Pure.

A finished Job is the only record of what its build did until every requester has taken its result
into its own status (docs/design.md §"Finished build Jobs"). So a Job is deleted only when it finished
more than the TTL ago and each TRTEngine its requester annotations name has either gone, or recorded
it: a target serving the engine that Job built, a later attempt of the same request, or (a status of
the current generation) no target that asks for that request any more. A failed Job a target still
names stays: it is the count of attempts that keeps a stalled target from building again. A rebuild
Job stays while its engine still wants it: an unrecovered fault an InferenceDeployment recorded (which
reads the Job to record its fault's recovery), or the engine's own rebuild annotation
(planning/rebuild.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from trtforge_operator.api import TargetStatus
from trtforge_operator.apply import children
from trtforge_operator.observe.views import JobView, RequesterView
from trtforge_operator.planning.build_results import result_key
from trtforge_operator.planning.engine_actions import DeleteJob, DeleteReason
from trtforge_operator.planning.rebuild import plan_rebuilds
from trtforge_operator.planning.target_state import TargetState


@dataclass(frozen=True)
class Requester:
    """What one requesting TRTEngine has recorded: its targets, whether its status is of its current
    generation, and the rebuild Jobs its pending rebuild requests need."""

    targets: Sequence[TargetStatus]
    current: bool
    rebuild_jobs: frozenset[str] = frozenset()


def requester(name: str, view: RequesterView) -> Requester:
    """What requester `name` has recorded, with the rebuild Jobs it still wants: its
    InferenceDeployments' unrecovered faults and its own accepted rebuild annotations
    (planning/rebuild.py)."""
    wanted = plan_rebuilds(name, view.targets, view.annotations, view.observed_faults, (), 0.0, 0.0)
    return Requester(
        targets=view.targets,
        current=view.current,
        rebuild_jobs=frozenset(r.job_name for r in wanted.requests),
    )


def _build_id(job_name: str | None) -> str:
    return job_name.removeprefix(children.JOB_PREFIX)[:20] if job_name else ""


def _serves(t: TargetStatus, engine_key: str) -> bool:
    state = TargetState.of(t.reason)
    return state is not None and state.serving and t.engine_key == engine_key


def recorded_by(job: JobView, r: Requester) -> bool:
    """Whether requester `r` no longer needs `job` to know what it did."""
    if job.kind == "rebuild":
        return job.name not in r.rebuild_jobs
    naming = [t for t in r.targets if t.job_name == job.name]
    if naming:  # recorded once each target it built for serves the engine it built
        built = result_key(job.result()) if job.complete else None
        return built is not None and all(_serves(t, built) for t in naming)
    if any(_build_id(t.job_name) == job.build_id and (t.attempts or 1) > job.attempt for t in r.targets):
        return True  # a later attempt of the same request superseded it
    asks = any(t.request_key and t.request_key[:20] == job.build_id for t in r.targets)
    return r.current and bool(r.targets) and not asks


def expired_jobs(
    jobs: Iterable[JobView],
    requesters: Mapping[str, Requester],
    now: float,
    ttl_seconds: float,
) -> list[JobView]:
    """The finished build and rebuild Jobs to delete now (`requesters`: `namespace/name` -> what that
    TRTEngine recorded; a name missing is an engine that is gone)."""
    out = []
    for j in jobs:
        if j.kind not in ("build", "rebuild") or j.deleting or not j.done:
            continue
        finished = j.finished or j.created
        if finished is None or now - finished < ttl_seconds:
            continue
        if all((r := requesters.get(name)) is None or recorded_by(j, r) for name in j.requesters()):
            out.append(j)
    return sorted(out, key=lambda j: j.name)


def plan_finished_jobs(
    jobs: Iterable[JobView], requesters: Mapping[str, Requester], now: float, ttl_seconds: float
) -> tuple[DeleteJob, ...]:
    """The deletions of the finished Jobs whose time has come (:func:`expired_jobs`)."""
    return tuple(
        DeleteJob(j.name, DeleteReason.EXPIRED) for j in expired_jobs(jobs, requesters, now, ttl_seconds)
    )


def plan_job_cleanup(
    jobs: Iterable[JobView], requesters: Mapping[str, RequesterView], now: float, ttl_seconds: float
) -> tuple[DeleteJob, ...]:
    """The finished-Job cleanup's plan from its observation (observe/engine.py observe_finished_jobs)."""
    recorded = {name: requester(name, view) for name, view in requesters.items()}
    return plan_finished_jobs(jobs, recorded, now, ttl_seconds)
