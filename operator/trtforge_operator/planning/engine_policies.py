"""Where one TRTEngine target stands, as a chain of small named policies (docs/design.md §"Observe,
plan, apply"). Pure.

The facts of a target are gathered once (:func:`target_facts`: its request key, its build Jobs, the
engine the store holds for it). Each policy looks at them and either returns a :class:`Verdict` (the
state the target is in, why, and whether a build starts now) or passes (None); the first verdict
wins (:func:`evaluate`), and the last policy always answers. The order is the decision: a missing
proof of possession comes before anything else, an engine in the store before any Job, a running Job
before a finished one, and a build starts only when nothing else holds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from trtforge.contract.gpu import GPUTarget
from trtforge.contract.manifest import Manifest
from trtforge_operator.apply import children
from trtforge_operator.config import OperatorConfig
from trtforge_operator.observe.keys import KeyInputs, key_inputs
from trtforge_operator.observe.views import EngineObserved, JobView, built_key, request_builds
from trtforge_operator.planning.build_results import (
    backoff_seconds,
    failure_message,
    no_retry,
    result_cache_hit,
    result_error,
    result_key,
)
from trtforge_operator.planning.keys import no_node_message
from trtforge_operator.planning.target_state import TargetState
from trtforge_operator.planning.text import iso_time, one_line
from trtforge_operator.planning.verify import VerifyOutcome


@dataclass(frozen=True)
class TargetFacts:
    """What one target's policies look at, gathered once from the pass's observation."""

    target: GPUTarget
    now: float
    max_attempts: int
    verify: VerifyOutcome | None = None  # proof of possession still missing: every target waits on it
    ki: KeyInputs | None = None  # None: no request key (see key_error)
    key_error: str | None = None  # why the target has no request key
    has_node: bool = False  # some Node hosts the target
    builds: tuple[JobView, ...] = ()  # the request's build Jobs, by attempt
    engine_key: str | None = None  # the engine a build or the store's request index names
    manifest: Manifest | None = None  # that engine, in the store
    rebuilding: bool = False  # a rebuild made for this engine runs
    rebuild_failed: str | None = None  # why the last rebuild made for this engine failed
    cache_hit: bool = False  # no build of this key ran on this engine's behalf
    requester: str = ""  # `namespace/name` of the TRTEngine
    unschedulable: str | None = None  # why the latest build's pod waits for a node
    retry_at: float | None = None  # when a failed latest attempt may be retried (its backoff)

    @property
    def latest(self) -> JobView | None:
        return self.builds[-1] if self.builds else None

    @property
    def attempt(self) -> int:
        return self.latest.attempt if self.latest is not None else 0

    @property
    def next_job(self) -> str:
        """The name of the build Job of the next attempt."""
        rk = self.ki.request_key if self.ki is not None else ""
        return children.job_name(children.build_id(None, rk), self.attempt + 1)

    @property
    def reported_key(self) -> str | None:
        """The engine key the latest build reported, once it completed."""
        latest = self.latest
        return result_key(latest.result()) if latest is not None and latest.complete else None

    @property
    def failure(self) -> str | None:
        """Why the latest attempt failed; None while none did (or its result is not read yet)."""
        latest = self.latest
        if latest is not None and latest.complete and latest.result() is not None:
            return result_error(latest.result()) or (
                f"build Job {latest.name} finished but the store has no engine "
                f"{self.reported_key or self.engine_key}"
            )
        if latest is not None and latest.failed_final:
            return failure_message(latest)
        return None


@dataclass(frozen=True)
class Verdict:
    """A policy's answer: the target's state and message, when it wakes, and what it starts."""

    state: TargetState
    message: str
    wake_at: float | None = None
    build: bool = False  # start the next attempt now
    stalled: bool = False  # stalled though the state alone does not say so (a verify that gave up)
    job_has_pod: bool = True  # the running build Job has a pod (False: none made yet)


def target_facts(
    obs: EngineObserved,
    target: GPUTarget,
    cfg: OperatorConfig,
    jobs_by_id: Mapping[str, list[JobView]],
    verify: VerifyOutcome | None = None,
) -> TargetFacts:
    """The facts of one target (see :class:`TargetFacts`)."""
    base = TargetFacts(
        target=target, now=obs.now, max_attempts=cfg.build.max_attempts, requester=obs.requester
    )
    if verify is not None:  # no build and no cache hit before the namespace proves it holds the model
        return dataclasses.replace(base, verify=verify)
    try:
        ki = key_inputs(
            obs.spec, target, obs.nodes, cfg, model_sha256=obs.verified_sha256, cache_scope=obs.cache_scope
        )
    except ValueError as e:
        return dataclasses.replace(base, key_error=str(e), has_node=any(n.hosts(target) for n in obs.nodes))
    builds = request_builds(jobs_by_id, ki.request_key)
    key = built_key(builds)
    if key is None and (obs.verified_sha256 or obs.spec.source.sha256):
        # a known digest: the store's index answers across the namespaces of the cache scope
        filed = obs.requests.get(ki.request_key)
        key = filed.engine_key if filed is not None else None
    me = obs.requester
    # Only rebuilds made for this engine (the requester the operator wrote on the Job): another
    # engine's rebuild of a key they share never changes this engine's status.
    rebuilds = (
        sorted(
            (j for j in jobs_by_id.get(key[:20], []) if j.kind == "rebuild" and j.created_for in ("", me)),
            key=lambda j: j.created or 0,
        )
        if key
        else []
    )
    last_rb = rebuilds[-1] if rebuilds else None
    latest = builds[-1] if builds else None
    return dataclasses.replace(
        base,
        ki=ki,
        has_node=bool(ki.hosting_nodes),
        builds=tuple(builds),
        engine_key=key,
        manifest=obs.manifests.get(key) if key else None,
        rebuilding=last_rb is not None and last_rb.running,
        rebuild_failed=f"rebuild {last_rb.name} failed: {failure_message(last_rb)}"
        if last_rb is not None and last_rb.failed_final
        else None,
        # A cache hit for *this* resource: no build of this key ran on its behalf (another
        # namespace's build, or one from before, is a hit here).
        cache_hit=not any(
            j.created_for in ("", me) and not j.failed_final and result_cache_hit(j.result()) is not True
            for j in builds
        ),
        unschedulable=obs.unschedulable.get(latest.name) if latest is not None else None,
        retry_at=(latest.finished or obs.now) + backoff_seconds(latest.attempt, cfg) if latest else None,
    )


# ------------------------------------------------------------------------------------- the policies


def model_not_proven(f: TargetFacts) -> Verdict | None:
    """The namespace has not proven it holds the model: the target waits on its verification."""
    if f.verify is None:
        return None
    return Verdict(f.verify.state, f.verify.message, stalled=f.verify.stalled)


def no_request_key(f: TargetFacts) -> Verdict | None:
    """The target has no request key: no node offers it, or a label its build needs is missing."""
    if f.ki is not None:
        return None
    if not f.has_node:
        return Verdict(TargetState.NO_MATCHING_NODE, no_node_message(f.target))
    return Verdict(TargetState.INVALID_TARGET, one_line(f.key_error or ""))


def engine_in_store(f: TargetFacts) -> Verdict | None:
    """The store holds the request's engine: Ready (rebuilding it after a fault, a cache hit, or built)."""
    m = f.manifest
    if m is None:
        return None
    if f.rebuilding:
        return Verdict(
            TargetState.REBUILDING, "rebuilding after a GPU fault (the current engine keeps serving)"
        )
    if f.cache_hit:
        return Verdict(TargetState.CACHE_HIT, "engine found in the store, no build needed")
    return Verdict(TargetState.BUILT, f"built in {round(m.build_seconds, 3)}s")


