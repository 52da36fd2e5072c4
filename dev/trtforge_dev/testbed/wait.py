"""Wait for a condition by polling, never by a fixed sleep."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class WaitTimeout(TimeoutError):
    """The condition did not hold in time; carries the last value the predicate returned."""

    def __init__(self, desc: str, timeout: float, last: object, error: BaseException | None) -> None:
        self.last = last
        self.error = error
        msg = f"timed out after {timeout:g}s waiting for {desc}; last observed: {last!r}"
        if error is not None:
            msg += f"; last error: {type(error).__name__}: {error}"
        super().__init__(msg)


def wait_for(
    predicate: Callable[[], T],
    timeout: float = 60.0,
    interval: float = 0.2,
    desc: str = "condition",
    ignore: tuple[type[BaseException], ...] = (),
) -> T:
    """Call `predicate` until it returns a truthy value, and return that value.

    Exceptions of the types in `ignore` count as "not yet" (the last one is reported on timeout);
    others propagate. Raises :class:`WaitTimeout` (a TimeoutError) naming `desc` and the last value.
    """
    deadline = time.monotonic() + timeout
    last: object = None
    error: BaseException | None = None
    while True:
        try:
            value = predicate()
        except ignore as e:
            error = e
        else:
            if value:
                return value
            last = value
        now = time.monotonic()
        if now >= deadline:
            raise WaitTimeout(desc, timeout, last, error)
        time.sleep(min(interval, deadline - now))
