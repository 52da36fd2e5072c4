"""A trtllm-serve worker rank on the mpirun path (trtforge_runtime.llm.mpi_worker and serve-llm's
worker branch): it answers the leader's questions as llama.cpp workers do, on loopback here; it
refuses to start without the checkpoint it must verify."""

from __future__ import annotations

import argparse
import asyncio
import logging

import aiohttp
import pytest
from trtforge_runtime.llm import cli
from trtforge_runtime.llm.group import ask
from trtforge_runtime.llm.mpi_worker import MpiWorkerSupervisor
from trtforge_runtime.llm.ranks import RankReport, Worker


@pytest.mark.asyncio
async def test_the_leader_reads_an_mpi_worker_as_ready_with_its_incarnation() -> None:
    sup = MpiWorkerSupervisor(rank=1, probe_host="127.0.0.1", probe_port=0)
    task = asyncio.create_task(sup.run())
    for _ in range(200):
        if sup.bound_port:
            break
        await asyncio.sleep(0.05)
    assert sup.bound_port
    async with aiohttp.ClientSession() as s:
        report, incarnation = await ask(s, Worker(1, "127.0.0.1", 50052, sup.bound_port))
    assert (report, incarnation) == (RankReport.READY, sup.incarnation)
    sup.request_stop()
    msg = await asyncio.wait_for(task, 30)
    assert msg.reason == "Completed"


def test_a_worker_rank_without_its_checkpoint_is_a_usage_error(caplog: pytest.LogCaptureFixture) -> None:
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers())
    args = parser.parse_args(["serve-llm", "--server", "trtllm-serve", "--rank", "1", "--world-size", "2"])
    with caplog.at_level(logging.ERROR):
        assert args.func(args) == 2
    assert "--checkpoint" in caplog.text
