"""The runtime retries a store that is temporarily unavailable (trtforge_runtime.lifecycle.retry)."""

from __future__ import annotations

import pytest
from trtforge_runtime.errors import Refusal
from trtforge_runtime.lifecycle.retry import budget_from_env, retry_delay, retryable, with_retries

from trtforge.store.base import StoreError
from trtforge.store.http import BrokerDenied


def _refusal(reason: str, cause: BaseException) -> Refusal:
    try:
        raise Refusal(reason, "could not read")  # type: ignore[arg-type]
    except Refusal as r:
        r.__cause__ = cause
        return r


class Clock:
    def __init__(self) -> None:
        self.t = 0.0
        self.slept: list[float] = []

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.t += s

    def now(self) -> float:
        return self.t


def test_delays_double_and_cap() -> None:
    assert [retry_delay(n) for n in range(1, 8)] == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0]


def test_what_is_retried() -> None:
    assert retryable(_refusal("StoreUnavailable", StoreError("HTTP 500")))
    assert not retryable(_refusal("StoreUnavailable", BrokerDenied("403")))
    assert not retryable(_refusal("EngineIntegrity", StoreError("x")))


def test_a_broker_that_recovers_is_waited_for() -> None:
    clock = Clock()
    calls: list[int] = []

    def fetch() -> str:
        calls.append(1)
        if len(calls) < 4:
            raise _refusal("StoreUnavailable", StoreError("HTTP 500: token review failed"))
        return "engine"

    assert with_retries(fetch, 60.0, clock.sleep, clock.now) == "engine"
    assert clock.slept == [0.5, 1.0, 2.0]


def test_a_denial_ends_at_once() -> None:
    clock = Clock()

    def fetch() -> str:
        raise _refusal("StoreUnavailable", BrokerDenied("refused (403)"))

    with pytest.raises(Refusal):
        with_retries(fetch, 60.0, clock.sleep, clock.now)
    assert clock.slept == []


def test_gives_up_when_the_budget_is_spent() -> None:
    clock = Clock()

    def fetch() -> str:
        raise _refusal("StoreUnavailable", StoreError("unreachable"))

    with pytest.raises(Refusal):
        with_retries(fetch, 10.0, clock.sleep, clock.now)
    assert sum(clock.slept) <= 10.0
    assert clock.slept == [0.5, 1.0, 2.0, 4.0]


def test_budget_from_env() -> None:
    assert budget_from_env({}) == 300.0
    assert budget_from_env({"TRTFORGE_STORE_RETRY_SECONDS": "0"}) == 0.0
    with pytest.raises(ValueError, match="TRTFORGE_STORE_RETRY_SECONDS"):
        budget_from_env({"TRTFORGE_STORE_RETRY_SECONDS": "soon"})
