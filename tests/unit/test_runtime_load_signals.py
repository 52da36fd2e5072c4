"""The runtime's load signals an autoscaler follows, under their documented names: requests in flight
(set as batches are taken, zero once drained) and queue depth, read back from /metrics' exposition."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families
from trtforge_runtime.serving.batcher import Batcher
from trtforge_runtime.serving.metrics import Metrics, exposition

from tests.unit.test_runtime_batcher import _Held
from tests.unit.test_runtime_batcher_events import until


def _gauges(m: Metrics) -> dict[str, float]:
    out = {}
    for fam in text_string_to_metric_families(exposition(m).decode()):
        for s in fam.samples:
            if s.labels.get("model") == "m":
                out[s.name] = s.value
    return out


@pytest.mark.asyncio
async def test_requests_in_flight_and_queue_depth_are_exported() -> None:
    sizes: list[int] = []
    go = threading.Event()
    inst = _Held(sizes, go)
    m = Metrics("m")
    b = Batcher([inst], 1, 0.0, 64, m, lambda e: None, learn_cap=False)
    b.start()
    try:
        x = np.ones((1, 4), np.float32)
        first = b.enqueue({"x": x}, 1)
        await until(inst.started.is_set, "the instance holds the first request")
        g = _gauges(m)
        assert g["trtforge_runtime_requests_in_flight"] == 1 and g["trtforge_runtime_queue_depth"] == 0
        rest = [b.enqueue({"x": x}, 1) for _ in range(3)]
        inst.started.clear()
        go.set()
        await asyncio.gather(first, *rest)
        g = _gauges(m)
        assert len(sizes) == 4
        assert g["trtforge_runtime_requests_in_flight"] == 0, "drained: nothing in flight"
        assert g["trtforge_runtime_queue_depth"] == 0
    finally:
        await b.stop()
