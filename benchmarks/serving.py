"""Serving: ``trtforge serve`` against KServe's Python model server over the same ONNX Runtime session.

One run, one machine, one client. For each layout (which cores the server gets, which the client) and
each model: the backend's in-process ceiling on the server's cores, then each server in turn pinned
to those cores with the same ONNX Runtime threads, driven by the same closed-loop v2 client
(:mod:`benchmarks.loadgen`, binary tensors) at each concurrency. KServe is first tried in a few
settings on SqueezeNet at concurrency 32 and the best one is used for the full grid.

Layouts on a 2-core machine: ``shared`` — servers on cores 0-1 with 2 intra-op threads, the client on
the same cores (how the issue's reference numbers were taken); ``isolated`` — servers on core 1 with
1 thread, the client alone on core 0 (nothing but the server competes for the server's core).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import (
    CACHE,
    KSERVE_VENV,
    ROOT,
    TRTFORGE,
    free_port,
    log,
    start,
    stop,
    table,
    taskset,
    tree_cpu_seconds,
    tree_rss_bytes,
    wait_http_ok,
    write_result,
)
from benchmarks.engines import ensure_engine, store_dir
from benchmarks.loadgen import v2_decode, v2_request
from benchmarks.models import io_names, model_file, sample_input


@dataclass(frozen=True)
class Layout:
    name: str
    server_cpus: str
    client_cpus: str
    threads: int


def layouts() -> dict[str, Layout]:
    n = os.cpu_count() or 2
    allc = f"0-{n - 1}" if n > 1 else "0"
    return {
        "shared": Layout("shared", allc, allc, n),
        "isolated": Layout("isolated", "1-" + str(n - 1) if n > 2 else "1", "0", max(1, n - 1)),
    }


@dataclass(frozen=True)
class Setting:
    """One configuration of a server: extra arguments and how many ONNX Runtime threads each
    session gets (``divide``: the layout's threads divided among that many sessions)."""

    label: str
    args: tuple[str, ...]
    divide: int = 1

    def threads(self, lay: Layout) -> int:
        return max(1, lay.threads // self.divide)


# Tried on SqueezeNet at concurrency 32, the same way for both servers; the best one of each is used
# for the full grid. Sessions x threads never exceed the layout's cores except where the label says.
SETTINGS: dict[str, list[Setting]] = {
    "trtforge": [
        Setting("instances=1 (default), all threads", ()),
        Setting("instances=2, threads split", ("--instances", "2"), 2),
        Setting("instances=2, threads split, max batch 4", ("--instances", "2", "--max-batch-size", "4"), 2),
    ],
    "kserve": [
        Setting("workers=1, def predict (defaults)", ("--workers", "1", "--predict_mode", "sync")),
        Setting(
            "workers=1, predict in thread pool, no latency log",
            ("--workers", "1", "--predict_mode", "executor", "--enable_latency_logging", "false"),
        ),
        Setting(
            "workers=2, threads split, no latency log",
            ("--workers", "2", "--predict_mode", "sync", "--enable_latency_logging", "false"),
            2,
        ),
        Setting(
            "workers=2, all threads each, no latency log",
            ("--workers", "2", "--predict_mode", "sync", "--enable_latency_logging", "false"),
        ),
    ],
}


class Server:
    """A server process under test, pinned to the layout's server cores."""

    def __init__(self, kind: str, model: str, lay: Layout, log_dir: Path, setting: Setting) -> None:
        extra = list(setting.args)
        threads = str(setting.threads(lay))
        self.kind, self.model, self.lay = kind, model, lay
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        mfile = model_file(model)
        if kind == "trtforge":
            store = store_dir(model)
            key, self.publisher = ensure_engine(mfile, store)
            cache = CACHE / "serve-cache" / f"{model}-{self.port}"
            cmd = [
                *TRTFORGE,
                "--log-format",
                "json",
                "serve",
                "--store",
                str(store),
                "--engine",
                key,
                "--model-name",
                model,
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--cache-dir",
                str(cache),
                *extra,
            ]
            env = {"TRTFORGE_GPU_PROBE": "none", "TRTFORGE_ORT_THREADS": threads}
        else:
            cmd = [
                str(KSERVE_VENV / "bin" / "python"),
                str(ROOT / "benchmarks" / "kserve_server.py"),
                "--model_file",
                str(mfile),
                "--model_name",
                model,
                "--http_port",
                str(self.port),
                "--ort_threads",
                threads,
                *extra,
            ]
            env = {}
        self.cmd = taskset(lay.server_cpus, cmd)
        self.log_path = log_dir / f"{kind}-{model}-{lay.name}-{self.port}.log"
        self.proc = start(self.cmd, self.log_path, env)
        try:
            wait_http_ok(f"{self.url}/v2/models/{model}/ready", timeout=180, proc=self.proc, interval=0.1)
        except Exception:
            stop(self.proc)
            raise RuntimeError(f"{kind} did not become ready; see {self.log_path}") from None

    def metrics(self) -> dict[str, float]:
        if self.kind != "trtforge":
            return {}
        try:
            with urllib.request.urlopen(f"{self.url}/metrics", timeout=5) as r:
                text = r.read().decode()
        except OSError:
            return {}
        out: dict[str, float] = {}
        for name in (
            "trtforge_runtime_batch_size_sum",
            "trtforge_runtime_batch_size_count",
            "trtforge_runtime_compute_duration_seconds_sum",
            "trtforge_runtime_queue_duration_seconds_sum",
        ):
            m = re.search(rf"^{name}\{{[^}}]*\}} ([0-9.e+-]+)$", text, re.M)
            if m:
                out[name] = float(m.group(1))
        return out

    def close(self) -> None:
        stop(self.proc)


def check_output(srv: Server, in_name: str, out_name: str, reference: np.ndarray) -> float:
    body, headers = v2_request(in_name, out_name, sample_input(1))
    req = urllib.request.Request(f"{srv.url}/v2/models/{srv.model}/infer", data=body, headers=headers)
    with urllib.request.urlopen(req, timeout=60) as r:
        got = v2_decode(r.read(), r.headers.get("Inference-Header-Content-Length"), out_name)
    err = float(np.max(np.abs(got.reshape(reference.shape) - reference)))
    if err > 1e-4:
        raise RuntimeError(f"{srv.kind} answered {srv.model} with max abs error {err} against ONNX Runtime")
    return err


def load(srv: Server, lay: Layout, c: int, seconds: float, warmup: float) -> dict[str, Any]:
    in_name, out_name = io_names(model_file(srv.model))
    cmd = taskset(
        lay.client_cpus,
        [
            sys.executable,
            "-m",
            "benchmarks.loadgen",
            "--url",
            srv.url,
            "--model",
            srv.model,
            "--input",
            in_name,
            "--output",
            out_name,
            "--concurrency",
            str(c),
            "--seconds",
            str(seconds),
            "--warmup",
            str(warmup),
        ],
    )
    import subprocess

    m0 = srv.metrics()
    cpu0, t0 = tree_cpu_seconds(srv.proc.pid), time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=seconds + warmup + 300)
    cpu1, t1 = tree_cpu_seconds(srv.proc.pid), time.monotonic()
    m1 = srv.metrics()
    if r.returncode != 0:
        raise RuntimeError(f"load generator failed: {r.stderr[-2000:]}")
    res: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
    res["server_cpu_util"] = round((cpu1 - cpu0) / (t1 - t0), 3)
    res["server_rss_mb"] = round(tree_rss_bytes(srv.proc.pid) / 2**20, 1)
    if m0 and m1:
        nb = m1.get("trtforge_runtime_batch_size_count", 0) - m0.get("trtforge_runtime_batch_size_count", 0)
        rows = m1.get("trtforge_runtime_batch_size_sum", 0) - m0.get("trtforge_runtime_batch_size_sum", 0)
        comp = m1.get("trtforge_runtime_compute_duration_seconds_sum", 0) - m0.get(
            "trtforge_runtime_compute_duration_seconds_sum", 0
        )
        res["mean_batch"] = round(rows / nb, 2) if nb else None
        res["compute_share"] = round(comp / (t1 - t0), 3)  # wall fraction the backend was computing
    res.pop("error_samples", None) if not res.get("errors") else None
    return res


def ceiling(model: str, lay: Layout, seconds: float) -> dict[str, Any]:
    import subprocess

    cmd = taskset(
        lay.server_cpus,
        [
            sys.executable,
            "-m",
            "benchmarks.ceiling",
            "--model-file",
            str(model_file(model)),
            "--threads",
            str(lay.threads),
            "--seconds",
            str(seconds),
        ],
    )
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=900)
    if r.returncode != 0:
        raise RuntimeError(f"ceiling failed: {r.stderr[-2000:]}")
    res: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
    return res


