"""The thin process layer of the LLM supervisor: start the server, watch it, serve the probes.

The server answers the OpenAI API on its own port (no hop on the token path). This process serves
``/v2/health/live``, ``/v2/health/ready`` and ``/metrics`` on the probe port (the container port the
operator names ``http``, where the test bed's metrics adapter reads ``/metrics``). Every decision is
:func:`trtforge_runtime.llm.probes.decide`'s; this module only observes and applies.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from trtforge.contract.llm import GoldenTokens
from trtforge.contract.termination import TerminationMessage, write_termination_message
from trtforge.logs import fields
from trtforge_runtime.llm import llama_server, probes, trtllm_serve
from trtforge_runtime.llm.canary import CanaryOutcome, compare, compare_text
from trtforge_runtime.llm.kill import kill_and_wait
from trtforge_runtime.llm.server_metrics import ServerKind, exposition

log = logging.getLogger(__name__)

POLL_S = 0.5
HEALTH_TIMEOUT_S = 3.0
CANARY_TIMEOUT_S = 120.0
STOP_GRACE_S = 10.0


@dataclass
class ServerPlan:
    """Everything the supervisor needs to run one server: made by the prepare step after the
    artefacts are verified and the tuning record checked."""

    kind: ServerKind
    argv: list[str]
    port: int  # the server's own (OpenAI) port
    model: str  # the model name in the metrics labels
    canary: GoldenTokens | None
    env: dict[str, str] = field(default_factory=dict)
    host: str = "127.0.0.1"  # where the supervisor reaches the server


@dataclass
class State:
    """What the supervisor has seen so far (the input of the next decision)."""

    started_at: float = 0.0
    ever_up: bool = False
    unhealthy_since: float | None = None
    canary: CanaryOutcome | None = None
    verdict: probes.Verdict = field(default_factory=lambda: probes.Verdict(False, True, probes.Action.WAIT))


def _health_path(kind: ServerKind) -> str:
    return llama_server.HEALTH if kind is ServerKind.LLAMA_CPP else trtllm_serve.HEALTH


def _metrics_path(kind: ServerKind) -> str:
    return llama_server.METRICS if kind is ServerKind.LLAMA_CPP else trtllm_serve.PROMETHEUS


async def read_health(session: aiohttp.ClientSession, plan: ServerPlan) -> probes.Health:
    url = f"http://{plan.host}:{plan.port}{_health_path(plan.kind)}"
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=HEALTH_TIMEOUT_S)) as r:
            if plan.kind is ServerKind.TRTLLM:
                return trtllm_serve.classify_health(r.status, r.headers)
            body: Any = None
            if r.status == 503:
                with contextlib.suppress(ValueError, aiohttp.ContentTypeError):
                    body = await r.json(content_type=None)
            return llama_server.classify_health(r.status, body if isinstance(body, Mapping) else None)
    except (aiohttp.ClientError, TimeoutError, OSError):
        return probes.Health.DOWN


async def run_canary(session: aiohttp.ClientSession, plan: ServerPlan) -> CanaryOutcome:
    """One greedy generation of the canary prompt, compared with the golden tokens."""
    spec = plan.canary
    if spec is None:
        return CanaryOutcome(True, "no canary configured")
    if plan.kind is ServerKind.TRTLLM:
        url = f"http://{plan.host}:{plan.port}{trtllm_serve.COMPLETIONS}"
        body = trtllm_serve.canary_request(plan.model, spec.prompt, spec.n_predict)
    else:
        url = f"http://{plan.host}:{plan.port}{llama_server.COMPLETION}"
        body = llama_server.canary_request(spec.prompt, spec.n_predict)
    try:
        async with session.post(url, json=body, timeout=aiohttp.ClientTimeout(total=CANARY_TIMEOUT_S)) as r:
            if r.status != 200:
                return CanaryOutcome(False, f"canary request answered {r.status}: {(await r.text())[:200]}")
            answer = await r.json(content_type=None)
        if plan.kind is ServerKind.TRTLLM:
            return compare_text(spec.text, trtllm_serve.canary_text(answer))
        return compare(spec, llama_server.canary_tokens(answer))
    except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as e:
        return CanaryOutcome(False, f"canary request failed: {e}")


def server_session() -> aiohttp.ClientSession:
    """The supervisor's client for its server: health polls, the canary and ``/metrics``, each on a
    connection of its own, closed after the answer. A kept-alive connection polled every 0.5 s never
    idles out, and llama.cpp's HTTP library watches an idle one by waking a thread every 10 ms on the
    server's own core (docs/design.md §"LLM serving")."""
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))


