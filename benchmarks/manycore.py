"""Many cores: does one ``trtforge serve`` pod use all of its cores?

For each N (default 2, 4, 8 and 14 on a 16-core host): the server is pinned to cores 0..N-1 and the
client to the rest. On the server's cores, first the backend's in-process ceiling (one session with
N threads, and N single-thread sessions side by side; the best images per second of either), then
``trtforge serve`` in each given setting, its answer over each protocol first compared with ONNX
Runtime's own output for the same input, then driven by Triton's ``perf_analyzer``
(:mod:`benchmarks.perf`) at each concurrency, on the cores the server does not use, so the client is
not what limits a fast server.

    python -m benchmarks.manycore --cores 2,4,8,14 --models squeezenet,resnet50

Settings (``--settings``, ``;``-separated): ``default`` runs ``trtforge serve`` with no tuning flags
(the runtime chooses for its cores: ``--workers auto``, one worker per 4 CPUs); anything else is
passed as flags, with each ``{expression}`` of ``n`` (N) replaced by its value, e.g.
``--workers {max(1, n // 4)} --max-batch-size 4``.

``--protocols http,grpc`` drives each point over each protocol in turn (HTTP binary alone by default).

Rounds (``--rounds``, 3 by default): this host's speed moves by 10-25% from one minute to the next, so
one window against one ceiling taken minutes earlier says as much about the minute as about the
server. Each round times the ceiling again at the full scan's best batch (on the server's cores, the
server up and idle), then drives each protocol once; each window is divided by its own round's
ceiling, and a point's published row is its median round by that share, with every round kept
beside it. While each window runs, every server
process's CPU is sampled every 0.25 s: per worker, its busy cores and its event loop's (the median of
the samples' rates, so the load generator's start-up does not dilute them).
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import perf
from benchmarks.ceiling import run_pinned
from benchmarks.common import (
    CACHE,
    CLK_TCK,
    cpu_ticks,
    descendants,
    free_ports,
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


def check_answers(model: Model, port: int, grpc_port: int | None, protocols: list[str]) -> None:
    """Raise unless the server's answer over each protocol matches ONNX Runtime's for the same input."""
    from benchmarks.serving import answer, reference_output

    ref = reference_output(model)
    for proto in protocols:
        address = f"127.0.0.1:{grpc_port if proto == 'grpc' else port}"
        got = answer(model, address, proto, sample_input(1))
        err = float(np.max(np.abs(got.reshape(ref.shape) - ref)))
        if err > 1e-4:
            raise RuntimeError(f"{model.name} over {proto}: max abs error {err} against ONNX Runtime")


def ceiling(model: Model, cpus: str, n: int, seconds: float, batches: str) -> dict[str, Any]:
    return run_pinned(model.file, cpus, n, seconds, batches)


def serve(
    model: Model, cpus: str, flags: list[str], log_path: Path
) -> tuple[subprocess.Popen[bytes], int, int | None, float]:
    """The server started and ready: its process, HTTP port, gRPC port (None: no gRPC), start-up s."""
    key, _ = ensure_engine(model.file, store_dir(model.name))
    port, maybe_grpc = free_ports(2)
    cache = CACHE / "manycore" / f"cache-{port}"
    grpc_port = maybe_grpc if grpc_supported() else None  # on, as by default
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


class CpuSampler:
    """Every server process's CPU (and its main thread's: a runtime's event loop) sampled every
    `interval` seconds on a thread of its own, from start() to stop()."""

    def __init__(self, pid: int, interval: float = 0.25) -> None:
        self.pids = descendants(pid)
        self.interval = interval
        self.samples: list[tuple[float, dict[int, tuple[int, int]]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)

    def _take(self) -> None:
        now: dict[int, tuple[int, int]] = {}
        for p in self.pids:
            proc, main = cpu_ticks(f"/proc/{p}/stat"), cpu_ticks(f"/proc/{p}/task/{p}/stat")
            if proc is not None and main is not None:
                now[p] = (proc, main)
        self.samples.append((time.monotonic(), now))

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._take()

    def start(self) -> None:
        self._take()
        self._thread.start()

    def stop(self) -> list[dict[str, Any]]:
        self._stop.set()
        self._thread.join()
        self._take()
        cpus = {}
        for p in self.pids:
            try:
                cpus[p] = len(os.sched_getaffinity(p))
            except OSError:
                cpus[p] = 0
        return busy_per_process(self.samples, cpus, CLK_TCK)


def busy_per_process(
    samples: list[tuple[float, dict[int, tuple[int, int]]]], cpus: dict[int, int], tick: float
) -> list[dict[str, Any]]:
    """Per process that did work: the cores it kept busy and its main thread's, each the median of
    the rates between consecutive samples (CPU ticks over seconds), so the idle seconds before the
    load arrives do not dilute them; busiest first. `cpus`: each process's allowed CPUs."""
    rates: dict[int, tuple[list[float], list[float]]] = {}
    for (t0, a), (t1, b) in itertools.pairwise(samples):
        dt = t1 - t0
        if dt <= 0:
            continue
        for p, (proc1, main1) in b.items():
            if p in a:
                proc0, main0 = a[p]
                r = rates.setdefault(p, ([], []))
                r[0].append((proc1 - proc0) / tick / dt)
                r[1].append((main1 - main0) / tick / dt)
    out = [
        {
            "pid": p,
            "cpus": cpus.get(p, 0),
            "busy_cores": round(statistics.median(procs), 2),
            "loop_cores": round(statistics.median(mains), 2),
        }
        for p, (procs, mains) in rates.items()
        if max(procs) > 0
    ]
    return sorted(out, key=lambda w: -w["busy_cores"])


