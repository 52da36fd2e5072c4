"""Serving: ``trtforge serve`` against Triton, MLServer and KServe over the same ONNX Runtime session.

One run, one machine, one client. For each model: the backend's in-process ceiling on the servers'
cores, then each server in turn, pinned to those cores, driven by the same closed-loop v2 client
(:mod:`benchmarks.loadgen`) over every protocol the server has: HTTP with binary tensors, gRPC with
raw tensor contents, and REST JSON where a server has no binary HTTP (MLServer).

Each server's settings sweep (:mod:`benchmarks.servers`) has the same size and axes for every server
(instances x threads per session, max batch, queue delay). Every setting is measured at concurrency
1, 8 and 32 on the server's first protocol; the best one at concurrency 1 serves the low-concurrency
points of the grid (c < 8), the best one over 8 and 32 together the rest (:func:`pick_best`).
Settings within 3% of the best in a band are a tie that one window per setting cannot break (a
ResNet-50 window moves by ±10% here): they meet again in paired rounds, all up at once and measured
back to back, and the median of the rounds chooses (:func:`break_tie`). Until the thirty-fourth
session the sweep's lower p99 broke such a tie, and in that session's run it chose a setting that a
paired A/B then read 4% slower. Every server gets the same rule. The sweep only chooses: every grid
point, on every protocol, is measured again on a fresh start of the chosen setting. (Reusing the
chosen setting's own sweep windows, as runs before the twenty-ninth session did, reported the best
of four noisy windows on the first protocol and one window on the others: the first protocol read
high by the choice itself.) Before any load, each server's answer over each protocol is checked
against ONNX Runtime run directly.

A grid point's share of the ceiling is its rate over the ceiling timed right before its window (its
best configuration, by a ceiling process pinned to the same cores that keeps its sessions idle in
between): this host's speed moves by 10% from one minute to the next, and a single ceiling timed
before the sweep judged windows up to an hour later (runs before the thirtieth session did that).

Layouts on a 2-core machine: ``shared`` — servers on cores 0-1 with 2 ONNX Runtime threads, the client
on the same cores (how the issue's reference numbers were taken); ``isolated`` — servers on core 1,
the client alone on core 0.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.ceiling import PinnedCeiling, run_pinned
from benchmarks.common import (
    CACHE,
    ROOT,
    free_ports,
    http_get,
    loadgen_cmd,
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
from benchmarks.loadgen import CLIENTS, run_load, v2_decode, v2_json_request, v2_request
from benchmarks.models import model_info, sample_input
from benchmarks.servers import Kind, Launch, Model, Setting, kinds, sweep_small_batch

KINDS = ("trtforge", "triton", "mlserver", "kserve")
PEERS_TO_BEAT = ("triton", "mlserver")
HIGH_BAND = 8  # grid points at c >= HIGH_BAND use the setting chosen for the high band
SWEEP_LOW = (1,)  # the sweep's concurrencies that choose the setting for c < HIGH_BAND ...
SWEEP_HIGH = (8, 32)  # ... and for c >= HIGH_BAND: two windows, so one noisy window does not decide
SWEEP_CONCURRENCIES = (*SWEEP_LOW, *SWEEP_HIGH)
SWEEP_TIE = 0.03  # settings whose mean shares differ by less than this are a tie in the sweep ...
PAIRED_TIE = 0.01  # ... and, in the paired rounds that break such a tie, by less than this
TIEBREAK_ROUNDS = 3  # paired rounds among the tied settings of a band (0: the sweep decides alone)
PROTOCOL_TITLES = {"http": "HTTP binary", "grpc": "gRPC", "json": "REST JSON"}


@dataclass(frozen=True)
class Layout:
    name: str
    server_cpus: str
    client_cpus: str
    threads: int
    client: str = "native"  # the load generator's HTTP binary client: "native" or "python"


def layouts(client: str = "native") -> dict[str, Layout]:
    """The layouts over the CPUs this process may use (run it under `taskset -c 0,1` on a bigger
    host to measure a 2-core pod), the load driven over HTTP binary by `client`."""
    cpus = sorted(os.sched_getaffinity(0))
    n = len(cpus)
    allc = ",".join(map(str, cpus))
    rest = ",".join(map(str, cpus[1:])) if n > 1 else allc
    return {
        "shared": Layout("shared", allc, allc, n, client),
        "isolated": Layout("isolated", rest, str(cpus[0]), max(1, n - 1), client),
    }


class Server:
    """A server process under test, pinned to the layout's server cores, ready when constructed."""

    def __init__(self, kind: Kind, model: Model, lay: Layout, setting: Setting, log_dir: Path) -> None:
        self.kind, self.model, self.lay, self.setting = kind.name, model, lay, setting
        work = CACHE / "servers"
        work.mkdir(parents=True, exist_ok=True)
        self.launch: Launch = kind.launch(model, setting, *free_ports(2), work)
        self.http = f"http://127.0.0.1:{self.launch.http_port}"
        self.log_path = log_dir / f"{kind.name}-{model.name}-{lay.name}-{self.launch.http_port}.log"
        self.t_start = time.monotonic()
        self.proc = start(taskset(lay.server_cpus, self.launch.cmd), self.log_path, self.launch.env)
        try:
            wait_http_ok(
                f"{self.http}/v2/models/{model.name}/ready", timeout=240, proc=self.proc, interval=0.1
            )
            if self.launch.grpc_port is not None:
                _wait_grpc_ready(self.url("grpc"), model.name, self.proc)
        except Exception as e:
            self.close()
            raise RuntimeError(f"{kind.name} did not become ready ({e}); see {self.log_path}") from None
        self.ready_s = round(time.monotonic() - self.t_start, 2)

    @property
    def protocols(self) -> tuple[str, ...]:
        return self.launch.protocols

    def url(self, protocol: str) -> str:
        if protocol == "grpc":
            return f"grpc://127.0.0.1:{self.launch.grpc_port}"
        return self.http

    def server_metadata(self) -> dict[str, Any]:
        status, body = http_get(f"{self.http}/v2")
        try:
            meta: dict[str, Any] = json.loads(body) if status == 200 else {}
        except ValueError:
            meta = {}
        return {k: meta[k] for k in ("name", "version") if k in meta}

    def metrics(self) -> dict[str, float]:
        if self.kind != "trtforge":
            return {}
        try:
            with urllib.request.urlopen(f"{self.http}/metrics", timeout=5) as r:
                text = r.read().decode()
        except OSError:
            return {}
        out: dict[str, float] = {}
        for name in (
            "trtforge_runtime_batch_size_sum",
            "trtforge_runtime_batch_size_count",
            "trtforge_runtime_compute_duration_seconds_sum",
        ):
            total = sum(float(v) for v in re.findall(rf"^{name}(?:\{{[^}}]*\}})? ([0-9.e+-]+)$", text, re.M))
            out[name] = total
        return out

    def close(self) -> None:
        stop(self.proc)
        for p in self.launch.cleanup:
            shutil.rmtree(p, ignore_errors=True)


