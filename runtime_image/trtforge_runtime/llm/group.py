"""The thin process layer of a rank group on llama.cpp's RPC backend (decisions: :mod:`.ranks`).

A worker rank's supervisor (:class:`WorkerSupervisor`) runs ``ggml-rpc-server`` on the rank port and
answers probes on its own probe port: ready once the rank process listens (read from the kernel's
socket table, never by connecting), not live once it has exited. The leader's supervisor
(:class:`LeaderSupervisor`) asks every worker's supervisor before it starts ``llama-server --rpc``,
and keeps asking while it serves; a rank gone kills the server (no request reaches it, so it never
aborts on a dead worker) and reports the group not ready and not live, naming the rank.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import aiohttp
from aiohttp import web

from trtforge.contract.termination import TerminationMessage
from trtforge.logs import fields
from trtforge_runtime.llm import probes, ranks
from trtforge_runtime.llm.kill import kill_and_wait
from trtforge_runtime.llm.supervisor import POLL_S, ServerPlan, Supervisor, _die_with_parent

log = logging.getLogger(__name__)

ASK_TIMEOUT_S = 2.0
RPC_SERVER = "ggml-rpc-server"


def listening(port: int) -> bool:
    """Whether a socket on this host listens on `port` (the kernel's tables; no connection made)."""
    found: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            found |= ranks.listening_ports(Path(table).read_text())
    return port in found


async def ask(session: aiohttp.ClientSession, worker: ranks.Worker) -> tuple[ranks.RankReport, str | None]:
    """One question to a worker's supervisor: liveness, then readiness; and which run of it answered."""
    incarnation: str | None = None

    async def status(path: str) -> int | None:
        nonlocal incarnation
        url = f"http://{worker.supervisor}{path}"
        try:
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=ASK_TIMEOUT_S)) as r:
                with contextlib.suppress(ValueError, aiohttp.ContentTypeError):
                    body = await r.json()
                    if isinstance(body, dict) and "incarnation" in body:
                        incarnation = str(body["incarnation"])
                return r.status
        except (aiohttp.ClientError, TimeoutError, OSError):
            return None

    live = await status("/v2/health/live")
    report = ranks.classify(live, await status("/v2/health/ready") if live == 200 else None)
    return report, incarnation


class LeaderSupervisor(Supervisor):
    """Rank 0: the server (``llama-server --rpc``) starts once every worker rank is ready, and the
    group is torn down when one is gone."""

    def __init__(
        self,
        plan: ServerPlan,
        policy: probes.Policy,
        probe_host: str,
        probe_port: int,
        workers: Sequence[ranks.Worker],
        group_policy: ranks.GroupPolicy,
        linger_s: float,
    ) -> None:
        super().__init__(plan, policy, probe_host, probe_port)
        self.workers = list(workers)
        self.group_policy = group_policy
        self.linger_s = linger_s  # how long a torn-down leader keeps saying why before it ends
        self.seen: dict[int, ranks.RankSeen] = {}
        self.met: dict[int, str | None] = {}  # rank -> the worker run the server was started with

    async def _ask_all(self) -> None:
        assert self._session is not None
        reports = await asyncio.gather(*(ask(self._session, w) for w in self.workers))
        now = time.monotonic()
        for w, (report, incarnation) in zip(self.workers, reports, strict=True):
            self.seen[w.rank] = ranks.next_seen(self.seen.get(w.rank), report, now, incarnation)

    async def _before_server(self) -> TerminationMessage | None:
        began = time.monotonic()
        last: tuple[int, ...] | None = None
        while not self._stop.is_set():
            await self._ask_all()
            gv = ranks.before_start(self.workers, self.seen, time.monotonic() - began, self.group_policy)
            if gv.action is ranks.GroupAction.START_SERVER:
                log.info(
                    "every rank is ready; starting the server", extra=fields(argv=" ".join(self.plan.argv))
                )
                self.met = {r: s.incarnation for r, s in self.seen.items()}
                return None
            cause = probes.Cause.RANKS_MISSING if gv.action is ranks.GroupAction.TEAR_DOWN else None
            self.state.verdict = probes.Verdict(False, gv.live, probes.Action.WAIT, cause, gv.detail)
            if gv.missing != last:
                log.info("waiting for ranks", extra=fields(missing=list(gv.missing), detail=gv.detail))
                last = gv.missing
            if gv.action is ranks.GroupAction.TEAR_DOWN:
                return TerminationMessage(
                    reason="Error", message=f"{probes.Cause.RANKS_MISSING.value}: {gv.detail}"
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), POLL_S)
        return TerminationMessage(reason="Completed", message="stopped before the ranks met")

    async def _overrule(self, verdict: probes.Verdict) -> probes.Verdict:
        await self._ask_all()
        gv = ranks.while_serving(self.workers, self.seen, time.monotonic(), self.group_policy, self.met)
        if gv.action is ranks.GroupAction.TEAR_DOWN:
            # Kill first: a request reaching a server with a dead worker aborts it (SIGABRT).
            await asyncio.to_thread(self.kill_server_now)
            torn = probes.Verdict(False, False, probes.Action.ABORT, probes.Cause.RANK_LOST, gv.detail)
            self.state.verdict = torn
            log.error(
                "rank lost; the group is torn down", extra=fields(missing=list(gv.missing), detail=gv.detail)
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.linger_s)
            return torn
        if not gv.ready and verdict.action is probes.Action.WAIT:
            return probes.Verdict(False, verdict.live, verdict.action, verdict.cause, gv.detail)
        return verdict