def _die_with_parent() -> None:
    """In the child before exec: the kernel kills the server when the supervisor dies (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class Supervisor:
    """Runs one server process under the decisions of :mod:`trtforge_runtime.llm.probes`."""

    def __init__(self, plan: ServerPlan, policy: probes.Policy, probe_host: str, probe_port: int) -> None:
        self.plan = plan
        self.policy = policy
        self.probe_host = probe_host
        self.probe_port = probe_port
        self.state = State()
        self.proc: asyncio.subprocess.Process | None = None
        self.bound_port: int | None = None
        self._stop = asyncio.Event()
        self._session: aiohttp.ClientSession | None = None

    # -- probe port ---------------------------------------------------------------------------
    async def _live(self, _: web.Request) -> web.Response:
        v = self.state.verdict
        if v.live:
            return web.json_response({"live": True})
        return web.json_response(
            {"live": False, "cause": v.cause.value if v.cause else "", "detail": v.detail}, status=503
        )

    async def _ready(self, _: web.Request) -> web.Response:
        v = self.state.verdict
        body = {"ready": v.ready, "canary": self.state.canary.message if self.state.canary else "not run"}
        if not v.ready and v.detail:
            body["detail"] = v.detail
        return web.json_response(body, status=200 if v.ready else 503)

    async def _metrics(self, _: web.Request) -> web.Response:
        text = ""
        if self._session is not None:
            url = f"http://{self.plan.host}:{self.plan.port}{_metrics_path(self.plan.kind)}"
            try:
                async with self._session.get(url, timeout=aiohttp.ClientTimeout(total=HEALTH_TIMEOUT_S)) as r:
                    if r.status == 200:
                        text = await r.text()
            except (aiohttp.ClientError, TimeoutError, OSError):
                pass
        return web.Response(
            text=exposition(self.plan.kind, self.plan.model, text), content_type="text/plain", charset="utf-8"
        )

    async def _start_probe_server(self) -> web.AppRunner:
        app = web.Application()
        app.router.add_get("/v2/health/live", self._live)
        app.router.add_get("/v2/health/ready", self._ready)
        app.router.add_get("/metrics", self._metrics)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self.probe_host, self.probe_port)
        await site.start()
        addrs = runner.addresses
        self.bound_port = int(addrs[0][1]) if addrs else self.probe_port
        return runner

    # -- the loop -----------------------------------------------------------------------------
    def request_stop(self) -> None:
        self._stop.set()

    async def run(self) -> TerminationMessage:
        """Serve until stopped (Completed) or until a decision aborts (Error, with the cause)."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self.request_stop)
        runner = await self._start_probe_server()
        self._session = server_session()
        graceful = False  # an abort (or a crash here) kills the server at once: it is dead or stuck
        try:
            early = await self._before_server()
            if early is not None:
                return early
            self.proc = await asyncio.create_subprocess_exec(
                *self.plan.argv, env={**os.environ, **self.plan.env}, preexec_fn=_die_with_parent
            )
            self.state.started_at = time.monotonic()
            log.info("LLM server started", extra=fields(pid=self.proc.pid, argv=" ".join(self.plan.argv)))
            msg = await self._watch()
            graceful = msg.reason == "Completed"
            return msg
        finally:
            await self._stop_server(graceful)
            await self._session.close()
            await runner.cleanup()

    async def _before_server(self) -> TerminationMessage | None:
        """Before the server starts (a group's leader waits for its ranks here); a message ends the run."""
        return None

    async def _overrule(self, verdict: probes.Verdict) -> probes.Verdict:
        """The verdict after what else the supervisor watches (a group's leader: its ranks)."""
        return verdict

    async def _watch(self) -> TerminationMessage:
        assert self.proc is not None and self._session is not None
        st = self.state
        while not self._stop.is_set():
            asked = time.monotonic()  # a silent server's time counts from the question, not the timeout
            health = await read_health(self._session, self.plan)
            if health is probes.Health.UP and st.canary is None:
                st.canary = await run_canary(self._session, self.plan)
                log.info("canary", extra=fields(passed=st.canary.passed, detail=st.canary.message))
                if not st.canary.passed:
                    # Stay up, not ready; the message tells a later kill why (termination.py).
                    write_termination_message(
                        TerminationMessage(reason="CanaryFailed", message=st.canary.message)
                    )
            now = time.monotonic()
            st.ever_up = st.ever_up or health is probes.Health.UP
            st.unhealthy_since = probes.next_unhealthy_since(st.unhealthy_since, health, st.ever_up, asked)
            obs = probes.Observation(
                now=now,
                started_at=st.started_at,
                process_alive=self.proc.returncode is None,
                exit_code=self.proc.returncode,
                health=health,
                unhealthy_since=st.unhealthy_since,
                ever_up=st.ever_up,
                canary_passed=bool(st.canary and st.canary.passed),
            )
            verdict = await self._overrule(probes.decide(obs, self.policy))
            if verdict != st.verdict:
                log.info(
                    "LLM server state",
                    extra=fields(
                        ready=verdict.ready, live=verdict.live, health=health.value, detail=verdict.detail
                    ),
                )
            st.verdict = verdict
            if verdict.action is probes.Action.ABORT:
                cause = verdict.cause.value if verdict.cause else "aborted"
                return TerminationMessage(reason="Error", message=f"{cause}: {verdict.detail}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), POLL_S)
        return TerminationMessage(reason="Completed", message="stopped")

    async def _stop_server(self, graceful: bool) -> None:
        """SIGTERM and a grace period on a clean stop; SIGKILL at once otherwise."""
        p = self.proc
        if p is None or p.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            p.send_signal(signal.SIGTERM if graceful else signal.SIGKILL)
        try:
            await asyncio.wait_for(p.wait(), STOP_GRACE_S)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                p.kill()
            await p.wait()

    def kill_server_now(self) -> None:
        """For a GPU fault: the server goes at once, from any thread; returns once it has exited."""
        p = self.proc
        if p is not None and p.returncode is None:
            kill_and_wait(p.pid)
