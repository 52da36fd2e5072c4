"""trtforge_runtime.lifecycle.threads.on_thread: work on a named daemon thread, its outcome in a future. (That
the module imports nothing heavy is checked through trtforge_runtime.lifecycle.preload, which imports it.)"""

from __future__ import annotations

import threading

import pytest
from trtforge_runtime.lifecycle.threads import on_thread


def test_the_future_gets_what_the_work_returns_on_its_own_named_daemon_thread() -> None:
    seen: list[threading.Thread] = []

    def work() -> int:
        seen.append(threading.current_thread())
        return 42

    fut, t = on_thread(work, "unit-work")
    assert fut.result(timeout=60) == 42
    t.join(timeout=60)
    assert seen == [t] and t is not threading.main_thread()
    assert t.name == "unit-work" and t.daemon


def test_the_future_gets_what_the_work_raises_as_raised() -> None:
    def work() -> int:
        raise KeyError("missing")

    fut, _ = on_thread(work, "unit-fail")
    with pytest.raises(KeyError, match="missing"):
        fut.result(timeout=60)