def build_running(f: TargetFacts) -> Verdict | None:
    """The latest build Job runs, or its pod waits for a node of the target."""
    latest = f.latest
    if latest is None or not latest.running:
        return None
    has_pod = latest.active > 0
    if f.unschedulable:
        message = one_line(f"build Job {latest.name} waits for a {f.target} node: {f.unschedulable}")
        return Verdict(TargetState.WAITING_FOR_GPU, message, job_has_pod=has_pod)
    message = f"build Job {latest.name} (attempt {latest.attempt}) is running"
    return Verdict(TargetState.BUILD_RUNNING, message, job_has_pod=has_pod)


def result_not_read(f: TargetFacts) -> Verdict | None:
    """The latest build Job completed, but its result is not on it (nor reported by its pod) yet."""
    latest = f.latest
    if latest is None or not latest.complete or latest.result() is not None:
        return None
    return Verdict(TargetState.COLLECTING_RESULT, "reading the build result")


def retry_cannot_help(f: TargetFacts) -> Verdict | None:
    """The latest attempt failed for a reason no retry fixes (the spec or the model must change)."""
    if f.failure is None or f.latest is None or not no_retry(f.latest):
        return None
    return Verdict(
        TargetState.INVALID_BUILD_INPUT, one_line(f"{f.failure}; not retrying (fix the spec or the model)")
    )


def retries_exhausted(f: TargetFacts) -> Verdict | None:
    """The latest attempt failed and it was the last one allowed."""
    if f.failure is None or f.latest is None or f.attempt < f.max_attempts:
        return None
    message = (
        f"attempt {f.attempt}/{f.max_attempts} failed: {f.failure}; giving up (change the spec to try again)"
    )
    return Verdict(TargetState.BUILD_RETRIES_EXHAUSTED, one_line(message))


def backing_off(f: TargetFacts) -> Verdict | None:
    """The latest attempt failed and the next waits for its backoff."""
    retry_at = f.retry_at
    if f.failure is None or f.latest is None or retry_at is None or f.now >= retry_at:
        return None
    message = f"attempt {f.attempt}/{f.max_attempts} failed: {f.failure}; retrying at {iso_time(retry_at)}"
    return Verdict(TargetState.BUILD_FAILED, one_line(message), wake_at=retry_at)


def no_node_to_build_on(f: TargetFacts) -> Verdict | None:
    """No node hosts the target to build on (after a failed attempt: that attempt's failure stands)."""
    if f.has_node:
        return None
    failed = TargetState.BUILD_FAILED  # a failed attempt to retry, but no node to retry on
    return Verdict(TargetState.NO_MATCHING_NODE if f.failure is None else failed, no_node_message(f.target))


def start_build(f: TargetFacts) -> Verdict:
    """Nothing else holds: the next attempt starts now (the first, or a retry after a failure)."""
    n = f.attempt + 1
    if f.failure is None:
        return Verdict(TargetState.BUILD_STARTING, f"starting build Job {f.next_job}", build=True)
    return Verdict(
        TargetState.BUILD_RETRYING,
        one_line(f"attempt {f.attempt} failed: {f.failure}; starting attempt {n}"),
        build=True,
    )


TARGET_POLICIES = (
    model_not_proven,
    no_request_key,
    engine_in_store,
    build_running,
    result_not_read,
    retry_cannot_help,
    retries_exhausted,
    backing_off,
    no_node_to_build_on,
)


def evaluate(f: TargetFacts) -> Verdict:
    """The first policy's verdict, in the chain's order (see the module docstring); the next build
    when every policy passes."""
    for policy in TARGET_POLICIES:
        verdict = policy(f)
        if verdict is not None:
            return verdict
    return start_build(f)
