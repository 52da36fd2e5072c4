"""Serving: ``trtforge serve`` against Triton, MLServer and KServe, all driven by ``perf_analyzer``.

One run, one machine. For each model: ONNX Runtime's in-process ceiling on the servers' cores
(:mod:`benchmarks.ceiling`), then each server in turn, pinned to those cores, in its setting
(:mod:`benchmarks.servers`), with the same ONNX Runtime session settings everywhere. Before any load,
each server's answer over each protocol is checked against ONNX Runtime run directly (through
``tritonclient``). Then Triton's ``perf_analyzer`` (:mod:`benchmarks.perf`) drives it in concurrency
mode at each concurrency over each protocol the server has: HTTP with binary tensors, gRPC, and HTTP
with JSON tensors where a server has no binary HTTP (MLServer). perf_analyzer's own windows and
stability rule decide when a point is measured; a point that does not settle is reported as failed.

Each point's throughput is set against the ceiling; at each concurrency trtforge's best protocol is
set against the best of Triton and MLServer (:func:`verdict`).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import perf
from benchmarks.ceiling import run_pinned
from benchmarks.common import (
    CACHE,
    free_ports,
    log,
    start,
    stop,
    table,
    taskset,
    tree_cpu_seconds,
    wait_http_ok,
    write_result,
)
from benchmarks.models import model_info, sample_input
from benchmarks.servers import Kind, Launch, Model, Setting, venvs

KINDS = ("trtforge", "triton", "mlserver", "kserve")


def kinds() -> dict[str, Kind]:
    """The servers by name: trtforge serve and its peers (benchmarks/servers/)."""
    from benchmarks.servers import kserve, mlserver, triton, trtforge

    return {k.name: k for k in (trtforge.KIND, triton.KIND, mlserver.KIND, kserve.KIND)}


PEERS_TO_BEAT = ("triton", "mlserver")
PROTOCOL_TITLES = {"http": "HTTP binary", "grpc": "gRPC", "json": "HTTP JSON"}
SHARED_MACHINE_NOTE = (
    "Measured on a 2-core virtual machine shared with other work (test suites running beside the"
    " benchmark): the servers, perf_analyzer and that work compete for the same two cores, so the"
    " absolute rates are low and move from one minute to the next; the comparison is of servers"
    " measured minutes apart on the same machine."
)


class Server:
    """A server process under test, pinned to `cpus`, ready when constructed."""

    def __init__(self, kind: Kind, model: Model, setting: Setting, cpus: str, log_dir: Path) -> None:
        self.kind, self.model, self.setting = kind.name, model, setting
        work = CACHE / "servers"
        work.mkdir(parents=True, exist_ok=True)
        self.launch: Launch = kind.launch(model, setting, *free_ports(2), work)
        self.http = f"127.0.0.1:{self.launch.http_port}"
        self.log_path = log_dir / f"{kind.name}-{model.name}-{self.launch.http_port}.log"
        t0 = time.monotonic()
        self.proc = start(taskset(cpus, self.launch.cmd), self.log_path, self.launch.env)
        try:
            wait_http_ok(
                f"http://{self.http}/v2/models/{model.name}/ready", timeout=240, proc=self.proc, interval=0.1
            )
            if self.launch.grpc_port is not None:
                _wait_grpc_ready(self.address("grpc"), model.name, self.proc)
        except Exception as e:
            self.close()
            raise RuntimeError(f"{kind.name} did not become ready ({e}); see {self.log_path}") from None
        self.ready_s = round(time.monotonic() - t0, 2)

    @property
    def protocols(self) -> tuple[str, ...]:
        return self.launch.protocols

    def address(self, protocol: str) -> str:
        return f"127.0.0.1:{self.launch.grpc_port}" if protocol == "grpc" else self.http

    def close(self) -> None:
        stop(self.proc)
        for p in self.launch.cleanup:
            shutil.rmtree(p, ignore_errors=True)


def _wait_grpc_ready(address: str, model: str, proc: subprocess.Popen[bytes], timeout: float = 120) -> None:
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(address)
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                if client.is_model_ready(model):
                    return
            except Exception:
                pass
            if proc.poll() is not None:
                raise RuntimeError(f"exited with {proc.returncode}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"gRPC {address} not ready after {timeout:.0f}s")
            time.sleep(0.1)
    finally:
        client.close()


# --- answers ------------------------------------------------------------------------------------------
def answer(m: Model, address: str, protocol: str, x: np.ndarray) -> np.ndarray:
    """The output for `x` of the server at `address` (host:port of `protocol`), through
    ``tritonclient``: HTTP with binary tensors (``http``) or JSON ones (``json``), or gRPC."""
    got: np.ndarray | None
    if protocol == "grpc":
        import tritonclient.grpc as grpcclient

        gclient = grpcclient.InferenceServerClient(address)
        try:
            ginp = grpcclient.InferInput(m.input, list(x.shape), "FP32")
            ginp.set_data_from_numpy(x)
            res = gclient.infer(m.name, [ginp], outputs=[grpcclient.InferRequestedOutput(m.output)])
            got = res.as_numpy(m.output)
        finally:
            gclient.close()
    else:
        import tritonclient.http as httpclient

        binary = protocol == "http"
        hclient = httpclient.InferenceServerClient(address, network_timeout=120)
        try:
            hinp = httpclient.InferInput(m.input, list(x.shape), "FP32")
            hinp.set_data_from_numpy(x, binary_data=binary)
            out = httpclient.InferRequestedOutput(m.output, binary_data=binary)
            got = hclient.infer(m.name, [hinp], outputs=[out]).as_numpy(m.output)
        finally:
            hclient.close()
    if got is None or got.size == 0:
        raise RuntimeError(f"{address} answered {protocol} with no contents for {m.output!r}")
    return np.asarray(got)


def check_answers(srv: Server, reference: np.ndarray) -> dict[str, float]:
    """Max abs error against ONNX Runtime for each protocol; raises when one is off."""
    errs = {}
    for protocol in srv.protocols:
        got = answer(srv.model, srv.address(protocol), protocol, sample_input(1))
        err = float(np.max(np.abs(got.reshape(reference.shape) - reference)))
        if err > 1e-4:
            raise RuntimeError(
                f"{srv.kind} answered {srv.model.name} over {protocol} with max abs error {err}"
                " against ONNX Runtime run directly"
            )
        errs[protocol] = err
    return errs


def reference_output(model: Model) -> np.ndarray:
    from benchmarks.ceiling import ort_session

    sess = ort_session(str(model.file), 1)
    (y,) = sess.run([model.output], {model.input: sample_input(1)})  # type: ignore[attr-defined]
    return np.asarray(y)


# --- load -------------------------------------------------------------------------------------------
def load(
    srv: Server, protocol: str, c: int, windows: perf.Windows, data: Path, client_cpus: str
) -> dict[str, Any]:
    """One perf_analyzer point, with the server's CPU use over the whole run (its trials included)."""
    report = CACHE / "perf" / f"{srv.kind}-{srv.model.name}-{protocol}-{c}.csv"
    report.parent.mkdir(parents=True, exist_ok=True)
    cmd = perf.command(
        srv.address(protocol),
        "grpc" if protocol == "grpc" else "http",
        srv.model.name,
        c,
        windows,
        report,
        data,
        json_tensors=protocol == "json",
    )
    cpu0, t0 = tree_cpu_seconds(srv.proc.pid), time.monotonic()
    # The longest run: every trial at the window's length, plus the time to drain c requests.
    timeout = windows.max_trials * windows.interval_ms / 1000 * 2 + 120
    pt = perf.measure(taskset(client_cpus, cmd), report, timeout)
    cpu1, t1 = tree_cpu_seconds(srv.proc.pid), time.monotonic()
    return {
        "protocol": protocol,
        **pt.as_dict(),
        "run_s": round(t1 - t0, 1),
        "server_cpu_util": round((cpu1 - cpu0) / (t1 - t0), 3),
    }


