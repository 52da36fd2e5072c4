"""Dynamic batching: requests queue up, each execution instance takes as many as fit one batch.

Semantics follow Triton's dynamic batcher: an instance that becomes free takes the oldest request and
queued requests with the same non-batch shapes, up to its even share of the queue among the pool's
instances (at most the max batch size); when that took everything queued and the batch is not full,
it waits up to ``max_queue_delay`` (counted from the oldest request's arrival) for more, up to the
max batch size. With a zero delay, batches still form whenever requests arrive while the instances
are busy. The queue is bounded: a request that finds it full is refused at once (503 with
Retry-After), never parked.

Each instance has its own worker thread; the event loop only moves requests and futures.

Adapting to load (docs/design.md, "Adapting to load"): with a *solo* instance added (a session with
every core's threads), a lone request (a batch of one that finds nothing else executing and nothing
else queued) runs on it, so it gets all the cores; while it runs, the pool's instances wait, so cores
are never oversubscribed; as soon as requests overlap, batches go to the pool (one instance per
core), each taking its share of the queue, never the whole queue while the others are busy.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from trtforge_runtime.backends import Instance
from trtforge_runtime.errors import DeviceFault, RequestError
from trtforge_runtime.metrics import Metrics

log = logging.getLogger(__name__)


class QueueFull(RequestError):
    def __init__(self, depth: int) -> None:
        super().__init__(
            503, f"the request queue is full ({depth} requests waiting); retry later", {"Retry-After": "1"}
        )


@dataclass
class _Item:
    inputs: dict[str, np.ndarray]
    rows: int
    signature: tuple[object, ...]
    future: asyncio.Future[dict[str, np.ndarray]]
    enqueued: float = field(default_factory=time.monotonic)


def _signature(inputs: dict[str, np.ndarray], batchable: bool) -> tuple[object, ...]:
    """What requests must share to be batched together: each input's non-batch shape and dtype."""
    if not batchable:
        return ()
    if len(inputs) == 1:
        for k, v in inputs.items():
            return (k, v.shape[1:], v.dtype)
    return tuple(sorted(((k, v.shape[1:], v.dtype) for k, v in inputs.items()), key=lambda e: e[0]))


