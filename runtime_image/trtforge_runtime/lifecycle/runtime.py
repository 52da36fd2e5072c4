"""The runtime's lifecycle: HTTP first (live, not ready), then fetch → verify → load → canary → ready,
faults and drain.

:class:`Runtime` owns the process's life; what requests may do is the inference service's
(``serving.service.Service``), which both protocol adapters call (``protocol.http_api`` over aiohttp,
``protocol.grpc_service`` over grpc.aio). Connections idle (or stuck before a complete request) for
``--idle-timeout`` are closed, and at most ``--max-connections`` are open (``protocol.connections``).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import time
from typing import Any

from aiohttp import web

from trtforge.contract.gpu_probe import GPUProbe, XidEvent, probe_identity
from trtforge.contract.manifest import Manifest
from trtforge.contract.termination import EXIT_OK, TerminationMessage, write_termination_message
from trtforge.logs import fields
from trtforge.store.base import EngineStore
from trtforge_runtime.backends import Backend, Instance, default_instances
from trtforge_runtime.errors import DeviceFault, Refusal
from trtforge_runtime.lifecycle import preload, startup_gc, warmstart
from trtforge_runtime.lifecycle.canary import run_canary
from trtforge_runtime.lifecycle.faults import FaultMonitor, exit_on_gpu_fault
from trtforge_runtime.lifecycle.identity import check_identity
from trtforge_runtime.lifecycle.retry import budget_from_env, with_retries
from trtforge_runtime.lifecycle.workers import Pod
from trtforge_runtime.protocol.connections import ConnectionLimiter
from trtforge_runtime.protocol.http_api import HttpApi
from trtforge_runtime.serving.batcher import Batcher
from trtforge_runtime.serving.model import default_model_name, model_spec
from trtforge_runtime.serving.service import Service
from trtforge_runtime.settings import Settings

log = logging.getLogger(__name__)

__all__ = ["Runtime", "Settings"]


class Runtime:
    def __init__(self, settings: Settings, store: EngineStore, probe: GPUProbe) -> None:
        self.s = settings
        self.store = store
        self.probe = probe
        self.pod = Pod.from_env()  # the other workers of `serve --workers N`, if any
        self.svc = Service(settings, self.pod)
        self.backend: Backend | None = None
        self._stop = asyncio.Event()
        self.exit_code = EXIT_OK
        self.port = settings.port
        self.grpc_port: int | None = None
        self._listening = False  # on every port (HTTP, and gRPC when on)
        self._listened = asyncio.Event()  # set with _listening
        self._serving = asyncio.Event()  # set once ready (the batcher runs)

    async def _start_grpc(self) -> tuple[Any, int]:
        """grpc.aio's server, listening; it and its port. After HTTP listens and the engine starts
        loading: importing grpc takes a while."""
        from trtforge_runtime.protocol.grpc_service import start_grpc

        return await start_grpc(self.svc, self.s.host, self.s.grpc_port or 0)

    # --- faults and ends ------------------------------------------------------------------
    def _fault(self, xid: int | None, gpu: str | None, detail: str) -> None:
        self.svc.stop_serving("not_ready", f"GPU fault: {detail}")
        self.svc.metrics.gpu_faults.labels(gpu or "unknown", str(xid) if xid is not None else "none").inc()
        log.error("GPU fault; exiting", extra=fields(xid=xid, gpu=gpu, detail=detail))
        exit_on_gpu_fault(self.probe, self.s.engine_key, xid, gpu, detail)

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
        t0 = time.monotonic()
        local = with_retries(
            lambda: warmstart.fetch(self.store, self.s.engine_key, self.s.cache_dir, check=self._check_gpu),
            budget_from_env(),
        )
        t1 = time.monotonic()
        manifest = local.manifest
        name = self.s.model_name or default_model_name(manifest)
        spec = model_spec(manifest, name, self.s.max_batch_size)
        n_instances = self.s.instances or default_instances(manifest.backend)
        backend = warmstart.load(manifest, local.artifact, n_instances)
        t2 = time.monotonic()
        warm = warmstart.collect_canary(manifest.key, backend, local.canary, spec)
        if warm is not None:  # run on the warm start's thread, on the first of the instances
            first, result = warm
            instances = [first, *(backend.new_instance() for _ in range(n_instances - 1))]
        else:
            instances = [backend.new_instance() for _ in range(n_instances)]
            result = run_canary(instances[0], local.canary, spec, manifest.canary.atol, manifest.canary.rtol)
        self.backend = backend
        self.svc.loaded(manifest, spec, instances)
        m = self.svc.metrics
        m.startup.labels("fetch").set(t1 - t0)
        m.engine_load.set(t2 - t1)
        m.startup.labels("load").set(t2 - t1)
        m.startup.labels("canary").set(result.seconds)  # where it ran (the warm start, or here)
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
            self.svc.stop_serving("not_ready", f"canary failed: {result.message}")
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
        svc = self.svc
        assert svc.spec is not None
        batcher = Batcher(
            svc.instances,
            svc.spec.max_batch,
            self.s.max_queue_delay_us / 1e6,
            self.s.max_queue,
            svc.metrics,
            self.on_device_fault,
            learn_cap=self.s.learn_batch_cap,
        )
        batcher.start()
        svc.serve(batcher)
        batch_cap = "learned" if batcher.cap.learn else "max"  # what batches the pool forms
        log.info("ready", extra=fields(model=svc.spec.name, port=self.port, batch_cap=batch_cap))
        self._serving.set()
        self._announce()

    def _announce(self) -> None:
        """Tell the pod's other workers that this one is ready and listening (once both are true)."""
        if self.pod is not None and self._listening and self.svc.state == "ready":
            self.pod.mark_ready()

    async def _startup(self) -> None:
        """Load, then serve; the garbage collector, paused by the CLI for start-up, comes back on
        when this ends, however it ends (trtforge_runtime.lifecycle.startup_gc)."""
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
        if self.svc.state == "loading":
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
        manifest, spec = self.svc.manifest, self.svc.spec
        if solo is None or manifest is None or spec is None:
            return None
        c = manifest.canary
        result = run_canary(solo, self._canary, spec, c.atol, c.rtol)
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
        svc = self.svc
        if solo is not None and svc.batcher is not None and svc.state == "ready":
            svc.batcher.add_solo(solo)
            log.info("solo instance ready", extra=fields(model=svc.spec.name if svc.spec else None))

    # --- the whole life ---------------------------------------------------------------------
    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop)
        monitor = FaultMonitor(self.probe, self.on_xid)
        monitor.start()
        # Bodies arrive undecoded (body.py decompresses them once, within the limit); a connection
        # with no complete request head for --idle-timeout (after opening or its last answer) closes.
        limiter: ConnectionLimiter | None = None
        api = HttpApi(self.svc, lambda: limiter.open if limiter is not None else 0)
        runner = web.AppRunner(
            api.app(self.s.max_request_bytes),
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
            self.svc.health_answer,
            lambda: self.svc.metrics,
            idle_timeout_s=self.s.idle_timeout_s,
        )
        startup = asyncio.create_task(self._startup())
        if self.s.listen_when_ready:
            # A later worker of `serve --workers N`: the port already serves; join it ready or not at
            # all (once ready, not after the solo instance: it loads while this worker serves).
            stop = asyncio.create_task(self._stop.wait())
            serving = asyncio.create_task(self._serving.wait())
            await asyncio.wait([startup, stop, serving], return_when="FIRST_COMPLETED")
            stop.cancel()
            serving.cancel()
            if self.svc.state != "ready":
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
            "listening",
            extra=fields(
                host=self.s.host,
                port=self.port,
                gil_switch_interval_us=switch_us,
                event_loop=type(loop).__module__.split(".")[0],  # asyncio or uvloop (--event-loop)
            ),
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
        svc = self.svc
        was_ready = svc.state == "ready"
        svc.stop_serving("draining", "shutting down")
        startup.cancel()
        listener.close()
        grpc_stopped = (
            asyncio.ensure_future(grpc_server.stop(self.s.drain_timeout_s))
            if grpc_server is not None
            else None
        )
        if was_ready:
            deadline = time.monotonic() + self.s.drain_timeout_s
            while (svc.active or (svc.batcher and svc.batcher.in_flight)) and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            log.info("drained", extra=fields(left=svc.active))
        if grpc_stopped is not None:
            await grpc_stopped
        if svc.batcher is not None:
            await svc.batcher.stop()
        await runner.cleanup()
        svc.decode_pool.shutdown(wait=False, cancel_futures=True)
        svc.inflate_pool.shutdown(wait=False, cancel_futures=True)
        monitor.stop()
        if self.exit_code == EXIT_OK:
            write_termination_message(
                TerminationMessage(
                    reason="Completed", message="stopped on signal", engine_key=self.s.engine_key
                )
            )
        return self.exit_code
