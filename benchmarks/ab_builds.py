"""Paired A/B of two builds of ``trtforge serve``: both up at once, windows alternated.

On a shared 2-core machine one server's throughput moves by ±15% from one window to the next (docs/
benchmarks.md §1c), so two builds measured one after the other differ by the machine's minute as
much as by their code. Here build A and build B (each a checkout with its own ``.venv``) serve the
same engine at the same time, pinned to the same cores, and the load generator alternates between
them window by window (A then B in odd rounds, B then A in even ones). Each round gives a paired
ratio B/A from two windows seconds apart; the median and the count of rounds where B is ahead are
the result. The idle build waits on its sockets meanwhile. Not part of ``make bench``.

    python -m benchmarks.ab_builds --a ../old-checkout --b . --point http:8 --rounds 8
    python -m benchmarks.ab_builds --a . --b . --env-b K=V --point grpc:32   # one build, two settings
    python -m benchmarks.ab_builds --a . --b . --flags-a='--gil-switch-interval-us 5000' --point grpc:32
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import (
    CACHE,
    free_ports,
    log,
    serve_cmd,
    start,
    stop,
    taskset,
    tree_cpu_seconds,
    wait_http_ok,
    write_result,
)
from benchmarks.engines import ensure_engine, store_dir
from benchmarks.loadgen import run_load
from benchmarks.models import io_names, model_file, sample_input


def round_order(round_index: int) -> tuple[str, str]:
    """Which build goes first in round `round_index` (0-based): A in even rounds, B in odd ones."""
    return ("A", "B") if round_index % 2 == 0 else ("B", "A")


def paired_summary(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> dict[str, Any]:
    """Round-by-round windows of A and B reduced to medians and the paired ratios B/A."""
    ratios = [y["throughput"] / max(x["throughput"], 1e-9) for x, y in zip(a, b, strict=True)]

    def med(rows: list[dict[str, Any]], key: str) -> float:
        return round(float(statistics.median(r[key] for r in rows)), 2)

    return {
        "rounds": len(ratios),
        "median_throughput": {"A": med(a, "throughput"), "B": med(b, "throughput")},
        "median_p99_ms": {"A": med(a, "p99_ms"), "B": med(b, "p99_ms")},
        "median_server_cpu_ms_per_request": {"A": med(a, "server_cpu_ms"), "B": med(b, "server_cpu_ms")},
        "ratio_b_over_a": {
            "median": round(float(statistics.median(ratios)), 3),
            "min": round(min(ratios), 3),
            "max": round(max(ratios), 3),
            "rounds_b_ahead": sum(r >= 1 for r in ratios),
        },
    }


@dataclass
class Build:
    name: str
    tree: Path
    port: int
    grpc_port: int
    proc: Any = None

    def url(self, protocol: str) -> str:
        if protocol == "grpc":
            return f"grpc://127.0.0.1:{self.grpc_port}"
        return f"http://127.0.0.1:{self.port}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--a", required=True, help="checkout of build A (its .venv/bin/trtforge serves)")
    p.add_argument("--b", required=True, help="checkout of build B")
    p.add_argument("--model", default="squeezenet")
    p.add_argument("--serve-flags", default="--instances 2 --max-batch-size 4 --max-queue-delay-us 2000")
    p.add_argument("--flags-a", default="", help="more `serve` flags for build A only")
    p.add_argument("--flags-b", default="", help="more `serve` flags for build B only")
    p.add_argument("--env", action="append", default=[], help="K=V for both servers (repeatable)")
    p.add_argument("--env-a", action="append", default=[], help="K=V for build A only (repeatable)")
    p.add_argument("--env-b", action="append", default=[], help="K=V for build B only (repeatable)")
    p.add_argument("--point", default="http:32", help="protocol:concurrency")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--cpus", default="0,1", help="servers and client share these (the shared layout)")
    p.add_argument("--name", default="ab-builds")
    a = p.parse_args(argv)
    protocol, _, conc = a.point.partition(":")
    if protocol not in ("http", "grpc") or not conc.isdigit():
        p.error(f"--point {a.point!r}: expected http:<concurrency> or grpc:<concurrency>")
    ports = free_ports(4)
    builds = {
        n: Build(n, Path(t).resolve(), ports[2 * i], ports[2 * i + 1])
        for i, (n, t) in enumerate((("A", a.a), ("B", a.b)))
    }
    for bld in builds.values():
        exe = bld.tree / ".venv" / "bin" / "trtforge"
        if not exe.exists():
            p.error(f"--{bld.name.lower()} {bld.tree}: no {exe} (make venv there first)")
    mfile = model_file(a.model)
    store = store_dir(a.model)
    key, _ = ensure_engine(mfile, store)
    in_name, out_name = io_names(mfile)
    for kv in (*a.env, *a.env_a, *a.env_b):
        if "=" not in kv:
            p.error(f"{kv!r}: expected K=V")
    env = {"TRTFORGE_GPU_PROBE": "none", **dict(kv.split("=", 1) for kv in a.env)}
    env_of = {
        "A": {**env, **dict(kv.split("=", 1) for kv in a.env_a)},
        "B": {**env, **dict(kv.split("=", 1) for kv in a.env_b)},
    }
    x = sample_input(1)
    samples: dict[str, list[dict[str, Any]]] = {"A": [], "B": []}
    try:
        for bld in builds.values():
            cmd = serve_cmd(
                str(store),
                key,
                a.model,
                bld.port,
                CACHE / f"ab-{bld.name}-{a.model}",
                "--grpc-port",
                str(bld.grpc_port),
                *a.serve_flags.split(),
                *(a.flags_a if bld.name == "A" else a.flags_b).split(),
                trtforge=[str(bld.tree / ".venv" / "bin" / "trtforge")],
            )
            bld.proc = start(taskset(a.cpus, cmd), CACHE / "logs" / f"ab-{bld.name}.log", env_of[bld.name])
        for bld in builds.values():
            wait_http_ok(f"{bld.url('http')}/v2/health/ready", timeout=240, proc=bld.proc)
        for r in range(a.rounds):
            for name in round_order(r):
                bld = builds[name]
                cpu0 = tree_cpu_seconds(bld.proc.pid)
                res, _ = run_load(
                    protocol, bld.url(protocol), a.model, in_name, out_name, x, int(conc), a.seconds, a.warmup
                )
                cpu1 = tree_cpu_seconds(bld.proc.pid)
                row = {
                    "round": r + 1,
                    "throughput": res.throughput,
                    "p99_ms": res.p99_ms,
                    "errors": res.errors,
                    "server_cpu_ms": 1000 * (cpu1 - cpu0) / max(1, res.completed),
                }
                samples[name].append(row)
            ra, rb = samples["A"][-1], samples["B"][-1]
            log(
                f"round {r + 1}: A {ra['throughput']:.1f} req/s (p99 {ra['p99_ms']:.0f})"
                f"  B {rb['throughput']:.1f} (p99 {rb['p99_ms']:.0f})"
                f"  B/A {rb['throughput'] / ra['throughput']:.3f}"
            )
    finally:
        for bld in builds.values():
            if bld.proc is not None:
                stop(bld.proc)
    summary = paired_summary(samples["A"], samples["B"])
    write_result(
        a.name,
        {
            "config": {**vars(a), "a": str(builds["A"].tree), "b": str(builds["B"].tree)},
            "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "summary": summary,
            "samples": samples,
        },
    )
    s = summary["ratio_b_over_a"]
    print(
        f"{a.point} [{a.serve_flags}] B/A median {s['median']} (min {s['min']}, max {s['max']}),"
        f" B ahead in {s['rounds_b_ahead']} of {summary['rounds']} rounds; medians"
        f" A {summary['median_throughput']['A']} B {summary['median_throughput']['B']} req/s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