def measure_server(
    kind: Kind,
    model: Model,
    concs: list[int],
    windows: perf.Windows,
    ref: np.ndarray,
    data: Path,
    cpus: str,
    threads: int,
    log_dir: Path,
) -> dict[str, Any]:
    """The server in its setting: answers checked, then every concurrency over every protocol."""
    setting = kind.setting(threads)
    srv = Server(kind, model, setting, cpus, log_dir)
    points: list[dict[str, Any]] = []
    failed: list[dict[str, Any]] = []
    try:
        answers = check_answers(srv, ref)
        for protocol in srv.protocols:
            for c in concs:
                try:
                    r = load(srv, protocol, c, windows, data, cpus)
                except perf.PerfError as e:
                    log(f"    {kind.name:8s} {protocol:4s} c={c:<3d} FAILED: {e}")
                    failed.append(
                        {
                            "protocol": protocol,
                            "concurrency": c,
                            "unstable": e.unstable,
                            "error": str(e)[-1500:],
                        }
                    )
                    continue
                points.append(r)
                log(
                    f"    {kind.name:8s} {protocol:4s} c={c:<3d} {r['throughput']:8.1f} infer/s"
                    f"  p50 {r['p50_ms']:8.1f}  p99 {r['p99_ms']:8.1f} ms  cpu {r['server_cpu_util']}"
                    f"  ({r['run_s']}s)"
                )
    finally:
        srv.close()
    return {
        "title": kind.title,
        "versions": kind.version(),
        "setting": setting.as_dict(),
        "ready_s": srv.ready_s,
        "answers_max_abs_error": answers,
        "points": points,
        "failed_points": failed,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="squeezenet,resnet50")
    p.add_argument("--servers", default=",".join(KINDS))
    p.add_argument("--concurrency", default="1,8,32")
    p.add_argument("--interval-ms", type=int, default=3000, help="perf_analyzer's window (SqueezeNet)")
    p.add_argument("--slow-factor", type=float, default=2.5, help="window multiplier for ResNet-50")
    p.add_argument("--stability", type=int, default=10, help="perf_analyzer --stability-percentage")
    p.add_argument("--max-trials", type=int, default=10, help="perf_analyzer --max-trials")
    p.add_argument("--ceiling-seconds", type=float, default=0.5, help="each batch size's in-process timing")
    p.add_argument("--ceiling-batches", default="1,2,4,8,16,32")
    p.add_argument("--note", default=SHARED_MACHINE_NOTE, help="what the result says about the machine")
    p.add_argument("--name", default="serving", help="result file name")
    a = p.parse_args(argv)
    concs = sorted({int(c) for c in a.concurrency.split(",")})
    cpus_list = sorted(os.sched_getaffinity(0))
    cpus, threads = ",".join(map(str, cpus_list)), len(cpus_list)
    all_kinds = kinds()
    servers = [all_kinds[k] for k in a.servers.split(",")]
    log_dir = CACHE / "logs"
    perf.PERF_ANALYZER.ensure()
    results: dict[str, Any] = {
        "note": a.note,
        "cpus": cpus,
        "load_generator": {
            "tool": "perf_analyzer",
            "tritonclient": perf.version(),
            "mode": "concurrency, one run per point, batch 1",
            "stability_percentage": a.stability,
            "max_trials": a.max_trials,
        },
        "config": vars(a),
        "peer_versions": venvs.peer_versions(),
        "loadavg_before": os.getloadavg(),
        "models": {},
    }
    t_begin = time.monotonic()
    for name in a.models.split(","):
        model = model_info(name)
        slow = a.slow_factor if name != "squeezenet" else 1.0
        windows = perf.Windows(int(a.interval_ms * slow), a.stability, a.max_trials)
        ceil = run_pinned(model.file, cpus, threads, a.ceiling_seconds * slow, a.ceiling_batches)
        log(f"  {name}: ceiling {ceil['best']['images_per_s']} img/s ({ceil['best']})")
        data = perf.input_file(CACHE / "perf" / f"{name}-input.json", model.input, sample_input(1))
        ref = reference_output(model)
        mres: dict[str, Any] = {"ceiling": ceil, "interval_ms": windows.interval_ms, "servers": {}}
        results["models"][name] = mres
        for kind in servers:
            t0 = time.monotonic()
            try:
                mres["servers"][kind.name] = measure_server(
                    kind, model, concs, windows, ref, data, cpus, threads, log_dir
                )
            except Exception as e:  # one server failing must not lose the others' results
                log(f"  {name} {kind.name} FAILED: {e}")
                results.setdefault("failed", {}).setdefault(name, {})[kind.name] = str(e)[-2000:]
            log(f"  {name} {kind.name}: {time.monotonic() - t0:.0f}s")
            ceil_pct(mres)
            partial = {**results, "partial": True, "loadavg_after": os.getloadavg()}
            partial["summary"] = summarize(partial)
            write_result(a.name, partial)
        # timed again after the servers: how far the machine's speed moved while they ran
        after = run_pinned(model.file, cpus, threads, a.ceiling_seconds * slow, a.ceiling_batches)
        mres["ceiling_after"] = after["best"]
        log(f"  {name}: ceiling after the servers {after['best']['images_per_s']} img/s")
    results["loadavg_after"] = os.getloadavg()
    results["wall_s"] = round(time.monotonic() - t_begin, 1)
    results["summary"] = summarize(results)
    write_result(a.name, results)
    print(render(results))
    return 1 if results.get("failed") else 0


