"""The plan of one TRTEngine target: its typed state, status and the build it needs. Pure.

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
from trtforge_operator.observe.keys import key_inputs
from trtforge_operator.observe.views import (
    EngineObserved,
    JobView,
    built_key,
    obs_requester,
    request_builds,
)
from trtforge_operator.planning.build_results import (
    backoff_seconds,
    failure_message,
    no_retry,
    result_cache_hit,
    result_error,
    result_key,
)
from trtforge_operator.planning.keys import build_request, no_node_message
from trtforge_operator.planning.target_state import ALWAYS_STALLED, TargetState
from trtforge_operator.planning.text import iso_time, one_line, timestamp
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
    st = TargetStatus(name=target.name, gpu=target.gpu, mig=target.mig, phase="Pending")
    out = TargetOutcome(st)
    if verify is not None:  # no build and no cache hit before the namespace proves it holds the model
        out.stalled = verify.stalled
        out.enter(verify.state, verify.message)
        return out
    try:
        ki = key_inputs(
            obs.spec, target, obs.nodes, cfg, model_sha256=obs.verified_sha256, cache_scope=obs.cache_scope
        )
    except ValueError as e:
        if not any(n.hosts(target) for n in obs.nodes):
            out.enter(TargetState.NO_MATCHING_NODE, no_node_message(target))
        else:
            out.enter(TargetState.INVALID_TARGET, one_line(str(e)))
        return out
    st.request_key = ki.request_key
    builds = request_builds(jobs_by_id, ki.request_key)
    key = built_key(builds)
    if key is None and (obs.verified_sha256 or obs.spec.model.sha256):
        # a known digest: the store's index answers across the namespaces of the cache scope
        filed = obs.requests.get(ki.request_key)
        key = filed.engine_key if filed is not None else None
    manifest = obs.manifests.get(key) if key else None
    latest = builds[-1] if builds else None
    if latest is not None:
        st.job_name = latest.name
        st.attempts = latest.attempt
        st.last_attempt_time = timestamp(latest.started or latest.created)
        if manifest is None and obs_requester(obs) not in latest.requesters():
            # claim only a Job this target waits on: a served engine needs no Job (at scale, every
            # claim on a shared Job is a patch whose whole Job every watcher reads again)
            out.use_job = latest.name
    if key:
        st.engine_key = key
        # Only rebuilds made for this engine (the requester the operator wrote on the Job): another
        # engine's rebuild of a key they share never changes this engine's status.
        me = obs_requester(obs)
        rebuilds = sorted(
            (j for j in jobs_by_id.get(key[:20], []) if j.kind == "rebuild" and j.created_for in ("", me)),
            key=lambda j: j.created or 0,
        )
        if rebuilds:
            last_rb = rebuilds[-1]
            out.rebuilding = last_rb.running
            if last_rb.failed_final:
                out.rebuild_failed = f"rebuild {last_rb.name} failed: {failure_message(last_rb)}"
    if manifest is not None:
        _fill_from_manifest(st, manifest, cfg.store_uri)
        # A cache hit for *this* resource: no build of this key ran on its behalf (another namespace's
        # build, or one from before, is a hit here).
        me = obs_requester(obs)
        built_here = any(
            j.created_for in ("", me) and not j.failed_final and result_cache_hit(j.result()) is not True
            for j in builds
        )
        st.cache_hit = not built_here
        if out.rebuilding:
            out.enter(
                TargetState.REBUILDING, "rebuilding after a GPU fault (the current engine keeps serving)"
            )
        elif st.cache_hit:
            out.enter(TargetState.CACHE_HIT, "engine found in the store, no build needed")
        else:
            out.enter(TargetState.BUILT, f"built in {st.build_seconds}s")
        return out
    if latest is not None and latest.running:
        waiting = obs.unschedulable.get(latest.name)
        if waiting:
            out.enter(
                TargetState.WAITING_FOR_GPU,
                one_line(f"build Job {latest.name} waits for a {target} node: {waiting}"),
            )
        else:
            out.enter(
                TargetState.BUILD_RUNNING, f"build Job {latest.name} (attempt {latest.attempt}) is running"
            )
        out.job_has_pod = latest.active > 0
        return out
    if latest is not None and latest.complete:
        rk = result_key(latest.result())
        if latest.result() is None:
            out.enter(TargetState.COLLECTING_RESULT, "reading the build result")
            return out
        if rk:
            st.engine_key = rk
        failed_msg = result_error(latest.result()) or (
            f"build Job {latest.name} finished but the store has no engine {rk or key}"
        )
    elif latest is not None and latest.failed_final:
        failed_msg = failure_message(latest)
    else:
        failed_msg = None
    attempt = latest.attempt if latest is not None else 0
    if failed_msg is not None and latest is not None:
        if no_retry(latest):
            out.enter(
                TargetState.INVALID_BUILD_INPUT,
                one_line(f"{failed_msg}; not retrying (fix the spec or the model)"),
            )
            return out
        if attempt >= cfg.build.max_attempts:
            out.enter(
                TargetState.BUILD_RETRIES_EXHAUSTED,
                one_line(
                    f"attempt {attempt}/{cfg.build.max_attempts} failed: {failed_msg}; giving up "
                    "(change the spec to try again)"
                ),
            )
            return out
        retry_at = (latest.finished or obs.now) + backoff_seconds(attempt, cfg)
        if obs.now < retry_at:
            out.enter(
                TargetState.BUILD_FAILED,
                one_line(
                    f"attempt {attempt}/{cfg.build.max_attempts} failed: {failed_msg}; "
                    f"retrying at {iso_time(retry_at)}"
                ),
            )
            out.wake_at = retry_at
            return out
    if not ki.hosting_nodes:
        failed = TargetState.BUILD_FAILED  # a failed attempt to retry, but no node to retry on
        out.enter(TargetState.NO_MATCHING_NODE if failed_msg is None else failed, no_node_message(target))
        return out
    out.create = build_request(
        obs.spec,
        ki,
        obs_requester(obs),
        engine_key=None,
        attempt=attempt + 1,
        verified_sha256=obs.verified_sha256,
        cache_scope=obs.cache_scope,
    )
    st.job_name = out.create.job_name
    st.attempts = attempt + 1
    st.last_attempt_time = timestamp(obs.now)  # the attempt is made now
    if failed_msg is None:
        out.enter(TargetState.BUILD_STARTING, f"starting build Job {st.job_name}")
    else:
        out.enter(
            TargetState.BUILD_RETRYING,
            one_line(f"attempt {attempt} failed: {failed_msg}; starting attempt {attempt + 1}"),
        )
    return out


def keep_times(st: TargetStatus, prev: TargetStatus | None) -> TargetStatus:
    """Keep the last-attempt time recorded for the same Job (when its attempt was made; the Job's own
    start time comes later and would be one more write), or when none can be observed (no churn)."""
    same_job = prev is not None and st.job_name is not None and st.job_name == prev.job_name
    if prev is not None and same_job and (prev.last_attempt_time is not None or st.last_attempt_time is None):
        st.last_attempt_time = prev.last_attempt_time
    return st
