"""Proof of possession before any build or cache hit (docs/security.md): the verify Job's next step. Pure."""

from __future__ import annotations

from dataclasses import dataclass

from trtforge_operator.apply import children
from trtforge_operator.config import OperatorConfig
from trtforge_operator.labels import (
    ANNOTATION_ATTEMPT,
    ANNOTATION_RECHECK_ROUND,
    ANNOTATION_SOURCE_FINGERPRINT,
)
from trtforge_operator.observe.views import (
    EngineObserved,
)
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


def plan_verify(obs: EngineObserved, cfg: OperatorConfig, round_: str = "") -> VerifyOutcome:
    """The next step of proving that obs.namespace holds the model through its current source.

    One verify Job per source fingerprint and attempt (create-if-absent); a failed attempt is retried
    with the build backoff up to build.maxAttempts, except when retrying cannot help (a pin the model
    does not match, a path out of the claim). `round_`: a re-read of a verified model (plan_recheck),
    whose Jobs are told apart from the first verification's and each other round's."""
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
            max_bytes=m.max_size_bytes,
            allowed_redirect_hosts=tuple(m.allowed_redirect_hosts),
            round_=round_,
        )

    def no_slot(n: int) -> VerifyOutcome | None:
        """Waiting when this namespace already runs as many verify Jobs as it may."""
        running = sum(1 for j in obs.verify_jobs if j.running and not j.deleting)
        limit = cfg.verify.max_concurrent_per_namespace
        if running < limit:
            return None
        return VerifyOutcome(
            TargetState.VERIFYING_MODEL,
            f"waiting for a verify slot to verify {uri} (attempt {n}): {running} verify Jobs running in "
            f"this namespace, limit {limit}",
            wake_at=obs.now + VERIFY_SLOT_RECHECK_S,
        )

    if latest is None:
        if (wait := no_slot(1)) is not None:
            return wait
        req = request(1)
        return VerifyOutcome(
            TargetState.VERIFYING_MODEL,
            f"verifying that this namespace holds {uri} (Job {req.job_name})",
            req,
        )
    if latest.running:
        stuck = obs.verify_stuck.get(latest.name)
        if stuck:
            return VerifyOutcome(
                TargetState.VERIFYING_MODEL,
                one_line(
                    f"verify Job {latest.name} (attempt {attempt}) cannot start its pod: {stuck}; it "
                    f"waits until the cause is fixed or its deadline ({cfg.verify.deadline_seconds} s)"
                ),
            )
        return VerifyOutcome(
            TargetState.VERIFYING_MODEL,
            f"verifying that this namespace holds {uri} (Job {latest.name}, attempt {attempt})",
        )
    result = obs.verify_failures.get(latest.name)
    if latest.complete and result is None:
        done_at = latest.finished or obs.now
        if obs.now - done_at < VERIFY_RESULT_GRACE_S:
            return VerifyOutcome(
                TargetState.VERIFYING_MODEL,
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
            TargetState.MODEL_VERIFY_FAILED,
            one_line(f"{failure}; not retrying (fix spec.model or the model)"),
            stalled=True,
        )
    if attempt >= cfg.build.max_attempts:
        return VerifyOutcome(
            TargetState.MODEL_VERIFY_FAILED,
            one_line(f"verify attempt {attempt}/{cfg.build.max_attempts} failed: {failure}; giving up"),
            stalled=True,
        )
    retry_at = (latest.finished or obs.now) + backoff_seconds(attempt, cfg)
    if obs.now < retry_at:
        return VerifyOutcome(
            TargetState.MODEL_VERIFY_FAILED,
            one_line(f"verify attempt {attempt} failed: {failure}; retrying at {iso_time(retry_at)}"),
            wake_at=retry_at,
        )
    if (wait := no_slot(attempt + 1)) is not None:
        return wait
    req = request(attempt + 1)
    return VerifyOutcome(
        TargetState.VERIFYING_MODEL,
        one_line(f"verify attempt {attempt} failed: {failure}; starting {req.job_name}"),
        req,
    )


@dataclass(frozen=True)
class RecheckOutcome:
    """Reading a verified, unpinned model again (spec.model.recheckInterval); targets keep serving the
    model verified last until a re-read records another digest."""

    message: str | None  # for status.model.message
    create: children.VerifyRequest | None = None
    wake_at: float | None = None


def plan_recheck(obs: EngineObserved, cfg: OperatorConfig) -> RecheckOutcome:
    """Whether to read the model again now. Pure. Called once the namespace holds a verified record."""
    m, p = obs.spec.model, obs.possession
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
