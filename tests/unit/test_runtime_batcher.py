"""The batcher's adaptation to load, in-process: lone batches on the solo instance, overlapping ones on
the pool, never both at once; and the ONNX Runtime thread plan behind it. The instances are the
batcher's input here; which batch runs where is decided by events the test sets."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest
from trtforge_runtime.backends.ort_session import thread_plan
from trtforge_runtime.lifecycle.workers import split_cpus
from trtforge_runtime.serving.batcher import Batcher, share
from trtforge_runtime.serving.metrics import Metrics

from tests.unit.test_runtime_batcher_events import until


def test_thread_plan() -> None:
    assert thread_plan(2, 2, None) == (1, 2)  # one instance per core, a lone request gets both
    assert thread_plan(16, 16, None) == (1, 16)
    assert thread_plan(16, 4, None) == (4, 16)
    assert thread_plan(2, 1, None) == (2, None)  # one instance already has every core
    assert thread_plan(1, 1, None) == (1, None)
    assert thread_plan(2, 2, 1) == (1, 2)  # TRTFORGE_ORT_THREADS
    assert thread_plan(2, 2, 2) == (2, None)


def test_each_instance_evens_out_the_rows_outstanding() -> None:
    assert share(64, 32, 0, 1) == 32  # one instance: the whole queue, up to the max batch
    assert share(16, 32, 0, 1) == 16
    assert share(64, 32, 0, 2) == 16  # the other instance is free: half each
    assert share(64, 31, 0, 2) == 16
    assert share(8, 32, 0, 2) == 8
    assert share(2, 2, 2, 2) == 2  # the other runs a full batch: the whole short queue
    assert share(64, 3, 1, 2) == 2
    assert share(64, 30, 2, 2) == 16  # it runs a short one: not the whole long queue
    assert share(64, 2, 30, 2) == 2  # never more than is queued
    assert share(64, 3, 0, 4) == 1  # at least one request
    assert share(64, 1, 0, 6) == 1
    assert share(64, 5, 0, 0) == 5  # no pool is no division by zero


class _Held:
    """Doubles its input; each batch logs its rows, then waits for `go` (shared by the instances)."""

    def __init__(self, sizes: list[int], go: threading.Event) -> None:
        self.sizes, self.go, self.started = sizes, go, threading.Event()

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.sizes.append(len(inputs["x"]))
        self.started.set()
        self.go.wait(60)
        return {"y": inputs["x"] * 2}


@pytest.mark.asyncio
async def test_an_instance_that_comes_free_leaves_the_busy_ones_their_share() -> None:
    """Two instances busy with one request each, 30 queued behind them: the first to come free takes
    about half, not all 30 into one long batch that would hold them while later requests are served
    around it."""
    sizes: list[int] = []
    go = threading.Event()
    pool = [_Held(sizes, go), _Held(sizes, go)]
    # The sharing rule alone: no learned cap, so no probe batch takes fewer rows than its share.
    b = Batcher(pool, 32, 0.0, 64, Metrics("m"), lambda e: None, learn_cap=False)
    b.start()
    try:
        x = np.ones((1, 4), np.float32)
        first = [b.enqueue({"x": x}, 1) for _ in range(2)]
        await until(lambda: all(i.started.is_set() for i in pool), "each instance holds one request")
        queued = [b.enqueue({"x": x * i}, 1) for i in range(30)]
        go.set()
        outs = await asyncio.gather(*first, *queued)
        for i, o in enumerate(outs[2:]):
            np.testing.assert_array_equal(o["y"], x * i * 2)
        assert sizes[:2] == [1, 1], sizes
        # 16 when the other was still running its row, 15 when it had just finished it
        assert sum(sizes) == 32 and max(sizes) <= 16, sizes
    finally:
        await b.stop()


@pytest.mark.asyncio
async def test_an_instance_that_comes_free_while_the_other_runs_takes_the_short_queue() -> None:
    """Two instances busy with one request each, two queued: the first to come free takes both (as
    many rows as the other holds plus the queue, halved), not one, which would leave the other
    request waiting for the next free instance behind later arrivals."""
    sizes: list[int] = []
    go_a, go_b = threading.Event(), threading.Event()
    pool = [_Held(sizes, go_a), _Held(sizes, go_b)]
    b = Batcher(pool, 2, 0.0, 64, Metrics("m"), lambda e: None, learn_cap=False)
    b.start()
    try:
        x = np.ones((1, 4), np.float32)
        first = [b.enqueue({"x": x}, 1) for _ in range(2)]
        await until(lambda: all(i.started.is_set() for i in pool), "each instance holds one request")
        queued = [b.enqueue({"x": x * i}, 1) for i in (3, 4)]
        go_a.set()  # the second instance keeps running its request
        await until(lambda: len(sizes) >= 3, "the first instance takes its next batch")
        assert sizes[2] == 2, sizes
        go_b.set()
        outs = await asyncio.gather(*first, *queued)
        np.testing.assert_array_equal(outs[2]["y"], x * 6)
        np.testing.assert_array_equal(outs[3]["y"], x * 8)
    finally:
        await b.stop()


class _Named:
    """Doubles its input; logs (name, rows) of each batch, asserts it runs off the event loop's thread,
    and holds each batch until `go` is set."""

    def __init__(self, name: str, log: list[tuple[str, int]], go: threading.Event | None = None) -> None:
        self.name, self.log = name, log
        self.go = go or threading.Event()
        if go is None:
            self.go.set()
        self.running = threading.Event()

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        assert threading.current_thread() is not threading.main_thread()
        self.log.append((self.name, len(inputs["x"])))
        self.running.set()
        self.go.wait(60)
        return {"y": inputs["x"] * 2}


LONE_REQUESTS = 200  # many: an answer that reached the client before its batch stopped counting as
# executing would send the next lone request to the pool now and then


@pytest.mark.asyncio
async def test_lone_requests_go_solo_once_there_is_a_solo_instance() -> None:
    log: list[tuple[str, int]] = []
    b = Batcher([_Named("pool-0", log), _Named("pool-1", log)], 8, 0.0, 64, Metrics("m"), lambda e: None)
    b.start()
    try:
        x = np.ones((1, 4), np.float32)
        out = await b.submit({"x": x}, 1)  # no solo instance yet: the pool
        np.testing.assert_array_equal(out["y"], x * 2)
        b.add_solo(_Named("solo", log))
        for i in range(LONE_REQUESTS):  # one at a time: each finds the last one's batch finished
            out = await b.submit({"x": x * i}, 1)
            np.testing.assert_array_equal(out["y"], x * i * 2)
    finally:
        await b.stop()
    names = [n for n, _ in log]
    assert names[0] in ("pool-0", "pool-1") and names[1:] == ["solo"] * LONE_REQUESTS, log


@pytest.mark.asyncio
async def test_requests_that_overlap_a_lone_one_wait_for_it_then_go_to_the_pool() -> None:
    """While the solo instance runs a lone request, the pool runs nothing (the cores are the solo's);
    the requests that arrived meanwhile then run on the pool, never on the solo instance."""
    log: list[tuple[str, int]] = []
    solo_go, pool_go = threading.Event(), threading.Event()
    pool = [_Named("pool-0", log, pool_go), _Named("pool-1", log, pool_go)]
    solo = _Named("solo", log, solo_go)
    b = Batcher(pool, 8, 0.0, 64, Metrics("m"), lambda e: None)
    b.add_solo(solo)
    b.start()
    try:
        x = np.ones((1, 4), np.float32)
        lone = b.enqueue({"x": x}, 1)
        await until(solo.running.is_set, "the lone request runs on the solo instance")
        overlapping = [b.enqueue({"x": x * i}, 1) for i in range(3)]
        await asyncio.sleep(0.05)  # room for a wrong pool thread to start one (it must not)
        assert log == [("solo", 1)], log
        solo_go.set()
        await until(lambda: len(log) == 3, "the three overlapping requests taken by the pool")
        pool_go.set()
        outs = await asyncio.gather(lone, *overlapping)
        for i, o in enumerate(outs[1:]):
            np.testing.assert_array_equal(o["y"], x * i * 2)
    finally:
        await b.stop()
    assert log[0] == ("solo", 1) and sorted(rows for _, rows in log[1:]) == [1, 2], log
    assert {n for n, _ in log[1:]} == {"pool-0", "pool-1"}, log


def test_workers_get_contiguous_even_shares_of_the_cpus() -> None:
    assert split_cpus([0, 1], 2) == [[0], [1]]
    assert split_cpus(range(14), 4) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10], [11, 12, 13]]
    assert split_cpus([5, 3, 4], 1) == [[3, 4, 5]]
    with pytest.raises(ValueError, match="3 workers need at least 3 CPUs; this process may use 2"):
        split_cpus([0, 1], 3)