def _wait_grpc_ready(url: str, model: str, proc: subprocess.Popen[bytes], timeout: float = 120) -> None:
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url.split("://", 1)[1])
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
                raise TimeoutError(f"gRPC {url} not ready after {timeout:.0f}s")
            time.sleep(0.1)
    finally:
        client.close()


# --- answers ------------------------------------------------------------------------------------------
def answer(srv: Server, protocol: str, x: np.ndarray) -> np.ndarray:
    """The server's output for `x` over `protocol`, decoded by a client no one here wrote where one
    exists (``tritonclient.grpc`` for gRPC)."""
    m = srv.model
    if protocol == "grpc":
        import tritonclient.grpc as grpcclient

        client = grpcclient.InferenceServerClient(srv.url("grpc").split("://", 1)[1])
        try:
            inp = grpcclient.InferInput(m.input, list(x.shape), "FP32")
            inp.set_data_from_numpy(x)
            res = client.infer(m.name, [inp], outputs=[grpcclient.InferRequestedOutput(m.output)])
            got = res.as_numpy(m.output)
        finally:
            client.close()
        if got is None or got.size == 0:
            raise RuntimeError(f"{srv.kind} answered gRPC with no raw contents for {m.output!r}")
        return np.asarray(got)
    make = v2_request if protocol == "http" else v2_json_request
    body, headers = make(m.input, m.output, x)
    req = urllib.request.Request(f"{srv.http}/v2/models/{m.name}/infer", data=body, headers=headers)
    with urllib.request.urlopen(req, timeout=60) as r:
        return v2_decode(r.read(), r.headers.get("Inference-Header-Content-Length"), m.output)


