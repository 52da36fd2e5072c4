"""The runtime process: HTTP first (live, not ready), then fetch → verify → load → canary → ready.

Endpoints (KServe Open Inference Protocol v2 over HTTP, plus /metrics):
``/v2/health/live``, ``/v2/health/ready``, ``/v2``, ``/v2/models/{name}[/versions/{v}]``,
``.../ready``, ``.../config``, ``.../infer``. Errors are ``{"error": "..."}`` with 400 (bad
request), 404 (unknown model), 408 (body slower than ``--body-timeout``), 413 (body, decompressed
body or JSON over its limit), 415 (a Content-Encoding other than gzip, deflate, identity), 503 (not
ready, draining, queue full, or too many large bodies at once, with Retry-After) and 500 (execution
failed).

Request limits (docs/design.md, "Runtime request limits"): the header's declarations are checked
against the model before any data is decoded; bodies are read undecoded within the size limit and a
memory budget shared by all requests; decompression and large decodes run in worker threads, so the
event loop keeps answering health probes; connections idle (or stuck before a complete request) for
``--idle-timeout`` are closed, and at most ``--max-connections`` are open.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError
from prometheus_client import CONTENT_TYPE_LATEST

from trtforge import __version__
from trtforge.contract.gpu_probe import GPUProbe, XidEvent, probe_identity
from trtforge.contract.manifest import Manifest
from trtforge.contract.termination import EXIT_OK, TerminationMessage, write_termination_message
from trtforge.logs import fields
from trtforge.store.base import EngineStore
from trtforge_runtime import preload, startup_gc, warmstart
from trtforge_runtime.backends import Backend, Instance, default_instances, load_backend
from trtforge_runtime.batcher import Batcher
from trtforge_runtime.body import BodyMemoryFull, Coding, MemoryBudget, content_coding, decompress, read_body
from trtforge_runtime.canary import run_canary
from trtforge_runtime.connections import ConnectionLimiter
from trtforge_runtime.errors import DeviceFault, Refusal, RequestError
from trtforge_runtime.faults import FaultMonitor, exit_now, gpu_fault_message
from trtforge_runtime.fetch import fetch_engine
from trtforge_runtime.identity import check_identity
from trtforge_runtime.metrics import Metrics, Outcome, exposition, outcome_for
from trtforge_runtime.model import ModelSpec, Serving, default_model_name, model_config, model_spec
from trtforge_runtime.retry import budget_from_env, with_retries
from trtforge_runtime.v2 import (
    DEFAULT_MAX_JSON_BYTES,
    HEADER_LENGTH,
    InferRequest,
    RequestPlans,
    encode_response,
)
from trtforge_runtime.workers import Pod

log = logging.getLogger(__name__)
JSON = "application/json"


@dataclass
class Settings:
    store_uri: str
    engine_key: str
    model_name: str | None = None
    host: str = "0.0.0.0"
    port: int = 8000
    cache_dir: Path = Path("/var/cache/trtforge")
    max_batch_size: int | None = None
    max_queue_delay_us: int = 0
    learn_batch_cap: bool = True  # cap batches where bigger ones stop computing each row faster
    instances: int | None = None  # None: one per CPU for CPU backends, 1 otherwise
    solo: bool = True  # a lone request runs on a session with every CPU's threads (CPU backends)
    max_queue: int = 256
    max_request_bytes: int = 64 << 20
    drain_timeout_s: float = 30.0
    max_json_bytes: int = DEFAULT_MAX_JSON_BYTES
    max_body_memory: int | None = None  # bytes of bodies held at once; default 2 x max_request_bytes
    idle_timeout_s: float = 30.0  # no complete request head for this long: the connection is closed
    body_timeout_s: float = 60.0
    max_connections: int = 1024
    grpc_port: int | None = 8001  # None: no gRPC endpoint; 0: any free port
    reuse_port: bool = False  # a worker of `serve --workers N`: share the ports (SO_REUSEPORT)
    listen_when_ready: bool = False  # a later worker: bind only once ready

    @property
    def body_memory(self) -> int:
        return max(self.max_body_memory or 0, 2 * self.max_request_bytes)


# Requests whose JSON part is at most this big (and identity-coded) are decoded on the event loop:
# binary tensors are views of the body, so their decode costs microseconds. Anything larger, or
# compressed, is decoded in a worker thread.
INLINE_DECODE_BYTES = 64 << 10


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        status=status, body=json.dumps({"error": message}).encode(), content_type=JSON, headers=headers
    )


def _ok(obj: dict[str, Any]) -> web.Response:
    return web.Response(body=json.dumps(obj).encode(), content_type=JSON)


class Runtime:
    def __init__(self, settings: Settings, store: EngineStore, probe: GPUProbe) -> None:
        self.s = settings
        self.store = store
        self.probe = probe
        self.state = "loading"  # loading | ready | not_ready | draining
        self.reason = "loading the engine"
        self.manifest: Manifest | None = None
        self.spec: ModelSpec | None = None
        self.backend: Backend | None = None
        self.batcher: Batcher | None = None
        self.pod = Pod.from_env()  # the other workers of `serve --workers N`, if any
        self.metrics = Metrics(settings.model_name or "model", self._worker())
        self.active = 0  # infer handlers running
        self._stop = asyncio.Event()
        self.exit_code = EXIT_OK
        self.port = settings.port
        self.has_bytes_inputs = False
        self._plans: RequestPlans | None = None  # the served model's decoded request headers
        self._limiter: ConnectionLimiter | None = None
        self.grpc_port: int | None = None
        self.bodies = MemoryBudget(settings.body_memory)
        self.decode_pool = ThreadPoolExecutor(2, thread_name_prefix="decode")
        self._listening = False  # on every port (HTTP, and gRPC when on)
        self._listened = asyncio.Event()  # set with _listening
        self._serving = asyncio.Event()  # set once ready (the batcher runs)

    async def _start_grpc(self) -> tuple[Any, int]:
        """grpc.aio's server, listening; it and its port. After HTTP listens and the engine starts
        loading: importing grpc takes a while."""
        from trtforge_runtime.grpc_service import start_grpc

        return await start_grpc(self, self.s.host, self.s.grpc_port or 0)

    def _worker(self) -> int | None:
        return self.pod.index if self.pod is not None else None

    # --- faults and ends ------------------------------------------------------------------
    def _fault(self, xid: int | None, gpu: str | None, detail: str) -> None:
        self.state, self.reason = "not_ready", f"GPU fault: {detail}"
        self.metrics.ready_m.set(0)
        self.metrics.gpu_faults.labels(gpu or "unknown", str(xid) if xid is not None else "none").inc()
        log.error("GPU fault; exiting", extra=fields(xid=xid, gpu=gpu, detail=detail))
        exit_now(gpu_fault_message(self.s.engine_key, xid, gpu, detail))

    def on_xid(self, e: XidEvent) -> None:
        self._fault(e.xid, e.gpu_uuid, e.message or f"Xid {e.xid} on {e.gpu_uuid}")

    def on_device_fault(self, e: DeviceFault) -> None:
        devs = []
        try:
            devs = self.probe.devices()
        except Exception:
            pass
        self._fault(None, devs[0].uuid if devs else None, f"device error during execution: {e}")

    def request_stop(self, code: int = EXIT_OK) -> None:
        self.exit_code = code
        self._stop.set()

    # --- start-up ---------------------------------------------------------------------------
    def _check_gpu(self, manifest: Manifest) -> None:
        check_identity(manifest, probe_identity(self.probe))

    def load(self) -> None:
        """Runs in a worker thread. Raises Refusal to end the process."""
        m = self.metrics
        t0 = time.monotonic()
        local = with_retries(
            lambda: fetch_engine(self.store, self.s.engine_key, self.s.cache_dir, check=self._check_gpu),
            budget_from_env(),
        )
        t1 = time.monotonic()
        m.startup.labels("fetch").set(t1 - t0)
        manifest = local.manifest
        name = self.s.model_name or default_model_name(manifest)
        if name != self.metrics.model:
            self.metrics = Metrics(name, self._worker())
            self.metrics.startup.labels("fetch").set(t1 - t0)
            m = self.metrics
        spec = model_spec(manifest, name, self.s.max_batch_size)
        n_instances = self.s.instances or default_instances(manifest.backend)
        backend = load_backend(manifest, local.artifact, n_instances)
        t2 = time.monotonic()
        m.engine_load.set(t2 - t1)
        m.startup.labels("load").set(t2 - t1)
        warm = warmstart.collect_canary(manifest.key, backend, local.canary, spec)
        if warm is not None:  # run on the warm start's thread, on the first of the instances
            first, result = warm
            instances = [first, *(backend.new_instance() for _ in range(n_instances - 1))]
        else:
            instances = [backend.new_instance() for _ in range(n_instances)]
            result = run_canary(instances[0], local.canary, spec, manifest.canary.atol, manifest.canary.rtol)
        self.manifest, self.spec, self.backend = manifest, spec, backend
        self.has_bytes_inputs = any(t.datatype == "BYTES" for t in spec.inputs)
        m.startup.labels("canary").set(result.seconds)  # where it ran (the warm start, or here)
        self._instances = instances
        self._canary = local.canary
        log_fields = fields(
            key=self.s.engine_key,
            model=name,
            backend=manifest.backend,
            fetched_bytes=local.downloaded_bytes,
            fetch_s=round(t1 - t0, 3),
            load_s=round(t2 - t1, 3),
            canary_s=round(result.seconds, 3),
            max_batch=spec.max_batch,
            instances=n_instances,
        )
        if not result.passed:
            self.state, self.reason = "not_ready", f"canary failed: {result.message}"
            log.error("canary failed; staying not ready", extra=log_fields)
            log.error(result.message)
            write_termination_message(
                TerminationMessage(
                    reason="CanaryFailed", message=result.message, engine_key=self.s.engine_key
                )
            )
            return
        log.info("engine verified, loaded and canary passed", extra=log_fields)

    async def _start_serving(self) -> None:
        assert self.spec is not None
        self.batcher = Batcher(
            self._instances,
            self.spec.max_batch,
            self.s.max_queue_delay_us / 1e6,
            self.s.max_queue,
            self.metrics,
            self.on_device_fault,
            learn_cap=self.s.learn_batch_cap,
        )
        self.batcher.start()
        self.state, self.reason = "ready", ""
        self.metrics.ready_m.set(1)
        batch_cap = "learned" if self.batcher.cap.learn else "max"  # what batches the pool forms
        log.info("ready", extra=fields(model=self.spec.name, port=self.port, batch_cap=batch_cap))
        self._serving.set()
        self._announce()

    def _announce(self) -> None:
        """Tell the pod's other workers that this one is ready and listening (once both are true)."""
        if self.pod is not None and self._listening and self.state == "ready":
            self.pod.mark_ready()

    def not_ready_reason(self) -> str | None:
        """Why the readiness probes say not ready; None when ready. A worker of `serve --workers N`
        is ready only once every worker of its pod is ready and listening (workers.Pod)."""
        if self.state != "ready":
            return self.reason or self.state
        if self.pod is not None and not self.pod.all_ready():
            return f"{self.pod.ready_count()} of {self.pod.workers} workers ready"
        return None

    async def _startup(self) -> None:
        """Load, then serve; the garbage collector, paused by the CLI for start-up, comes back on
        when this ends, however it ends (trtforge_runtime.startup_gc)."""
        try:
            await self._load_and_serve()
        finally:
            preload.discard()
            frozen = startup_gc.resume()
            log.info("start-up done; garbage collection on", extra=fields(frozen_objects=frozen))

    async def _load_and_serve(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(None, self.load)
        except Refusal as e:
            log.error(e.message, extra=fields(reason=e.reason))
            msg = TerminationMessage(reason=e.reason, message=e.message, engine_key=self.s.engine_key)
            write_termination_message(msg)
            self.request_stop(msg.exit_code)
            return
        except Exception as e:
            log.exception("start-up failed")
            msg = TerminationMessage(
                reason="Error", message=f"start-up failed: {e}", engine_key=self.s.engine_key
            )
            write_termination_message(msg)
            self.request_stop(msg.exit_code)
            return
        if self.state == "loading":
            await self._start_serving()
            await self._listened.wait()
            if self.s.solo:
                # Building a session holds the GIL (docs/design.md, "Runtime cold start"): load the
                # solo instance once every port listens, so that it never delays Ready.
                await self._add_solo()

    def _load_solo(self) -> Instance | None:
        """Runs in a worker thread once ready: the solo instance, canary-checked; None without one."""
        make = getattr(self.backend, "new_solo_instance", None)
        solo = make() if make is not None else None
        if solo is None or self.manifest is None or self.spec is None:
            return None
        c = self.manifest.canary
        result = run_canary(solo, self._canary, self.spec, c.atol, c.rtol)
        if not result.passed:
            log.warning("the solo instance failed the canary; serving without it: " + result.message)
            return None
        return solo

    async def _add_solo(self) -> None:
        """After ready, so that it never delays start-up: a lone request gets every CPU's threads."""
        try:
            solo = await asyncio.get_running_loop().run_in_executor(None, self._load_solo)
        except Exception:
            log.exception("the solo instance did not load; serving without it")
            return
        if solo is not None and self.batcher is not None and self.state == "ready":
            self.batcher.add_solo(solo)
            log.info("solo instance ready", extra=fields(model=self.spec.name if self.spec else None))

    # --- HTTP ---------------------------------------------------------------------------------
    def _model(self, request: web.Request) -> ModelSpec:
        return self.model_spec_for(request.match_info["name"], request.match_info.get("version"))

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

    async def live(self, request: web.Request) -> web.Response:
        return _ok({"live": True})

    async def ready(self, request: web.Request) -> web.Response:
        why = self.not_ready_reason()
        if why is None:
            return _ok({"ready": True})
        return web.Response(
            status=503, content_type=JSON, body=json.dumps({"ready": False, "error": why}).encode()
        )

    async def server_metadata(self, request: web.Request) -> web.Response:
        return _ok({"name": "trtforge", "version": __version__, "extensions": ["binary_tensor_data"]})

    async def model_metadata(self, request: web.Request) -> web.Response:
        try:
            return _ok(self._model(request).metadata())
        except RequestError as e:
            return _error(e.status, e.message, e.headers)

    async def model_ready(self, request: web.Request) -> web.Response:
        try:
            spec = self._model(request)
        except RequestError as e:
            if e.status == 404:
                return _error(404, e.message)
            return web.Response(
                status=503,
                content_type=JSON,
                body=json.dumps(
                    {"name": request.match_info["name"], "ready": False, "error": self.reason}
                ).encode(),
            )
        why = self.not_ready_reason()
        if why is None:
            return _ok({"name": spec.name, "ready": True})
        return web.Response(
            status=503,
            content_type=JSON,
            body=json.dumps({"name": spec.name, "ready": False, "error": why}).encode(),
        )

    def config_for(self, name: str, version: str | None) -> dict[str, object]:
        """The model's configuration in Triton's form (model.model_config); RequestError as
        model_spec_for's."""
        spec = self.model_spec_for(name, version)
        assert self.manifest is not None
        serving = Serving(
            self.manifest.backend, len(self._instances), self.s.max_queue_delay_us, self.s.max_queue
        )
        return model_config(spec, serving)

    async def model_config(self, request: web.Request) -> web.Response:
        try:
            return _ok(self.config_for(request.match_info["name"], request.match_info.get("version")))
        except RequestError as e:
            return _error(e.status, e.message, e.headers)

    async def metrics_handler(self, request: web.Request) -> web.Response:
        m = self.metrics
        if self.batcher is not None:
            m.queue_depth_m.set(self.batcher.depth)
        if self._limiter is not None:
            m.open_connections.set(self._limiter.open)
        return web.Response(body=exposition(m), headers={"Content-Type": CONTENT_TYPE_LATEST})

    def health_answer(self, path: str) -> tuple[int, dict[str, object]] | None:
        """The health endpoints' answers, for connections over the cap (None: not a health path)."""
        path = path.split("?", 1)[0]
        if path == "/v2/health/live":
            return 200, {"live": True}
        if path == "/v2/health/ready":
            why = self.not_ready_reason()
            return (200, {"ready": True}) if why is None else (503, {"ready": False, "error": why})
        return None

    async def _receive(self, request: web.Request, coding: Coding) -> tuple[bytes | bytearray, int]:
        """The body as sent, and the bytes reserved for it in the shared budget (release them)."""
        limit = self.s.max_request_bytes
        cl = request.content_length
        if cl is not None and cl > limit:
            raise RequestError(413, f"request body of {cl} bytes exceeds the limit of {limit} bytes")
        need = (cl if cl is not None else limit) + (0 if coding is Coding.IDENTITY else limit)
        reserved = self.bodies.try_acquire(need)  # the common case: no wait, no timer
        if reserved is None:
            try:
                async with asyncio.timeout(self.s.body_timeout_s):
                    reserved = await self.bodies.acquire(need)
            except TimeoutError as e:
                raise BodyMemoryFull(self.bodies.total) from e
        try:
            async with asyncio.timeout(self.s.body_timeout_s):
                return await read_body(request.content, cl, limit), reserved
        except TimeoutError as e:
            self.bodies.release(reserved)
            raise RequestError(
                408, f"the request body did not arrive within {self.s.body_timeout_s:g} s (--body-timeout)"
            ) from e
        except RequestPayloadError as e:
            self.bodies.release(reserved)
            raise RequestError(400, f"request body is malformed: {e}") from e
        except BaseException:
            self.bodies.release(reserved)
            raise

    def _decode(
        self, raw: bytes | bytearray, coding: Coding, header_length: int | None, spec: ModelSpec
    ) -> tuple[InferRequest, int]:
        return self.decode_body(decompress(raw, coding, self.s.max_request_bytes), header_length, spec)

    def decode_body(
        self, body: bytes | bytearray | memoryview, header_length: int | None, spec: ModelSpec
    ) -> tuple[InferRequest, int]:
        """An identity-coded body's request and its batch rows (RequestError if it is not valid)."""
        plans = self._plans
        if plans is None or plans.spec is not spec:
            plans = self._plans = RequestPlans(spec, self.s.max_json_bytes)
        return plans.decode(body, header_length)

    async def infer(self, request: web.Request) -> web.Response:
        t0 = time.perf_counter()
        self.active += 1
        outcome = Outcome.SUCCESS
        reserved = 0
        try:
            spec = self._model(request)
            if self.state != "ready" or self.batcher is None:
                raise RequestError(
                    503, f"model {spec.name!r} is not ready: {self.reason}", {"Retry-After": "1"}
                )
            coding = content_coding(request.headers.get("Content-Encoding"))
            hl = request.headers.get(HEADER_LENGTH)
            try:
                header_length = int(hl) if hl is not None else None
            except ValueError as e:
                raise RequestError(400, f"{HEADER_LENGTH} {hl!r} is not an integer") from e
            raw, reserved = await self._receive(request, coding)
            json_part = len(raw) if header_length is None else header_length
            if coding is Coding.IDENTITY and json_part <= INLINE_DECODE_BYTES and not spec.has_bytes_inputs:
                req, rows = self._decode(raw, coding, header_length, spec)
            else:
                loop = asyncio.get_running_loop()
                req, rows = await loop.run_in_executor(
                    self.decode_pool, self._decode, raw, coding, header_length, spec
                )
            del raw
            results = await self.batcher.submit(req.inputs, rows)
            out, out_hl = encode_response(spec, req, results)
            if out_hl is None:
                return web.Response(body=out, content_type=JSON)
            return web.Response(
                body=out, headers={HEADER_LENGTH: str(out_hl), "Content-Type": "application/octet-stream"}
            )
        except RequestError as e:
            outcome = outcome_for(e.status)
            refused = _error(e.status, e.message, e.headers)
            if not request.content.is_eof():  # a body left unread: the connection cannot go on
                refused.force_close()
            return refused
        except Exception as e:
            outcome = Outcome.ERROR
            log.exception("inference failed")
            return _error(500, f"inference failed: {e}")
        finally:
            if reserved:
                self.bodies.release(reserved)
            self.active -= 1
            self.metrics.observe_request(outcome, time.perf_counter() - t0)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.s.max_request_bytes + 1)
        r = app.router
        r.add_post("/v2/models/{name}/infer", self.infer)  # first: the hot path resolves soonest
        r.add_get("/v2/health/live", self.live)
        r.add_get("/v2/health/ready", self.ready)
        r.add_get("/v2", self.server_metadata)
        r.add_get("/metrics", self.metrics_handler)
        for base in ("/v2/models/{name}", "/v2/models/{name}/versions/{version}"):
            r.add_get(base, self.model_metadata)
            r.add_get(base + "/ready", self.model_ready)
            r.add_get(base + "/config", self.model_config)
        r.add_post("/v2/models/{name}/versions/{version}/infer", self.infer)
        return app

    # --- the whole life ---------------------------------------------------------------------
    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop)
        monitor = FaultMonitor(self.probe, self.on_xid)
        monitor.start()
        # Bodies arrive undecoded (body.py decompresses them once, within the limit); a connection
        # with no complete request head for --idle-timeout (after opening or its last answer) closes.
        runner = web.AppRunner(
            self.app(),
            access_log=None,
            handle_signals=False,
            auto_decompress=False,
            keepalive_timeout=self.s.idle_timeout_s,
        )
        await runner.setup()
        http = runner.server
        assert http is not None
        limiter = ConnectionLimiter(
            http,
            self.s.max_connections,
            self.health_answer,
            lambda: self.metrics,
            idle_timeout_s=self.s.idle_timeout_s,
        )
        self._limiter = limiter
        startup = asyncio.create_task(self._startup())
        if self.s.listen_when_ready:
            # A later worker of `serve --workers N`: the port already serves; join it ready or not at
            # all (once ready, not after the solo instance: it loads while this worker serves).
            stop = asyncio.create_task(self._stop.wait())
            serving = asyncio.create_task(self._serving.wait())
            await asyncio.wait([startup, stop, serving], return_when="FIRST_COMPLETED")
            stop.cancel()
            serving.cancel()
            if self.state != "ready":
                self.request_stop(self.exit_code)
                startup.cancel()
                await runner.cleanup()
                monitor.stop()
                return self.exit_code if self.exit_code != EXIT_OK else 1
        listener = await loop.create_server(
            limiter, self.s.host, self.s.port, backlog=1024, reuse_address=True, reuse_port=self.s.reuse_port
        )
        if listener.sockets:
            self.port = listener.sockets[0].getsockname()[1]
        switch_us = round(sys.getswitchinterval() * 1e6)  # set by the CLI (--gil-switch-interval-us)
        log.info(
            "listening", extra=fields(host=self.s.host, port=self.port, gil_switch_interval_us=switch_us)
        )
        grpc_server = None
        if self.s.grpc_port is not None:
            try:
                grpc_server, self.grpc_port = await self._start_grpc()
                log.info("listening for gRPC", extra=fields(host=self.s.host, grpc_port=self.grpc_port))
            except OSError as e:
                log.error(str(e))
                msg = TerminationMessage(reason="Error", message=str(e), engine_key=self.s.engine_key)
                write_termination_message(msg)
                self.request_stop(msg.exit_code)
        self._listening = True
        self._listened.set()
        self._announce()
        await self._stop.wait()
        # Stop: not ready at once, no new connections, let in-flight requests finish.
        was_ready = self.state == "ready"
        self.state, self.reason = "draining", "shutting down"
        self.metrics.ready_m.set(0)
        startup.cancel()
        listener.close()
        grpc_stopped = (
            asyncio.ensure_future(grpc_server.stop(self.s.drain_timeout_s))
            if grpc_server is not None
            else None
        )
        if was_ready:
            deadline = time.monotonic() + self.s.drain_timeout_s
            while (self.active or (self.batcher and self.batcher.in_flight)) and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            log.info("drained", extra=fields(left=self.active))
        if grpc_stopped is not None:
            await grpc_stopped
        if self.batcher is not None:
            await self.batcher.stop()
        await runner.cleanup()
        self.decode_pool.shutdown(wait=False, cancel_futures=True)
        monitor.stop()
        if self.exit_code == EXIT_OK:
            write_termination_message(
                TerminationMessage(
                    reason="Completed", message="stopped on signal", engine_key=self.s.engine_key
                )
            )
        return self.exit_code
