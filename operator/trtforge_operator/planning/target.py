"""The plan of one TRTEngine target: its typed state (the first verdict of its policy chain,
engine_policies.py), status and the build it needs. Pure.

The engine is found by what was asked for: the Job's result, or the store's request index that the
builder writes, so a stored engine means Ready with no Job at all, from any namespace. Otherwise one
Job per request key, retried with exponential backoff under a new name per attempt, then stalled.
When the request of a Ready target changes, its engine keeps serving (Updating) until the new
request's engine is in the store.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from trtforge.contract.gpu import GPUTarget
from trtforge.contract.layout import engine_path
from trtforge.contract.manifest import Manifest
from trtforge_operator.api import (
    Accuracy,
    TargetStatus,
)
from trtforge_operator.apply import children
from trtforge_operator.config import OperatorConfig
from trtforge_operator.observe.views import (
    EngineObserved,
    JobView,
    obs_requester,
)
from trtforge_operator.planning.engine_policies import TargetFacts, evaluate, target_facts
from trtforge_operator.planning.keys import build_request
from trtforge_operator.planning.target_state import ALWAYS_STALLED, TargetState
from trtforge_operator.planning.text import one_line, timestamp
from trtforge_operator.planning.verify import VerifyOutcome


def _fill_from_manifest(st: TargetStatus, m: Manifest, store_uri: str) -> None:
    st.engine_key = m.key
    st.engine_uri = f"{store_uri.rstrip('/')}/{engine_path(m.key, m.engine_file)}"
    st.sha256 = m.sha256
    st.size_bytes = m.size_bytes
    st.backend = m.backend
    st.backend_version = m.backend_version
    st.cuda = m.cuda
    st.compute_capability = m.gpu.compute_capability
    st.build_seconds = round(m.build_seconds, 3)
    st.accuracy = Accuracy(
        max_abs_error=m.accuracy.max_abs_error,
        max_rel_error=m.accuracy.max_rel_error,
        passed=m.accuracy.passed,
    )


@dataclass
class TargetOutcome:
    """One target's typed state, its status (phase and reason follow the state), and what it needs."""

    status: TargetStatus
    state: TargetState = TargetState.NO_MATCHING_NODE
    create: children.BuildRequest | None = None
    use_job: str | None = None
    wake_at: float | None = None
    stalled: bool = False
    rebuilding: bool = False
    rebuild_failed: str | None = None
    updating: bool = False  # a new request builds while the previous engine keeps serving
    job_has_pod: bool = True  # the running Job has a pod (False: the Job controller has made none yet)

    def enter(self, state: TargetState, message: str) -> None:
        """Put the target in `state`: its phase and reason follow; a stalling state stalls."""
        self.state = state
        self.status.phase, self.status.reason, self.status.message = state.phase, state.value, message
        self.stalled = self.stalled or state in ALWAYS_STALLED


def plan_target(
    obs: EngineObserved,
    target: GPUTarget,
    cfg: OperatorConfig,
    jobs_by_id: Mapping[str, list[JobView]],
    prev: TargetStatus | None = None,
    verify: VerifyOutcome | None = None,
) -> TargetOutcome:
    """One target; while a changed request builds (or its new model source is verified), the
    previous Ready engine keeps serving."""
    out = _plan_request(obs, target, cfg, jobs_by_id, verify)
    st = out.status
    _keep_recorded_build(out, prev)
    _keep_starting(out, prev)
    if out.state.serving or prev is None or prev.phase != "Ready" or not prev.engine_key:
        return out
    if prev.request_key == st.request_key:
        return out
    old = obs.manifests.get(prev.engine_key)
    if old is None:
        return out
    pending = f"{st.reason}: {st.message}" if st.message else (st.reason or st.phase)
    failed = out.state.phase == "Failed"
    serving = TargetStatus(
        name=st.name,
        gpu=st.gpu,
        mig=st.mig,
        phase="Ready",
        request_key=prev.request_key,
        job_name=st.job_name,
        attempts=st.attempts,
        last_attempt_time=st.last_attempt_time,
        cache_hit=prev.cache_hit,
    )
    _fill_from_manifest(serving, old, cfg.store_uri)
    out.status = serving
    out.enter(
        TargetState.UPDATE_FAILED if failed else TargetState.UPDATING,
        one_line(
            f"engine {old.key[:12]} keeps serving; the changed request "
            f"{'failed' if failed else 'is in progress'} ({pending})"
        ),
    )
    out.updating = not failed
    if failed:
        out.rebuild_failed = f"{st.name}: update failed: {pending}"
    return out


