"""The batcher's adaptation to load, in-process: lone batches on the solo instance, overlapping ones on
the pool, never both at once; and the ONNX Runtime thread plan behind it."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest
from trtforge_runtime.backends.onnxruntime_backend import thread_plan
from trtforge_runtime.batcher import Batcher, share
from trtforge_runtime.metrics import Metrics
from trtforge_runtime.workers import split_cpus


def test_thread_plan() -> None:
    assert thread_plan(2, 2, None) == (1, 2)  # one instance per core, a lone request gets both
    assert thread_plan(16, 16, None) == (1, 16)
    assert thread_plan(16, 4, None) == (4, 16)
    assert thread_plan(2, 1, None) == (2, None)  # one instance already has every core
    assert thread_plan(1, 1, None) == (1, None)
    assert thread_plan(2, 2, 1) == (1, 2)  # TRTFORGE_ORT_THREADS
    assert thread_plan(2, 2, 2) == (2, None)


def test_each_instance_takes_an_even_share_of_the_queue() -> None:
    assert share(64, 32, 1) == 32  # one instance: the whole queue, up to the max batch
    assert share(16, 32, 1) == 16
    assert share(64, 32, 2) == 16  # two instances, busy or free: half each
    assert share(64, 31, 2) == 16
    assert share(8, 32, 2) == 8
    assert share(64, 3, 4) == 1  # at least one request
    assert share(64, 1, 6) == 1
    assert share(64, 5, 0) == 5  # no pool is no division by zero


class _PerRow:
    """An instance whose batch takes time in proportion to its rows, logging each batch's size."""

    def __init__(self, sizes: list[int]) -> None:
        self.sizes = sizes

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.sizes.append(len(inputs["x"]))
        time.sleep(0.005 * len(inputs["x"]))
        return {"y": inputs["x"] * 2}


@pytest.mark.asyncio
async def test_an_instance_that_comes_free_leaves_the_busy_ones_their_share() -> None:
    """Two instances busy, 30 requests queued behind them: the first to come free takes half, not all
    30 into one long batch that would hold them while later requests are served around it."""
    sizes: list[int] = []
    b = Batcher([_PerRow(sizes), _PerRow(sizes)], 32, 0.0, 64, Metrics("m"), lambda e: None)
    b.start()
    try:
        x = np.ones((1, 4), np.float32)
        first = [b.enqueue({"x": x}, 1) for _ in range(2)]
        await asyncio.sleep(0)  # both instances take one request each
        await asyncio.sleep(0)
        queued = [b.enqueue({"x": x * i}, 1) for i in range(30)]
        outs = await asyncio.gather(*first, *queued)
        for i, o in enumerate(outs[2:]):
            np.testing.assert_array_equal(o["y"], x * i * 2)
        assert sizes[:2] == [1, 1], sizes
        assert sum(sizes) == 32 and max(sizes) == 15, sizes
    finally:
        await b.stop()


class _Timed:
    """An instance that doubles its input and records when it ran, in which thread."""

    def __init__(self, name: str, log: list[tuple[str, float, float]]) -> None:
        self.name, self.log = name, log

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        t0 = time.monotonic()
        time.sleep(0.02)
        self.log.append((self.name, t0, time.monotonic()))
        assert threading.current_thread() is not threading.main_thread()
        return {"y": inputs["x"] * 2}


@pytest.mark.asyncio
async def test_lone_batches_go_solo_and_overlapping_ones_to_the_pool_never_both() -> None:
    log: list[tuple[str, float, float]] = []
    b = Batcher([_Timed("pool-0", log), _Timed("pool-1", log)], 8, 0.0, 64, Metrics("m"), lambda e: None)
    b.start()
    try:
        x = np.ones((1, 4), np.float32)
        out = await b.submit({"x": x}, 1)  # no solo instance yet: the pool
        np.testing.assert_array_equal(out["y"], x * 2)
        b.add_solo(_Timed("solo", log))
        for _ in range(3):  # one at a time
            await b.submit({"x": x}, 1)
        assert [n for n, _, _ in log] == ["pool-0", "solo", "solo", "solo"]
        log.clear()
        outs = await asyncio.gather(*(b.submit({"x": x * i}, 1) for i in range(24)))
        for i, o in enumerate(outs):
            np.testing.assert_array_equal(o["y"], x * i * 2)
        names = [n for n, _, _ in log]
        assert {"pool-0", "pool-1"} <= set(names) and "solo" not in names, names  # overlapping: the pool
        solo_runs = [(t0, t1) for n, t0, t1 in log if n == "solo"]
        pool_runs = [(t0, t1) for n, t0, t1 in log if n != "solo"]
        for s0, s1 in solo_runs:
            assert all(p1 <= s0 or p0 >= s1 for p0, p1 in pool_runs), "solo overlapped the pool"
    finally:
        await b.stop()


def test_workers_get_contiguous_even_shares_of_the_cpus() -> None:
    assert split_cpus([0, 1], 2) == [[0], [1]]
    assert split_cpus(range(14), 4) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10], [11, 12, 13]]
    assert split_cpus([5, 3, 4], 1) == [[3, 4, 5]]
    with pytest.raises(ValueError, match="3 workers need at least 3 CPUs; this process may use 2"):
        split_cpus([0, 1], 3)