def reference_output(model: str) -> np.ndarray:
    from benchmarks.ceiling import ort_session

    mfile = model_file(model)
    in_name, out_name = io_names(mfile)
    sess = ort_session(str(mfile), 1)
    (y,) = sess.run([out_name], {in_name: sample_input(1)})  # type: ignore[attr-defined]
    return np.asarray(y)


def sweep(kind: str, lay: Layout, seconds: float, warmup: float, log_dir: Path) -> list[dict[str, Any]]:
    out = []
    for st in SETTINGS[kind]:
        srv = Server(kind, "squeezenet", lay, log_dir, st)
        try:
            r = load(srv, lay, 32, seconds, warmup)
        finally:
            srv.close()
        log(f"  {kind} [{st.label}] c=32: {r['throughput']} req/s, p99 {r['p99_ms']} ms")
        out.append({"setting": st.label, "threads_per_session": st.threads(lay), **r})
    return out


def pick_best(sweep_results: list[dict[str, Any]], tie: float = 0.03) -> int:
    """The setting with the highest throughput; within `tie` of it, the one with the lowest p99."""
    top = max(float(r["throughput"]) for r in sweep_results)
    near = [i for i, r in enumerate(sweep_results) if float(r["throughput"]) >= (1 - tie) * top]
    return min(near, key=lambda i: float(sweep_results[i]["p99_ms"]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="squeezenet,resnet50")
    p.add_argument("--concurrency", default="1,8,32,64")
    p.add_argument("--layouts", default="shared,isolated")
    p.add_argument("--seconds", type=float, default=6.0, help="measuring window per point (SqueezeNet)")
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--slow-factor", type=float, default=2.0, help="window multiplier for ResNet-50")
    p.add_argument("--ceiling-seconds", type=float, default=2.0)
    p.add_argument("--no-sweep", action="store_true", help="both servers with their defaults only")
    p.add_argument("--name", default="serving", help="result file name")
    a = p.parse_args(argv)
    models = a.models.split(",")
    concs = [int(c) for c in a.concurrency.split(",")]
    log_dir = CACHE / "logs"
    all_layouts = layouts()
    results: dict[str, Any] = {"layouts": {}, "config": vars(a)}
    for lname in a.layouts.split(","):
        lay = all_layouts[lname]
        log(
            f"layout {lname}: servers on cpus {lay.server_cpus} ({lay.threads} threads),"
            f" client on {lay.client_cpus}"
        )
        lres: dict[str, Any] = {"layout": vars(lay), "models": {}, "sweeps": {}, "settings": {}}
        chosen: dict[str, Setting] = {}
        for kind in ("trtforge", "kserve"):
            if a.no_sweep:
                chosen[kind] = SETTINGS[kind][0]
                continue
            sw = sweep(kind, lay, a.seconds * 0.75, a.warmup, log_dir)
            lres["sweeps"][kind] = sw
            chosen[kind] = SETTINGS[kind][pick_best(sw)]
        lres["settings"] = {
            k: {"label": v.label, "threads_per_session": v.threads(lay)} for k, v in chosen.items()
        }
        for model in models:
            slow = a.slow_factor if model != "squeezenet" else 1.0
            secs, warm = a.seconds * slow, a.warmup * (2.5 if slow > 1 else 1)
            in_name, out_name = io_names(model_file(model))
            ref = reference_output(model)
            ceil = ceiling(model, lay, a.ceiling_seconds)
            log(f"  {model}: ceiling {ceil['best']['images_per_s']} img/s (batch {ceil['best']['batch']})")
            mres: dict[str, Any] = {"ceiling": ceil, "servers": {}}
            for kind in ("trtforge", "kserve"):
                srv = Server(kind, model, lay, log_dir, chosen[kind])
                points = []
                try:
                    err = check_output(srv, in_name, out_name, ref)
                    for c in concs:
                        r = load(srv, lay, c, secs, warm)
                        r["pct_of_ceiling"] = round(100 * r["throughput"] / ceil["best"]["images_per_s"], 1)
                        points.append(r)
                        log(
                            f"    {kind:8s} c={c:<3d} {r['throughput']:8.1f} req/s  p50 {r['p50_ms']:8.1f} ms"
                            f"  p99 {r['p99_ms']:8.1f} ms  errors {r['errors']}"
                            f"  server cpu {r['server_cpu_util']}  batch {r.get('mean_batch')}"
                        )
                finally:
                    srv.close()
                mres["servers"][kind] = {
                    "points": points,
                    "max_abs_error_vs_ort": err,
                    "setting": chosen[kind].label,
                    **({"publisher": srv.publisher} if kind == "trtforge" else {}),
                }
            lres["models"][model] = mres
        results["layouts"][lname] = lres
    summary = summarize(results)
    results["summary"] = summary
    write_result(a.name, results)
    print(render(results))
    return 0


def summarize(results: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for lname, lres in results["layouts"].items():
        s: dict[str, Any] = {}
        for model, m in lres["models"].items():
            tf = {p["concurrency"]: p for p in m["servers"]["trtforge"]["points"]}
            ks = {p["concurrency"]: p for p in m["servers"]["kserve"]["points"]}
            ms: dict[str, Any] = {}
            if 32 in tf and 32 in ks:
                ms["speedup_c32"] = round(tf[32]["throughput"] / max(ks[32]["throughput"], 1e-9), 1)
                ms["p99_lower_c32"] = tf[32]["p99_ms"] < ks[32]["p99_ms"]
            ks_default = next(iter((lres.get("sweeps") or {}).get("kserve") or []), None)
            if model == "squeezenet" and 32 in tf and ks_default:
                # KServe's defaults at the same point, from the sweep (taken in the same run)
                ms["speedup_c32_vs_kserve_defaults"] = round(
                    tf[32]["throughput"] / ks_default["throughput"], 1
                )
                ms["p99_lower_c32_vs_kserve_defaults"] = tf[32]["p99_ms"] < ks_default["p99_ms"]
            ge8 = [p["pct_of_ceiling"] for c, p in tf.items() if c >= 8]
            ms["min_pct_of_ceiling_c_ge_8"] = min(ge8) if ge8 else None
            s[model] = ms
        out[lname] = s
    return out


def render(results: dict[str, Any]) -> str:
    parts = []
    for lname, lres in results["layouts"].items():
        lay = lres["layout"]
        st = lres["settings"]
        parts.append(
            f"\nLayout {lname}: servers on cpus {lay['server_cpus']}"
            f" ({lay['threads']} ONNX Runtime threads in all), client on cpus {lay['client_cpus']}."
            f" trtforge: {st['trtforge']['label']} ({st['trtforge']['threads_per_session']} thread(s)"
            f" per session); KServe: {st['kserve']['label']} ({st['kserve']['threads_per_session']}"
            " thread(s) per session)."
        )
        sweep_rows = [
            [
                kind,
                r["setting"],
                r["threads_per_session"],
                r["throughput"],
                r["p50_ms"],
                r["p99_ms"],
                r["server_cpu_util"],
            ]
            for kind, sw in (lres.get("sweeps") or {}).items()
            for r in sw
        ]
        if sweep_rows:
            parts.append(
                table(
                    [
                        "server",
                        "setting (SqueezeNet, c=32)",
                        "threads/session",
                        "req/s",
                        "p50 ms",
                        "p99 ms",
                        "server CPU",
                    ],
                    sweep_rows,
                )
            )
            parts.append("")
        rows = []
        for model, m in lres["models"].items():
            ceil = m["ceiling"]["best"]["images_per_s"]
            ks = {p["concurrency"]: p for p in m["servers"]["kserve"]["points"]}
            for p in m["servers"]["trtforge"]["points"]:
                k = ks.get(p["concurrency"], {})
                rows.append(
                    [
                        model,
                        p["concurrency"],
                        p["throughput"],
                        p["p50_ms"],
                        p["p99_ms"],
                        f"{p['pct_of_ceiling']}%",
                        p.get("mean_batch"),
                        k.get("throughput"),
                        k.get("p50_ms"),
                        k.get("p99_ms"),
                        round(p["throughput"] / k["throughput"], 1) if k.get("throughput") else None,
                        ceil,
                    ]
                )
        parts.append(
            table(
                [
                    "model",
                    "conc",
                    "trtforge req/s",
                    "p50 ms",
                    "p99 ms",
                    "of ceiling",
                    "batch",
                    "KServe req/s",
                    "p50 ms",
                    "p99 ms",
                    "speed-up",
                    "ceiling img/s",
                ],
                rows,
            )
        )
    return "\n".join(parts)


if __name__ == "__main__":
    sys.exit(main())
