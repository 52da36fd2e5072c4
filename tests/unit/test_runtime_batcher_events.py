"""The dynamic batcher, driven on pytest-asyncio's event loop.

The execution instance is the batcher's input here: it doubles its input and holds each batch until the
test lets it go, so which requests share a batch is decided by events, never by timing. Real ONNX
Runtime sessions behind the batcher are exercised by tests/integration/test_serve.py.
"""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest
from trtforge_runtime.errors import DeviceFault, RequestError
from trtforge_runtime.serving.batcher import Batcher, QueueFull
from trtforge_runtime.serving.metrics import Metrics

pytestmark = pytest.mark.asyncio


class GatedInstance:
    """Doubles `x`; each batch waits for `release` (set by the test). Records the rows of each batch."""

    def __init__(self, fault: bool = False) -> None:
        self.release = threading.Event()
        self.started = threading.Event()
        self.batches: list[int] = []
        self.fault = fault

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.batches.append(int(inputs["x"].shape[0]))
        self.started.set()
        self.release.wait(60)
        if self.fault:
            raise DeviceFault("Xid 79 during execution")
        return {"y": inputs["x"] * 2}


def rows(value: float, n: int = 1) -> dict[str, np.ndarray]:
    return {"x": np.full((n, 4), value, np.float32)}


def rules_only(inst: GatedInstance, max_batch: int, max_queue_delay_s: float) -> Batcher:
    """A batcher over `inst` that applies the batching rules alone: the cap is not learned, so no
    probe batch takes fewer rows than the rules give."""
    return Batcher(
        [inst],
        max_batch=max_batch,
        max_queue_delay_s=max_queue_delay_s,
        max_queue=16,
        metrics=Metrics("m"),
        on_device_fault=print,
        learn_cap=False,
    )


async def until(predicate: object, what: str) -> None:
    """Yield to the loop until `predicate()` holds (bounded so a broken batcher fails, not hangs)."""
    for _ in range(10_000):
        if predicate():  # type: ignore[operator]
            return
        await asyncio.sleep(0.001)
    raise AssertionError(f"never: {what}")


async def test_requests_queued_behind_a_busy_instance_share_one_batch_and_get_their_own_rows() -> None:
    inst = GatedInstance()
    b = rules_only(inst, max_batch=8, max_queue_delay_s=0)
    b.start()
    try:
        first = asyncio.create_task(b.submit(rows(1.0), 1))
        await until(inst.started.is_set, "the first batch started")
        later = [asyncio.create_task(b.submit(rows(float(v), 2), 2)) for v in (2, 3, 4)]
        await until(lambda: b.depth == 3, "three requests queued behind the busy instance")
        inst.release.set()
        out = await asyncio.gather(first, *later)
    finally:
        await b.stop()
    assert inst.batches == [1, 6]
    for got, v, n in zip(out, (1, 2, 3, 4), (1, 2, 2, 2), strict=True):
        np.testing.assert_array_equal(got["y"], np.full((n, 4), 2.0 * v, np.float32))


async def test_a_partial_batch_waits_for_company_within_the_queue_delay() -> None:
    inst = GatedInstance()
    inst.release.set()
    b = rules_only(inst, max_batch=2, max_queue_delay_s=3600)
    b.start()
    try:
        alone = asyncio.create_task(b.submit(rows(1.0), 1))
        await until(lambda: b.in_flight == 1, "the first request accepted")
        for _ in range(20):
            await asyncio.sleep(0)
        assert not alone.done() and inst.batches == [], "a partial batch ran before its delay was up"
        await b.submit(rows(2.0), 1)  # fills the batch: both run together at once
        await alone
    finally:
        await b.stop()
    assert inst.batches == [2]


async def test_a_lone_request_with_another_instance_free_runs_without_waiting_the_delay() -> None:
    a, b_inst = GatedInstance(), GatedInstance()
    a.release.set()
    b_inst.release.set()
    b = Batcher(
        [a, b_inst],
        max_batch=8,
        max_queue_delay_s=3600,
        max_queue=16,
        metrics=Metrics("m"),
        on_device_fault=print,
    )
    b.start()
    try:
        for _ in range(20):  # both workers wait for requests
            await asyncio.sleep(0)
        alone = asyncio.create_task(b.submit(rows(1.0), 1))
        await until(lambda: a.started.is_set() or b_inst.started.is_set(), "the lone request ran")
        await alone
    finally:
        await b.stop()
    assert a.batches + b_inst.batches == [1]


