"""TRTEngine planning: observed state in, desired build Jobs and status out. No I/O.

Per resolved target: compute its *request key* (docs/design.md §"Engine keys"): the model (sha256
when pinned), the build config, the GPU binding the target and GFD labels state, the builder image and
the recipe version. Never a TensorRT, CUDA or backend version: the builder reports those. The engine
is found by what was asked for: the Job's result, or (pinned models) the store's request index that
the builder writes, so a stored engine means Ready with no Job at all, from any namespace. Otherwise
one Job per request key, retried with exponential backoff under a new name per attempt, then Stalled.
When the request of a Ready target changes (a new builder image, recipe or spec), its engine keeps
serving (reason Updating) until the new request's engine is in the store.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trtforge.contract.build_result import BuildFailure, BuildResult
from trtforge.contract.engine_key import (
    Backend,
    RequestKeyRecord,
    RequestRecord,
    request_key,
    target_binding,
)
from trtforge.contract.gpu import KNOWN_GPUS, GPUTarget
from trtforge.contract.layout import engine_path
from trtforge.contract.manifest import Manifest
from trtforge.contract.possession import PossessionRecord, scoped_key, source_fingerprint
from trtforge_operator import children
from trtforge_operator.api import (
    Accuracy,
    Condition,
    TargetStatus,
    TRTEngineSpec,
    TRTEngineStatus,
    VerifiedModel,
    ready_text,
    set_condition,
)
from trtforge_operator.api.trtengine import TargetPhase
from trtforge_operator.config import OperatorConfig
from trtforge_operator.labels import ANNOTATION_ATTEMPT, ANNOTATION_SOURCE_FINGERPRINT, LABEL_BUILD_ID
from trtforge_operator.observed import JobView, NodeView, utc

ManifestLookup = Callable[[str], Manifest | None]
RequestLookup = Callable[[str], RequestRecord | None]


def no_requests(_request_key: str) -> RequestRecord | None:
    return None


@dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass(frozen=True)
class Capacity:
    """Build Jobs running now, cluster-wide and requested from this namespace, and the limits."""

    running_total: int
    running_in_namespace: int
    max_total: int
    max_per_namespace: int

    def allows(self, extra_total: int, extra_ns: int) -> bool:
        return (
            self.running_total + extra_total < self.max_total
            and self.running_in_namespace + extra_ns < self.max_per_namespace
        )


@dataclass(frozen=True)
class EngineObserved:
    namespace: str
    name: str
    generation: int
    spec: TRTEngineSpec
    status: TRTEngineStatus
    nodes: Sequence[NodeView]
    # Build Jobs of the build namespace: a list, or (the operator's way) an index by build id, so one
    # pass looks up only its own targets' Jobs instead of scanning every Job (docs/design.md §"Scale").
    jobs: Sequence[JobView] | Mapping[str, Iterable[object]]
    manifests: ManifestLookup
    capacity: Capacity
    now: float
    unschedulable: Mapping[str, str] = field(default_factory=dict)  # build Job -> why its pod waits
    requests: RequestLookup = no_requests  # the store's request index: request key -> engine
    uid: str = ""
    # Proof of possession (docs/security.md): the broker's record for this namespace and the current
    # source (None: not proven yet), the verify Jobs of this namespace, and why finished ones failed.
    possession: PossessionRecord | None = None
    verify_jobs: Sequence[JobView] = ()
    verify_failures: Mapping[str, BuildFailure] = field(default_factory=dict)  # failed verify Job -> why
    cache_scope: str = ""  # the namespace's cache scope (CacheSettings.scope)

    @property
    def source_fingerprint(self) -> str:
        m = self.spec.model
        return source_fingerprint(m.uri, m.secret_ref.name if m.secret_ref else None, m.sha256)

    @property
    def verified_sha256(self) -> str | None:
        """The model digest this namespace proved it holds through the current source, else None."""
        p = self.possession
        if p is None or not p.proves(self.namespace, self.source_fingerprint, self.spec.model.sha256 or None):
            return None
        return p.sha256

    # Fault rebuilds asked of this engine by its InferenceDeployments, as the Jobs they need
    # (planning/rebuild.py): this planner creates them, the one owner of build Jobs.
    rebuild_jobs: Sequence[dict[str, Any]] = ()


@dataclass
class EnginePlan:
    status: TRTEngineStatus
    jobs_to_create: list[dict[str, Any]] = field(default_factory=list)
    verify_jobs_to_create: list[dict[str, Any]] = field(default_factory=list)  # in the tenant namespace
    add_requester: list[str] = field(default_factory=list)  # names of existing Jobs this engine now uses
    events: list[Event] = field(default_factory=list)
    requeue_after: float | None = None  # seconds until a backoff expires


@dataclass(frozen=True)
class KeyInputs:
    target: GPUTarget
    backend: Backend
    request_key: str
    node_selector: dict[str, str]
    hosting_nodes: tuple[str, ...]

    @property
    def request_digest(self) -> str:
        return self.request_key


def discovered_targets(spec: TRTEngineSpec, nodes: Sequence[NodeView]) -> list[GPUTarget]:
    """GPU targets found on Nodes that autoTargets selects (MIG only where the MIG config succeeded)."""
    auto = spec.auto_targets
    found: list[GPUTarget] = []
    for n in nodes:
        if auto is not None and not auto.selects(n.labels):
            continue
        found.extend(n.targets())
    return found


def resolve_targets(spec: TRTEngineSpec, nodes: Sequence[NodeView]) -> list[GPUTarget]:
    return spec.resolved_targets(discovered_targets(spec, nodes))


def key_inputs(
    spec: TRTEngineSpec,
    target: GPUTarget,
    nodes: Sequence[NodeView],
    cfg: OperatorConfig,
    *,
    model_sha256: str | None = None,
    cache_scope: str = "",
) -> KeyInputs:
    """Request key and node selector of one target (docs/design.md §"Engine keys").

    The GPU part comes from the target and, for hardware-compatible builds, the GFD labels of the
    first hosting node. Raises ValueError when a label such a build needs is missing. The model is
    its pin, or `model_sha256`, the digest the namespace proved it holds; the key is scoped to the
    namespace's cache scope (docs/security.md).
    """
    hosting = sorted((n for n in nodes if n.hosts(target)), key=lambda n: n.name)
    first = hosting[0] if hosting else None
    build = spec.build_config()
    backend = cfg.backend_for(target.gpu)
    binding = target_binding(
        target.gpu,
        target.mig,
        build.hardware_compatibility,
        compute_capability=first.compute_capability if first else None,
        arch=first.arch if first else None,
    )
    digest = model_sha256 or spec.model.sha256
    rk = scoped_key(
        request_key(
            RequestKeyRecord(
                model_sha256=digest,
                model_uri=None if digest else spec.model.uri,
                build=build,
                gpu=binding,
                backend=backend,
                builder_image=cfg.builder_image,
            )
        ),
        cache_scope,
    )
    return KeyInputs(
        target=target,
        backend=backend,
        request_key=rk,
        node_selector=target.node_selector(first.arch if first and first.arch else None),
        hosting_nodes=tuple(n.name for n in hosting),
    )


def build_request(
    spec: TRTEngineSpec,
    ki: KeyInputs,
    requester: str,
    *,
    engine_key: str | None,
    attempt: int = 1,
    rebuild_of: str | None = None,
    avoid_nodes: tuple[str, ...] = (),
    verified_sha256: str | None = None,
    cache_scope: str = "",
) -> children.BuildRequest:
    """The build of one target of `spec` (a first build, a retry, or a rebuild after a GPU fault).

    With `verified_sha256` (the namespace proved it holds the model) the build reads the broker's
    staged copy of the model, not the tenant's source."""
    val = spec.validation_settings()
    return children.BuildRequest(
        target=ki.target,
        model_uri=spec.model.uri,
        model_sha256=verified_sha256 or spec.model.sha256,
        staged_model=verified_sha256 is not None,
        cache_scope=cache_scope,
        build=spec.build_config(),
        engine_key=engine_key,
        request_digest=ki.request_key,
        node_selector=ki.node_selector,
        requester=requester,
        timing_cache=spec.builder.timing_cache,
        timeout_seconds=spec.builder.timeout_seconds,
        samples=val.samples,
        rtol=val.rtol,
        atol=val.atol,
        backend=ki.backend,
        attempt=attempt,
        rebuild_of=rebuild_of,
        avoid_nodes=avoid_nodes,
    )