def check_answers(srv: Server, reference: np.ndarray) -> dict[str, float]:
    """Max abs error against ONNX Runtime for each protocol; raises when one is off."""
    errs = {}
    for protocol in srv.protocols:
        got = answer(srv, protocol, sample_input(1))
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
    srv: Server, protocol: str, c: int, seconds: float, warmup: float, client_procs: int = 1
) -> dict[str, Any]:
    m = srv.model
    cmd = taskset(
        srv.lay.client_cpus,
        loadgen_cmd(
            srv.url(protocol),
            m.name,
            m.input,
            m.output,
            c,
            seconds,
            warmup,
            "--protocol",
            protocol,
            "--procs",
            str(client_procs),
            "--client",
            srv.lay.client,
        ),
    )
    # A client on every core needs no pinning: it runs in this process (one interpreter start and
    # import less per point); otherwise it is a pinned process of its own.
    in_process = client_procs == 1 and srv.lay.client_cpus == layouts()["shared"].client_cpus
    m0 = srv.metrics()
    cpu0, t0 = tree_cpu_seconds(srv.proc.pid), time.monotonic()
    if in_process:
        result, _ = run_load(
            protocol,
            srv.url(protocol),
            m.name,
            m.input,
            m.output,
            sample_input(1),
            c,
            seconds,
            warmup,
            client=srv.lay.client,
        )
        res: dict[str, Any] = asdict(result)
    else:
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=seconds + warmup + 300)
        if r.returncode != 0:
            raise RuntimeError(f"load generator failed: {r.stderr[-2000:]}")
        res = json.loads(r.stdout.strip().splitlines()[-1])
    cpu1, t1 = tree_cpu_seconds(srv.proc.pid), time.monotonic()
    m1 = srv.metrics()
    res["server_cpu_util"] = round((cpu1 - cpu0) / (t1 - t0), 3)
    res["server_rss_mb"] = round(tree_rss_bytes(srv.proc.pid) / 2**20, 1)
    if m0 and m1:
        nb = m1["trtforge_runtime_batch_size_count"] - m0["trtforge_runtime_batch_size_count"]
        rows = m1["trtforge_runtime_batch_size_sum"] - m0["trtforge_runtime_batch_size_sum"]
        comp = (
            m1["trtforge_runtime_compute_duration_seconds_sum"]
            - m0["trtforge_runtime_compute_duration_seconds_sum"]
        )
        res["mean_batch"] = round(rows / nb, 2) if nb else None
        res["compute_share"] = round(comp / (t1 - t0), 3)  # instance-seconds computing per wall second
    if not res.get("errors"):
        res.pop("error_samples", None)
    return res


def ceiling(model: Model, lay: Layout, seconds: float, batches: str) -> dict[str, Any]:
    return run_pinned(model.file, lay.server_cpus, lay.threads, seconds, batches)


def _scores(points: list[list[dict[str, Any]]]) -> tuple[list[float], list[float]]:
    """Each setting's mean share of the best throughput at each of the band's concurrencies, and
    its mean p99 over the lowest p99 there (`points[i]`: setting i's points, same band for all)."""
    width = {len(row) for row in points}
    if len(width) != 1 or not width.pop():
        raise ValueError(f"every setting needs the same non-empty band of points, got {points!r}")
    columns = list(zip(*points, strict=True))
    top = [max(float(r["throughput"]) for r in col) for col in columns]
    low = [min(float(r["p99_ms"]) for r in col) for col in columns]

    def mean_share(row: list[dict[str, Any]]) -> float:
        return sum(float(r["throughput"]) / max(t, 1e-9) for r, t in zip(row, top, strict=True)) / len(row)

    def mean_p99(row: list[dict[str, Any]]) -> float:
        return sum(float(r["p99_ms"]) / max(q, 1e-9) for r, q in zip(row, low, strict=True)) / len(row)

    return [mean_share(row) for row in points], [mean_p99(row) for row in points]


def near_best(points: list[list[dict[str, Any]]], tie: float = SWEEP_TIE) -> list[int]:
    """The settings whose mean share of the best throughput (:func:`pick_best`) is within `tie` of
    the highest: the ones a single sweep window cannot tell apart."""
    shares, _p99s = _scores(points)
    return [i for i, share in enumerate(shares) if share >= max(shares) - tie]


def pick_best(points: list[list[dict[str, Any]]], tie: float = SWEEP_TIE) -> int:
    """The best setting for a band of concurrencies: `points[i]` holds setting i's sweep points at
    the band's concurrencies, in the same order for every setting. Each point counts as its share of
    the best throughput at its concurrency; the setting with the highest mean share wins, and among
    those within `tie` of it, the one whose p99s are lowest (mean of each p99 over the lowest p99
    at its concurrency). With one concurrency: the highest throughput, ties to the lower p99."""
    _shares, p99s = _scores(points)
    return min(near_best(points, tie), key=lambda i: p99s[i])


def paired_scores(rounds: list[list[list[dict[str, Any]]]]) -> tuple[list[float], list[float]]:
    """Each candidate's median over the paired rounds of its share of that round's best and of its
    p99 ratio, both as :func:`pick_best` scores a band: `rounds[r][i]` holds candidate i's points at
    the band's concurrencies in round r, measured back to back with the others'."""
    if not rounds or len({len(r) for r in rounds}) != 1:
        raise ValueError(f"every round needs the same candidates, got {len(rounds)} rounds")
    scored = [_scores(r) for r in rounds]
    n = len(rounds[0])
    share = [statistics.median(s[0][i] for s in scored) for i in range(n)]
    p99 = [statistics.median(s[1][i] for s in scored) for i in range(n)]
    return share, p99


