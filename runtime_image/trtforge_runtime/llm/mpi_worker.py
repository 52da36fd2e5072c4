"""A worker rank of a TensorRT-LLM group on the mpirun path (decisions: :mod:`.mpi_launch`).

Its supervisor has fetched and verified the checkpoint and tuning record at the same paths as the
leader's (the leader's trtllm-serve line names them on every rank), then answers probes: live while
it runs, ready once verified; the leader starts mpirun only when every worker says ready. The rank's
MPI processes are not its children: mpirun starts OpenMPI's daemon in this container through
``trtforge rank-exec``, and it ends with the job. A GPU fault ends the pod (the fault monitor), which
ends every process in the container.
"""

from __future__ import annotations

import asyncio
import uuid

from aiohttp import web

from trtforge.contract.termination import TerminationMessage
from trtforge_runtime.llm.group import serve_rank_probes


class MpiWorkerSupervisor:
    def __init__(self, rank: int, probe_host: str, probe_port: int) -> None:
        self.rank = rank
        self.probe_host = probe_host
        self.probe_port = probe_port
        self.bound_port: int | None = None
        self.incarnation = uuid.uuid4().hex  # this run: a restarted worker is another (ranks.RankSeen)
        self._stop = asyncio.Event()

    async def _live(self, _: web.Request) -> web.Response:
        return web.json_response({"live": True, "rank": self.rank, "incarnation": self.incarnation})

    async def _ready(self, _: web.Request) -> web.Response:
        body = {"ready": True, "rank": self.rank, "incarnation": self.incarnation, "launch": "mpirun"}
        return web.json_response(body)

    def request_stop(self) -> None:
        self._stop.set()

    def kill_server_now(self) -> None:
        """For a GPU fault: nothing of its own to kill; the pod's end takes the MPI processes with it."""

    async def run(self) -> TerminationMessage:
        runner, self.bound_port = await serve_rank_probes(
            self._live, self._ready, self.probe_host, self.probe_port, self.request_stop
        )
        try:
            await self._stop.wait()
            return TerminationMessage(reason="Completed", message="stopped")
        finally:
            await runner.cleanup()