def backoff_seconds(failed_attempts: int, cfg: OperatorConfig) -> float:
    """Wait after the n-th failed attempt: base * 2^(n-1), capped."""
    b = cfg.build
    return float(min(b.retry_max_seconds, b.retry_base_seconds * (2 ** max(0, failed_attempts - 1))))


NO_RETRY = frozenset({"InvalidArgument", "ModelIntegrity", "InvalidModel", "InvalidProfile"})


def parse_result(result: Mapping[str, Any] | None) -> BuildResult | BuildFailure | None:
    """The builder's result JSON (copied onto the Job) as the contract's model."""
    if not result:
        return None
    try:
        if "error" in result:
            return BuildFailure.model_validate(result)
        return BuildResult.model_validate(result)
    except ValueError:
        return None


def result_key(result: Mapping[str, Any] | None) -> str | None:
    r = parse_result(result)
    return r.key if isinstance(r, BuildResult) else None


def result_error(result: Mapping[str, Any] | None) -> str | None:
    r = parse_result(result)
    return one_line(f"{r.reason}: {r.error}") if isinstance(r, BuildFailure) else None


def result_cache_hit(result: Mapping[str, Any] | None) -> bool | None:
    r = parse_result(result)
    return r.cache_hit if isinstance(r, BuildResult) else None


