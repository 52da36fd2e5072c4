"""Dynamic batching: requests queue up, each execution instance takes as many as fit one batch.

Semantics follow Triton's dynamic batcher: an instance that becomes free takes the oldest request and
queued requests with the same non-batch shapes, up to its share (:func:`share`: what evens out the
rows queued and held by the pool's other instances; at most the batch cap); when that took
everything queued, no other instance is free and the batch is not full, it waits up to
``max_queue_delay`` (counted from the oldest request's arrival) for more, up to the batch cap. The
cap is learned: it starts at 2 and climbs, up to the max batch size, while the pool's own timings
say bigger batches compute each row faster; it is lower still for the few batches that probe
smaller sizes (:mod:`trtforge_runtime.serving.batchcap`); with the learning off, it is the max batch size.
With a zero delay, batches still form whenever requests arrive while the instances are busy. The
queue is bounded: a request that finds it full is refused at once (503 with Retry-After), never
parked.

Each instance has its own thread, which takes its batches from the queue itself and runs them back
to back: an instance that finishes a batch starts the next one without waiting for the event loop.
The loop only queues requests (:meth:`Batcher.enqueue`) and resolves their futures, one call per
batch (docs/design.md, "Adapting to load").

Adapting to load (the same section): with a *solo* instance added (a session with every core's
threads), a lone request (a batch of one that finds nothing else executing and nothing else queued)
runs on it, on the solo instance's own thread, so it gets all the cores; while it runs, the pool's
instances wait, so cores are never oversubscribed; as soon as requests overlap, batches go to the
pool (one instance per core), each taking its share of the queue, never a long queue into one batch
while the others run short ones.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from trtforge.logs import fields
from trtforge_runtime.backends import Instance
from trtforge_runtime.errors import DeviceFault, RequestError
from trtforge_runtime.serving.batchcap import BatchCap
from trtforge_runtime.serving.metrics import Metrics

log = logging.getLogger(__name__)

Outputs = dict[str, np.ndarray]
CAP_LOG_INTERVAL_S = 60.0  # at most one `batch cap` log line a minute; the gauge shows every change


class QueueFull(RequestError):
    busy = True

    def __init__(self, depth: int) -> None:
        super().__init__(
            503, f"the request queue is full ({depth} requests waiting); retry later", {"Retry-After": "1"}
        )


class ShuttingDown(RequestError):
    def __init__(self) -> None:
        super().__init__(503, "the runtime is shutting down; retry on another replica", {"Retry-After": "1"})


@dataclass
class _Item:
    inputs: dict[str, np.ndarray]
    rows: int
    signature: tuple[object, ...]
    future: asyncio.Future[Outputs]
    enqueued: float = field(default_factory=time.monotonic)


@dataclass(frozen=True)
class _Outcome:
    """A computed batch: each request's outputs and the seconds it computed, or the error for all."""

    parts: list[Outputs] | None = None
    seconds: float | None = None
    error: RequestError | None = None
    fault: DeviceFault | None = None


def _signature(inputs: dict[str, np.ndarray], batchable: bool) -> tuple[object, ...]:
    """What requests must share to be batched together: each input's non-batch shape and dtype."""
    if not batchable:
        return ()
    if len(inputs) == 1:
        for k, v in inputs.items():
            return (k, v.shape[1:], v.dtype)
    return tuple(sorted(((k, v.shape[1:], v.dtype) for k, v in inputs.items()), key=lambda e: e[0]))


