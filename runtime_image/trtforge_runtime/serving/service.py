"""The one inference service that both protocols call.

The front ends (``http_api`` for HTTP/1.1 through aiohttp, ``grpc_service`` for gRPC through
grpc.aio) only decode requests and encode answers; what a request is allowed to do is decided here,
once: health and readiness, metadata and the model configuration, admission (the model is known and
ready, its body fits the body-memory budget, the queue takes it), decoding within the limits,
inference through the batcher, and the request metrics. Refusals are :class:`RequestError`\\ s,
which ``errors`` maps to HTTP statuses, gRPC codes and metrics outcomes.

The lifecycle (``server.Runtime``: fetch, verify, load, canary, faults, drain) moves the service
from loading to ready (:meth:`Service.serve`) and out of it (:meth:`Service.stop_serving`); the
service never calls back into it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from trtforge import __version__
from trtforge.contract.manifest import Manifest
from trtforge_runtime.backends import Instance
from trtforge_runtime.errors import RequestError, outcome_for
from trtforge_runtime.lifecycle.workers import Pod
from trtforge_runtime.protocol.v2 import InferRequest, RequestPlans
from trtforge_runtime.serving.batcher import Batcher
from trtforge_runtime.serving.body import Coding, MemoryBudget, decompress
from trtforge_runtime.serving.metrics import Metrics, Outcome
from trtforge_runtime.serving.model import ModelSpec, Serving, model_config
from trtforge_runtime.settings import Settings

# Requests whose JSON part is at most this big (and identity-coded) are decoded on the event loop:
# binary tensors are views of the body, so their decode costs microseconds. Anything larger, or
# compressed, is decoded in a worker thread.
INLINE_DECODE_BYTES = 64 << 10

EXTENSIONS = ("binary_tensor_data", "model_configuration")


@dataclass
class Call:
    """One inference request in flight: the outcome its metrics record (set by :meth:`Service.call`
    from how it ends) and the body memory it holds (released when it ends)."""

    outcome: Outcome = Outcome.SUCCESS
    reserved: int = 0


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
        self._plans: RequestPlans | None = None  # the served model's decoded request headers

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

    def decode(
        self, body: bytes | bytearray | memoryview, header_length: int | None, spec: ModelSpec
    ) -> tuple[InferRequest, int]:
        """An identity-coded v2 body's request and its batch rows (RequestError if it is not valid)."""
        plans = self._plans
        if plans is None or plans.spec is not spec:
            plans = self._plans = RequestPlans(spec, self.s.max_json_bytes)
        return plans.decode(body, header_length)

    def _decode_coded(
        self, raw: bytes | bytearray, coding: Coding, header_length: int | None, spec: ModelSpec
    ) -> tuple[InferRequest, int]:
        return self.decode(decompress(raw, coding, self.s.max_request_bytes), header_length, spec)

    async def decode_body(
        self, raw: bytes | bytearray, coding: Coding, header_length: int | None, spec: ModelSpec
    ) -> tuple[InferRequest, int]:
        """A v2 HTTP body's request and rows: small identity-coded ones on the event loop, the rest
        (compressed, large JSON, BYTES inputs) in a worker thread, so the loop keeps answering."""
        json_part = len(raw) if header_length is None else header_length
        if coding is Coding.IDENTITY and json_part <= INLINE_DECODE_BYTES and not spec.has_bytes_inputs:
            return self._decode_coded(raw, coding, header_length, spec)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self.decode_pool, self._decode_coded, raw, coding, header_length, spec
        )

    def infer(self, inputs: dict[str, np.ndarray], rows: int) -> asyncio.Future[dict[str, np.ndarray]]:
        """Queue a decoded request (QueueFull at once when the queue is full); its outputs' future."""
        batcher = self.batcher
        if batcher is None:
            raise RequestError(503, f"the model is not ready: {self.reason}", {"Retry-After": "1"})
        return batcher.enqueue(inputs, rows)