def pick_paired(rounds: list[list[list[dict[str, Any]]]], tie: float = PAIRED_TIE) -> int:
    """The best of a few candidate settings measured in paired rounds (:func:`paired_scores`): the
    highest median share wins, and among those within `tie` of it, the lowest median p99 ratio.
    Pairing cancels the machine's drift from one minute to the next, which a single window per
    setting cannot."""
    share, p99 = paired_scores(rounds)
    n = len(share)
    near = [i for i in range(n) if share[i] >= max(share) - tie]
    return min(near, key=lambda i: p99[i])


# Each closed-loop worker gets this many answers inside a window, so that the requests cut by the
# window's edges weigh little. Chosen for the per-stream rates (loadgen.stream_rate, the throughput
# until the thirty-sixth session): ResNet-50 at c=64 answers each worker about every 2.7 s here, so a
# 10 s window gave it 3 or 4, and the two throughput estimates of one window differed by up to 16%
# (in 30 s windows: within 3% for trtforge, 5% for Triton's uneven service: that estimate's bias,
# loadgen's docstring). The shares' estimate (loadgen.window_share) has no such bias; the long
# windows keep its spread small.
MIN_STREAM_ANSWERS = 10
WARMUP_STREAM_ANSWERS = 2  # the warm-up outlasts the first cycles, when every worker sent at once


@dataclass(frozen=True)
class Windows:
    """A point's warm-up and measuring window: at least `seconds` and `warmup`, and at high
    concurrency long enough for each worker to get `stream_answers` answers in the window (and
    WARMUP_STREAM_ANSWERS in the warm-up) at `rate`, the model's ceiling in images per second, which
    no server beats. `rate` None or `stream_answers` 0: fixed windows."""

    seconds: float
    warmup: float
    rate: float | None = None
    stream_answers: int = MIN_STREAM_ANSWERS

    def _cycles(self, answers: int, concurrency: int) -> float:
        return answers * concurrency / self.rate if self.rate and self.stream_answers else 0.0

    def window(self, concurrency: int) -> float:
        return max(self.seconds, self._cycles(self.stream_answers, concurrency))

    def warm(self, concurrency: int) -> float:
        return max(self.warmup, self._cycles(min(WARMUP_STREAM_ANSWERS, self.stream_answers), concurrency))

    def as_dict(self, concurrencies: list[int]) -> dict[str, Any]:
        return {
            "seconds": self.seconds,
            "warmup": self.warmup,
            "stream_answers": self.stream_answers,
            "by_concurrency": {
                str(c): [round(self.window(c), 1), round(self.warm(c), 1)] for c in concurrencies
            },
        }


def break_tie(
    kind: Kind,
    model: Model,
    lay: Layout,
    candidates: list[Setting],
    band: tuple[int, ...],
    win: Windows,
    rounds: int,
    log_dir: Path,
) -> tuple[int, dict[str, Any]]:
    """The best of `candidates` for `band` (:func:`pick_paired`), its index there, and the record of
    the rounds: every candidate up at once, pinned to the same cores, and in each round every one
    measured at each of the band's concurrencies back to back, the order rotating from round to
    round, so each comparison is of windows seconds apart (the idle ones wait on their sockets)."""
    servers: list[Server] = []
    try:
        for s in candidates:
            servers.append(Server(kind, model, lay, s, log_dir))
        primary = servers[0].protocols[0]
        measured: list[list[list[dict[str, Any]]]] = []
        for r in range(rounds):
            shift = r % len(servers)
            order = [*range(shift, len(servers)), *range(shift)]
            row: list[list[dict[str, Any]]] = [[] for _ in servers]
            for c in band:
                for i in order:
                    pt = load(servers[i], primary, c, win.window(c), win.warm(c))
                    row[i].append(
                        {
                            "concurrency": c,
                            "throughput": pt["throughput"],
                            "p99_ms": pt["p99_ms"],
                            "errors": pt["errors"],
                        }
                    )
            measured.append(row)
            log(
                f"    {kind.name} tie-break {r + 1}/{rounds} on {primary}: "
                + "; ".join(
                    f"[{candidates[i].label}] "
                    + ", ".join(
                        f"c={p['concurrency']} {p['throughput']} req/s p99 {p['p99_ms']}" for p in row[i]
                    )
                    for i in range(len(servers))
                )
            )
    finally:
        for srv in servers:
            srv.close()
    pick = pick_paired(measured)
    log(f"    {kind.name} tie-break chose [{candidates[pick].label}]")
    record = {
        "protocol": primary,
        "candidates": [s.label for s in candidates],
        "rounds": measured,
        "chosen": candidates[pick].label,
    }
    return pick, record


