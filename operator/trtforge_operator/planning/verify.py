"""Proof of possession before any build or cache hit (docs/security.md): the verify Job's next step. Pure."""

from __future__ import annotations

from dataclasses import dataclass

from trtforge.contract.build_result import BuildFailure
from trtforge_operator.apply import children
from trtforge_operator.config import OperatorConfig
from trtforge_operator.labels import (
    ANNOTATION_ATTEMPT,
    ANNOTATION_RECHECK_ROUND,
    ANNOTATION_SOURCE_FINGERPRINT,
)
from trtforge_operator.observe.views import EngineObserved, JobView
from trtforge_operator.planning.build_results import (
    backoff_seconds,
    failure_message,
)
from trtforge_operator.planning.target_state import TargetState
from trtforge_operator.planning.text import iso_time, one_line

# Failures a retry of the same source cannot fix (the source, the pin or the bytes must change).
VERIFY_NO_RETRY = frozenset(
    {"InvalidArgument", "ModelIntegrity", "ModelSourceRefused", "InvalidModel", "ModelTooLarge"}
)
VERIFY_RESULT_GRACE_S = 30.0  # a verify Job that succeeded but whose record the store does not show yet
VERIFY_SLOT_RECHECK_S = 10.0  # how soon an engine waiting for a verify slot looks again


@dataclass(frozen=True)
class VerifyOutcome:
    """Where proof of possession stands while it is not there: every target waits on it."""

    state: TargetState  # VerifyingModel or ModelVerifyFailed
    message: str
    create: children.VerifyRequest | None = None
    wake_at: float | None = None
    stalled: bool = False


@dataclass(frozen=True)
class VerifyFacts:
    """What the verification's policies look at: the latest verify Job of this source and round, and
    what its pod reported."""

    uri: str  # spec.model.uri
    now: float
    next_request: children.VerifyRequest  # the verify Job of the next attempt
    latest: JobView | None = None
    attempt: int = 0  # the latest's attempt (0: none yet)
    running: int = 0  # verify Jobs running in the namespace
    limit: int = 1  # verify.maxConcurrentPerNamespace
    stuck: str | None = None  # why the latest's pod cannot start
    result: BuildFailure | None = None  # why the latest failed, as its pod reported it
    max_attempts: int = 1
    deadline_seconds: int = 0
    retry_at: float | None = None  # when a failed latest attempt may be retried (its backoff)

    @property
    def failure(self) -> str:
        """Why the latest (finished) attempt failed."""
        latest = self.latest
        if self.result is not None:
            return one_line(f"{self.result.reason}: {self.result.error}")
        if latest is not None and latest.complete:
            return "the verify Job finished, but the broker holds no record of it"
        return failure_message(latest) if latest is not None else ""


def verify_facts(obs: EngineObserved, cfg: OperatorConfig, round_: str = "") -> VerifyFacts:
    """The facts of proving that obs.namespace holds the model through its current source (`round_`:
    a re-read of a verified model, whose Jobs are told apart from the first verification's)."""
    fp = obs.source_fingerprint
    mine = sorted(
        (
            j
            for j in obs.verify_jobs
            if j.annotations.get(ANNOTATION_SOURCE_FINGERPRINT) == fp
            and j.annotations.get(ANNOTATION_RECHECK_ROUND, "") == round_
            and not j.deleting
        ),
        key=lambda j: int(j.annotations.get(ANNOTATION_ATTEMPT) or 1),
    )
    latest = mine[-1] if mine else None
    attempt = int(latest.annotations.get(ANNOTATION_ATTEMPT) or 1) if latest is not None else 0
    m = obs.spec.source
    return VerifyFacts(
        uri=m.uri,
        now=obs.now,
        next_request=children.VerifyRequest(
            namespace=obs.namespace,
            engine=obs.name,
            engine_uid=obs.uid,
            model_uri=m.uri,
            model_sha256=m.sha256,
            secret=m.secret_ref.name if m.secret_ref else None,
            fingerprint=fp,
            attempt=attempt + 1,
            max_bytes=m.max_size_bytes,
            allowed_redirect_hosts=tuple(m.allowed_redirect_hosts),
            round_=round_,
            model_format=obs.spec.llm.source.format if obs.spec.llm is not None else "onnx",
        ),
        latest=latest,
        attempt=attempt,
        running=sum(1 for j in obs.verify_jobs if j.running and not j.deleting),
        limit=cfg.verify.max_concurrent_per_namespace,
        stuck=obs.verify_stuck.get(latest.name) if latest is not None else None,
        result=obs.verify_failures.get(latest.name) if latest is not None else None,
        max_attempts=cfg.build.max_attempts,
        deadline_seconds=cfg.verify.deadline_seconds,
        retry_at=(latest.finished or obs.now) + backoff_seconds(attempt, cfg) if latest is not None else None,
    )


# ------------------------------------------------------------------------------------- the policies


def verify_running(f: VerifyFacts) -> VerifyOutcome | None:
    """The latest verify Job runs, or its pod cannot start (it waits for the cause or its deadline)."""
    latest = f.latest
    if latest is None or not latest.running:
        return None
    if f.stuck:
        return VerifyOutcome(
            TargetState.VERIFYING_MODEL,
            one_line(
                f"verify Job {latest.name} (attempt {f.attempt}) cannot start its pod: {f.stuck}; it "
                f"waits until the cause is fixed or its deadline ({f.deadline_seconds} s)"
            ),
        )
    message = f"verifying that this namespace holds {f.uri} (Job {latest.name}, attempt {f.attempt})"
    return VerifyOutcome(TargetState.VERIFYING_MODEL, message)


