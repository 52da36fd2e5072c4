"""Many cores: does one ``trtforge serve`` pod use all of its cores?

For each N (default 2, 4, 8 and 14 on a 16-core host): the server is pinned to cores 0..N-1 and the
client to the rest. On the server's cores, first the backend's in-process ceiling (one session with
N threads, and N single-thread sessions side by side; the best images per second of either), then
``trtforge serve`` in each given setting, driven by :mod:`benchmarks.loadgen` at each concurrency,
with every answer compared with ONNX Runtime's own output for the same input (``--check``): an
answer that differs counts as an error. The client runs as several processes when it has the cores
for them, so the client is not what limits a fast server.

    python -m benchmarks.manycore --cores 2,4,8,14 --models squeezenet,resnet50

Settings (``--settings``, ``;``-separated): ``default`` runs ``trtforge serve`` with no tuning flags
(the runtime chooses for its cores: ``--workers auto``, one worker per 4 CPUs); anything else is
passed as flags, with each ``{expression}`` of ``n`` (N) replaced by its value, e.g.
``--workers {max(1, n // 4)} --max-batch-size 4``.

``--protocols http,grpc`` drives each point over each protocol in turn (HTTP binary alone by default).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.ceiling import run_pinned
from benchmarks.common import (
    CACHE,
    ROOT,
    free_port,
    loadgen_cmd,
    log,
    serve_cmd,
    start,
    stop,
    table,
    taskset,
    tree_cpu_seconds,
    wait_http_ok,
    write_result,
)
from benchmarks.engines import ensure_engine, store_dir
from benchmarks.loadgen import CLIENTS
from benchmarks.models import model_info, sample_input
from benchmarks.servers import Model
from benchmarks.servers.trtforge import grpc_supported


def expand(setting: str, n: int) -> str:
    """`setting` with each ``{expression}`` of `n` (the server's cores) replaced by its value, e.g.
    ``--workers {max(1, n // 4)}``."""
    return re.sub(
        r"\{([^{}]+)\}",
        lambda m: str(eval(m.group(1), {"__builtins__": {}}, {"n": n, "max": max, "min": min})),
        setting,
    )


def _ready_lines(log_path: Path) -> int:
    """How many runtimes (workers) of the server have logged that they are ready."""
    n = 0
    for line in log_path.read_text(errors="replace").splitlines():
        if line.startswith("{") and '"msg": "ready"' in line:
            n += 1
    return n


def without_defaults(flags: list[str]) -> list[str]:
    """`flags` without a ``--workers auto`` (the default), to tell which settings are the same server."""
    out: list[str] = []
    i = 0
    while i < len(flags):
        if flags[i : i + 2] == ["--workers", "auto"]:
            i += 2
            continue
        out.append(flags[i])
        i += 1
    return out


def reference(model: Model) -> Path:
    """ONNX Runtime's output for the load generator's input, saved for ``loadgen --check``."""
    from benchmarks.ceiling import ort_session

    sess = ort_session(str(model.file), 1)
    (y,) = sess.run([model.output], {model.input: sample_input(1)})  # type: ignore[attr-defined]
    path = CACHE / "manycore" / f"{model.name}-reference.npy"
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, np.asarray(y, dtype=np.float32))
    return path


def ceiling(model: Model, cpus: str, n: int, seconds: float, batches: str) -> dict[str, Any]:
    return run_pinned(model.file, cpus, n, seconds, batches)


def serve(
    model: Model, cpus: str, flags: list[str], log_path: Path
) -> tuple[subprocess.Popen[bytes], int, int | None, float]:
    """The server started and ready: its process, HTTP port, gRPC port (None: no gRPC), start-up s."""
    key, _ = ensure_engine(model.file, store_dir(model.name))
    port = free_port()
    cache = CACHE / "manycore" / f"cache-{port}"
    grpc_port = free_port() if grpc_supported() else None  # on, as by default
    grpc = ["--grpc-port", str(grpc_port)] if grpc_port is not None else []
    cmd = serve_cmd(str(store_dir(model.name)), key, model.name, port, cache, *grpc, *flags)
    t0 = time.monotonic()
    p = start(taskset(cpus, cmd), log_path, {"TRTFORGE_GPU_PROBE": "none"})
    try:
        wait_http_ok(
            f"http://127.0.0.1:{port}/v2/models/{model.name}/ready", timeout=300, proc=p, interval=0.05
        )
        # A connection stays with the worker that accepted it: load starts once every worker is ready
        # (the runtime's readiness waits for all of them; the log check covers older trees).
        workers = int(flags[flags.index("--workers") + 1]) if "--workers" in flags else 1
        deadline = time.monotonic() + 300
        while _ready_lines(log_path) < workers:
            if p.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{workers} workers never were all ready")
            time.sleep(0.05)
    except Exception:
        stop(p)
        raise RuntimeError(f"trtforge serve did not become ready; see {log_path}") from None
    return p, port, grpc_port, time.monotonic() - t0


def drive(
    model: Model,
    url: str,
    protocol: str,
    cpus: str,
    procs: int,
    c: int,
    seconds: float,
    warmup: float,
    ref: Path,
    pid: int,
    client: str = "native",
) -> dict[str, Any]:
    cmd = taskset(
        cpus,
        loadgen_cmd(
            url,
            model.name,
            model.input,
            model.output,
            c,
            seconds,
            warmup,
            "--procs",
            str(procs),
            "--check",
            str(ref),
            "--protocol",
            protocol,
            "--client",
            client,
        ),
    )
    cpu0, t0 = tree_cpu_seconds(pid), time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=seconds + warmup + 300)
    cpu1, t1 = tree_cpu_seconds(pid), time.monotonic()
    if r.returncode != 0:
        raise RuntimeError(f"load generator failed: {r.stderr[-2000:]}")
    res: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
    res["server_cpu_cores"] = round((cpu1 - cpu0) / (t1 - t0), 2)
    res["client_cpu_cores"] = round(res["client_cpu_s"] / max(res["seconds"], 1e-9), 2)
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cores", default="2,4,8,14", help="server core counts N (cores 0..N-1)")
    p.add_argument("--models", default="squeezenet,resnet50")
    p.add_argument("--settings", default="default", help="';'-separated trtforge serve flags, {n} = N")
    p.add_argument("--concurrency", default="auto", help="comma-separated, or auto: max(64, 8 N)")
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--slow-factor", type=float, default=1.6, help="window multiplier for ResNet-50")
    p.add_argument("--ceiling-seconds", type=float, default=1.0)
    p.add_argument("--ceiling-batches", default="1,4,8,16,32")
    p.add_argument("--protocols", default="http", help="comma-separated: http, grpc")
    p.add_argument("--name", default="manycore")
    p.add_argument(
        "--client", choices=CLIENTS, default="native", help="see benchmarks.loadgen (native needs cc)"
    )
    a = p.parse_args(argv)
    protocols = [x for x in a.protocols.split(",") if x]
    if not protocols or set(protocols) - {"http", "grpc"}:
        p.error(f"--protocols {a.protocols!r}: expected a comma-separated list of http and grpc")
    if "grpc" in protocols and not grpc_supported():
        p.error("--protocols grpc: this trtforge serve has no gRPC")
    total = os.cpu_count() or 1
    cores = [int(n) for n in a.cores.split(",")]
    if max(cores) >= total:
        raise SystemExit(f"--cores {a.cores}: the client needs at least one of this machine's {total} cores")
    settings = [s.strip() for s in a.settings.split(";") if s.strip()]
    log_dir = CACHE / "logs"
    res: dict[str, Any] = {
        "host_cpus": total,
        "config": vars(a),
        "loadavg_before": os.getloadavg(),
        "runs": [],
    }
    for name in a.models.split(","):
        model = model_info(name)
        ref = reference(model)
        slow = a.slow_factor if name != "squeezenet" else 1.0
        for n in cores:
            scpus, ccpus = f"0-{n - 1}", f"{n}-{total - 1}"
            procs = max(1, min(4, total - n))
            ceil = ceiling(model, scpus, n, a.ceiling_seconds * slow, a.ceiling_batches)
            best = float(ceil["best"]["images_per_s"])
            log(f"{name} N={n}: ceiling {best} img/s ({ceil['best']})")
            done: list[list[str]] = []
            for s in settings:
                flags = [] if s == "default" else shlex.split(expand(s, n))
                if without_defaults(flags) in done:
                    continue  # the same server as a setting already run on these N cores
                done.append(without_defaults(flags))
                try:
                    srv, port, grpc_port, ready_s = serve(
                        model, scpus, flags, log_dir / f"manycore-{name}-{n}.log"
                    )
                except RuntimeError as e:  # recorded; the other settings and core counts still run
                    log(f"  [{s}] FAILED: {e}")
                    res.setdefault("failed", []).append(
                        {"model": name, "n": n, "setting": s, "error": str(e)}
                    )
                    continue
                try:
                    concs = (
                        [max(64, 8 * n)]
                        if a.concurrency == "auto"
                        else [int(c) for c in a.concurrency.split(",")]
                    )
                    for c, proto in [(c, proto) for c in concs for proto in protocols]:
                        url = (
                            f"grpc://127.0.0.1:{grpc_port}" if proto == "grpc" else f"http://127.0.0.1:{port}"
                        )
                        try:
                            r = drive(
                                model,
                                url,
                                proto,
                                ccpus,
                                procs,
                                c,
                                a.seconds * slow,
                                a.warmup * slow,
                                ref,
                                srv.pid,
                                a.client,
                            )
                        except (RuntimeError, subprocess.TimeoutExpired) as e:
                            log(f"  [{s}] c={c} {proto} FAILED: {e}")
                            res.setdefault("failed", []).append(
                                {
                                    "model": name,
                                    "n": n,
                                    "setting": s,
                                    "concurrency": c,
                                    "protocol": proto,
                                    "error": str(e)[-2000:],
                                }
                            )
                            continue
                        r.pop("error_samples", None) if not r["errors"] else None
                        run = {
                            "model": name,
                            "n": n,
                            "server_cpus": scpus,
                            "client_cpus": ccpus,
                            "setting": s,
                            "ready_s": round(ready_s, 2),
                            "ceiling": ceil,
                            "pct_of_ceiling": round(100 * r["throughput"] / best, 1),
                            **r,
                        }
                        res["runs"].append(run)
                        log(
                            f"  [{s}] c={c} {proto}: {r['throughput']} req/s"
                            f" = {run['pct_of_ceiling']}% of ceiling,"
                            f" p99 {r['p99_ms']} ms, errors {r['errors']},"
                            f" server {r['server_cpu_cores']} cores, client {r['client_cpu_cores']} cores"
                        )
                finally:
                    stop(srv)
                    shutil.rmtree(CACHE / "manycore" / f"cache-{port}", ignore_errors=True)
                write_result(a.name, res)  # after every server run: a run cut short keeps what it measured
    res["loadavg_after"] = os.getloadavg()
    write_result(a.name, res)
    print(render(res))
    return 0


def render(res: dict[str, Any]) -> str:
    rows = [
        [
            r["model"],
            r["n"],
            r["setting"],
            r.get("protocol", "http"),
            r["concurrency"],
            r["ceiling"]["best"]["images_per_s"],
            r["throughput"],
            f"{r['pct_of_ceiling']}%",
            r["p50_ms"],
            r["p99_ms"],
            r["errors"],
            r["completed"],
            r["server_cpu_cores"],
            r["client_cpu_cores"],
        ]
        for r in res["runs"]
    ]
    invalid = res.get("invalid_runs") or []
    if invalid:
        fails_head = (
            f"\n\nNot valid, left out of the table ({len(invalid)} runs with "
            f"{', '.join(sorted({r['setting'] for r in invalid}))}): {invalid[0]['invalid']}."
            + "".join(f" {r['model']} N={r['n']} [{r['setting']}]: {r['throughput']} req/s;" for r in invalid)
        )
    else:
        fails_head = ""
    fails = fails_head + "".join(
        f"\n\nfailed: {f['model']} N={f['n']} [{f['setting']}]: {f['error'].strip().splitlines()[-1]}"
        for f in res.get("failed", [])
    )
    head = (
        f"Many cores: server on cores 0..N-1, client on the rest of {res['host_cpus']};"
        " every answer compared with ONNX Runtime's (a differing one counts as an error)."
    )
    return (
        head
        + "\n"
        + table(
            [
                "model",
                "N",
                "setting",
                "protocol",
                "conc",
                "ceiling img/s",
                "req/s",
                "of ceiling",
                "p50 ms",
                "p99 ms",
                "errors",
                "correct answers in window",
                "server cores busy",
                "client cores busy",
            ],
            rows,
        )
        + fails
    )


if __name__ == "__main__":
    sys.exit(main())