def measure_server(
    kind: Kind,
    model: Model,
    lay: Layout,
    concs: list[int],
    win: Windows,
    ref: np.ndarray,
    log_dir: Path,
    small_batch: int,
    ceiling_now: Callable[[], float] | None = None,
    tiebreak_rounds: int = TIEBREAK_ROUNDS,
) -> dict[str, Any]:
    """Sweep (its small max batch `small_batch`), choose, then the grid over every protocol; each
    grid window right after `ceiling_now()` (the ceiling timed again, kept as the point's ``ceiling``).
    Settings the sweep cannot tell apart in a band (:func:`near_best`) meet again in
    `tiebreak_rounds` paired rounds (:func:`break_tie`), which choose among them."""
    settings = kind.sweep(lay.threads, small_batch)
    sweep: list[dict[str, Any]] = []
    answers: dict[str, float] = {}
    meta: dict[str, Any] = {}
    for s in settings:
        srv = Server(kind, model, lay, s, log_dir)
        try:
            answers = check_answers(srv, ref)
            meta = srv.server_metadata()
            primary = srv.protocols[0]
            # keyed by str(concurrency), as the result file keeps them
            pts = {str(c): load(srv, primary, c, win.window(c), win.warm(c)) for c in SWEEP_CONCURRENCIES}
        finally:
            srv.close()
        log(
            f"    {kind.name} [{s.label}] ready {srv.ready_s}s; {primary} "
            + "; ".join(
                f"c={c}: {pts[str(c)]['throughput']} req/s p99 {pts[str(c)]['p99_ms']} ms" for c in pts
            )
        )
        sweep.append({"setting": s.as_dict(), "protocol": primary, "ready_s": srv.ready_s, "points": pts})
    chosen: dict[str, int] = {}
    tiebreaks: dict[str, Any] = {}
    for band_name, band in (("low", SWEEP_LOW), ("high", SWEEP_HIGH)):
        band_points = [[sw["points"][str(c)] for c in band] for sw in sweep]
        near = near_best(band_points)
        chosen[band_name] = pick_best(band_points)
        if tiebreak_rounds > 0 and len(near) > 1:
            try:
                pick, record = break_tie(
                    kind, model, lay, [settings[i] for i in near], band, win, tiebreak_rounds, log_dir
                )
            except Exception as e:  # the sweep's own pick stands, and the record says why
                log(f"    {kind.name} tie-break failed, the sweep's pick stands: {e}")
                tiebreaks[band_name] = {"failed": str(e)[-2000:]}
                continue
            tiebreaks[band_name] = {**record, "sweep_pick": settings[chosen[band_name]].label}
            chosen[band_name] = near[pick]
    low, high = chosen["low"], chosen["high"]
    points: list[dict[str, Any]] = []
    for idx in dict.fromkeys((low, high)):  # each chosen setting once, low first
        wanted = [c for c in concs if (low if c < HIGH_BAND else high) == idx]
        srv = Server(kind, model, lay, settings[idx], log_dir)
        try:
            answers = check_answers(srv, ref)
            for protocol in srv.protocols:
                for c in wanted:
                    ceil = ceiling_now() if ceiling_now is not None else None
                    r = load(srv, protocol, c, win.window(c), win.warm(c))
                    r.update(protocol=protocol, setting=settings[idx].label)
                    if ceil is not None:
                        r["ceiling"] = ceil
                    points.append(r)
                    log(
                        f"    {kind.name:8s} {protocol:4s} c={c:<3d} {r['throughput']:8.1f} req/s"
                        f"  p50 {r['p50_ms']:8.1f}  p99 {r['p99_ms']:8.1f} ms  errors {r['errors']}"
                        f"  cpu {r['server_cpu_util']}  batch {r.get('mean_batch')}"
                        f"  answers per stream {r.get('stream_answers_min')}-{r.get('stream_answers_max')}"
                        + (f"  ceiling {ceil} img/s" if ceil is not None else "")
                    )
        finally:
            srv.close()
    points.sort(key=lambda p: (p["protocol"], p["concurrency"]))
    return {
        "title": kind.title,
        "versions": {**kind.version(), **({"server": meta} if meta else {})},
        "sweep": sweep,
        "chosen": {"low": settings[low].label, "high": settings[high].label},
        "tiebreaks": tiebreaks,
        "answers_max_abs_error": answers,
        "points": points,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="squeezenet,resnet50")
    p.add_argument("--servers", default=",".join(KINDS))
    p.add_argument("--concurrency", default="1,8,32,64")
    p.add_argument("--layout", default="shared", choices=sorted(layouts()))
    # Windows hold many batches: ResNet-50's instances finish a batch of 4 about every 0.5 s here,
    # so a 4.5 s window counted whole batches (about 9 per instance) and one batch more or less
    # moved a point by 11%; at 10 s the step is under 5%.
    p.add_argument("--seconds", type=float, default=4.0, help="measuring window per point (SqueezeNet)")
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--slow-factor", type=float, default=2.5, help="window multiplier for ResNet-50")
    p.add_argument(
        "--stream-answers",
        type=int,
        default=MIN_STREAM_ANSWERS,
        help="windows grow until each worker gets this many answers at the ceiling's rate (0: fixed)",
    )
    # Each batch size is timed this long; the ceiling is the best of eleven such timings, so short
    # ones make it the luckiest of eleven noisy samples.
    p.add_argument("--ceiling-seconds", type=float, default=1.0)
    p.add_argument("--ceiling-batches", default="1,2,4,8,16,32")
    p.add_argument(
        "--window-ceiling-seconds",
        type=float,
        default=2.0,
        help="the ceiling timed before each grid window (its best configuration only)",
    )
    p.add_argument(
        "--tiebreak-rounds",
        type=int,
        default=TIEBREAK_ROUNDS,
        help="paired rounds among the settings the sweep finds tied in a band (0: the sweep decides)",
    )
    p.add_argument("--name", default="serving", help="result file name")
    p.add_argument("--client", choices=CLIENTS, default="native", help="see benchmarks.loadgen")
    a = p.parse_args(argv)
    concs = sorted({int(c) for c in a.concurrency.split(",")} | set(SWEEP_CONCURRENCIES))
    lay = layouts(a.client)[a.layout]
    all_kinds = kinds()
    servers = [all_kinds[k] for k in a.servers.split(",")]
    log_dir = CACHE / "logs"
    log(
        f"layout {lay.name}: servers on cpus {lay.server_cpus} ({lay.threads} threads),"
        f" client on {lay.client_cpus}"
    )
    results: dict[str, Any] = {
        "layout": vars(lay),
        "config": vars(a),
        "loadavg_before": os.getloadavg(),
        "models": {},
    }
    t_begin = time.monotonic()
    # Every model's ceiling first; then server by server (both models each), so a run cut short
    # misses the last server (KServe, the reference peer), not half of every server.
    models: dict[str, tuple[Model, Windows, np.ndarray]] = {}
    timers: dict[str, PinnedCeiling] = {}  # closed in the finally below, however the run ends
    try:
        for name in a.models.split(","):
            model = model_info(name)
            slow = a.slow_factor if name != "squeezenet" else 1.0
            ceil = ceiling(model, lay, a.ceiling_seconds * slow, a.ceiling_batches)
            small = sweep_small_batch(ceil)
            best = ceil["best"]
            rate = float(best["images_per_s"])
            win = Windows(a.seconds * slow, a.warmup * slow, rate, a.stream_answers)
            models[name] = (model, win, reference_output(model))
            timers[name] = PinnedCeiling(
                model.file, lay.server_cpus, lay.threads, best, a.window_ceiling_seconds * slow
            )
            log(f"  {name}: ceiling {best['images_per_s']} img/s ({best}); the sweep's small batch {small}")
            results["models"][name] = {
                "ceiling": ceil,
                "sweep_small_batch": small,
                "windows": win.as_dict(concs),
                "servers": {},
            }
        for kind in servers:
            for name, (model, win, ref) in models.items():
                mres = results["models"][name]
                t0 = time.monotonic()
                try:
                    mres["servers"][kind.name] = measure_server(
                        kind,
                        model,
                        lay,
                        concs,
                        win,
                        ref,
                        log_dir,
                        int(mres["sweep_small_batch"]),
                        timers[name].measure,
                        a.tiebreak_rounds,
                    )
                except Exception as e:  # one server failing must not lose the others' results
                    log(f"  {name} {kind.name} FAILED: {e}")
                    results.setdefault("failed", {}).setdefault(name, {})[kind.name] = str(e)[-2000:]
                log(f"  {name} {kind.name}: {time.monotonic() - t0:.0f}s")
                ceil_pct(mres)
                # After every server, what is measured so far (a run cut short keeps it, marked partial).
                partial = {**results, "partial": True, "loadavg_after": os.getloadavg()}
                partial["summary"] = summarize(partial)
                write_result(a.name, partial)
    finally:
        for t in timers.values():
            t.close()
    results["loadavg_after"] = os.getloadavg()
    results["wall_s"] = round(time.monotonic() - t_begin, 1)
    results["summary"] = summarize(results)
    write_result(a.name, results)
    print(render(results))
    return 1 if results.get("failed") else 0