def record_pending(f: VerifyFacts) -> VerifyOutcome | None:
    """The latest verify Job succeeded a moment ago; the broker's record may not show yet."""
    latest = f.latest
    if latest is None or not latest.complete or f.result is not None:
        return None
    done_at = latest.finished or f.now
    if f.now - done_at >= VERIFY_RESULT_GRACE_S:
        return None
    return VerifyOutcome(
        TargetState.VERIFYING_MODEL,
        f"verify Job {latest.name} finished; reading the broker's record",
        wake_at=done_at + VERIFY_RESULT_GRACE_S,
    )


def source_refused(f: VerifyFacts) -> VerifyOutcome | None:
    """The latest attempt failed for a reason no retry of the same source fixes."""
    if f.latest is None or f.result is None or f.result.reason not in VERIFY_NO_RETRY:
        return None
    message = one_line(f"{f.failure}; not retrying (fix spec.model or the model)")
    return VerifyOutcome(TargetState.MODEL_VERIFY_FAILED, message, stalled=True)


def verify_retries_exhausted(f: VerifyFacts) -> VerifyOutcome | None:
    """The latest attempt failed and it was the last one allowed."""
    if f.latest is None or f.attempt < f.max_attempts:
        return None
    message = one_line(f"verify attempt {f.attempt}/{f.max_attempts} failed: {f.failure}; giving up")
    return VerifyOutcome(TargetState.MODEL_VERIFY_FAILED, message, stalled=True)


def verify_backing_off(f: VerifyFacts) -> VerifyOutcome | None:
    """The latest attempt failed and the next waits for its backoff."""
    if f.latest is None or f.retry_at is None or f.now >= f.retry_at:
        return None
    message = one_line(f"verify attempt {f.attempt} failed: {f.failure}; retrying at {iso_time(f.retry_at)}")
    return VerifyOutcome(TargetState.MODEL_VERIFY_FAILED, message, wake_at=f.retry_at)


def verify_slot_full(f: VerifyFacts) -> VerifyOutcome | None:
    """This namespace already runs as many verify Jobs as it may: the next attempt waits."""
    if f.running < f.limit:
        return None
    return VerifyOutcome(
        TargetState.VERIFYING_MODEL,
        f"waiting for a verify slot to verify {f.uri} (attempt {f.attempt + 1}): {f.running} verify Jobs "
        f"running in this namespace, limit {f.limit}",
        wake_at=f.now + VERIFY_SLOT_RECHECK_S,
    )


def start_verify(f: VerifyFacts) -> VerifyOutcome:
    """Nothing else holds: the next verify Job starts now (the first, or a retry)."""
    req = f.next_request
    if f.latest is None:
        message = f"verifying that this namespace holds {f.uri} (Job {req.job_name})"
    else:
        message = one_line(f"verify attempt {f.attempt} failed: {f.failure}; starting {req.job_name}")
    return VerifyOutcome(TargetState.VERIFYING_MODEL, message, req)


VERIFY_POLICIES = (
    verify_running,
    record_pending,
    source_refused,
    verify_retries_exhausted,
    verify_backing_off,
    verify_slot_full,
)


def plan_verify(obs: EngineObserved, cfg: OperatorConfig, round_: str = "") -> VerifyOutcome:
    """The next step of proving that obs.namespace holds the model through its current source: the
    first answer of :data:`VERIFY_POLICIES`, else the next verify Job.

    One verify Job per source fingerprint and attempt (create-if-absent); a failed attempt is retried
    with the build backoff up to build.maxAttempts, except when retrying cannot help (a pin the model
    does not match, a path out of the claim). `round_`: a re-read of a verified model (plan_recheck),
    whose Jobs are told apart from the first verification's and each other round's."""
    f = verify_facts(obs, cfg, round_)
    for policy in VERIFY_POLICIES:
        outcome = policy(f)
        if outcome is not None:
            return outcome
    return start_verify(f)


@dataclass(frozen=True)
class RecheckOutcome:
    """Reading a verified, unpinned model again (spec.model.recheckInterval); targets keep serving the
    model verified last until a re-read records another digest."""

    message: str | None  # for status.model.message
    create: children.VerifyRequest | None = None
    wake_at: float | None = None


def plan_recheck(obs: EngineObserved, cfg: OperatorConfig) -> RecheckOutcome:
    """Whether to read the model again now. Pure. Called once the namespace holds a verified record."""
    m, p = obs.spec.source, obs.possession
    if m.sha256 or p is None:
        return RecheckOutcome(None)
    every = m.recheck_seconds
    if every is None:
        return RecheckOutcome(
            f"not pinned and spec.model.recheckInterval is unset: the model was read once, at "
            f"{iso_time(p.verified_at)}; a change at {m.uri} is never seen"
        )
    due = p.verified_at + every
    if obs.now < due:
        return RecheckOutcome(f"read again at {iso_time(due)} (every {m.recheck_interval})", wake_at=due)
    out = plan_verify(obs, cfg, round_=f"r{int(p.verified_at):x}")
    return RecheckOutcome(
        one_line(f"reading the model again (due {iso_time(due)}): {out.message}"), out.create, out.wake_at
    )