def _keep_starting(out: TargetOutcome, prev: TargetStatus | None) -> None:
    """A Job the Job controller has made no pod for yet is still starting: the target keeps saying
    so (BuildStarting or BuildRetrying, as written when the Job was created), one write less per
    build; it is BuildRunning once a pod exists."""
    before = TargetState.of(prev.reason) if prev is not None else None
    if (
        prev is not None
        and out.state is TargetState.BUILD_RUNNING
        and not out.job_has_pod
        and before in (TargetState.BUILD_STARTING, TargetState.BUILD_RETRYING)
        and prev.job_name == out.status.job_name
    ):
        out.enter(before, prev.message or "")


def _keep_recorded_build(out: TargetOutcome, prev: TargetStatus | None) -> None:
    """A served engine whose build Job was cleaned up (planning/finished_jobs.py) stays as recorded:
    the same request and engine keep their Job, attempts and Built-or-CacheHit (no status churn)."""
    st = out.status
    before = TargetState.of(prev.reason) if prev is not None else None
    if (
        prev is None
        or before not in (TargetState.BUILT, TargetState.CACHE_HIT)
        or out.state not in (TargetState.BUILT, TargetState.CACHE_HIT)
        or st.job_name is not None
        or (prev.request_key, prev.engine_key) != (st.request_key, st.engine_key)
    ):
        return
    st.job_name, st.attempts, st.last_attempt_time = prev.job_name, prev.attempts, prev.last_attempt_time
    st.cache_hit = prev.cache_hit
    out.enter(before, prev.message or "")


def _plan_request(
    obs: EngineObserved,
    target: GPUTarget,
    cfg: OperatorConfig,
    jobs_by_id: Mapping[str, list[JobView]],
    verify: VerifyOutcome | None = None,
) -> TargetOutcome:
    """The target's facts, the first verdict of its policy chain (planning/engine_policies.py), and the
    status and build that verdict makes."""
    f = target_facts(obs, target, cfg, jobs_by_id, verify)
    verdict = evaluate(f)
    out = TargetOutcome(TargetStatus(name=target.name, gpu=target.gpu, mig=target.mig, phase="Pending"))
    if f.ki is not None:
        _fill_request(out, f, cfg.store_uri)
        if verdict.build:
            _start_build(out, f, obs)
    out.stalled = verdict.stalled
    out.job_has_pod = verdict.job_has_pod
    out.wake_at = verdict.wake_at
    out.enter(verdict.state, verdict.message)
    return out


def _fill_request(out: TargetOutcome, f: TargetFacts, store_uri: str) -> None:
    """What the status says of the request: its key, its latest build Job and the engine it names."""
    st, latest = out.status, f.latest
    st.request_key = f.ki.request_key if f.ki is not None else None
    if latest is not None:
        st.job_name = latest.name
        st.attempts = latest.attempt
        st.last_attempt_time = timestamp(latest.started or latest.created)
        if f.manifest is None and f.requester not in latest.requesters():
            # claim only a Job this target waits on: a served engine needs no Job (at scale, every
            # claim on a shared Job is a patch whose whole Job every watcher reads again)
            out.use_job = latest.name
    if f.engine_key:
        st.engine_key = f.engine_key
        out.rebuilding = f.rebuilding
        out.rebuild_failed = f.rebuild_failed
    if f.manifest is not None:
        _fill_from_manifest(st, f.manifest, store_uri)
        st.cache_hit = f.cache_hit
    elif f.reported_key and f.latest is not None and f.latest.result() is not None:
        st.engine_key = f.reported_key


def _start_build(out: TargetOutcome, f: TargetFacts, obs: EngineObserved) -> None:
    """The next attempt's build Job, made now."""
    assert f.ki is not None
    out.create = build_request(
        obs.spec,
        f.ki,
        obs_requester(obs),
        engine_key=None,
        attempt=f.attempt + 1,
        verified_sha256=obs.verified_sha256,
        cache_scope=obs.cache_scope,
    )
    st = out.status
    st.job_name = out.create.job_name
    st.attempts = f.attempt + 1
    st.last_attempt_time = timestamp(obs.now)  # the attempt is made now


def keep_times(st: TargetStatus, prev: TargetStatus | None) -> TargetStatus:
    """Keep the last-attempt time recorded for the same Job (when its attempt was made; the Job's own
    start time comes later and would be one more write), or when none can be observed (no churn)."""
    same_job = prev is not None and st.job_name is not None and st.job_name == prev.job_name
    if prev is not None and same_job and (prev.last_attempt_time is not None or st.last_attempt_time is None):
        st.last_attempt_time = prev.last_attempt_time
    return st
