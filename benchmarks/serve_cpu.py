"""Server CPU seconds per request of ``trtforge serve``, robust to a shared machine.

Starts the server on a model (SqueezeNet by default) pinned like the serving benchmark's ``shared``
layout, drives it with the benchmark's load generator at each concurrency, and reads the server
process's CPU time (all threads, from /proc) and its ``requests_total`` before and after each run:
their ratio is the server's CPU per request (and the event loop's: its main thread's), which other
processes' load changes far less than throughput. Also prints throughput as a share of the in-process
ceiling measured in the same run, and the 1-minute load average. ``--env K=V`` (repeatable) sets
server environment variables, e.g. ``TRTFORGE_HTTP_FAST_PATH=0`` to measure the aiohttp path alone.
``--protocols http,grpc`` measures both protocols of one server in turn (HTTP binary, then gRPC with
raw contents), so their costs per request are compared in the same minutes. Not part of ``make bench``.

    python -m benchmarks.serve_cpu --concurrency 8,32 --seconds 10 --repeat 2 --protocols http,grpc
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from benchmarks.ceiling import run_pinned
from benchmarks.common import (
    CACHE,
    ROOT,
    free_ports,
    loadgen_cmd,
    serve_cmd,
    start,
    stop,
    taskset,
    wait_http_ok,
)
from benchmarks.engines import ensure_engine, store_dir
from benchmarks.models import io_names, model_file

_TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(stat: Path) -> float:
    """User + system CPU seconds so far from a /proc stat file (a process's: all its threads)."""
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def process_cpu_s(pid: int) -> tuple[float, float]:
    """CPU seconds of the whole process and of its main thread (the event loop)."""
    return cpu_s(Path(f"/proc/{pid}/stat")), cpu_s(Path(f"/proc/{pid}/task/{pid}/stat"))


def requests_done(port: int) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return sum(
        float(m.group(1))
        for m in re.finditer(r"^trtforge_runtime_requests_total\{[^}]*\} (\S+)$", text, re.M)
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="squeezenet")
    p.add_argument("--concurrency", default="8,32")
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--cpus", default=f"0-{(os.cpu_count() or 1) - 1}")
    p.add_argument("--serve-args", default="")
    p.add_argument("--env", action="append", default=[], help="K=V for the server (repeatable)")
    p.add_argument("--protocols", default="http", help="comma-separated: http, grpc")
    p.add_argument("--no-ceiling", action="store_true")
    a = p.parse_args(argv)
    mfile = model_file(a.model)
    store = store_dir(a.model)
    key, _ = ensure_engine(mfile, store)
    in_name, out_name = io_names(mfile)
    ceiling = None
    if not a.no_ceiling:
        threads = len(os.sched_getaffinity(0))
        ceiling = float(run_pinned(mfile, a.cpus, threads, 0.5, "1,2,4,8,16,32")["best"]["images_per_s"])
    protocols = a.protocols.split(",")
    port, grpc_port = free_ports(2)
    cache = CACHE / "serve-cpu-cache"
    grpc_flags = ["--grpc-port", str(grpc_port)] if "grpc" in protocols else ["--no-grpc"]
    cmd = serve_cmd(
        str(store), key, a.model, port, cache, *grpc_flags, *a.serve_args.split(), json_logs=False
    )
    env = {"TRTFORGE_GPU_PROBE": "none", **dict(kv.split("=", 1) for kv in a.env)}
    srv = start(taskset(a.cpus, cmd), CACHE / "logs" / "serve-cpu.log", env)
    rows = []
    try:
        wait_http_ok(f"http://127.0.0.1:{port}/v2/health/ready", 300, srv, 0.1)
        time.sleep(2.0)  # the solo instance loads after ready
        for _ in range(a.repeat):
            for c, protocol in [(int(x), pr) for x in a.concurrency.split(",") for pr in protocols]:
                url = f"grpc://127.0.0.1:{grpc_port}" if protocol == "grpc" else f"http://127.0.0.1:{port}"
                n0, (cpu0, loop0) = requests_done(port), process_cpu_s(srv.pid)
                out = subprocess.run(
                    taskset(
                        a.cpus,
                        loadgen_cmd(url, a.model, in_name, out_name, c, a.seconds, 1, "--protocol", protocol),
                    ),
                    capture_output=True,
                    text=True,
                    cwd=ROOT,
                    check=True,
                ).stdout
                (cpu1, loop1), n1 = process_cpu_s(srv.pid), requests_done(port)
                res = json.loads(out.strip().splitlines()[-1])
                row = {
                    "protocol": protocol,
                    "concurrency": c,
                    "requests": int(n1 - n0),
                    "server_cpu_ms_per_request": round(1000 * (cpu1 - cpu0) / max(1.0, n1 - n0), 3),
                    "loop_cpu_ms_per_request": round(1000 * (loop1 - loop0) / max(1.0, n1 - n0), 3),
                    "client_cpu_ms_per_request": round(
                        1000 * res["client_cpu_s"] / max(1, res["completed"]), 3
                    ),
                    "throughput": res["throughput"],
                    "pct_of_ceiling": round(100 * res["throughput"] / ceiling, 1) if ceiling else None,
                    "errors": res.get("errors"),
                    "load1": os.getloadavg()[0],
                }
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        stop(srv)
    print(json.dumps({"model": a.model, "ceiling_images_per_s": ceiling, "env": a.env, "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