def _no_retry(job: JobView) -> bool:
    r = parse_result(job.result())
    return isinstance(r, BuildFailure) and r.reason in NO_RETRY


def one_line(text: str, limit: int = 300) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def failure_message(job: JobView) -> str:
    err = result_error(job.result())
    if err:
        return err
    if job.failure_reason == "DeadlineExceeded":
        return f"build Job {job.name} ran past its deadline"
    if job.failure_message:
        return one_line(f"{job.failure_reason}: {job.failure_message}")
    return f"build Job {job.name} failed ({job.failure_reason or 'no reason given'})"


def _iso(epoch: float) -> str:
    return dt.datetime.fromtimestamp(epoch, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _ts(epoch: float | None) -> dt.datetime | None:
    return utc(epoch) if epoch else None


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
class _TargetOutcome:
    status: TargetStatus
    create: children.BuildRequest | None = None
    use_job: str | None = None
    wake_at: float | None = None
    stalled: bool = False
    rebuilding: bool = False
    rebuild_failed: str | None = None
    updating: bool = False  # a new request builds while the previous engine keeps serving


def _plan_target(
    obs: EngineObserved,
    target: GPUTarget,
    cfg: OperatorConfig,
    jobs_by_id: Mapping[str, list[JobView]],
    prev: TargetStatus | None = None,
    verify: VerifyOutcome | None = None,
) -> _TargetOutcome:
    """One target; while a changed request builds (or its new model source is verified), the
    previous Ready engine keeps serving."""
    out = _plan_request(obs, target, cfg, jobs_by_id, verify)
    st = out.status
    if st.phase == "Ready" or prev is None or prev.phase != "Ready" or not prev.engine_key:
        return out
    if prev.request_key == st.request_key:
        return out
    old = obs.manifests(prev.engine_key)
    if old is None:
        return out
    pending = f"{st.reason}: {st.message}" if st.message else (st.reason or st.phase)
    failed = st.phase == "Failed"
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
    serving.reason = "UpdateFailed" if failed else "Updating"
    serving.message = one_line(
        f"engine {old.key[:12]} keeps serving; the changed request "
        f"{'failed' if failed else 'is in progress'} ({pending})"
    )
    out.status = serving
    out.updating = not failed
    if failed:
        out.rebuild_failed = f"{st.name}: update failed: {pending}"
    return out


def _plan_request(
    obs: EngineObserved,
    target: GPUTarget,
    cfg: OperatorConfig,
    jobs_by_id: Mapping[str, list[JobView]],
    verify: VerifyOutcome | None = None,
) -> _TargetOutcome:
    st = TargetStatus(name=target.name, gpu=target.gpu, mig=target.mig, phase="Pending")
    if verify is not None:  # no build and no cache hit before the namespace proves it holds the model
        st.phase, st.reason, st.message = verify.phase, verify.reason, verify.message
        return _TargetOutcome(st, stalled=verify.stalled)
    try:
        ki = key_inputs(
            obs.spec, target, obs.nodes, cfg, model_sha256=obs.verified_sha256, cache_scope=obs.cache_scope
        )
    except ValueError as e:
        if not any(n.hosts(target) for n in obs.nodes):
            st.reason, st.message = "NoMatchingNode", no_node_message(target)
            return _TargetOutcome(st)
        st.phase, st.reason, st.message = "Failed", "InvalidTarget", one_line(str(e))
        return _TargetOutcome(st, stalled=True)
    st.request_key = ki.request_key
    bid = children.build_id(None, ki.request_key)
    builds = sorted((j for j in jobs_by_id.get(bid, []) if j.kind == "build"), key=lambda j: j.attempt)
    succeeded = [j for j in builds if j.complete]
    key = next((k for j in reversed(succeeded) if (k := result_key(j.result()))), None)
    if key is None and (obs.verified_sha256 or obs.spec.model.sha256):
        # a known digest: the store's index answers across the namespaces of the cache scope
        filed = obs.requests(ki.request_key)
        key = filed.engine_key if filed is not None else None
    manifest = obs.manifests(key) if key else None
    latest = builds[-1] if builds else None
    out = _TargetOutcome(st)
    if latest is not None:
        st.job_name = latest.name
        st.attempts = latest.attempt
        st.last_attempt_time = _ts(latest.started or latest.created)
        if obs_requester(obs) not in latest.requesters():
            out.use_job = latest.name
    if key:
        st.engine_key = key
        rebuilds = sorted(
            (j for j in jobs_by_id.get(key[:20], []) if j.kind == "rebuild"), key=lambda j: j.created or 0
        )
        if rebuilds:
            last_rb = rebuilds[-1]
            out.rebuilding = last_rb.running
            if last_rb.failed_final:
                out.rebuild_failed = f"rebuild {last_rb.name} failed: {failure_message(last_rb)}"
    if manifest is not None:
        _fill_from_manifest(st, manifest, cfg.store_uri)
        st.phase = "Ready"
        # A cache hit for *this* resource: no build of this key ran on its behalf (another namespace's
        # build, or one from before, is a hit here).
        me = obs_requester(obs)
        built_here = any(
            j.created_for in ("", me) and not j.failed_final and result_cache_hit(j.result()) is not True
            for j in builds
        )
        st.cache_hit = not built_here
        st.reason = "Rebuilding" if out.rebuilding else ("CacheHit" if st.cache_hit else "Built")
        st.message = (
            "rebuilding after a GPU fault (the current engine keeps serving)"
            if out.rebuilding
            else "engine found in the store, no build needed"
            if st.cache_hit
            else f"built in {st.build_seconds}s"
        )
        return out
    if latest is not None and latest.running:
        st.phase, st.reason = "Building", "BuildRunning"
        st.message = f"build Job {latest.name} (attempt {latest.attempt}) is running"
        waiting = obs.unschedulable.get(latest.name)
        if waiting:
            st.reason = "WaitingForGPU"
            st.message = one_line(f"build Job {latest.name} waits for a {target} node: {waiting}")
        return out
    if latest is not None and latest.complete:
        rk = result_key(latest.result())
        if latest.result() is None:
            st.phase, st.reason, st.message = "Building", "CollectingResult", "reading the build result"
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
        st.phase, st.reason = "Failed", "BuildFailed"
        if _no_retry(latest):
            st.reason = "InvalidBuildInput"
            st.message = one_line(f"{failed_msg}; not retrying (fix the spec or the model)")
            out.stalled = True
            return out
        if attempt >= cfg.build.max_attempts:
            st.reason = "BuildRetriesExhausted"
            st.message = one_line(
                f"attempt {attempt}/{cfg.build.max_attempts} failed: {failed_msg}; giving up "
                "(change the spec to try again)"
            )
            out.stalled = True
            return out
        retry_at = (latest.finished or obs.now) + backoff_seconds(attempt, cfg)
        if obs.now < retry_at:
            st.message = one_line(
                f"attempt {attempt}/{cfg.build.max_attempts} failed: {failed_msg}; "
                f"retrying at {_iso(retry_at)}"
            )
            out.wake_at = retry_at
            return out
    if not ki.hosting_nodes:
        st.phase, st.reason = ("Pending", "NoMatchingNode") if failed_msg is None else (st.phase, st.reason)
        st.message = no_node_message(target)
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
    if failed_msg is None:
        st.phase, st.reason = "Building", "BuildStarting"
        st.message = f"starting build Job {st.job_name}"
    else:
        st.phase, st.reason = "Building", "BuildRetrying"
        st.message = one_line(f"attempt {attempt} failed: {failed_msg}; starting attempt {attempt + 1}")
    return out


def no_node_message(target: GPUTarget) -> str:
    """Why a target has no node, with a hint from the known-GPU table (display only) when the MIG
    profile is not one it lists for the product."""
    msg = f"no schedulable node offers {target} ({target.resource_name() or 'cpu'})"
    known = KNOWN_GPUS.get(target.gpu)
    if target.mig and known is not None and target.mig not in known.mig:
        msg += f"; note: {target.gpu} is not known to have MIG profile {target.mig} ({', '.join(known.mig)})"
    return msg


VERIFY_NO_RETRY = frozenset({"InvalidArgument", "ModelIntegrity"})
VERIFY_RESULT_GRACE_S = 30.0  # a verify Job that succeeded but whose record the store does not show yet


@dataclass(frozen=True)
class VerifyOutcome:
    """Where proof of possession stands while it is not there: every target waits on it."""

    phase: TargetPhase
    reason: str
    message: str
    create: children.VerifyRequest | None = None
    wake_at: float | None = None
    stalled: bool = False


def plan_verify(obs: EngineObserved, cfg: OperatorConfig) -> VerifyOutcome:
    """The next step of proving that obs.namespace holds the model through its current source.

    One verify Job per source fingerprint and attempt (create-if-absent); a failed attempt is retried
    with the build backoff up to build.maxAttempts, except when retrying cannot help (a pin the model
    does not match, a path out of the claim)."""
    fp = obs.source_fingerprint
    mine = sorted(
        (
            j
            for j in obs.verify_jobs
            if j.annotations.get(ANNOTATION_SOURCE_FINGERPRINT) == fp and not j.deleting
        ),
        key=lambda j: int(j.annotations.get(ANNOTATION_ATTEMPT) or 1),
    )
    latest = mine[-1] if mine else None
    attempt = int(latest.annotations.get(ANNOTATION_ATTEMPT) or 1) if latest is not None else 0
    uri = obs.spec.model.uri

    def request(n: int) -> children.VerifyRequest:
        m = obs.spec.model
        return children.VerifyRequest(
            namespace=obs.namespace,
            engine=obs.name,
            engine_uid=obs.uid,
            model_uri=m.uri,
            model_sha256=m.sha256,
            secret=m.secret_ref.name if m.secret_ref else None,
            fingerprint=fp,
            attempt=n,
        )

    if latest is None:
        req = request(1)
        return VerifyOutcome(
            "Pending",
            "VerifyingModel",
            f"verifying that this namespace holds {uri} (Job {req.job_name})",
            req,
        )
    if latest.running:
        return VerifyOutcome(
            "Pending",
            "VerifyingModel",
            f"verifying that this namespace holds {uri} (Job {latest.name}, attempt {attempt})",
        )
    result = obs.verify_failures.get(latest.name)
    if latest.complete and result is None:
        done_at = latest.finished or obs.now
        if obs.now - done_at < VERIFY_RESULT_GRACE_S:
            return VerifyOutcome(
                "Pending",
                "VerifyingModel",
                f"verify Job {latest.name} finished; reading the broker's record",
                wake_at=done_at + VERIFY_RESULT_GRACE_S,
            )
        failure = "the verify Job finished, but the broker holds no record of it"
    elif result is not None:
        failure = one_line(f"{result.reason}: {result.error}")
    else:
        failure = failure_message(latest)
    if result is not None and result.reason in VERIFY_NO_RETRY:
        return VerifyOutcome(
            "Failed",
            "ModelVerifyFailed",
            one_line(f"{failure}; not retrying (fix spec.model or the model)"),
            stalled=True,
        )
    if attempt >= cfg.build.max_attempts:
        return VerifyOutcome(
            "Failed",
            "ModelVerifyFailed",
            one_line(f"verify attempt {attempt}/{cfg.build.max_attempts} failed: {failure}; giving up"),
            stalled=True,
        )
    retry_at = (latest.finished or obs.now) + backoff_seconds(attempt, cfg)
    if obs.now < retry_at:
        return VerifyOutcome(
            "Failed",
            "ModelVerifyFailed",
            one_line(f"verify attempt {attempt} failed: {failure}; retrying at {_iso(retry_at)}"),
            wake_at=retry_at,
        )
    req = request(attempt + 1)
    return VerifyOutcome(
        "Pending",
        "VerifyingModel",
        one_line(f"verify attempt {attempt} failed: {failure}; starting {req.job_name}"),
        req,
    )


class _IndexedJobs(Mapping[str, list[JobView]]):
    """Live Jobs of an index keyed by build id, looked up one id at a time (never scanned whole)."""

    def __init__(self, index: Mapping[str, Iterable[object]]) -> None:
        self._index = index

    def __getitem__(self, build_id: str) -> list[JobView]:
        found = [j for j in list(self._index.get(build_id, ())) if isinstance(j, JobView) and not j.deleting]
        if not found:
            raise KeyError(build_id)
        return found

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._index))

    def __len__(self) -> int:
        return len(self._index)