def reachable_share(ceiling_run: dict[str, Any], concurrency: int) -> float:
    """How much of the best ceiling `concurrency` requests in flight can reach in process: the best
    configuration of the ceiling run that needs at most that many requests at once (batch x
    sessions), over the best of all. One request at a time runs as a batch of one on one session.
    1.0 where the run has no per-configuration timings."""
    best = float(ceiling_run["best"]["images_per_s"])
    configs = [*ceiling_run.get("per_batch", []), *ceiling_run.get("parallel_sessions", [])]
    fits = [
        float(x["images_per_s"])
        for x in configs
        if int(x["batch"]) * int(x.get("sessions", 1)) <= concurrency
    ]
    if not fits or best <= 0:
        return 1.0
    return min(1.0, max(fits) / best)


def ceil_pct(mres: dict[str, Any]) -> None:
    """Each point's share of the model's in-process ceiling."""
    c = float(mres["ceiling"]["best"]["images_per_s"])
    for s in mres["servers"].values():
        for p in s["points"]:
            p["pct_of_ceiling"] = round(100 * p["throughput"] / c, 1)


# --- verdicts ------------------------------------------------------------------------------------
def _best_point(points: list[dict[str, Any]], c: int) -> dict[str, Any] | None:
    at = [p for p in points if p["concurrency"] == c]
    return max(at, key=lambda p: p["throughput"]) if at else None


