"""Where ``trtforge serve`` spends its time under load: a py-spy sample of every thread.

Starts the server on SqueezeNet (pinned like the serving benchmark's ``shared`` layout), drives it
with the benchmark's load generator at one concurrency, samples it with py-spy (installed into the
KServe venv by hand, ``.cache/bench-kserve-venv/bin/pip install py-spy``, or on PATH), and prints
the share of samples per thread and the hottest leaf frames. Not part of ``make bench``.

    python -m benchmarks.profile_serve --concurrency 32 --seconds 10 [--protocol grpc]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

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
from benchmarks.servers.venvs import KSERVE

RAW = ("--format", "raw", "-o")


def summarize(raw: Path, top: int) -> str:
    threads: Counter[str] = Counter()
    leaves: Counter[tuple[str, str]] = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, n_text = line.rsplit(" ", 1)
        n = int(n_text)
        frames = stack.split(";")
        name = frames[0].split(": ", 1)[-1]
        total += n
        threads[name] += n
        leaves[(name, frames[-1])] += n
    out = [f"{total} samples (idle threads not sampled)", "share  thread"]
    out += [f"{100 * n / total:5.1f}% {t}" for t, n in threads.most_common()]
    out += ["", "share  thread | leaf frame"]
    out += [f"{100 * n / total:5.1f}% {t} | {f}" for (t, f), n in leaves.most_common(top)]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="squeezenet")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--cpus", default=f"0-{(os.cpu_count() or 1) - 1}")
    p.add_argument("--serve-args", default="", help="extra `trtforge serve` arguments, e.g. '--instances 2'")
    p.add_argument("--top", type=int, default=20)
    p.add_argument("--protocol", choices=("http", "grpc"), default="http", help="what the load speaks")
    p.add_argument(
        "--gil", action="store_true", help="sample only the thread holding the GIL (where the CPU goes)"
    )
    a = p.parse_args(argv)
    pyspy = shutil.which("py-spy") or str(KSERVE.path / "bin" / "py-spy")
    if not Path(pyspy).exists():
        print("py-spy not found: .cache/bench-kserve-venv/bin/pip install py-spy", file=sys.stderr)
        return 2
    mfile = model_file(a.model)
    store = store_dir(a.model)
    key, _ = ensure_engine(mfile, store)
    port, grpc_port = free_ports(2)
    cmd = serve_cmd(
        str(store),
        key,
        a.model,
        port,
        CACHE / "profile-cache",
        "--grpc-port",
        str(grpc_port),
        *a.serve_args.split(),
        json_logs=False,
    )
    url = f"grpc://127.0.0.1:{grpc_port}" if a.protocol == "grpc" else f"http://127.0.0.1:{port}"
    srv = start(taskset(a.cpus, cmd), CACHE / "logs" / "profile-serve.log", {"TRTFORGE_GPU_PROBE": "none"})
    try:
        wait_http_ok(f"http://127.0.0.1:{port}/v2/health/ready", 300, srv, 0.1)
        in_name, out_name = io_names(mfile)
        load = subprocess.Popen(
            taskset(
                a.cpus,
                loadgen_cmd(
                    url,
                    a.model,
                    in_name,
                    out_name,
                    a.concurrency,
                    a.seconds + 2,
                    1,
                    "--protocol",
                    a.protocol,
                ),
            ),
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        time.sleep(1.5)
        raw = CACHE / "profile-serve.txt"
        subprocess.run(
            [
                pyspy,
                "record",
                "-p",
                str(srv.pid),
                "-d",
                str(int(a.seconds)),
                "-r",
                "200",
                "--threads",
                *(["--gil"] if a.gil else []),
                *RAW,
                str(raw),
            ],
            check=True,
            capture_output=True,
        )
        out, _ = load.communicate(timeout=a.seconds + 120)
    finally:
        stop(srv)
    res = json.loads(out.strip().splitlines()[-1])
    print(
        f"load: {res['throughput']} req/s, p50 {res['p50_ms']} ms, p99 {res['p99_ms']} ms"
        f" at concurrency {a.concurrency} over {a.protocol}"
    )
    print(summarize(raw, a.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