def jobs_by_build_id(jobs: Sequence[JobView] | Mapping[str, Iterable[object]]) -> Mapping[str, list[JobView]]:
    """The live (not deleting) Jobs per build id, from a list or from an index keyed by build id."""
    if isinstance(jobs, Mapping):
        return _IndexedJobs(jobs)
    out: dict[str, list[JobView]] = {}
    for j in jobs:
        if not j.deleting:
            out.setdefault(j.build_id, []).append(j)
    return out


def obs_requester(obs: EngineObserved) -> str:
    return f"{obs.namespace}/{obs.name}"


def plan_engine(obs: EngineObserved, cfg: OperatorConfig) -> EnginePlan:
    """The desired Jobs and status of one TRTEngine."""
    targets = resolve_targets(obs.spec, obs.nodes)
    jobs_by_id = jobs_by_build_id(obs.jobs)
    prev = {t.name: t for t in obs.status.targets}
    plan = EnginePlan(status=TRTEngineStatus())
    outcomes: list[_TargetOutcome] = []
    extra_total = extra_ns = 0
    planned: set[str] = set()
    verify = plan_verify(obs, cfg) if obs.verified_sha256 is None and targets else None
    if verify is not None:
        if verify.create is not None:
            plan.verify_jobs_to_create.append(children.verify_job(verify.create, cfg))
        if verify.wake_at is not None:
            plan.requeue_after = max(0.5, verify.wake_at - obs.now)
    for target in targets:
        o = _plan_target(obs, target, cfg, jobs_by_id, prev.get(target.name), verify)
        if o.create is not None and o.create.job_name in planned:
            o.create = None  # targets that ask for the same engine (hardware-compatible) share a Job
        elif o.create is not None:
            if obs.capacity.allows(extra_total, extra_ns):
                planned.add(o.create.job_name)
                extra_total += 1
                extra_ns += 1
                plan.jobs_to_create.append(children.build_job(o.create, cfg))
            else:
                queued = (
                    f"waiting for a build slot ({obs.capacity.running_total} running, "
                    f"limits {obs.capacity.max_total} total, "
                    f"{obs.capacity.max_per_namespace} per namespace)"
                )
                if o.updating:  # the previous engine keeps serving meanwhile
                    o.status.message = one_line(f"{o.status.message}; {queued}")
                else:
                    o.status.phase, o.status.reason, o.status.message = "Pending", "Queued", queued
                o.status.job_name = None
                o.create = None
        if o.use_job:
            plan.add_requester.append(o.use_job)
        if o.wake_at is not None:
            wait = max(0.5, o.wake_at - obs.now)
            plan.requeue_after = wait if plan.requeue_after is None else min(plan.requeue_after, wait)
        outcomes.append(o)
    for job in obs.rebuild_jobs:
        name = job["metadata"]["name"]
        existing = jobs_by_id.get(job["metadata"]["labels"][LABEL_BUILD_ID], [])
        if name in planned or any(j.name == name or (j.kind == "rebuild" and j.running) for j in existing):
            continue  # asked for already, or a rebuild of that engine is running: create-if-absent
        if obs.capacity.allows(extra_total, extra_ns):
            planned.add(name)
            extra_total += 1
            extra_ns += 1
            plan.jobs_to_create.append(job)
        else:
            plan.requeue_after = min(plan.requeue_after or 5.0, 5.0)
    statuses = [_keep_times(o.status, prev.get(o.status.name)) for o in outcomes]
    p = obs.possession
    plan.status = TRTEngineStatus(
        observed_generation=obs.generation,
        conditions=_conditions(obs, outcomes, statuses),
        targets=statuses,
        ready_targets=ready_text(sum(1 for s in statuses if s.phase == "Ready"), len(statuses)),
        model=VerifiedModel(sha256=p.sha256, verified_time=utc(p.verified_at), size_bytes=p.size_bytes)
        if p is not None and obs.verified_sha256 is not None
        else None,
    )
    plan.events = transition_events(obs.status, plan.status)
    return plan


