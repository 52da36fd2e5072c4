"""The plan of an LLM TRTEngine (docs/llm.md): refusals before any Job, one quantize Job per
checkpoint key, then a tune Job per target; status and conditions from what the Jobs reported. Pure.

Order of a pass: proof of possession first (planning/verify.py, as for ONNX models: the quantize
Job reads the source the broker staged); each target's refusal policies (planning/llm_policies.py);
the checkpoint (in the store, quantizing, refused by the accuracy gate, or to quantize now); then,
once it is in the store, each forgeable target's tune Job; then the re-tunes the rebuilds ask for
(a GPU fault under a deployment's pod, or the TRTEngine's annotation: planning/rebuild.py). A failed
Job is retried as build Jobs are, unless its reported reason says no retry can help
(planning/llm_retry.py); the condition says why (the gate's refusal with both perplexities).

What is per GPU is the tuning record, so an LLM engine's "rebuild" is a re-tune of that target,
never a new quantize Job: the checkpoint is per source digest and recipe, whatever the GPU
(docs/design.md §"LLM rebuild is a re-tune").
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from trtforge.contract.build_result import BuildFailure
from trtforge.contract.gpu import GPUTarget
from trtforge.contract.llm import Backend, Refusal
from trtforge.contract.llm.result import PerplexityFigures, QuantizeResult, TuneResult, parse_llm_message
from trtforge.contract.llm.unified_memory import WeightsFit
from trtforge_operator.api import (
    CheckpointStatus,
    Condition,
    PerplexityStatus,
    TargetStatus,
    set_condition,
)
from trtforge_operator.api.trtengine import BUILDING, READY, STALLED
from trtforge_operator.apply import llm_jobs
from trtforge_operator.config import OperatorConfig
from trtforge_operator.labels import LABEL_TARGET
from trtforge_operator.observe.keys import key_inputs
from trtforge_operator.observe.llm_keys import (
    checkpoint_backend,
    engine_checkpoint_key,
    llm_backend,
    quantize_id,
    tune_id,
)
from trtforge_operator.observe.views import EngineObserved, JobView, jobs_by_build_id, obs_requester, utc
from trtforge_operator.planning.groups import tune_gpus
from trtforge_operator.planning.llm_policies import (
    LLMTargetFacts,
    checkpoint_fit,
    estimated_fit,
    llm_target_refusal,
    target_identity,
)
from trtforge_operator.planning.llm_retry import RetryDecision, RetryStep, retry_decision
from trtforge_operator.planning.rebuild import RebuildCause, RebuildRequest, holds_back
from trtforge_operator.planning.text import one_line, timestamp
from trtforge_operator.planning.verify import VerifyOutcome

# Reasons of an LLM engine's checkpoint and targets (status reasons, typed here, never parsed).
VERIFYING = "VerifyingModel"
SOURCE_UNSUPPORTED = "SourceFormatUnsupported"
QUANTIZING = "Quantizing"
QUANTIZED = "Quantized"
CACHE_HIT = "CacheHit"
GATE_FAILED = "AccuracyGateFailed"
QUANTIZE_FAILED = "QuantizeFailed"
QUANTIZE_RETRYING = "QuantizeRetrying"
NO_MATCHING_NODE = "NoMatchingNode"
WAITING_FOR_CHECKPOINT = "WaitingForCheckpoint"
CHECKPOINT_FAILED = "CheckpointFailed"
TUNING = "Tuning"
TUNED = "Tuned"
TUNE_FAILED = "TuneFailed"
TUNE_RETRYING = "TuneRetrying"


@dataclass(frozen=True)
class JobCreate:
    """A Job the plan asks for: its manifest, and the target name it is for (None: the quantize Job).
    `rebuild`: a re-tune (admitted as a rebuild: it never changes the target's status)."""

    job: dict[str, object]
    target: str | None = None
    rebuild: bool = False


@dataclass
class LLMPlan:
    """What the LLM pass decided: statuses, the Jobs to create, Jobs to claim, and Warnings."""

    checkpoint: CheckpointStatus | None
    targets: list[TargetStatus]
    creates: list[JobCreate] = field(default_factory=list)
    claims: list[str] = field(default_factory=list)
    warnings: list[tuple[str, str]] = field(default_factory=list)  # (reason, message)
    stalled: list[str] = field(default_factory=list)
    wake_at: float | None = None  # a failed Job's next attempt waits for its backoff until then

    def wake(self, at: float) -> None:
        self.wake_at = at if self.wake_at is None else min(self.wake_at, at)

    @property
    def ready(self) -> int:
        return sum(1 for t in self.targets if t.phase == "Ready")


def _latest(jobs: Mapping[str, Sequence[JobView]], job_id: str, kind: str) -> JobView | None:
    """The latest Job of `kind` with build id `job_id` (in the shared cache scope a quantize Job's id
    is its checkpoint key's, which re-tunes, named as rebuilds of that key, share)."""
    found = [j for j in jobs.get(job_id, ()) if not j.deleting and j.kind == kind]
    return max(found, key=lambda j: j.attempt) if found else None


def _reported(job: JobView) -> QuantizeResult | TuneResult | BuildFailure | None:
    raw = job.result()
    return None if raw is None else parse_llm_message(json.dumps(raw))


def _failure(job: JobView, result: object) -> str:
    return result.error if isinstance(result, BuildFailure) else job.failure_message or "no result"


def _retry(
    plan: LLMPlan, what: str, job: JobView, result: object, now: float, cfg: OperatorConfig
) -> tuple[RetryDecision, str]:
    """What follows a failed Job (planning/llm_retry.py), and its line for the status. A stop is a
    warning and stalls the engine; a backoff wakes the pass when it ends."""
    failure = result if isinstance(result, BuildFailure) else None
    decision = retry_decision(job, failure, now, cfg)
    message = one_line(decision.describe(f"{what} Job {job.name} failed: {_failure(job, result)}"))
    if decision.step is RetryStep.BACKING_OFF and decision.retry_at is not None:
        plan.wake(decision.retry_at)
    return decision, message


def _perplexity(p: object) -> PerplexityStatus | None:
    if not isinstance(p, PerplexityFigures):
        return None
    return PerplexityStatus(
        source=p.source, result=p.result, increase=p.increase, max_increase=p.max_increase
    )


def gate_message(p: PerplexityStatus) -> str:
    """Both figures of an accuracy gate refusal, in one line."""
    return (
        f"perplexity rose from {p.source:.4f} (source) to {p.result:.4f} (quantized), "
        f"{p.increase:+.2%}, past the bound of {p.max_increase:.2%} (spec.llm.maxPerplexityIncrease); "
        "nothing was published"
    )


def target_refusal(obs: EngineObserved, cfg: OperatorConfig, t: GPUTarget) -> Refusal | None:
    """Why the target may not be forged (planning/llm_policies.py), else None."""
    return llm_target_refusal(target_facts(obs, cfg, t))


def target_facts(obs: EngineObserved, cfg: OperatorConfig, t: GPUTarget) -> LLMTargetFacts:
    """What the LLM target policies look at, for one target."""
    llm = obs.spec.llm
    assert llm is not None
    return LLMTargetFacts(
        target=t,
        recipe=llm.recipe_enum(),
        parallelism=obs.spec.parallelism_of(t),
        backend=llm_backend(cfg, t),
        parameters=llm.parameter_count(),
        identity=target_identity(t, obs.nodes),
        allow_unified_memory_overflow=llm.allow_unified_memory_overflow,
    )


def plan_llm(
    obs: EngineObserved,
    cfg: OperatorConfig,
    targets: list[GPUTarget],
    verify: VerifyOutcome | None,
    rebuilds: Sequence[RebuildRequest] = (),
) -> LLMPlan:
    """The LLM engine's statuses and Jobs (see the module docstring); `rebuilds`: those
    planning/rebuild.py derived from the operator's fault records and the TRTEngine's asks."""
    llm = obs.spec.llm
    assert llm is not None
    requester = obs_requester(obs)
    statuses: dict[str, TargetStatus] = {}
    forgeable: list[GPUTarget] = []
    plan = LLMPlan(checkpoint=None, targets=[])
    for t in targets:
        par = obs.spec.parallelism_of(t)
        st = TargetStatus(name=t.name, gpu=t.gpu, mig=t.mig, mapping=par.mapping)
        refusal = target_refusal(obs, cfg, t)
        if refusal is not None:
            st.phase, st.reason, st.message = "Failed", refusal.reason.value, refusal.message
            plan.warnings.append((refusal.reason.value, refusal.message))
            plan.stalled.append(refusal.message)
        else:
            forgeable.append(t)
            st.weights_overflow_mib = _overflow(estimated_fit(target_facts(obs, cfg, t)))
        statuses[t.name] = st
    plan.targets = [statuses[t.name] for t in targets]
    if forgeable and llm.source.format != "gguf":
        msg = (
            f"spec.llm.source.format {llm.source.format}: a Hugging Face checkpoint folder is not staged "
            "by the verify step yet; give a GGUF file"
        )
        for t in forgeable:
            s = statuses[t.name]
            s.phase, s.reason, s.message = "Failed", SOURCE_UNSUPPORTED, msg
        plan.warnings.append((SOURCE_UNSUPPORTED, msg))
        plan.stalled.append(msg)
        return plan
    if not forgeable:
        return plan  # refused before any Job
    digest = obs.verified_sha256
    if digest is None or verify is not None:
        msg = verify.message if verify is not None else "verifying the source"
        for t in forgeable:
            s = statuses[t.name]
            s.phase, s.reason, s.message = "Pending", VERIFYING, msg
            if verify is not None and verify.stalled:
                s.phase = "Failed"
                plan.stalled.append(msg)
        return plan
    backend = checkpoint_backend(cfg, forgeable)
    ckey = engine_checkpoint_key(obs.spec, digest, backend)
    qid = quantize_id(ckey, obs.cache_scope)
    ck = _plan_checkpoint(obs, cfg, plan, ckey, qid, backend, digest, requester)
    plan.checkpoint = ck
    for t in forgeable:
        if _refuse_weights(obs, plan, statuses[t.name], t, ck):
            continue
        _plan_tune(obs, cfg, plan, statuses[t.name], t, ck, qid, requester)
    for req in rebuilds:
        retune = retune_request(obs, cfg, forgeable, ck, req, requester)
        if retune is not None and not _asked_already(obs.jobs, retune, req):
            plan.creates.append(JobCreate(llm_jobs.tune_job(retune, cfg), target=req.target, rebuild=True))
    return plan


def _refuse_weights(
    obs: EngineObserved, plan: LLMPlan, st: TargetStatus, t: GPUTarget, ck: CheckpointStatus
) -> bool:
    """A published checkpoint whose weights do not fit the target (planning/llm_policies.py,
    `checkpoint_fit`): the target is Failed before its tune Job, and never served; weights admitted
    into Grace memory are recorded on the status."""
    if ck.phase != "Ready":
        return False
    m = obs.checkpoint
    weight_bytes = m.weight_bytes if m is not None else ck.size_bytes
    if weight_bytes is None:
        return False
    allow = obs.spec.llm is not None and obs.spec.llm.allow_unified_memory_overflow
    fit = checkpoint_fit(t, target_identity(t, obs.nodes), obs.spec.parallelism_of(t), weight_bytes, allow)
    refusal = fit.refusal
    if refusal is None:
        st.weights_overflow_mib = _overflow(fit)  # the measured weights decide, not the estimate
        return False
    st.phase, st.reason, st.message = "Failed", refusal.reason.value, refusal.message
    st.engine_key = ck.checkpoint_key
    plan.warnings.append((refusal.reason.value, refusal.message))
    plan.stalled.append(refusal.message)
    return True


def _overflow(fit: WeightsFit) -> int | None:
    """The status's record of weights admitted into Grace memory (None: they fit HBM)."""
    return fit.overflow_mib if fit.overflows else None


def retune_request(
    obs: EngineObserved,
    cfg: OperatorConfig,
    forgeable: Sequence[GPUTarget],
    ck: CheckpointStatus,
    req: RebuildRequest,
    requester: str,
) -> llm_jobs.TuneRequest | None:
    """The re-tune `req` asks for: the target's tune Job again, off the nodes to avoid, replacing the
    stored record; named by the checkpoint key and the fault (the deployment waits for that name). None
    when the checkpoint it names is not the published one or the target is gone (nothing to re-tune)."""
    t = next((x for x in forgeable if x.name == req.target), None)
    if t is None or ck.phase != "Ready" or ck.checkpoint_key != req.engine_key:
        return None
    try:
        ki = key_inputs(obs.spec, t, obs.nodes, cfg, cache_scope=obs.cache_scope)
    except ValueError:
        return None
    return llm_jobs.TuneRequest(
        job_id=req.engine_key[:20],  # as ONNX rebuilds: the id of the key they rebuild
        checkpoint_key=req.engine_key,
        target=t,
        parallelism=obs.spec.parallelism_of(t),
        gpus=tune_gpus(obs.spec.parallelism_of(t), t, obs.nodes),
        backend=llm_backend(cfg, t),
        node_selector=dict(ki.node_selector),
        requester=requester,
        mig_strategy=ki.mig_strategy,
        timeout_seconds=obs.spec.builder.timeout_seconds,
        rebuild_of=req.fault,
        rebuild_asked=req.cause is RebuildCause.ASKED,
        avoid_nodes=tuple(sorted(req.avoid_nodes)),
    )


def _asked_already(
    jobs: Sequence[JobView] | Mapping[str, Sequence[JobView]],
    retune: llm_jobs.TuneRequest,
    req: RebuildRequest,
) -> bool:
    """Create-if-absent: its Job exists (whatever its state), or a running re-tune of the same
    target holds it back (one at a time; a fault's is never held back by an ask)."""
    same = jobs_by_build_id(jobs).get(retune.job_id, [])
    mine = [j for j in same if j.labels.get(LABEL_TARGET) == req.target]
    return any(j.name == retune.job_name for j in same) or any(j.running and holds_back(req, j) for j in mine)


def _plan_checkpoint(
    obs: EngineObserved,
    cfg: OperatorConfig,
    plan: LLMPlan,
    ckey: str,
    qid: str,
    backend: Backend,
    digest: str,
    requester: str,
) -> CheckpointStatus:
    llm = obs.spec.llm
    assert llm is not None
    ck = CheckpointStatus(recipe=llm.recipe, checkpoint_key=ckey, backend=backend.value)
    job = _latest(jobs_by_build_id(obs.jobs), qid, llm_jobs.QUANTIZE)
    result = _reported(job) if job is not None else None
    if job is not None:
        ck.job_name = job.name
        if requester not in job.requesters() and obs.checkpoint is None:
            plan.claims.append(job.name)
    m = obs.checkpoint
    if isinstance(result, QuantizeResult):
        ck.manifest_uri, ck.backend_version = result.manifest_uri, result.backend_version
        ck.quantized_type, ck.size_bytes, ck.cache_hit = (
            result.quantized_type,
            result.size_bytes,
            result.cache_hit,
        )
        ck.perplexity = _perplexity(result.perplexity)
    if m is not None:
        ck.phase, ck.reason = "Ready", CACHE_HIT if job is None or ck.cache_hit else QUANTIZED
        ck.backend_version = ck.backend_version or m.backend_version
        ck.size_bytes = ck.size_bytes or m.total_bytes
        if ck.perplexity is None and m.checkpoint is not None and m.checkpoint.accuracy is not None:
            g = m.checkpoint.accuracy
            ck.perplexity = PerplexityStatus(
                source=g.source, result=g.result, increase=g.increase, max_increase=g.max_increase
            )
        ck.message = f"checkpoint {ckey[:12]} is in the store"
        return ck
    if job is not None and job.running:
        ck.phase, ck.reason = "Building", QUANTIZING
        ck.message = f"quantize Job {job.name} runs ({llm.recipe} on {backend.value})"
        return ck
    if isinstance(result, QuantizeResult):  # the store read lags the Job by a moment
        ck.phase, ck.reason, ck.message = "Ready", QUANTIZED, f"checkpoint {ckey[:12]} published"
        return ck
    attempt = 1
    if job is not None and job.done:
        gate = _perplexity(getattr(result, "perplexity", None))
        decision, message = _retry(plan, "quantize", job, result, obs.now, cfg)
        ck.message = message
        if decision.step in (RetryStep.PERMANENT, RetryStep.EXHAUSTED):
            ck.phase, ck.reason = "Failed", QUANTIZE_FAILED
            if gate is not None:
                ck.perplexity, ck.reason, ck.message = gate, GATE_FAILED, gate_message(gate)
            plan.warnings.append((ck.reason, ck.message))
            plan.stalled.append(ck.message)
            return ck
        if decision.step is RetryStep.BACKING_OFF:
            ck.phase, ck.reason = "Pending", QUANTIZE_RETRYING
            return ck
        attempt = decision.attempt + 1
    req = llm_jobs.QuantizeRequest(
        job_id=qid,
        checkpoint_key=ckey,
        source_sha256=digest,
        quantization=llm.quantization(),
        backend=backend,
        canary_prompt=llm.canary.prompt,
        canary_tokens=llm.canary.max_tokens,
        requester=requester,
        timeout_seconds=obs.spec.builder.timeout_seconds,
        attempt=attempt,
    )
    plan.creates.append(JobCreate(llm_jobs.quantize_job(req, cfg)))
    ck.phase, ck.reason, ck.job_name = "Building", QUANTIZING, req.job_name
    created = f"quantize Job {req.job_name} created ({llm.recipe} on {backend.value})"
    ck.message = one_line(f"{ck.message}; {created}") if attempt > 1 else created
    return ck


def _plan_tune(
    obs: EngineObserved,
    cfg: OperatorConfig,
    plan: LLMPlan,
    st: TargetStatus,
    t: GPUTarget,
    ck: CheckpointStatus,
    qid: str,
    requester: str,
) -> None:
    if ck.phase != "Ready":
        failed = ck.phase == "Failed"
        st.phase = "Failed" if failed else "Pending"
        st.reason = CHECKPOINT_FAILED if failed else WAITING_FOR_CHECKPOINT
        st.message = one_line(f"checkpoint: {ck.reason}: {ck.message}")
        return
    assert ck.checkpoint_key is not None
    st.engine_key = ck.checkpoint_key
    backend = llm_backend(cfg, t)
    par = obs.spec.parallelism_of(t)
    try:
        ki = key_inputs(obs.spec, t, obs.nodes, cfg, cache_scope=obs.cache_scope)
    except ValueError as e:
        st.phase, st.reason, st.message = "Pending", NO_MATCHING_NODE, str(e)
        return
    if not ki.hosting_nodes:
        st.phase, st.reason = "Pending", NO_MATCHING_NODE
        st.message = f"no Ready node hosts {t}"
        return
    tid = tune_id(qid, t, par, backend, cfg.builder_image)
    job = _latest(jobs_by_build_id(obs.jobs), tid, llm_jobs.TUNE)
    result = _reported(job) if job is not None else None
    if job is not None:
        st.job_name, st.attempts = job.name, job.attempt
        st.last_attempt_time = timestamp(job.started or job.created)
    if isinstance(result, TuneResult):
        st.phase, st.reason = "Ready", TUNED
        st.tuning_key, st.backend, st.backend_version = (
            result.tuning_key,
            backend.value,
            result.backend_version,
        )
        st.cache_hit = result.cache_hit
        settings = ", ".join(f"{k}={v}" for k, v in sorted(result.settings.items()))
        st.message = one_line(f"tuning cache {result.tuning_key[:12]} ({settings})")
        return
    prev = next((p for p in obs.status.targets if p.name == t.name), None)
    if job is None and prev is not None and prev.phase == "Ready" and prev.engine_key == ck.checkpoint_key:
        return _keep(st, prev)  # its tune Job was cleaned up after it was recorded
    if job is not None and job.running:
        st.phase, st.reason, st.message = "Building", TUNING, f"tune Job {job.name} runs"
        return
    attempt = 1
    if job is not None and job.done:
        decision, message = _retry(plan, "tune", job, result, obs.now, cfg)
        st.message = message
        if decision.step in (RetryStep.PERMANENT, RetryStep.EXHAUSTED):
            st.phase, st.reason = "Failed", TUNE_FAILED
            plan.warnings.append((TUNE_FAILED, st.message))
            plan.stalled.append(st.message)
            return
        if decision.step is RetryStep.BACKING_OFF:
            st.phase, st.reason = "Pending", TUNE_RETRYING
            return
        attempt = decision.attempt + 1
    elif job is not None and requester not in job.requesters():
        plan.claims.append(job.name)
    req = llm_jobs.TuneRequest(
        job_id=tid,
        checkpoint_key=ck.checkpoint_key,
        target=t,
        parallelism=par,
        gpus=tune_gpus(par, t, obs.nodes),
        backend=backend,
        node_selector=dict(ki.node_selector),
        requester=requester,
        mig_strategy=ki.mig_strategy,
        timeout_seconds=obs.spec.builder.timeout_seconds,
        attempt=attempt,
    )
    plan.creates.append(JobCreate(llm_jobs.tune_job(req, cfg), target=t.name))
    st.phase, st.reason, st.job_name, st.attempts = "Building", TUNING, req.job_name, attempt
    created = f"tune Job {req.job_name} created"
    st.message = one_line(f"{st.message}; {created}") if attempt > 1 else created


def _keep(st: TargetStatus, prev: TargetStatus) -> None:
    for name in ("phase", "reason", "message", "tuning_key", "backend", "backend_version", "cache_hit"):
        setattr(st, name, getattr(prev, name))
    st.job_name, st.attempts, st.last_attempt_time = prev.job_name, prev.attempts, prev.last_attempt_time


def llm_conditions(old: Sequence[Condition], generation: int, at: float, plan: LLMPlan) -> list[Condition]:
    """Ready (every target tuned on a published checkpoint), Building, Stalled (a refusal or a
    failed Job, each named)."""
    when = utc(at)
    total, ready = len(plan.targets), plan.ready
    building = (plan.checkpoint is not None and plan.checkpoint.phase == "Building") or any(
        t.phase == "Building" for t in plan.targets
    )
    first = next((t for t in plan.targets if t.phase != "Ready"), None)
    conds = list(old)
    if total and ready == total:
        conds = set_condition(conds, READY, "True", "Ready", f"{ready}/{total} targets ready",
                              observed_generation=generation, at=when)  # fmt: skip
    else:
        reason = (first.reason if first is not None else None) or "NoTargets"
        msg = first.message if first is not None and first.message else f"{ready}/{total} targets ready"
        conds = set_condition(conds, READY, "False", reason, one_line(msg),
                              observed_generation=generation, at=when)  # fmt: skip
    conds = set_condition(
        conds,
        BUILDING,
        "True" if building else "False",
        "Forging" if building else "Idle",
        "quantize or tune Jobs run" if building else "",
        observed_generation=generation,
        at=when,
    )
    stalled = "; ".join(plan.stalled)
    conds = set_condition(
        conds,
        STALLED,
        "True" if stalled else "False",
        (plan.warnings[0][0] if plan.warnings else "Stalled") if stalled else "NotStalled",
        one_line(stalled)[:4000],
        observed_generation=generation,
        at=when,
    )
    return conds