async def test_a_full_queue_refuses_at_once_with_503() -> None:
    inst = GatedInstance()
    b = Batcher(
        [inst], max_batch=0, max_queue_delay_s=0, max_queue=1, metrics=Metrics("m"), on_device_fault=print
    )
    b.start()
    try:
        running = asyncio.create_task(b.submit(rows(1.0), 1))
        await until(inst.started.is_set, "the first request running")
        queued = asyncio.create_task(b.submit(rows(2.0), 1))
        await until(lambda: b.depth == 1, "one request queued")
        with pytest.raises(QueueFull) as refused:
            await b.submit(rows(3.0), 1)
        assert refused.value.status == 503 and refused.value.headers == {"Retry-After": "1"}
        inst.release.set()
        await asyncio.gather(running, queued)
    finally:
        await b.stop()
    assert inst.batches == [1, 1], "max_batch=0: one request per execution"


async def test_a_device_fault_fails_the_batch_with_500_and_reports_the_fault() -> None:
    inst = GatedInstance(fault=True)
    inst.release.set()
    faults: list[DeviceFault] = []
    b = Batcher(
        [inst],
        max_batch=4,
        max_queue_delay_s=0,
        max_queue=4,
        metrics=Metrics("m"),
        on_device_fault=faults.append,
    )
    b.start()
    try:
        with pytest.raises(RequestError) as failed:
            await b.submit(rows(1.0), 1)
    finally:
        await b.stop()
    assert failed.value.status == 500 and "device fault" in failed.value.message
    assert [str(f) for f in faults] == ["Xid 79 during execution"]


async def test_stopping_refuses_what_is_still_queued_with_503() -> None:
    inst = GatedInstance()
    b = Batcher(
        [inst], max_batch=0, max_queue_delay_s=0, max_queue=4, metrics=Metrics("m"), on_device_fault=print
    )
    b.start()
    running = asyncio.create_task(b.submit(rows(1.0), 1))
    await until(inst.started.is_set, "the first request running")
    queued = asyncio.create_task(b.submit(rows(2.0), 1))
    await until(lambda: b.depth == 1, "one request queued")
    await b.stop()
    with pytest.raises(RequestError) as refused:
        await queued
    assert refused.value.status == 503 and "shutting down" in refused.value.message
    with pytest.raises(RequestError):
        await b.submit(rows(3.0), 1)  # nothing is queued once stopped
    inst.release.set()
    np.testing.assert_array_equal((await running)["y"], rows(2.0)["x"])  # the running batch ends


@pytest.mark.parametrize(("learn", "sizes"), [(True, [1, 16, 2, 6]), (False, [1, 16, 8])])
async def test_a_probe_batch_takes_fewer_rows_than_its_share_and_leaves_the_rest_queued(
    learn: bool, sizes: list[int]
) -> None:
    """With the cap at 16 (as if learned), 24 requests queued behind a busy instance: the first batch
    takes its share (16); the next, about to take 8 (bucket 8, nothing below it timed yet), probes
    bucket 2 (trtforge_runtime.serving.batchcap's every other batch), and the 6 it left go in the batch
    after. With the cap not learned, nothing probes."""
    inst = GatedInstance()
    b = Batcher([inst], 16, 0.0, 64, Metrics("m"), print, learn_cap=learn)
    b.cap.limit = 16  # the learned cap starts at 2: here it has climbed to the max batch
    b.start()
    try:
        first = asyncio.create_task(b.submit(rows(1.0), 1))
        await until(inst.started.is_set, "the first batch started")
        later = [asyncio.create_task(b.submit(rows(float(v)), 1)) for v in range(24)]
        await until(lambda: b.depth == 24, "24 requests queued behind the busy instance")
        inst.release.set()
        out = await asyncio.gather(first, *later)
    finally:
        await b.stop()
    assert inst.batches == sizes
    for got, v in zip(out[1:], range(24), strict=True):
        np.testing.assert_array_equal(got["y"], np.full((1, 4), 2.0 * v, np.float32))