def point_ceiling(point: dict[str, Any], model_ceiling: float) -> float:
    """The ceiling a grid point is judged against: the one timed next to its window, or the model's
    for a point without one (runs before the thirtieth session)."""
    return float(point.get("ceiling") or model_ceiling)


def reachable_share(ceiling_run: dict[str, Any], concurrency: int) -> float:
    """How much of the best ceiling `concurrency` requests in flight can reach in process: the best
    configuration of the full ceiling run that needs at most that many requests at once (batch x
    sessions), over the best of all. One request at a time runs as a batch of one on one session,
    so at c=1 this is that timing's share (ResNet-50: 22.9 of 25.7 img/s, which needs two sessions
    side by side). 1.0 where the run has no per-configuration timings."""
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
    """Each grid point's share of its :func:`point_ceiling`."""
    c = float(mres["ceiling"]["best"]["images_per_s"])
    for s in mres["servers"].values():
        for p in s["points"]:
            p["pct_of_ceiling"] = round(100 * p["throughput"] / point_ceiling(p, c), 1)


# --- summary: the targets -------------------------------------------------------------------
def _best_point(points: list[dict[str, Any]], c: int) -> dict[str, Any] | None:
    at = [p for p in points if p["concurrency"] == c]
    return max(at, key=lambda p: p["throughput"]) if at else None


