"""trtforge_runtime.lifecycle.startup_gc: the collector is off for start-up, then on, with start-up's objects
frozen out of every later collection."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
from trtforge_runtime.lifecycle import startup_gc


@pytest.fixture(autouse=True)
def _restore_collector() -> Iterator[None]:
    was_enabled = gc.isenabled()
    yield
    gc.unfreeze()
    if was_enabled:
        gc.enable()
    else:
        gc.disable()


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def test_pause_stops_collections_until_resume() -> None:
    gc.unfreeze()
    gc.enable()
    startup_gc.pause()
    assert not gc.isenabled()
    runs: list[int] = []

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "stop":
            runs.append(info["generation"])

    gc.callbacks.append(count)
    try:
        for _ in range(50_000):  # far past the first generation's threshold
            _Cycle()
        assert runs == []
        frozen = startup_gc.resume()
        assert gc.isenabled()
        # Frozen objects can still die (other threads of the test process drop theirs), never join.
        assert frozen > 0 and 0 < gc.get_freeze_count() <= frozen
        for _ in range(50_000):
            _Cycle()
        assert runs, "no collection after resume"
    finally:
        gc.callbacks.remove(count)


def test_resume_freezes_what_is_alive_and_collects_what_comes_after() -> None:
    gc.unfreeze()
    startup_gc.pause()
    kept = _Cycle()
    startup_gc.resume()
    # A frozen object is never collected, even once unreachable: it is in no generation.
    assert all(o is not kept for o in gc.get_objects())
    later = _Cycle()
    assert any(o is later for o in gc.get_objects())
    del later
    assert gc.collect() >= 1  # garbage made after start-up is collected as usual


def test_resume_is_idempotent() -> None:
    gc.unfreeze()
    startup_gc.pause()
    first = startup_gc.resume()
    assert startup_gc.resume() >= first and gc.isenabled()
