"""The one inference service that both protocols call, and its one request pipeline.

The protocol adapters (``protocol.http_api`` on aiohttp, ``protocol.grpc_service`` on grpc.aio) hand
each inference request over as a :class:`Wire`: how that protocol reads its body, decodes it and
encodes the answer. :meth:`Service.infer` runs every request through the same steps, written once:
admit (the model is known and ready), receive (the body within the body-memory budget), decode (on
the event loop when cheap, else in a worker thread), batch and run (the batcher; a full queue
refuses at once), encode; counted in the request metrics however it ends. Health and readiness,
metadata and the model configuration are answered here too. Refusals are :class:`RequestError`\\ s,
which ``errors`` maps to HTTP statuses, gRPC codes and metrics outcomes (docs/design.md, "Runtime
protocols").

The lifecycle (``lifecycle.runtime.Runtime``: fetch, verify, load, canary, faults, drain) moves the
service from loading to ready (:meth:`Service.serve`) and out of it (:meth:`Service.stop_serving`);
the service never calls back into it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol, TypeVar

import numpy as np

from trtforge import __version__
from trtforge.contract.manifest import Manifest
from trtforge_runtime.backends import Instance
from trtforge_runtime.errors import RequestError, outcome_for
from trtforge_runtime.lifecycle.workers import Pod
from trtforge_runtime.serving.batcher import Batcher
from trtforge_runtime.serving.body import Coding, MemoryBudget, Source, body_deadline, read_body
from trtforge_runtime.serving.inflate import inflate, inflate_pool
from trtforge_runtime.serving.metrics import Metrics, Outcome, exposition
from trtforge_runtime.serving.model import InferRequest, ModelSpec, Serving, model_config
from trtforge_runtime.settings import Settings

EXTENSIONS = ("binary_tensor_data", "model_configuration")


Answer = TypeVar("Answer", covariant=True)


@dataclass
class Call:
    """One inference request in flight: the outcome its metrics record (set by :meth:`Service.call`
    from how it ends) and the body memory it holds (released when it ends)."""

    outcome: Outcome = Outcome.SUCCESS
    reserved: int = 0


class Wire(Protocol[Answer]):
    """One inference request as a protocol adapter hands it to :meth:`Service.infer`."""

    def model(self) -> tuple[str, str | None]:
        """The model's name and version (None: any) the request names."""
        ...

    async def receive(self, call: Call) -> None:
        """Have the whole body, its bytes held in the body-memory budget (added to
        ``call.reserved``, which the pipeline releases); RequestError if it cannot."""
        ...

    def decodes_inline(self, spec: ModelSpec) -> bool:
        """Whether decoding is cheap enough for the event loop (else a worker thread decodes)."""
        ...

    def decode(self, spec: ModelSpec) -> tuple[InferRequest, int]:
        """The request's tensors, checked against `spec`, and its batch rows; RequestError if it is
        not valid."""
        ...

    def encode(self, spec: ModelSpec, req: InferRequest, results: dict[str, np.ndarray]) -> Answer:
        """The answer, in this protocol's form."""
        ...


