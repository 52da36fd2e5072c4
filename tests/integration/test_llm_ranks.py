"""A 2-rank llama.cpp group on loopback under real `trtforge serve-llm` supervisors: a worker rank
(`ggml-rpc-server` on its rank port, probes on its own) and a leader that starts `llama-server --rpc`
only after the worker's supervisor says ready. The group answers the real `openai` client with the same
greedy answer as one process; killing the worker's rank process makes the leader report the missing
rank, not ready and not live, and end the group without sending its server a request."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from trtforge_dev.testbed import llama
from trtforge_dev.testbed.procs import free_ports

from tests.integration.llm_bed import (
    CANARY_PROMPT,
    Supervised,
    golden_tokens,
    http,
    llama_server,
    smollm2_gguf,
)

pytestmark = pytest.mark.integration

CHAT = [{"role": "user", "content": "Name a colour."}]


def _chat(port: int) -> str:
    from openai import OpenAI

    client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=120)
    reply = client.chat.completions.create(model="smollm2", messages=CHAT, max_tokens=12, temperature=0)  # type: ignore[arg-type]
    content = reply.choices[0].message.content
    assert content
    return content


@pytest.fixture(scope="module")
def one_process(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[int], str]:
    """The canary's greedy tokens and a greedy chat answer from one process, no ranks."""
    tmp = tmp_path_factory.mktemp("one")
    server, gguf = llama_server(), smollm2_gguf()
    golden = golden_tokens(server, gguf, tmp)
    s = Supervised(tmp, ["--model", str(gguf), "--model-name", "smollm2", "--server-binary", str(server)])
    try:
        s.wait_probe("/v2/health/ready", 200)
        return golden, _chat(s.port)
    finally:
        s.stop()


class Worker:
    """`trtforge serve-llm --rank 1`: ggml-rpc-server under its supervisor."""

    def __init__(self, tmp: Path, rank_port: int, probe_port: int) -> None:
        self.rank_port, self.probe_port = rank_port, probe_port
        self.log_path = tmp / "worker.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 (closed in stop)
        env = {
            **os.environ,
            "TRTFORGE_TERMINATION_LOG": str(tmp / "worker-termination"),
            "TRTFORGE_GPU_PROBE": "none",
        }
        self.proc = subprocess.Popen(
            [
                sys.executable, "-m", "trtforge.cli", "serve-llm", "--rank", "1", "--world-size", "2",
                "--host", "127.0.0.1", "--rank-port", str(self.rank_port),
                "--probe-port", str(self.probe_port),
                "--server-binary", str(llama.llama_bin("ggml-rpc-server")), "--threads", "1",
            ],
            stdout=self._log, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip

    def rank_pid(self) -> int:
        out = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True, check=False)
        pids = [int(p) for p in out.stdout.split()]
        assert pids, f"no ggml-rpc-server child: {self.log_path.read_text(errors='replace')[-2000:]}"
        return pids[0]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()


def _leader(tmp: Path, worker: str, golden: list[int]) -> Supervised:
    return Supervised(
        tmp,
        [
            "--model", str(smollm2_gguf()), "--model-name", "smollm2", "--server-binary", str(llama_server()),
            "--canary-prompt", CANARY_PROMPT, "--golden-tokens", ",".join(map(str, golden)),
            "--world-size", "2", "--worker", worker, "--rank-loss-linger", "60",
        ],
    )  # fmt: skip


def _wait(check: Any, desc: str, timeout: float = 300) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, desc
        time.sleep(0.1)


def test_two_ranks_meet_serve_the_one_process_answer_and_a_lost_rank_tears_the_group_down(
    one_process: tuple[list[int], str], tmp_path: Path
) -> None:
    golden, one_answer = one_process
    rank_port, probe_port = free_ports(2)
    # The leader first: it waits for rank 1 and says which rank it waits for.
    leader = _leader(tmp_path, f"127.0.0.1:{rank_port}:{probe_port}", golden)
    worker: Worker | None = None
    try:
        waiting = leader.wait_probe("/v2/health/ready", 503)
        waiting = _wait(
            lambda: (leader.probe("/v2/health/ready")[1] or {}).get("detail"), "no waiting detail"
        )
        assert f"rank 1 (127.0.0.1:{probe_port}): unreachable" in waiting
        assert leader.probe("/v2/health/live")[0] == 200
        assert "LLM server started" not in leader.logs()  # an unreachable worker would abort it
        worker = Worker(tmp_path, rank_port, probe_port)
        _wait(
            lambda: http("GET", f"http://127.0.0.1:{probe_port}/v2/health/ready")[0] == 200,
            "worker not ready",
        )
        rss_before = _rss_kib(worker.rank_pid())
        ready = leader.wait_probe("/v2/health/ready", 200)  # the ranks met and the canary passed
        assert "equal the golden tokens" in ready["canary"], (
            ready
        )  # the group's greedy tokens = one process's
        assert f"--rpc 127.0.0.1:{rank_port}" in leader.log_path.read_text(errors="replace")
        # The model's layers live on rank 1 (llama.cpp puts them on its RPC device): its memory grew.
        assert _rss_kib(worker.rank_pid()) - rss_before > 40 * 1024
        assert _chat(leader.port) == one_answer

        server_pid = leader.server_pid()
        os.kill(worker.rank_pid(), signal.SIGKILL)  # rank 1's process dies
        body = leader.wait_probe("/v2/health/live", 503, timeout=120)
        assert body["cause"] == "a rank of the group is gone" and "rank 1 (127.0.0.1:" in body["detail"], body
        status, ready = leader.probe("/v2/health/ready")
        assert status == 503 and "rank 1" in ready["detail"], ready
        # The supervisor killed its server before any request could reach it: no SIGABRT (134).
        _wait(
            lambda: not Path(f"/proc/{server_pid}").exists() or _zombie(server_pid), "the server still runs"
        )
        assert "status 134" not in leader.logs() and "status -6" not in leader.logs()
        assert worker.proc.wait(60) == 1  # the worker's supervisor ended with its rank
        leader.proc.send_signal(signal.SIGTERM)  # cut the linger short
        leader.wait_exit()
        msg = leader.termination()
        assert msg["reason"] == "Error" and "rank 1" in msg["message"], msg
    finally:
        leader.stop()
        if worker is not None:
            worker.stop()


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z")
    except OSError:
        return True


def test_a_worker_rank_is_probed_through_its_supervisor_not_its_rank_port(tmp_path: Path) -> None:
    worker = Worker(tmp_path, *free_ports(2))
    try:
        body = _wait(
            lambda: (http("GET", f"http://127.0.0.1:{worker.probe_port}/v2/health/ready")[1] or {}).get(
                "ready"
            ),
            "not ready",
        )
        assert body is True
        status, live = http("GET", f"http://127.0.0.1:{worker.probe_port}/v2/health/live")
        assert status == 200 and live["rank"] == 1
    finally:
        worker.stop()