BAND = 0.05  # the band near the ceiling
WIN = "win"
TIE = f"tie ({BAND:.0%} band near the ceiling)"
MET_VERDICTS = frozenset({WIN, TIE})


def verdict(tf: dict[str, Any], peer: dict[str, Any], ceiling: float) -> str:
    """``win`` (at or above the peer with a p99 no higher); ``tie`` near `ceiling` (one of the two
    within :data:`BAND` of it; the caller passes the ceiling reachable at the point's concurrency,
    :func:`reachable_share`), when trtforge's throughput is within the band below the peer's and its
    p99 within the band above the peer's; otherwise ``loss``, or a win or tie whose p99 is too high, which
    says so. Only :data:`MET_VERDICTS` meet the target (docs/benchmarks.md, "Verdict at each point").

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
    out: dict[str, Any] = {}
    for model, m in results["models"].items():
        srv = m["servers"]
        ceil = float(m["ceiling"]["best"]["images_per_s"])
        s: dict[str, Any] = {"points": []}
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
            s["points"].append(
                {
                    "concurrency": c,
                    "trtforge": {k: tf[k] for k in ("protocol", "throughput", "p99_ms", "pct_of_ceiling")},
                    "best_peer": {"server": kb, **{k: pb[k] for k in ("protocol", "throughput", "p99_ms")}},
                    "ratio": round(tf["throughput"] / max(pb["throughput"], 1e-9), 2),
                    "reachable_share": round(reach, 3),
                    "verdict": verdict(tf, pb, point_ceiling(tf, ceil) * reach),
                }
            )
        by = {(p["protocol"], p["concurrency"]): p for p in tf_pts}
        ge8 = [p["pct_of_ceiling"] for p in tf_pts if p["concurrency"] >= 8 and p["protocol"] == "http"]
        s["min_pct_of_ceiling_c_ge_8_http"] = min(ge8) if ge8 else None
        ge8g = [p["pct_of_ceiling"] for p in tf_pts if p["concurrency"] >= 8 and p["protocol"] == "grpc"]
        s["min_pct_of_ceiling_c_ge_8_grpc"] = min(ge8g) if ge8g else None
        if ("http", 32) in by and ("grpc", 32) in by:
            s["grpc_vs_http_c32"] = round(by[("grpc", 32)]["throughput"] / by[("http", 32)]["throughput"], 3)
        out[model] = s
    return out


# --- tables ------------------------------------------------------------------------------------------
def _cell(p: dict[str, Any] | None) -> str:
    return "-" if p is None else f"{p['throughput']:.1f} ({p['p99_ms']:.0f})"


def _share_cell(p: dict[str, Any] | None) -> str:
    if p is None:
        return "-"
    return f"{p['pct_of_ceiling']}%" + (f" of {p['ceiling']:g}" if p.get("ceiling") else "")


def _window_ceilings_text(servers: dict[str, Any]) -> str:
    """ "; timed again before each grid window: lo-hi img/s", or nothing (runs before it)."""
    cs = [float(p["ceiling"]) for s in servers.values() for p in s["points"] if p.get("ceiling")]
    return f"; timed again before each grid window: {min(cs):g}-{max(cs):g} img/s" if cs else ""


def tiebreak_text(servers: dict[str, Any]) -> str:
    """One line per tie the paired rounds broke (:func:`break_tie`): each candidate's median share
    of its round's best, the choice, and what the sweep alone would have chosen; "" with none."""
    lines = []
    for kind, s in servers.items():
        for band, name in (("low", f"c<{HIGH_BAND}"), ("high", f"c>={HIGH_BAND}")):
            tb = (s.get("tiebreaks") or {}).get(band)
            if not tb:
                continue
            if "failed" in tb:
                why = tb["failed"].strip().splitlines()[-1] if tb["failed"].strip() else "no message"
                lines.append(f"- {kind} {name}: the tie-break failed, the sweep's pick stands ({why})")
                continue
            shares, _p99s = paired_scores(tb["rounds"])
            cands = ", ".join(f"[{label}] {shares[i]:.3f}" for i, label in enumerate(tb["candidates"]))
            lines.append(
                f"- {kind} {name}: tied in the sweep, {len(tb['rounds'])} paired rounds over"
                f" {PROTOCOL_TITLES[tb['protocol']]} (median share of each round's best): {cands};"
                f" chosen [{tb['chosen']}] (the sweep alone: [{tb['sweep_pick']}])"
            )
    if not lines:
        return ""
    return "Ties broken in paired rounds:\n" + "\n".join(lines)