class WorkerSupervisor:
    """A worker rank: ``ggml-rpc-server`` on the rank port, probes on the probe port."""

    def __init__(self, argv: list[str], rank: int, rank_port: int, probe_host: str, probe_port: int) -> None:
        self.argv = argv
        self.rank = rank
        self.rank_port = rank_port
        self.probe_host = probe_host
        self.probe_port = probe_port
        self.proc: asyncio.subprocess.Process | None = None
        self.bound_port: int | None = None
        self._stop = asyncio.Event()
        self.incarnation = uuid.uuid4().hex  # this run: a restarted worker is another (ranks.RankSeen)

    def _alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    async def _live(self, _: web.Request) -> web.Response:
        if self._alive():
            return web.json_response({"live": True, "rank": self.rank, "incarnation": self.incarnation})
        code = self.proc.returncode if self.proc is not None else None
        return web.json_response(
            {
                "live": False,
                "rank": self.rank,
                "incarnation": self.incarnation,
                "detail": f"{RPC_SERVER} exited with status {code}",
            },
            status=503,
        )

    async def _ready(self, _: web.Request) -> web.Response:
        ok = ranks.worker_ready(self._alive(), listening(self.rank_port))
        return web.json_response(
            {"ready": ok, "rank": self.rank, "rank_port": self.rank_port, "incarnation": self.incarnation},
            status=200 if ok else 503,
        )

    def request_stop(self) -> None:
        self._stop.set()

    def kill_server_now(self) -> None:
        """For a GPU fault: the rank process goes at once, from any thread; returns once it has exited."""
        p = self.proc
        if p is not None and p.returncode is None:
            kill_and_wait(p.pid)

    async def run(self) -> TerminationMessage:
        runner, self.bound_port = await serve_rank_probes(
            self._live, self._ready, self.probe_host, self.probe_port, self.request_stop
        )
        try:
            self.proc = await asyncio.create_subprocess_exec(*self.argv, preexec_fn=_die_with_parent)
            log.info(
                "rank process started",
                extra=fields(rank=self.rank, pid=self.proc.pid, argv=" ".join(self.argv)),
            )
            while not self._stop.is_set():
                if self.proc.returncode is not None:
                    detail = f"rank {self.rank}: {RPC_SERVER} exited with status {self.proc.returncode}"
                    log.error(detail)
                    return TerminationMessage(
                        reason="Error", message=f"{probes.Cause.SERVER_EXITED.value}: {detail}"
                    )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), POLL_S)
            return TerminationMessage(reason="Completed", message="stopped")
        finally:
            if self.proc is not None and self.proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.proc.pid, signal.SIGKILL)
                await self.proc.wait()
            await runner.cleanup()


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def serve_rank_probes(
    live: Handler, ready: Handler, host: str, port: int, on_stop: Callable[[], None]
) -> tuple[web.AppRunner, int]:
    """A worker rank's supervisor: SIGTERM and SIGINT call `on_stop`, and `live` and `ready` answer
    ``/v2/health/live`` and ``/v2/health/ready`` on host:port; the runner and the port it bound."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, on_stop)
    app = web.Application()
    app.router.add_get("/v2/health/live", live)
    app.router.add_get("/v2/health/ready", ready)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner, int(runner.addresses[0][1]) if runner.addresses else port


def rpc_server_argv(binary: str, host: str, rank_port: int, threads: int | None) -> list[str]:
    """``ggml-rpc-server`` on the rank port (it serves the tensors the leader sends it: a llama.cpp
    worker rank needs no artefact of its own)."""
    out = [binary, "-H", host, "-p", str(rank_port)]
    if threads is not None:
        if threads < 1:
            raise ValueError(f"--threads {threads}: must be at least 1")
        out += ["-t", str(threads)]
    return out