BAND = 0.05  # the band near the ceiling in which two servers tie
WIN = "win"
TIE = f"tie ({BAND:.0%} band near the ceiling)"
MET_VERDICTS = frozenset({WIN, TIE})


def verdict(tf: dict[str, Any], peer: dict[str, Any], ceiling: float) -> str:
    """``win`` (at or above the peer with a p99 no higher); ``tie`` near `ceiling` (one of the two
    within :data:`BAND` of it; the caller passes the ceiling reachable at the point's concurrency,
    :func:`reachable_share`), when trtforge's throughput is within the band below the peer's and its
    p99 within the band above the peer's; otherwise ``loss``, or a win or tie whose p99 is too high,
    which says so. Only :data:`MET_VERDICTS` meet the target.

    The p99 shares the band because at the ceiling both servers queue: with c clients in a closed
    loop the latency is c over the rate, so rates a few per cent apart give p99s a few per cent apart.
    """
    t, q = float(tf["throughput"]), float(peer["throughput"])
    lt, lq = float(tf["p99_ms"]), float(peer["p99_ms"])
    near_ceiling = max(t, q) >= (1 - BAND) * ceiling
    in_band = near_ceiling and t >= (1 - BAND) * q
    if t >= q and lt <= lq:
        return WIN
    if in_band and lt <= (1 + BAND) * lq:
        return TIE
    if t >= q:
        return "win, p99 higher"
    return "tie, p99 higher" if in_band else "loss"