def median_round(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """One point's rounds (each with ``pct_of_round_ceiling``) as its published row: the median round
    (the lower middle of an even count), with the rounds' essentials under ``rounds`` and the median,
    min and max of their shares of their own round's ceiling."""
    if not rounds:
        raise ValueError("a point needs at least one round")
    ordered = sorted(rounds, key=lambda r: r["pct_of_round_ceiling"])
    mid = ordered[(len(ordered) - 1) // 2]
    shares = [r["pct_of_round_ceiling"] for r in rounds]
    keep = (
        "round",
        "throughput",
        "round_ceiling",
        "pct_of_round_ceiling",
        "p99_ms",
        "errors",
        "server_cores_loaded",
    )
    return {
        **mid,
        "errors": sum(r["errors"] for r in rounds),
        "round_shares": {"median": mid["pct_of_round_ceiling"], "min": min(shares), "max": max(shares)},
        "rounds": [{k: r.get(k) for k in keep} for r in rounds],
    }


def drive(
    model: Model,
    address: str,
    protocol: str,
    cpus: str,
    c: int,
    windows: perf.Windows,
    data: Path,
    pid: int,
) -> dict[str, Any]:
    """One perf_analyzer point pinned to `cpus`, with the server's CPU sampled while it runs."""
    report = CACHE / "manycore" / f"perf-{model.name}-{protocol}-{c}.csv"
    report.parent.mkdir(parents=True, exist_ok=True)
    cmd = taskset(cpus, perf.command(address, protocol, model.name, c, windows, report, data))
    sampler = CpuSampler(pid)
    cpu0, t0 = tree_cpu_seconds(pid), time.monotonic()
    client0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    sampler.start()
    try:
        pt = perf.measure(cmd, report, windows.max_trials * windows.interval_ms / 1000 * 2 + 120)
    finally:
        workers = sampler.stop()
    client1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu1, t1 = tree_cpu_seconds(pid), time.monotonic()
    client_s = (client1.ru_utime + client1.ru_stime) - (client0.ru_utime + client0.ru_stime)
    return {
        "concurrency": c,
        "protocol": protocol,
        **pt.as_dict(),
        "errors": 0,  # perf_analyzer stops at a failed request: a point with errors is a failed point
        "server_cpu_cores": round((cpu1 - cpu0) / (t1 - t0), 2),  # over the whole run, trials included
        "server_cores_loaded": round(sum(w["busy_cores"] for w in workers), 2),
        "workers": workers,
        "client_cpu_cores": round(client_s / (t1 - t0), 2),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cores", default="2,4,8,14", help="server core counts N (cores 0..N-1)")
    p.add_argument("--models", default="squeezenet,resnet50")
    p.add_argument("--settings", default="default", help="';'-separated trtforge serve flags, {n} = N")
    p.add_argument("--concurrency", default="auto", help="comma-separated, or auto: max(64, 8 N)")
    p.add_argument("--seconds", type=float, default=5.0, help="perf_analyzer's measurement window")
    p.add_argument("--stability", type=int, default=10, help="perf_analyzer --stability-percentage")
    p.add_argument("--max-trials", type=int, default=10, help="perf_analyzer --max-trials")
    p.add_argument("--slow-factor", type=float, default=1.6, help="window multiplier for ResNet-50")
    p.add_argument("--ceiling-seconds", type=float, default=1.0)
    p.add_argument("--ceiling-batches", default="1,4,8,16,32")
    p.add_argument(
        "--rounds", type=int, default=3, help="windows per point, each against a ceiling timed just before"
    )
    p.add_argument("--protocols", default="http", help="comma-separated: http, grpc")
    p.add_argument("--name", default="manycore")
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
        slow = a.slow_factor if name != "squeezenet" else 1.0
        windows = perf.Windows(int(a.seconds * slow * 1000), a.stability, a.max_trials)
        data = perf.input_file(CACHE / "manycore" / f"{name}-input.json", model.input, sample_input(1))
        for n in cores:
            scpus, ccpus = f"0-{n - 1}", f"{n}-{total - 1}"
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
                    check_answers(model, port, grpc_port, protocols)
                    concs = (
                        [max(64, 8 * n)]
                        if a.concurrency == "auto"
                        else [int(c) for c in a.concurrency.split(",")]
                    )
                    points = [(c, proto) for c in concs for proto in protocols]
                    done_rounds: dict[tuple[int, str], list[dict[str, Any]]] = {pt: [] for pt in points}
                    for rnd in range(1, a.rounds + 1):
                        rc = ceiling(model, scpus, n, a.ceiling_seconds * slow, str(ceil["best"]["batch"]))
                        rceil = float(rc["best"]["images_per_s"])
                        log(f"  [{s}] round {rnd}/{a.rounds}: ceiling {rceil} img/s ({rc['best']})")
                        for c, proto in points:
                            address = f"127.0.0.1:{grpc_port if proto == 'grpc' else port}"
                            try:
                                r = drive(model, address, proto, ccpus, c, windows, data, srv.pid)
                            except perf.PerfError as e:
                                log(f"  [{s}] c={c} {proto} round {rnd} FAILED: {e}")
                                res.setdefault("failed", []).append(
                                    {
                                        "model": name,
                                        "n": n,
                                        "setting": s,
                                        "concurrency": c,
                                        "protocol": proto,
                                        "round": rnd,
                                        "error": str(e)[-2000:],
                                    }
                                )
                                continue
                            run = {
                                "model": name,
                                "n": n,
                                "server_cpus": scpus,
                                "client_cpus": ccpus,
                                "setting": s,
                                "ready_s": round(ready_s, 2),
                                "ceiling": ceil,
                                "pct_of_ceiling": round(100 * r["throughput"] / best, 1),
                                "round": rnd,
                                "round_ceiling": rceil,
                                "pct_of_round_ceiling": round(100 * r["throughput"] / rceil, 1),
                                **r,
                            }
                            done_rounds[(c, proto)].append(run)
                            busy = ", ".join(
                                f"{w['busy_cores']}/{w['cpus']} (loop {w['loop_cores']})"
                                for w in r["workers"]
                            )
                            log(
                                f"  [{s}] c={c} {proto} round {rnd}: {r['throughput']} req/s"
                                f" = {run['pct_of_round_ceiling']}% of the round's ceiling"
                                f" ({run['pct_of_ceiling']}% of the scan's), p99 {r['p99_ms']} ms,"
                                f" server {r['server_cores_loaded']} cores loaded"
                                f" [per process: {busy}], client {r['client_cpu_cores']} cores"
                            )
                    res["runs"] += [median_round(rs) for rs in done_rounds.values() if rs]
                finally:
                    stop(srv)
                    shutil.rmtree(CACHE / "manycore" / f"cache-{port}", ignore_errors=True)
                write_result(a.name, res)  # after every server run: a run cut short keeps what it measured
    res["loadavg_after"] = os.getloadavg()
    write_result(a.name, res)
    print(render(res))
    return 0


_POINT_HEADERS = ("model", "N", "setting", "protocol", "conc")


def _point(r: dict[str, Any]) -> list[Any]:
    """The columns that name a row's point (:data:`_POINT_HEADERS`)."""
    return [r["model"], r["n"], r["setting"], r.get("protocol", "http"), r["concurrency"]]


def _per_process(r: dict[str, Any]) -> str:
    """`r`'s server processes as busy cores / allowed CPUs, busiest first (the idle supervisor left out)."""
    busy = [w for w in r.get("workers", []) if w["busy_cores"] >= 0.05]
    return ", ".join(f"{w['busy_cores']}/{w['cpus']}" for w in busy)


def render(res: dict[str, Any]) -> str:
    rounds = any("round_shares" in r for r in res["runs"])
    if rounds:
        headers = [
            *_POINT_HEADERS,
            "scan's ceiling img/s",
            "rounds' ceilings img/s",
            "req/s (median round)",
            "of the scan's ceiling",
            "of its round's ceiling, median (min-max)",
            "p99 ms",
            "errors, all rounds",
            "server cores loaded (per process)",
            "client cores busy",
        ]
        rows = [
            [
                *_point(r),
                r["ceiling"]["best"]["images_per_s"],
                " / ".join(f"{x['round_ceiling']:g}" for x in r["rounds"]),
                r["throughput"],
                f"{r['pct_of_ceiling']}%",
                "**{median}%** ({min}-{max}%)".format(**r["round_shares"]),
                r["p99_ms"],
                r["errors"],
                f"{r['server_cores_loaded']} ({_per_process(r)})",
                r["client_cpu_cores"],
            ]
            for r in res["runs"]
        ]
    else:
        headers = [
            *_POINT_HEADERS,
            "ceiling img/s",
            "req/s",
            "of ceiling",
            "p50 ms",
            "p99 ms",
            "errors",
            "server cores busy",
            "client cores busy",
        ]
        rows = [
            [
                *_point(r),
                r["ceiling"]["best"]["images_per_s"],
                r["throughput"],
                f"{r['pct_of_ceiling']}%",
                r["p50_ms"],
                r["p99_ms"],
                r["errors"],
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
    client = res["config"].get("client")  # set only where the harness's own clients drove the load
    head = f"Many cores: server on cores 0..N-1, client on the rest of {res['host_cpus']}; " + (
        f"load from the harness's own {client} clients, every answer compared with ONNX Runtime's."
        if client
        else "load from perf_analyzer, each server's answers compared with ONNX Runtime's before it."
    )
    if rounds:
        head += (
            f" {res['config']['rounds']} rounds per point, each window against the ceiling timed just"
            " before it at the scan's best batch; the row is the median round by that share."
        )
    return (
        head
        + "\n"
        + table(
            headers,
            rows,
        )
        + fails
    )


if __name__ == "__main__":
    sys.exit(main())
