"""trtforge_runtime.lifecycle.event_loop: the loop `--event-loop` names, and a clear refusal when it
can't run."""

from __future__ import annotations

import asyncio
import importlib.util

import pytest
from trtforge_runtime.lifecycle import event_loop


async def _loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__.split(".")[0]


@pytest.mark.parametrize("name", event_loop.CHOICES)
def test_each_choice_runs_a_coroutine_on_its_own_loop(name: str) -> None:
    event_loop.check(name)
    assert event_loop.run(_loop_module(), name) == name


def test_uvloop_missing_is_refused_with_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "uvloop" else real(n, *a))
    with pytest.raises(
        event_loop.EventLoopUnavailable, match=r"--event-loop uvloop: .*trtforge-runtime\[uvloop\]"
    ):
        event_loop.check("uvloop")
    event_loop.check("asyncio")  # the standard library's loop is always there
