"""Whether a failed quantize or tune Job is tried again: the build Jobs' policy (planning/build_results.py,
``build.maxAttempts`` attempts, exponential backoff from ``build.retryBaseSeconds``), with the LLM
steps' own permanent failures. Decided by the reason the Job reported (typed), never by its message.
Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from trtforge.contract.build_result import BuildFailure, FailureReason
from trtforge_operator.config import OperatorConfig
from trtforge_operator.observe.views import JobView
from trtforge_operator.planning.build_results import NO_RETRY, backoff_seconds
from trtforge_operator.planning.text import iso_time

# Failures the same inputs fail again with: the accuracy gate refused the result (ValidationFailed),
# the source is not a model or not the pinned one, the image lacks the backend, a bad argument.
_LLM_ONLY: frozenset[FailureReason] = frozenset(
    {"ValidationFailed", "BackendUnavailable", "ModelSourceRefused", "ModelTooLarge"}
)
LLM_NO_RETRY: frozenset[str] = NO_RETRY | _LLM_ONLY


class RetryStep(StrEnum):
    """What follows a failed attempt."""

    PERMANENT = "Permanent"  # a failure no retry fixes: stop, the spec or the source must change
    EXHAUSTED = "Exhausted"  # the last attempt allowed failed
    BACKING_OFF = "BackingOff"  # the next attempt waits until retry_at
    RETRY_NOW = "RetryNow"  # start attempt `attempt + 1` now


@dataclass(frozen=True)
class RetryDecision:
    step: RetryStep
    attempt: int  # the failed attempt's number
    max_attempts: int
    retry_at: float | None = None  # BACKING_OFF and RETRY_NOW: when the next attempt may start

    def describe(self, failure: str) -> str:
        """One line for the status: the failure and what follows it."""
        n, m = self.attempt, self.max_attempts
        at = iso_time(self.retry_at or 0.0)
        return {
            RetryStep.PERMANENT: f"{failure}; not retrying (fix the spec or the source)",
            RetryStep.EXHAUSTED: f"attempt {n}/{m}: {failure}; giving up (change the spec to try again)",
            RetryStep.BACKING_OFF: f"attempt {n}/{m}: {failure}; retrying at {at}",
            RetryStep.RETRY_NOW: f"attempt {n}/{m}: {failure}; starting attempt {n + 1}",
        }[self.step]


def retry_decision(
    failed: JobView, reported: BuildFailure | None, now: float, cfg: OperatorConfig
) -> RetryDecision:
    """What follows the failed latest attempt `failed` of a quantize or tune Job; `reported`: the
    failure its pod reported (None: it reported none, e.g. killed, out of memory, past its deadline,
    all retried)."""
    attempt, most = failed.attempt, cfg.build.max_attempts
    if reported is not None and reported.reason in LLM_NO_RETRY:
        return RetryDecision(RetryStep.PERMANENT, attempt, most)
    if attempt >= most:
        return RetryDecision(RetryStep.EXHAUSTED, attempt, most)
    retry_at = (failed.finished or now) + backoff_seconds(attempt, cfg)
    step = RetryStep.BACKING_OFF if now < retry_at else RetryStep.RETRY_NOW
    return RetryDecision(step, attempt, most, retry_at)