def share(max_batch: int, queued_rows: int, instances: int) -> int:
    """Rows one worker takes: an even share of what is queued among all `instances` of the pool, busy
    ones included (at least one request, at most the max batch). The first instance to come free
    never takes the whole queue into one long batch while the others are about to come free: that
    batch's requests would all wait for its slowest row while later arrivals were served around it
    (docs/design.md, "Adapting to load")."""
    return max(1, min(max_batch, -(-queued_rows // max(1, instances))))


def _execute(instance: Instance, feeds: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Run one batch in the instance's thread: the requests' tensors are joined there, not on the
    event loop (numpy copies without the GIL)."""
    if len(feeds) == 1:
        return instance.run(feeds[0])
    return instance.run({k: np.concatenate([f[k] for f in feeds]) for k in feeds[0]})


class Batcher:
    def __init__(
        self,
        instances: list[Instance],
        max_batch: int,
        max_queue_delay_s: float,
        max_queue: int,
        metrics: Metrics,
        on_device_fault: Callable[[DeviceFault], None],
    ) -> None:
        self._instances = instances
        self.max_batch = max_batch  # 0: not batchable, one request per execution
        self.max_queue_delay_s = max_queue_delay_s
        self.max_queue = max_queue
        self._metrics = metrics
        self._on_device_fault = on_device_fault
        self._queue: collections.deque[_Item] = collections.deque()
        self._arrived = asyncio.Event()
        self._executors = [
            ThreadPoolExecutor(1, thread_name_prefix=f"instance-{i}") for i in range(len(instances))
        ]
        self._tasks: list[asyncio.Task[None]] = []
        self.in_flight = 0  # requests accepted and not yet answered
        self._solo: Instance | None = None
        self._solo_executor: ThreadPoolExecutor | None = None
        self._solo_idle = asyncio.Event()
        self._solo_idle.set()
        self._executing = 0  # batches running on any instance

    def add_solo(self, instance: Instance) -> None:
        """Run lone batches on `instance` from now on (see the module docstring)."""
        self._solo_executor = ThreadPoolExecutor(1, thread_name_prefix="instance-solo")
        self._solo = instance

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._worker(i)) for i in range(len(self._instances))]

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for ex in self._executors:
            ex.shutdown(wait=False, cancel_futures=True)
        if self._solo_executor is not None:
            self._solo_executor.shutdown(wait=False, cancel_futures=True)

    @property
    def depth(self) -> int:
        return len(self._queue)

    async def submit(self, inputs: dict[str, np.ndarray], rows: int) -> dict[str, np.ndarray]:
        return await self.enqueue(inputs, rows)

    def enqueue(self, inputs: dict[str, np.ndarray], rows: int) -> asyncio.Future[dict[str, np.ndarray]]:
        """Queue a request; its future has the outputs (cancel it to withdraw the request). QueueFull
        at once when the queue is full. No task is needed to wait for it (the HTTP fast path adds a
        callback)."""
        if len(self._queue) >= self.max_queue:
            raise QueueFull(len(self._queue))
        fut: asyncio.Future[dict[str, np.ndarray]] = asyncio.get_running_loop().create_future()
        self._queue.append(_Item(inputs, rows, _signature(inputs, self.max_batch > 0), fut))
        self._arrived.set()  # the queue-depth gauge is set per batch taken and on each scrape
        self.in_flight += 1
        fut.add_done_callback(self._left)
        return fut

    def _left(self, fut: asyncio.Future[dict[str, np.ndarray]]) -> None:
        self.in_flight -= 1

    def _take(self, batch: list[_Item], rows: int, limit: int) -> int:
        """Move queued items compatible with batch[0] into `batch` up to `limit` rows, oldest first;
        the new row count."""
        sig = batch[0].signature
        keep: list[_Item] = []
        while self._queue and rows < limit:
            it = self._queue.popleft()
            if it.future.done():  # the client went away
                continue
            if it.signature == sig and rows + it.rows <= limit:
                batch.append(it)
                rows += it.rows
            else:
                keep.append(it)
                if rows + it.rows > limit and it.signature == sig:
                    break
        self._queue.extendleft(reversed(keep))
        return rows

    async def _next_batch(self) -> list[_Item]:
        while True:
            while not self._queue:
                self._arrived.clear()
                await self._arrived.wait()
            first = self._queue.popleft()
            if not first.future.done():
                break
        batch = [first]
        if self.max_batch == 0:
            return batch
        limit = share(self.max_batch, first.rows + sum(it.rows for it in self._queue), len(self._instances))
        rows = self._take(batch, first.rows, limit)
        if self.max_queue_delay_s > 0 and not self._queue:
            # It took everything queued: it waits, up to the delay, for company up to the max batch.
            # (With requests still queued, batches are formed from the backlog and nothing waits.)
            limit = self.max_batch
            deadline = first.enqueued + self.max_queue_delay_s
            while rows < limit:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._arrived.clear()
                try:
                    await asyncio.wait_for(self._arrived.wait(), left)
                except TimeoutError:
                    break
                rows = self._take(batch, rows, limit)
        return batch

    async def _worker(self, index: int) -> None:
        loop = asyncio.get_running_loop()
        instance = self._instances[index]
        executor = self._executors[index]
        m = self._metrics
        while True:
            batch = await self._next_batch()
            m.queue_depth_m.set(len(self._queue))
            if self._queue:
                self._arrived.set()  # other free instances may take what this batch left
            now = time.monotonic()
            for it in batch:
                m.queue_time_m.observe(now - it.enqueued)
            feeds = [it.inputs for it in batch]
            rows = sum(it.rows for it in batch)
            m.batch_size_m.observe(rows)
            while not self._solo_idle.is_set():  # a lone batch has every core: wait for it
                await self._solo_idle.wait()
            lone = len(batch) == 1 and self._executing == 0 and not self._queue
            solo = self._solo if lone else None
            self._executing += 1
            if solo is not None:
                self._solo_idle.clear()
            try:
                t0 = time.monotonic()
                if solo is not None:
                    out = await loop.run_in_executor(self._solo_executor, _execute, solo, feeds)
                    m.solo_batches_m.inc()
                else:
                    out = await loop.run_in_executor(executor, _execute, instance, feeds)
                m.compute_time_m.observe(time.monotonic() - t0)
            except DeviceFault as e:
                m.execution_errors.labels(m.model).inc()
                for it in batch:
                    if not it.future.done():
                        it.future.set_exception(RequestError(500, f"device fault during execution: {e}"))
                self._on_device_fault(e)
                continue
            except Exception as e:
                m.execution_errors.labels(m.model).inc()
                log.exception("execution failed")
                for it in batch:
                    if not it.future.done():
                        it.future.set_exception(RequestError(500, f"execution failed: {e}"))
                continue
            finally:
                self._executing -= 1
                if solo is not None:
                    self._solo_idle.set()
            if len(batch) == 1:
                if not batch[0].future.done():
                    batch[0].future.set_result(out)
                continue
            start = 0
            for it in batch:
                end = start + it.rows
                if not it.future.done():
                    it.future.set_result({k: v[start:end] for k, v in out.items()})
                start = end
