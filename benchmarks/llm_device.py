"""LLM serving on a GPU machine: llama.cpp built for CUDA, serving directly and behind
``trtforge serve-llm``, one streaming chat client for both sides, and tokens per joule from NVML's
power readings during each run.

The device machine has no package registry and aiperf's dependencies do not fit in what a call
carries, so this client (aiohttp, streaming ``/v1/chat/completions``, ``ignore_eos`` and a fixed
``max_tokens``) measures both sides alike: TTFT, inter-token latency and output tokens/s.

    python -m benchmarks.llm_device --llama-bin DIR --gguf FILE --out FILE.json
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from trtforge.contract.llm import golden_request

CANARY_PROMPT = "The capital of France is"
PROMPT = "Write a long story about a lighthouse keeper who finds a map. " * 4


def wait_ok(url: str, timeout: float, proc: subprocess.Popen[bytes]) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if proc.poll() is not None:
            raise RuntimeError(f"process exited {proc.returncode} before {url} answered 200")
        time.sleep(0.2)
    raise TimeoutError(url)


class Power:
    """NVML power samples (milliwatts) every 50 ms on a thread; energy by the trapezoid rule."""

    def __init__(self) -> None:
        import pynvml

        pynvml.nvmlInit()
        self.nvml = pynvml
        self.handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        self.name = pynvml.nvmlDeviceGetName(self.handle)
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Power:
        self.samples = []
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            mw = self.nvml.nvmlDeviceGetPowerUsage(self.handle)
            self.samples.append((time.monotonic(), mw / 1000.0))
            self._stop.wait(0.05)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def joules(self) -> float:
        s = self.samples
        return sum((t1 - t0) * (w0 + w1) / 2 for (t0, w0), (t1, w1) in itertools.pairwise(s))

    def mean_watts(self) -> float:
        return statistics.mean(w for _, w in self.samples) if self.samples else 0.0


async def one_request(session: Any, url: str, model: str, max_tokens: int) -> dict[str, Any]:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": max_tokens,
        "stream": True,
        "ignore_eos": True,
        "temperature": 0.0,
    }
    t0 = time.perf_counter()
    stamps: list[float] = []
    async with session.post(f"{url}/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        async for raw in r.content:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            if chunk.get("choices") and chunk["choices"][0].get("delta", {}).get("content"):
                stamps.append(time.perf_counter())
    if not stamps:
        raise RuntimeError("no tokens streamed")
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    return {"ttft": stamps[0] - t0, "itl": statistics.mean(gaps) if gaps else 0.0, "tokens": len(stamps)}


async def load(url: str, model: str, concurrency: int, requests: int, max_tokens: int) -> dict[str, Any]:
    import aiohttp

    queue = list(range(requests))
    out: list[dict[str, Any]] = []
    # a connection per request: llama-server's HTTP library closes a keep-alive connection after a
    # few requests, and a pooled one reused just then fails with ServerDisconnected on either side
    connector = aiohttp.TCPConnector(force_close=True)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        await one_request(session, url, model, 4)  # warm-up

        async def worker() -> None:
            while queue:
                queue.pop()
                out.append(await one_request(session, url, model, max_tokens))

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - t0
    ttft = sorted(r["ttft"] for r in out)
    itl = sorted(r["itl"] for r in out)
    tokens = sum(r["tokens"] for r in out)
    return {
        "ttft_ms_p50": 1000 * ttft[len(ttft) // 2],
        "itl_ms_p50": 1000 * itl[len(itl) // 2],
        "output_tokens_per_s": tokens / wall,
        "tokens": tokens,
        "wall_s": wall,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--llama-bin", type=Path, required=True)
    ap.add_argument("--gguf", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--parallel", type=int, default=16)
    ap.add_argument("--min-requests", type=int, default=16, help="requests per point, at least")
    ap.add_argument("--per-client", type=int, default=4, help="requests per point per client")
    a = ap.parse_args(argv)
    server = str(a.llama_bin / "llama-server")
    common = ["-c", str(a.parallel * 512), "-np", str(a.parallel), "-ngl", "99"]
    direct_port, sup_port, probe_port = 18080, 18081, 18000
    logs = a.out.parent
    direct = subprocess.Popen(
        [server, "-m", str(a.gguf), "--host", "127.0.0.1", "--port", str(direct_port), "--metrics",
         "-a", "smollm2", *common],
        stdout=open(logs / "direct.log", "wb"),  # noqa: SIM115
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    procs = [direct]
    power = Power()
    results: list[dict[str, Any]] = []
    try:
        wait_ok(f"http://127.0.0.1:{direct_port}/health", 300, direct)
        body = json.dumps(golden_request(CANARY_PROMPT, 8)).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{direct_port}/completion", data=body)
        golden = json.load(urllib.request.urlopen(req, timeout=60))["tokens"]
        sup = subprocess.Popen(
            [sys.executable, "-m", "trtforge.cli", "serve-llm", "--model", str(a.gguf),
             "--model-name", "smollm2", "--host", "127.0.0.1", "--port", str(sup_port),
             "--probe-port", str(probe_port), "--server-binary", server,
             "--ctx-size", str(a.parallel * 512), "--parallel", str(a.parallel), "--gpu-layers", "99",
             "--canary-prompt", CANARY_PROMPT, "--golden-tokens", ",".join(map(str, golden))],
            stdout=open(logs / "supervised.log", "wb"),  # noqa: SIM115
            stderr=subprocess.STDOUT,
            env={**os.environ, "TRTFORGE_GPU_PROBE": "nvml"},
        )  # fmt: skip
        procs.append(sup)
        wait_ok(f"http://127.0.0.1:{probe_port}/v2/health/ready", 300, sup)
        sides = {"direct": direct_port, "supervised": sup_port}
        for c in a.concurrency:
            n = max(a.min_requests, a.per_client * c)
            for side in ["direct", "supervised"] if c % 2 else ["supervised", "direct"]:
                with power:
                    row = asyncio.run(load(f"http://127.0.0.1:{sides[side]}", "smollm2", c, n, a.max_tokens))
                row.update(side=side, concurrency=c, requests=n, mean_watts=round(power.mean_watts(), 1))
                row["tokens_per_joule"] = round(row["tokens"] / power.joules(), 3) if power.joules() else None
                results.append(row)
                print(json.dumps(row), flush=True)
    finally:
        for p in procs:
            p.terminate()
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
    card = power.name if isinstance(power.name, str) else power.name.decode()
    a.out.write_text(json.dumps({"card": card, "max_tokens": a.max_tokens, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
