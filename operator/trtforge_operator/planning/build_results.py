"""What a finished build Job says: the builder's result on it, or why the Job failed. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trtforge.contract.build_result import BuildFailure, BuildResult
from trtforge_operator.config import OperatorConfig
from trtforge_operator.observe.views import JobView
from trtforge_operator.planning.text import one_line

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


def no_retry(job: JobView) -> bool:
    r = parse_result(job.result())
    return isinstance(r, BuildFailure) and r.reason in NO_RETRY


def failure_message(job: JobView) -> str:
    err = result_error(job.result())
    if err:
        return err
    if job.failure_reason == "DeadlineExceeded":
        return f"build Job {job.name} ran past its deadline"
    if job.failure_message:
        return one_line(f"{job.failure_reason}: {job.failure_message}")
    return f"build Job {job.name} failed ({job.failure_reason or 'no reason given'})"


def backoff_seconds(failed_attempts: int, cfg: OperatorConfig) -> float:
    """Wait after the n-th failed attempt: base * 2^(n-1), capped."""
    b = cfg.build
    return float(min(b.retry_max_seconds, b.retry_base_seconds * (2 ** max(0, failed_attempts - 1))))