def _keep_times(st: TargetStatus, prev: TargetStatus | None) -> TargetStatus:
    """Keep the previous last-attempt time when the planner could not observe one (no churn)."""
    if prev is not None and st.last_attempt_time is None and st.job_name and st.job_name == prev.job_name:
        st.last_attempt_time = prev.last_attempt_time
    return st


def _conditions(
    obs: EngineObserved, outcomes: list[_TargetOutcome], statuses: list[TargetStatus]
) -> list[Condition]:
    gen = obs.generation
    at = _ts(obs.now)
    conds = list(obs.status.conditions)
    n = len(statuses)
    ready = [s for s in statuses if s.phase == "Ready"]
    building = [s for s in statuses if s.phase == "Building"]
    failed = [s for s in statuses if s.phase == "Failed"]
    rebuilding = [o.status.name for o in outcomes if o.rebuilding or o.updating]
    rebuild_failed = [o.rebuild_failed for o in outcomes if o.rebuild_failed]
    stalled = [o.status for o in outcomes if o.stalled]
    if n == 0:
        conds = set_condition(
            conds,
            "Ready",
            "False",
            "NoTargets",
            "no targets: list spec.targets, or enable autoTargets on a cluster with GPU nodes",
            observed_generation=gen,
            at=at,
        )
    elif len(ready) == n:
        conds = set_condition(
            conds,
            "Ready",
            "True",
            "AllTargetsReady",
            f"{n}/{n} targets ready",
            observed_generation=gen,
            at=at,
        )
    else:
        waiting = "; ".join(f"{s.name}: {s.phase}" for s in statuses if s.phase != "Ready")
        conds = set_condition(
            conds,
            "Ready",
            "False",
            "TargetsNotReady",
            one_line(f"{len(ready)}/{n} targets ready; {waiting}", 1000),
            observed_generation=gen,
            at=at,
        )
    if building or rebuilding:
        names = [s.name for s in building] + rebuilding
        updating = any(o.updating for o in outcomes)
        conds = set_condition(
            conds,
            "Building",
            "True",
            "BuildRunning" if building else ("Updating" if updating else "Rebuilding"),
            f"building: {', '.join(names)}",
            observed_generation=gen,
            at=at,
        )
    else:
        conds = set_condition(
            conds, "Building", "False", "Idle", "no build running", observed_generation=gen, at=at
        )
    if failed or rebuild_failed:
        msgs = [f"{s.name}: {s.message}" for s in failed] + [m for m in rebuild_failed if m]
        conds = set_condition(
            conds,
            "Degraded",
            "True",
            "BuildFailed",
            one_line("; ".join(msgs), 1000),
            observed_generation=gen,
            at=at,
        )
    else:
        conds = set_condition(conds, "Degraded", "False", "AsExpected", "", observed_generation=gen, at=at)
    if stalled:
        reason = next(
            (
                s.reason
                for s in stalled
                if s.reason in ("InvalidTarget", "InvalidBuildInput", "ModelVerifyFailed")
            ),
            "BuildRetriesExhausted",
        )
        conds = set_condition(
            conds,
            "Stalled",
            "True",
            reason,
            one_line("; ".join(f"{s.name}: {s.message}" for s in stalled), 1000),
            observed_generation=gen,
            at=at,
        )
    else:
        conds = set_condition(conds, "Stalled", "False", "AsExpected", "", observed_generation=gen, at=at)
    return conds