class Service:
    def __init__(self, settings: Settings, pod: Pod | None) -> None:
        self.s = settings
        self.pod = pod  # the other workers of `serve --workers N`, if any
        self.state = "loading"  # loading | ready | not_ready | draining
        self.reason = "loading the engine"
        self.manifest: Manifest | None = None
        self.spec: ModelSpec | None = None
        self.instances: list[Instance] = []
        self.batcher: Batcher | None = None
        self.metrics = Metrics(settings.model_name or "model", self.worker)
        self.active = 0  # inference requests in flight
        self.bodies = MemoryBudget(settings.body_memory)
        self.decode_pool = ThreadPoolExecutor(2, thread_name_prefix="decode")
        self.inflate_pool = inflate_pool()  # below the loop's priority: a bomb never holds the loop

    @property
    def worker(self) -> int | None:
        return self.pod.index if self.pod is not None else None

    # --- the lifecycle's moves ----------------------------------------------------------------
    def loaded(self, manifest: Manifest, spec: ModelSpec, instances: list[Instance]) -> None:
        """The engine is loaded and verified: its model is known (metadata, configuration)."""
        self.manifest, self.spec, self.instances = manifest, spec, instances
        if spec.name != self.metrics.model:
            self.metrics = Metrics(spec.name, self.worker)

    def serve(self, batcher: Batcher) -> None:
        self.batcher = batcher
        self.state, self.reason = "ready", ""
        self.metrics.ready_m.set(1)

    def stop_serving(self, state: str, reason: str) -> None:
        """Not ready any more (`state`: not_ready or draining), saying why."""
        self.state, self.reason = state, reason
        self.metrics.ready_m.set(0)

    # --- health and metadata --------------------------------------------------------------------
    def not_ready_reason(self) -> str | None:
        """Why the readiness probes say not ready; None when ready. A worker of `serve --workers N`
        is ready only once every worker of its pod is ready and listening (workers.Pod)."""
        if self.state != "ready":
            return self.reason or self.state
        if self.pod is not None and not self.pod.all_ready():
            return f"{self.pod.ready_count()} of {self.pod.workers} workers ready"
        return None

    def health_answer(self, path: str) -> tuple[int, dict[str, object]] | None:
        """The health endpoints' answers, for connections over the cap (None: not a health path)."""
        path = path.split("?", 1)[0]
        if path == "/v2/health/live":
            return 200, {"live": True}
        if path == "/v2/health/ready":
            why = self.not_ready_reason()
            return (200, {"ready": True}) if why is None else (503, {"ready": False, "error": why})
        return None

    def exposition(self, open_connections: int) -> bytes:
        """The metrics page (/metrics), with the queue's depth and the open connections as of now."""
        m = self.metrics
        if self.batcher is not None:
            m.queue_depth_m.set(self.batcher.depth)
        m.open_connections.set(open_connections)
        return exposition(m)

    def server_metadata(self) -> dict[str, object]:
        return {"name": "trtforge", "version": __version__, "extensions": list(EXTENSIONS)}

    def model_spec_for(self, name: str, version: str | None) -> ModelSpec:
        """The served model if `name` (and `version`, when given) name it; 404, or 503 while loading."""
        spec = self.spec
        if spec is None:
            if self.s.model_name is None or name == self.s.model_name:
                raise RequestError(503, f"model is not loaded yet: {self.reason}", {"Retry-After": "1"})
            raise RequestError(404, f"unknown model {name!r}")
        if name != spec.name:
            raise RequestError(404, f"unknown model {name!r}; this server serves {spec.name!r}")
        if version is not None and version != spec.version:
            raise RequestError(404, f"model {name!r} has no version {version!r}; it has {spec.version!r}")
        return spec

    def model_ready(self, name: str, version: str | None) -> str | None:
        """Why model `name` is not ready (None: it is); RequestError 404 for a model not served."""
        try:
            self.model_spec_for(name, version)
        except RequestError as e:
            if e.status == 404:
                raise
            return self.reason
        return self.not_ready_reason()

    def config_for(self, name: str, version: str | None) -> dict[str, object]:
        """The model's configuration in Triton's form (model.model_config); RequestError as
        model_spec_for's."""
        spec = self.model_spec_for(name, version)
        assert self.manifest is not None
        serving = Serving(
            self.manifest.backend, len(self.instances), self.s.max_queue_delay_us, self.s.max_queue
        )
        return model_config(spec, serving)

    # --- inference ------------------------------------------------------------------------------
    @contextmanager
    def call(self) -> Iterator[Call]:
        """One inference request, however it ends: counted while in flight, its outcome and latency
        recorded (a RequestError's by its status, anything else as an error), its body memory
        released."""
        t0 = time.perf_counter()
        self.active += 1
        c = Call()
        try:
            yield c
        except RequestError as e:
            c.outcome = outcome_for(e.status)
            raise
        except BaseException:
            c.outcome = Outcome.ERROR
            raise
        finally:
            if c.reserved:
                self.bodies.release(c.reserved)
            self.active -= 1
            self.metrics.observe_request(c.outcome, time.perf_counter() - t0)

    def admit(self, name: str, version: str | None) -> ModelSpec:
        """The model a request names, if it can take requests now (404 unknown, 503 not ready)."""
        spec = self.model_spec_for(name, version)
        if self.state != "ready" or self.batcher is None:
            raise RequestError(503, f"model {spec.name!r} is not ready: {self.reason}", {"Retry-After": "1"})
        return spec

    async def receive(
        self, source: Source, length: int | None, coding: Coding, call: Call
    ) -> bytes | bytearray:
        """A streamed body as sent (`length`: its claimed size, None when chunked), its bytes held in
        the budget as they arrive (`call` releases them), within a deadline that fits its claimed size
        (body.body_deadline); a coded body comes back inflated (serving.inflate), each step's bytes
        held in the budget as they are made."""
        limit = self.s.max_request_bytes
        if length is not None and length > limit:
            raise RequestError(413, f"request body of {length} bytes exceeds the limit of {limit} bytes")
        deadline = body_deadline(length, self.s.body_timeout_s)
        reader = self.bodies.reader()
        try:
            async with asyncio.timeout(deadline):
                raw = await read_body(source, length, limit, reader.take)
        except TimeoutError as e:
            raise RequestError(
                408,
                f"the request body did not arrive within {deadline:g} s (--body-timeout, or less for a"
                f" body of {length} bytes)",
            ) from e
        finally:
            call.reserved += reader.keep()
            reader.close()
        if coding is Coding.IDENTITY:
            return raw
        reader = self.bodies.reader()  # inflated step by step, each step's bytes held as they are made
        try:
            return await inflate(raw, coding, limit, reader.take, self.inflate_pool)
        finally:
            call.reserved += reader.keep()
            reader.close()

    async def infer(self, wire: Wire[Answer]) -> Answer:
        """The request pipeline: admit → receive → decode → batch and run → encode, for any protocol
        (:class:`Wire`). Raises RequestError for a refusal, anything else for a failed execution."""
        with self.call() as call:
            spec = self.admit(*wire.model())
            await wire.receive(call)
            if wire.decodes_inline(spec):
                req, rows = wire.decode(spec)
            else:
                loop = asyncio.get_running_loop()
                req, rows = await loop.run_in_executor(self.decode_pool, wire.decode, spec)
            results = await self.enqueue(req.inputs, rows)
            return wire.encode(spec, req, results)

    def enqueue(self, inputs: dict[str, np.ndarray], rows: int) -> asyncio.Future[dict[str, np.ndarray]]:
        """Queue a decoded request (QueueFull at once when the queue is full); its outputs' future."""
        batcher = self.batcher
        if batcher is None:
            raise RequestError(503, f"the model is not ready: {self.reason}", {"Retry-After": "1"})
        return batcher.enqueue(inputs, rows)
