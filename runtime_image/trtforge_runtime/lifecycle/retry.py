"""Retrying a store that is temporarily unavailable, instead of exiting at the first failure.

A store read can fail for a while for reasons that pass by themselves: the engine broker restarting,
or unable to check tokens while the apiserver restarts (it answers 5xx), a network blip. Exiting
(code 80) would put the pod into the kubelet's crash-loop back-off, which grows to minutes; retrying
here resumes as soon as the store answers. A refusal that waiting cannot fix (401/403 from the
broker, a missing or corrupt engine) ends the process at once, as before.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import TypeVar

from trtforge.logs import fields
from trtforge.store.http import BrokerDenied
from trtforge_runtime.errors import Refusal

log = logging.getLogger(__name__)

T = TypeVar("T")
BUDGET_ENV = "TRTFORGE_STORE_RETRY_SECONDS"
DEFAULT_BUDGET_S = 300.0
FIRST_DELAY_S = 0.5
MAX_DELAY_S = 8.0


def retry_delay(failures: int) -> float:
    """Seconds to wait after the `failures`-th failure in a row: 0.5, 1, 2, 4, 8, 8, ..."""
    return min(FIRST_DELAY_S * 2 ** max(0, failures - 1), MAX_DELAY_S)


def retryable(e: Refusal) -> bool:
    """Store unavailable for a reason that may pass; never a denial or an integrity problem."""
    return e.reason == "StoreUnavailable" and not isinstance(e.__cause__, BrokerDenied)


def budget_from_env(env: dict[str, str] | None = None) -> float:
    raw = (os.environ if env is None else env).get(BUDGET_ENV)
    if raw is None or raw == "":
        return DEFAULT_BUDGET_S
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"${BUDGET_ENV}={raw!r}: expected seconds (a number >= 0)") from None
    if value < 0:
        raise ValueError(f"${BUDGET_ENV}={raw!r}: expected seconds (a number >= 0)")
    return value


def with_retries(
    fn: Callable[[], T],
    budget_s: float,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """`fn()`, tried again with back-off while it raises a retryable Refusal, for up to `budget_s`."""
    start = clock()
    failures = 0
    while True:
        try:
            return fn()
        except Refusal as e:
            if not retryable(e):
                raise
            failures += 1
            delay = retry_delay(failures)
            if clock() - start + delay > budget_s:
                log.error("store still unavailable; giving up", extra=fields(tries=failures))
                raise
            log.warning(
                "store unavailable; retrying",
                extra=fields(attempt=failures, retry_in_s=delay, error=e.message[:300]),
            )
            sleep(delay)