def transition_events(old: TRTEngineStatus, new: TRTEngineStatus) -> list[Event]:
    """Events for per-target phase changes (what `kubectl describe` shows)."""
    before = {t.name: t for t in old.targets}
    out: list[Event] = []
    for t in new.targets:
        p = before.get(t.name)
        if p is not None and p.phase == t.phase and p.reason == t.reason and p.sha256 == t.sha256:
            continue
        if t.phase == "Ready" and t.reason in ("Updating", "UpdateFailed"):
            kind = "Normal" if t.reason == "Updating" else "Warning"
            out.append(
                Event(
                    kind, "EngineUpdating" if kind == "Normal" else "UpdateFailed", f"{t.name}: {t.message}"
                )
            )
        elif t.phase == "Ready":
            how = "cache hit" if t.cache_hit else f"built in {t.build_seconds}s"
            if p is not None and p.phase == "Ready" and p.sha256 != t.sha256:
                how = "rebuilt engine published"
            out.append(
                Event("Normal", "EngineReady", f"{t.name}: engine {(t.engine_key or '')[:12]} ready ({how})")
            )
        elif t.phase == "Building" and t.reason in ("BuildStarting", "BuildRetrying"):
            out.append(Event("Normal", "BuildStarted", f"{t.name}: {t.message}"))
        elif t.phase == "Failed":
            out.append(Event("Warning", t.reason or "BuildFailed", f"{t.name}: {t.message}"))
        elif t.phase == "Pending" and t.reason in ("NoMatchingNode", "Queued"):
            out.append(Event("Normal", t.reason, f"{t.name}: {t.message}"))
    return out


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


def invalid_spec_status(
    old: TRTEngineStatus, generation: int, message: str, now: float, *, reason: str = "InvalidSpec"
) -> TRTEngineStatus:
    """Status of a TRTEngine whose spec the models refuse (the CRD of an old cluster lets it in), or
    whose model source is not allowed (`reason` InvalidModelSource)."""
    at = _ts(now)
    conds = list(old.conditions)
    msg = one_line(message, 1000)
    conds = set_condition(conds, "Ready", "False", reason, msg, observed_generation=generation, at=at)
    conds = set_condition(conds, "Building", "False", "Idle", "", observed_generation=generation, at=at)
    conds = set_condition(conds, "Degraded", "False", "AsExpected", "", observed_generation=generation, at=at)
    conds = set_condition(conds, "Stalled", "True", reason, msg, observed_generation=generation, at=at)
    return TRTEngineStatus(
        observed_generation=generation,
        conditions=conds,
        targets=list(old.targets),
        ready_targets=old.ready_targets,
    )