def render(results: dict[str, Any]) -> str:
    lay = results["layout"]
    parts = [
        (
            "**Partial: the run was cut short; what follows is what it measured.**\n"
            if results.get("partial")
            else ""
        )
        + f"Layout {lay['name']}: servers on cpus {lay['server_cpus']} ({lay['threads']} ONNX Runtime"
        f" threads in all), client on cpus {lay['client_cpus']}. 1-min load average before the run"
        f" {results['loadavg_before'][0]:.2f}, after {results['loadavg_after'][0]:.2f}."
    ]
    for model, errors in (results.get("failed") or {}).items():
        for kind, err in errors.items():
            parts.append(f"\n**{kind} on {model} failed**: {err.splitlines()[-1] if err else err}")
    for model, m in results["models"].items():
        servers = m["servers"]
        ceil = m["ceiling"]["best"]
        parts.append(
            f"\n**{model}** — in-process ceiling {ceil['images_per_s']} img/s "
            f"(batch {ceil['batch']}"
            + (f", {ceil['sessions']} sessions side by side" if "sessions" in ceil else "")
            + ")"
            + _window_ceilings_text(servers)
            + "."
            " Settings sweep (req/s and p99 ms on each server's first protocol):"
        )
        rows = []
        for kind, s in servers.items():
            for sw in s["sweep"]:
                at = [sw["points"].get(str(c)) for c in SWEEP_CONCURRENCIES]
                mark = [
                    w
                    for w, lab in (
                        (f"c<{HIGH_BAND}", s["chosen"]["low"]),
                        (f"c>={HIGH_BAND}", s["chosen"]["high"]),
                    )
                    if lab == sw["setting"]["label"]
                ]
                rows.append(
                    [
                        kind,
                        sw["setting"]["label"],
                        PROTOCOL_TITLES[sw["protocol"]],
                        *(_cell(pt) for pt in at),
                        at[-1]["server_cpu_util"] if at[-1] else None,
                        ", ".join(mark) or "",
                    ]
                )
        parts.append(
            table(
                [
                    "server",
                    "setting",
                    "protocol",
                    *(f"c={c} req/s (p99)" for c in SWEEP_CONCURRENCIES),
                    f"server CPU at c={SWEEP_CONCURRENCIES[-1]}",
                    "chosen for",
                ],
                rows,
            )
        )
        parts.append("")
        breaks = tiebreak_text(servers)
        if breaks:
            parts.extend([breaks, ""])
        parts.append(
            f"Grid, **{model}**: req/s (p99 ms) in each server's chosen setting;"
            " trtforge's share of the ceiling."
        )
        rows = []
        protos = [
            pr
            for pr in PROTOCOL_TITLES
            if any(p["protocol"] == pr for s in servers.values() for p in s["points"])
        ]
        concs = sorted({p["concurrency"] for s in servers.values() for p in s["points"]})
        for c in concs:
            for pr in protos:
                at = {
                    k: next((p for p in s["points"] if p["concurrency"] == c and p["protocol"] == pr), None)
                    for k, s in servers.items()
                }
                if not any(at.values()):
                    continue
                tf = at.get("trtforge")
                rows.append(
                    [
                        c,
                        PROTOCOL_TITLES[pr],
                        *(_cell(at.get(k)) for k in servers),
                        _share_cell(tf),
                        tf.get("mean_batch") if tf else None,
                    ]
                )
        parts.append(
            table(
                [
                    "conc",
                    "protocol",
                    *(f"{k} req/s (p99)" for k in servers),
                    "trtforge of the ceiling (timed next to its window, img/s)",
                    "trtforge batch",
                ],
                rows,
            )
        )
        summ = results["summary"].get(model, {})
        if summ.get("points"):
            parts.append("")
            parts.append(
                f"trtforge against the best of Triton and MLServer, **{model}** (each at its best protocol):"
            )
            parts.append(
                table(
                    [
                        "conc",
                        "trtforge req/s",
                        "p99 ms",
                        "protocol",
                        "best peer",
                        "req/s",
                        "p99 ms",
                        "protocol",
                        "ratio",
                        "verdict",
                    ],
                    [
                        [
                            pt["concurrency"],
                            pt["trtforge"]["throughput"],
                            pt["trtforge"]["p99_ms"],
                            pt["trtforge"]["protocol"],
                            pt["best_peer"]["server"],
                            pt["best_peer"]["throughput"],
                            pt["best_peer"]["p99_ms"],
                            pt["best_peer"]["protocol"],
                            pt["ratio"],
                            pt["verdict"],
                        ]
                        for pt in summ["points"]
                    ],
                )
            )
    return "\n".join(parts)


if __name__ == "__main__":
    sys.exit(main())