def summarize(results: dict[str, Any]) -> dict[str, Any]:
    """Per model and concurrency: trtforge's best protocol against the best peer's, with the verdict."""
    out: dict[str, Any] = {}
    for model, m in results["models"].items():
        srv = m["servers"]
        ceil = float(m["ceiling"]["best"]["images_per_s"])
        rows = []
        tf_pts = srv.get("trtforge", {}).get("points", [])
        for c in sorted({p["concurrency"] for p in tf_pts}):
            tf = _best_point(tf_pts, c)
            peers = [
                (k, bp)
                for k in PEERS_TO_BEAT
                if k in srv and (bp := _best_point(srv[k]["points"], c)) is not None
            ]
            if tf is None or not peers:
                continue
            kb, pb = max(peers, key=lambda kp: kp[1]["throughput"])
            reach = reachable_share(m["ceiling"], c)
            rows.append(
                {
                    "concurrency": c,
                    "trtforge": {k: tf[k] for k in ("protocol", "throughput", "p99_ms", "pct_of_ceiling")},
                    "best_peer": {"server": kb, **{k: pb[k] for k in ("protocol", "throughput", "p99_ms")}},
                    "ratio": round(tf["throughput"] / max(pb["throughput"], 1e-9), 2),
                    "reachable_share": round(reach, 3),
                    "verdict": verdict(tf, pb, ceil * reach),
                }
            )
        out[model] = {"points": rows}
    return out


# --- tables ------------------------------------------------------------------------------------------
def _cell(p: dict[str, Any] | None) -> str:
    return "-" if p is None else f"{p['throughput']:.1f} ({p['p99_ms']:.0f})"


def render(results: dict[str, Any]) -> str:
    """The tables of docs/benchmarks.md's serving section."""
    lg = results["load_generator"]
    parts = [
        (
            "**Partial: the run was cut short; what follows is what it measured.**\n"
            if results.get("partial")
            else ""
        )
        + f"perf_analyzer (tritonclient {lg['tritonclient']}), {lg['mode']}; a point is three windows in a"
        f" row within {lg['stability_percentage']}% of each other, at most {lg['max_trials']} windows."
        f" Servers and perf_analyzer on cpus {results['cpus']}. 1-min load average before the run"
        f" {results['loadavg_before'][0]:.2f}, after {results['loadavg_after'][0]:.2f}."
    ]
    for model, errors in (results.get("failed") or {}).items():
        for kind, err in errors.items():
            parts.append(f"\n**{kind} on {model} failed**: {err.splitlines()[-1] if err else err}")
    for model, m in results["models"].items():
        servers = m["servers"]
        ceil = m["ceiling"]["best"]
        parts.append(
            f"\n**{model}**: in-process ceiling {ceil['images_per_s']} img/s (batch {ceil['batch']}"
            + (f", {ceil['sessions']} sessions side by side" if "sessions" in ceil else "")
            + ")"
            + (
                f", {m['ceiling_after']['images_per_s']} img/s timed again after the servers"
                if m.get("ceiling_after")
                else ""
            )
            + f"; perf_analyzer windows of {m['interval_ms'] / 1000:g} s. Inferences/s (p99 ms) and"
            " trtforge's share of the ceiling:"
        )
        measured = [q for s in servers.values() for q in [*s["points"], *s["failed_points"]]]
        # one column per server and protocol it was driven over, one row per concurrency
        columns = [
            (k, pr)
            for k, s in servers.items()
            for pr in PROTOCOL_TITLES
            if any(q["protocol"] == pr for q in [*s["points"], *s["failed_points"]])
        ]
        rows = []
        for c in sorted({q["concurrency"] for q in measured}):
            cells = []
            for k, pr in columns:
                s = servers[k]
                pt = next((p for p in s["points"] if p["concurrency"] == c and p["protocol"] == pr), None)
                bad = next(
                    (f for f in s["failed_points"] if f["concurrency"] == c and f["protocol"] == pr), None
                )
                cells.append(("unstable" if bad.get("unstable") else "failed") if bad else _cell(pt))
            shares = [
                f"{p['protocol']} {p['pct_of_ceiling']}%"
                for p in servers.get("trtforge", {}).get("points", [])
                if p["concurrency"] == c
            ]
            rows.append([c, *cells, " / ".join(shares) or "-"])
        heads = [f"{k} {PROTOCOL_TITLES[pr]}" for k, pr in columns]
        parts.append(table(["conc", *heads, "trtforge of the ceiling"], rows))
        # each point's verdict against the best peer is a row of the targets table (benchmarks.report)
    return "\n".join(parts)


if __name__ == "__main__":
    sys.exit(main())