def share(max_batch: int, queued_rows: int, running_rows: int, instances: int) -> int:
    """Rows one instance takes: enough to even out the pool's outstanding rows, those queued plus those
    running on the other instances, among all `instances` (at least one request, at most the max
    batch and what is queued). While the others run full batches, it takes the whole queue up to the
    cap, as Triton's batcher does; it never takes a long queue into one batch while the others run
    short ones, which would hold that batch's requests while later arrivals were served around them
    (docs/design.md, "Adapting to load")."""
    outstanding = queued_rows + running_rows
    return max(1, min(max_batch, queued_rows, -(-outstanding // max(1, instances))))


def _execute(instance: Instance, feeds: list[dict[str, np.ndarray]]) -> Outputs:
    """Run one batch in the instance's thread: the requests' tensors are joined there, not on the
    event loop (numpy copies without the GIL)."""
    if len(feeds) == 1:
        return instance.run(feeds[0])
    return instance.run({k: np.concatenate([f[k] for f in feeds]) for k in feeds[0]})


def _split(batch: list[_Item], out: Outputs) -> list[Outputs]:
    """Each request's rows of a batch's outputs (views, no copy)."""
    if len(batch) == 1:
        return [out]
    parts, start = [], 0
    for it in batch:
        end = start + it.rows
        parts.append({k: v[start:end] for k, v in out.items()})
        start = end
    return parts


class Batcher:
    """The queue and the instances' threads. :meth:`enqueue` is called on the event loop; the
    threads take batches under the same lock (``_lock``)."""

    def __init__(
        self,
        instances: list[Instance],
        max_batch: int,
        max_queue_delay_s: float,
        max_queue: int,
        metrics: Metrics,
        on_device_fault: Callable[[DeviceFault], None],
        learn_cap: bool = True,
    ) -> None:
        self._instances = instances
        self.max_batch = max_batch  # 0: not batchable, one request per execution
        self.cap = BatchCap(max_batch, learn_cap)  # the pool's batches' limit, at most max_batch
        metrics.batch_cap_m.set(self.cap.limit)
        self._cap_logged = -CAP_LOG_INTERVAL_S  # when the cap's last change was logged
        self._cap_changes = 0  # changes since
        self.max_queue_delay_s = max_queue_delay_s
        self.max_queue = max_queue
        self._metrics = metrics
        self._on_device_fault = on_device_fault
        # One lock, three conditions, so a notification wakes only threads that can use it:
        # `_work` the pool threads waiting for requests (or for company for a partial batch),
        # `_solo_work` the solo thread, `_solo_done` pool threads holding a batch while a lone one runs.
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)
        self._solo_work = threading.Condition(self._lock)
        self._solo_done = threading.Condition(self._lock)
        self._queue: collections.deque[_Item] = collections.deque()
        self._stopping = False
        self._executing = 0  # batches running on any instance
        # Each pool instance's rows: its running batch's, kept while it hands the answers over and
        # takes the next (it is about to run again), zero once it waits for requests.
        self._held = [0] * len(instances)
        self._idle = 0  # pool threads waiting for requests
        self._solo: Instance | None = None
        self._solo_batch: list[_Item] | None = None  # handed to the solo thread, not yet taken
        self._solo_busy = False  # a lone batch is handed over or running: the pool waits
        self._loop: asyncio.AbstractEventLoop | None = None
        self.in_flight = 0  # requests accepted and not yet answered (the event loop's count)

    def add_solo(self, instance: Instance) -> None:
        """Run lone batches on `instance`, on a thread of its own, from now on (module docstring)."""
        with self._lock:
            self._solo = instance
        threading.Thread(target=self._solo_thread, name="instance-solo", daemon=True).start()

    def start(self) -> None:
        """Start one thread per instance; call on the event loop that will enqueue."""
        self._loop = asyncio.get_running_loop()
        for i in range(len(self._instances)):
            threading.Thread(target=self._pool_thread, args=(i,), name=f"instance-{i}", daemon=True).start()

    async def stop(self) -> None:
        """Stop taking batches; requests still queued are refused (503). A batch that is running
        finishes on its (daemon) thread, and its answers are dropped if the loop has gone."""
        with self._lock:
            self._stopping = True
            left = list(self._queue) + (self._solo_batch or [])
            self._queue.clear()
            self._solo_batch = None
            for cv in (self._work, self._solo_work, self._solo_done):
                cv.notify_all()
        for it in left:
            if not it.future.done():
                it.future.set_exception(ShuttingDown())

    @property
    def depth(self) -> int:
        return len(self._queue)

    async def submit(self, inputs: dict[str, np.ndarray], rows: int) -> Outputs:
        return await self.enqueue(inputs, rows)

    def enqueue(self, inputs: dict[str, np.ndarray], rows: int) -> asyncio.Future[Outputs]:
        """Queue a request; its future has the outputs (cancel it to withdraw the request). QueueFull
        at once when the queue is full."""
        fut: asyncio.Future[Outputs] = asyncio.get_running_loop().create_future()
        item = _Item(inputs, rows, _signature(inputs, self.max_batch > 0), fut)
        with self._lock:
            if self._stopping:
                raise ShuttingDown()
            if len(self._queue) >= self.max_queue:
                raise QueueFull(len(self._queue))
            self._queue.append(item)
            self._work.notify()  # an idle pool thread takes it, or a partial batch waiting for company
        self.in_flight += 1
        fut.add_done_callback(self._left)
        return fut

    def _left(self, fut: asyncio.Future[Outputs]) -> None:
        self.in_flight -= 1
        if not self.in_flight:
            self._metrics.in_flight_m.set(0)  # idle: batches (which set it) stop coming

    # -- the instances' threads (everything below runs there, `_lock` held where it says) --------
    def _lone(self, batch: list[_Item]) -> bool:
        """Whether `batch` is lone (one request, nothing else executing or queued) and there is a solo
        instance to run it. `_lock` held."""
        return len(batch) == 1 and self._solo is not None and self._executing == 0 and not self._queue

    def _to_solo(self, batch: list[_Item]) -> None:
        """Hand `batch` to the solo thread; the pool waits until it is done. `_lock` held."""
        self._solo_batch, self._solo_busy = batch, True
        self._solo_work.notify()

    def _take(self, batch: list[_Item], rows: int, limit: int) -> int:
        """Move queued items compatible with batch[0] into `batch` up to `limit` rows, oldest first;
        the new row count. `_lock` held."""
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

    def _next_batch(self, index: int) -> list[_Item] | None:
        """The next batch for pool instance `index`, the rules of the module docstring; None when
        stopping. `_lock` held."""
        while True:
            while not self._queue and not self._stopping:
                self._held[index] = 0
                self._idle += 1
                try:
                    self._work.wait()
                finally:
                    self._idle -= 1
            if self._stopping:
                return None
            first = self._queue.popleft()
            if not first.future.done():
                break
        batch = [first]
        if self.max_batch == 0:
            return batch
        queued = first.rows + sum(it.rows for it in self._queue)
        others = sum(self._held) - self._held[index]
        limit = share(self.cap.limit, queued, others, len(self._instances))
        probe = self.cap.probe(limit)  # fewer rows when this batch probes a smaller size
        wait_cap = probe if probe < limit else self.cap.limit  # what waiting for company may fill
        rows = self._take(batch, first.rows, probe)
        if self.max_queue_delay_s > 0 and not self._queue and self._idle == 0:
            # It took everything queued and no other instance is free: it waits, up to the delay, for
            # company up to the cap. (With requests still queued, batches are formed from the
            # backlog; with another instance free, it runs now: nothing gains from waiting.)
            deadline = first.enqueued + self.max_queue_delay_s
            while rows < wait_cap and not self._stopping:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._work.wait(left)
                rows = self._take(batch, rows, wait_cap)
        return batch

    def _observe_taken(self, batch: list[_Item]) -> None:
        """Record a batch as taken (queue depth, each request's wait, its size)."""
        m = self._metrics
        m.queue_depth_m.set(len(self._queue))
        m.in_flight_m.set(self.in_flight)  # read off the event loop's count: an int, read whole
        now = time.monotonic()
        for it in batch:
            m.queue_time_m.observe(now - it.enqueued)
        m.batch_size_m.observe(sum(it.rows for it in batch))

    def _pool_thread(self, index: int) -> None:
        instance = self._instances[index]
        while True:
            with self._lock:
                batch = self._next_batch(index)
                overlapped = False  # a batch that waited for a lone one is not lone itself
                while batch is not None and self._solo_busy and not self._stopping:
                    overlapped = True
                    self._solo_done.wait()  # a lone batch has every core: wait for it
                if batch is None:
                    return
                if self._stopping:  # it was held for a lone batch or for company: refuse it
                    self._to_loop(self._fail, batch, ShuttingDown(), None)
                    return
                if self._queue:
                    self._work.notify()  # another free instance may take what this batch left
                if not overlapped and self._lone(batch):
                    self._to_solo(batch)
                    continue
                self._executing += 1
                rows = self._held[index] = sum(it.rows for it in batch)
            self._observe_taken(batch)
            outcome: _Outcome | None = None
            try:
                outcome = self._compute(instance, batch)
            finally:
                with self._lock:  # settled before any client can see its answer and send the next
                    self._executing -= 1
                    seconds = outcome.seconds if outcome is not None else None
                    changed = seconds is not None and self.cap.observe(rows, seconds)
                    report = self._cap_report() if changed else None
            assert outcome is not None  # _compute returns; what it cannot catch ends the thread above
            self._deliver(batch, outcome)
            if report is not None:
                log.info("batch cap", extra=fields(**report))

    def _cap_report(self) -> dict[str, object] | None:
        """After a change of the learned cap: set the gauge; what to log, at most once per
        CAP_LOG_INTERVAL_S (the cap can wander among sizes that compute equally fast). `_lock` held."""
        self._metrics.batch_cap_m.set(self.cap.limit)
        self._cap_changes += 1
        now = time.monotonic()
        if now - self._cap_logged < CAP_LOG_INTERVAL_S:
            return None
        report: dict[str, object] = {
            "limit": self.cap.limit,
            "max_batch": self.max_batch,
            "per_row_ms": self.cap.per_row_ms(),
            "changes": self._cap_changes,  # since the last line (this one included)
        }
        self._cap_logged, self._cap_changes = now, 0
        return report

    def _solo_thread(self) -> None:
        assert self._solo is not None
        while True:
            with self._lock:
                while self._solo_batch is None and not self._stopping:
                    self._solo_work.wait()
                batch, self._solo_batch = self._solo_batch, None
                if batch is None or self._stopping:  # stop() refuses a batch it finds here
                    return
                self._executing += 1
            self._observe_taken(batch)
            outcome: _Outcome | None = None
            try:
                outcome = self._compute(self._solo, batch)
                self._metrics.solo_batches_m.inc()
            finally:
                with self._lock:  # settled before any client can see its answer and send the next
                    self._executing -= 1
                    self._solo_busy = False
                    self._solo_done.notify_all()
                    if self._queue:
                        self._work.notify()
            assert outcome is not None  # as in _pool_thread
            self._deliver(batch, outcome)

    def _compute(self, instance: Instance, batch: list[_Item]) -> _Outcome:
        """Execute `batch` on `instance` here; its answers or its error, not yet handed to the loop.
        The caller settles the batcher's state first (an answer lets its client send the next request,
        which must find this batch no longer executing), then calls :meth:`_deliver`."""
        m = self._metrics
        t0 = time.monotonic()
        try:
            parts = _split(batch, _execute(instance, [it.inputs for it in batch]))
        except DeviceFault as e:
            m.execution_errors.labels(m.model).inc()
            return _Outcome(error=RequestError(500, f"device fault during execution: {e}"), fault=e)
        except Exception as e:
            m.execution_errors.labels(m.model).inc()
            log.exception("execution failed")
            return _Outcome(error=RequestError(500, f"execution failed: {e}"))
        seconds = time.monotonic() - t0
        m.compute_time_m.observe(seconds)
        return _Outcome(parts=parts, seconds=seconds)

    def _deliver(self, batch: list[_Item], outcome: _Outcome) -> None:
        """Hand a computed batch's answers (or its error) to the loop in one call."""
        if outcome.parts is not None:
            self._to_loop(self._answer, batch, outcome.parts)
        else:
            assert outcome.error is not None
            self._to_loop(self._fail, batch, outcome.error, outcome.fault)

    def _to_loop(self, fn: Callable[..., None], *args: object) -> None:
        loop = self._loop
        if loop is None:
            return
        try:
            loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop is closed: the runtime has stopped, nobody is waiting
            pass

    # -- back on the event loop ------------------------------------------------------------------
    @staticmethod
    def _answer(batch: list[_Item], parts: list[Outputs]) -> None:
        for it, part in zip(batch, parts, strict=True):
            if not it.future.done():
                it.future.set_result(part)

    def _fail(self, batch: list[_Item], error: RequestError, fault: DeviceFault | None) -> None:
        for it in batch:
            if not it.future.done():
                it.future.set_exception(error)
        if fault is not None:
            self._on_device_fault(fault)
