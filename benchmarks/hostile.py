"""Liveness under hostile load: does ``/v2/health/live`` answer within 100 ms while tenants attack?

Three parts (``--part``). ``catalogue``: the hostile bodies below, against SqueezeNet over HTTP.
``families``: every attack family of the hostile-client suite
(tests/integration/test_serve_hostile_families.py: the HTTP/2 ones of :mod:`trtforge_dev.hostile_h2`
on the gRPC port, the HTTP/1.1 ones of :mod:`trtforge_dev.hostile`) for ``--family-seconds`` each,
one after another against one server of the suite's MLP (built by the real builder; small requests,
so the attackers' frames and not the tensors' bytes make the load), each beside the liveness prober
and legitimate HTTP and gRPC infers checked against ONNX Runtime
(:func:`trtforge_dev.hostile_run.under_attack`); per family the probes' latency, the legitimate
success rate and the server's peak RSS above idle. ``front-door``: issue 63's cases 1-5 (calls that
cannot finish, a gzip bomb over HTTP, slowloris heads past the connection cap, frame floods, and the
floods that cost latency) the same way, each against the same run's quiet baseline
(:data:`FRONT_DOOR`, :func:`front_door_verdicts`).

``trtforge serve`` (SqueezeNet, the benchmark engine) is pinned to ``--server-cpus``; a prober on
``--probe-cpus`` polls ``/v2/health/live`` on a fresh connection every 20 ms, as a kubelet would;
attackers on ``--attack-cpus`` send, for ``--rounds`` rounds: every body of the hostile catalogue
(:mod:`trtforge_dev.hostile`: 60 MB of every shape, a gzip bomb, corrupt encodings), ``--parallel``
60 MB bodies at once, and ``--half-open`` connections that never finish a request (closed by the
server's idle timeout). A valid request follows each attack and must match ONNX Runtime.

The attackers are a client of their own (:mod:`trtforge_dev.hostile` over ``http.client``), not
``perf_analyzer``: perf_analyzer sends only well-formed requests at a concurrency, and this needs
malformed, oversized and never-finished ones.

Reported: the probes' latency percentiles and failures (per phase and overall), the server's peak
RSS above idle, and every attack's status. The tests (tests/integration/test_serve_hostile.py) assert
the answers; this measures the timing, which belongs on a quiet machine.

    python -m benchmarks.hostile --server-cpus 0-1 --probe-cpus 2 --attack-cpus 3-5
    python -m benchmarks.hostile --part families --server-cpus 0 --probe-cpus 1 --attack-cpus 1
    python -m benchmarks.hostile --part front-door --server-cpus 0 --probe-cpus 1 --attack-cpus 1
"""

from __future__ import annotations

import argparse
import functools
import http.client
import json
import os
import socket
import tempfile
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from trtforge_dev.hostile import MB, LiveProbe, Target, binary_body, hostile_requests, post, rss_kb
from trtforge_dev.hostile_run import FAMILIES, FRESH_CLIENT_FAMILIES, QUIET, under_attack

from benchmarks.common import (
    CACHE,
    free_port,
    free_ports,
    log,
    serve_cmd,
    start,
    stop,
    table,
    taskset,
    wait_http_ok,
    write_result,
)
from benchmarks.engines import ensure_engine, store_dir
from benchmarks.models import INPUT_SHAPE, io_names, model_file, sample_input

LIVENESS_TARGET_MS = 100.0
INFER = "/v2/models/squeezenet/infer"
RSS_BOUND_MB = 300.0


class Valid:
    """A valid binary request whose answer must equal ONNX Runtime's on the same input."""

    def __init__(self, model: Path, address: str, name: str, in_name: str) -> None:
        import onnxruntime as ort

        self.session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
        self.address, self.name, self.in_name = address, name, in_name
        self.failures = 0

    def __call__(self, seed: int) -> None:
        x = sample_input(1, seed)
        body, h = binary_body(self.in_name, "FP32", list(x.shape), x.tobytes())
        conn = http.client.HTTPConnection(self.address, timeout=120)
        try:
            conn.request("POST", f"/v2/models/{self.name}/infer", body=body, headers=h)
            r = conn.getresponse()
            data = r.read()
        finally:
            conn.close()
        ok = r.status == 200
        if ok:
            out = json.loads(data)["outputs"][0]
            ref = self.session.run(None, {self.in_name: x})[0]
            ok = np.allclose(
                np.asarray(out["data"], np.float32).reshape(ref.shape), ref, rtol=1e-4, atol=1e-5
            )
        if not ok:
            self.failures += 1
            log(f"valid request (seed {seed}) failed: {r.status} {data[:200]!r}")


def _attack(
    address: str, body: bytes | Iterable[bytes], headers: dict[str, str], timeout: float
) -> int | str:
    """One hostile request: its HTTP status, or the name of the socket error that ended it."""
    try:
        return post(address, body, headers, path=INFER, timeout=timeout)[0]
    except OSError as e:  # the server closed early or stopped reading: recorded, not fatal
        return type(e).__name__


def _phase_stats(probe: LiveProbe, start_t: float, end_t: float) -> dict[str, Any]:
    lat = sorted(lat for t, lat in zip(probe.times, probe.latencies, strict=True) if start_t <= t <= end_t)
    bad = sum(
        1 for t, s in zip(probe.times, probe.statuses, strict=True) if start_t <= t <= end_t and s != "200"
    )
    if not lat:
        return {"probes": 0, "failed": bad}

    def q(p: float) -> float:
        return round(lat[min(len(lat) - 1, max(0, int(np.ceil(p * len(lat))) - 1))] * 1e3, 1)

    return {
        "probes": len(lat),
        "failed": bad,
        "p50_ms": q(0.5),
        "p99_ms": q(0.99),
        "max_ms": round(lat[-1] * 1e3, 1),
    }


def run(a: argparse.Namespace) -> dict[str, Any]:
    model = model_file("squeezenet")
    in_name, _ = io_names(model)
    store = store_dir("squeezenet")
    key, publisher = ensure_engine(model, store)
    port = free_port()
    address = f"127.0.0.1:{port}"
    work = Path(tempfile.mkdtemp(prefix="hostile-", dir=CACHE))
    cmd = taskset(
        a.server_cpus,
        serve_cmd(
            str(store),
            key,
            "squeezenet",
            port,
            work / "cache",
            "--no-grpc",
            "--idle-timeout",
            str(a.idle_timeout),
        ),
    )
    proc = start(cmd, work / "serve.log", {"TRTFORGE_GPU_PROBE": "none"})
    phases: dict[str, tuple[float, float]] = {}
    attacks: list[dict[str, Any]] = []
    try:
        wait_http_ok(f"http://{address}/v2/health/ready", 300, proc)
        os.sched_setaffinity(0, _cpus(a.attack_cpus))
        valid = Valid(model, address, "squeezenet", in_name)
        for i in range(3):
            valid(i)
        time.sleep(1.0)
        idle_kb = rss_kb(proc.pid, "VmRSS")
        catalogue = list(hostile_requests(in_name, INPUT_SHAPE))
        big, big_h = binary_body(in_name, "FP32", [1, *INPUT_SHAPE], bytes(60 * MB))
        send = functools.partial(_attack, address, timeout=a.request_timeout)
        with LiveProbe(address, work / "probe.log", cpus=a.probe_cpus) as probe:
            time.sleep(2.0)
            phases["idle"] = (time.time() - 2.0, time.time())
            for rnd in range(a.rounds):
                t0 = time.time()
                for req in catalogue:
                    s0 = time.time()
                    status = send(req.body, req.headers)
                    log(f"round {rnd + 1}: {req.what}: {status} in {time.time() - s0:.2f} s")
                    attacks.append(
                        {"round": rnd, "what": req.what, "status": status, "s": round(time.time() - s0, 3)}
                    )
                    valid(rnd)
                phases[f"catalogue round {rnd + 1}"] = (t0, time.time())
                t0 = time.time()
                with ThreadPoolExecutor(a.parallel) as pool:
                    got = list(pool.map(send, [big] * a.parallel, [big_h] * a.parallel))
                attacks.append(
                    {
                        "round": rnd,
                        "what": f"{a.parallel} x 60 MB at once",
                        "status": sorted(set(map(str, got))),
                    }
                )
                valid(rnd)
                phases[f"{a.parallel} x 60 MB, round {rnd + 1}"] = (t0, time.time())
                log(
                    f"round {rnd + 1}: {a.parallel} x 60 MB at once: {sorted(set(map(str, got)))} "
                    f"in {time.time() - t0:.2f} s"
                )
            t0 = time.time()
            partial = b"POST /v2/models/squeezenet/infer HTTP/1.1\r\nHost: x\r\nContent-Le"
            socks = []
            for i in range(a.half_open):
                s = socket.create_connection(("127.0.0.1", port))
                if i % 2:
                    s.sendall(partial)
                socks.append(s)
            valid(99)
            closed = 0
            for s in socks:
                s.settimeout(a.idle_timeout * 10)
                try:
                    closed += s.recv(1024) == b""
                except OSError:
                    pass
                s.close()
            phases[f"{a.half_open} half-open connections"] = (t0, time.time())
            log(
                f"{a.half_open} half-open connections: {closed} closed by the server "
                f"in {time.time() - t0:.2f} s"
            )
            time.sleep(1.0)
        peak_mb = (rss_kb(proc.pid, "VmHWM") - idle_kb) / 1024
        alive = proc.poll() is None
    finally:
        stop(proc)
    overall = _phase_stats(probe, min(s for s, _ in phases.values()), max(e for _, e in phases.values()))
    return {
        "engine": {"key": key, "publisher": publisher},
        "cpus": {"server": a.server_cpus, "probe": a.probe_cpus, "attack": a.attack_cpus},
        "rounds": a.rounds,
        "overall": overall,
        "phases": {name: _phase_stats(probe, s, e) for name, (s, e) in phases.items()},
        "peak_rss_above_idle_mb": round(peak_mb, 1),
        "half_open_closed": f"{closed}/{a.half_open}",
        "valid_failures": valid.failures,
        "server_alive": alive,
        "attacks": attacks,
        "targets": {
            "liveness_p99_ms": LIVENESS_TARGET_MS,
            "liveness_met": bool(
                overall.get("failed") == 0 and overall.get("max_ms", 1e9) <= LIVENESS_TARGET_MS
            ),
            "rss_bound_mb": RSS_BOUND_MB,
            "rss_met": peak_mb <= RSS_BOUND_MB,
        },
    }


def run_families(a: argparse.Namespace) -> dict[str, Any]:
    """Every attack family for ``--family-seconds`` against one quiet server (gRPC on)."""
    from trtforge_dev.serve_engines import env_for, make_mlp_bed, run_ort

    CACHE.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="hostile-families-", dir=CACHE))
    bed = make_mlp_bed(work, mlp_seed=51)
    port, grpc_port = free_ports(2)
    flags = ("--grpc-port", str(grpc_port), "--idle-timeout", str(a.idle_timeout), *a.serve_flag)
    cmd = taskset(a.server_cpus, serve_cmd(str(bed.store), bed.key, "mlp", port, work / "cache", *flags))
    proc = start(cmd, work / "serve.log", env_for(bed.gpu_file, work / "termination"))
    x = np.random.default_rng(51).standard_normal((2, 64)).astype(np.float32)
    reference = run_ort(bed.mlp, {"x": x})["y"]
    target = Target("127.0.0.1", grpc_port, port, "mlp", "x", x)
    families = list(FAMILIES) if a.families == "all" else a.families.split(",")
    results: dict[str, Any] = {}
    try:
        wait_http_ok(f"http://127.0.0.1:{port}/v2/health/ready", 300, proc)
        os.sched_setaffinity(0, _cpus(a.attack_cpus))
        time.sleep(1.0)
        idle_kb = rss_kb(proc.pid, "VmRSS")
        for family in families:
            out = under_attack(
                family,
                target,
                pid=proc.pid,
                idle_rss_kb=idle_kb,
                output="y",
                reference=reference,
                probe_out=work / f"probe-{family}.log",
                seconds=a.family_seconds,
                probe_cpus=a.probe_cpus,
            )
            results[family] = out.summary()
            log(f"{family}: {results[family]}")
            if not out.alive:
                break
            time.sleep(1.0)  # the server settles before the next family
        alive = proc.poll() is None
    finally:
        stop(proc)
    return {
        "cpus": {"server": a.server_cpus, "probe": a.probe_cpus, "attack": a.attack_cpus},
        "model": "the suite's MLP (x: 2 x 64 FP32 -> y: 2 x 10), ONNX Runtime backend",
        "family_seconds": a.family_seconds,
        "idle_timeout_s": a.idle_timeout,
        "serve_flags": a.serve_flag,
        "families": results,
        "server_alive": alive,
        "targets": {
            "liveness_p99_ms": LIVENESS_TARGET_MS,
            "legit_success": 0.9,
            "rss_bound_mb": RSS_BOUND_MB,
        },
    }


def render_families(res: dict[str, Any]) -> str:
    """Per family: the probes' latency, the legitimate success, the peak RSS above idle."""
    rows = []
    for family, r in res["families"].items():
        rows.append(
            [
                family,
                r["probes"],
                r["probes_failed"],
                r["health_p50_ms"],
                r["health_p99_ms"],
                r["health_max_ms"],
                r["http_success"].split(" ")[0],
                r.get("grpc_success", "-").split(" ")[0],
                r["rss_start_above_idle_mb"],
                r["rss_peak_above_idle_mb"],
            ]
        )
    cpus = res["cpus"]
    t = res["targets"]
    return (
        f"Attack families, {res['family_seconds']:.0f} s each: server on CPUs {cpus['server'] or 'any'}, "
        f"prober on {cpus['probe'] or 'any'}, attackers and legitimate clients on "
        f"{cpus['attack'] or 'any'}; extra serve flags: {' '.join(res['serve_flags']) or 'none'}. RSS "
        "above the server's idle RSS, at the family's start and its peak.\n"
        + table(
            [
                "family",
                "probes",
                "failed",
                "health p50 ms",
                "health p99 ms",
                "max ms",
                "HTTP infers ok",
                "gRPC infers ok",
                "RSS at start MB",
                "RSS peak MB",
            ],
            rows,
        )
        + f"\nTargets: health p99 within {t['liveness_p99_ms']:.0f} ms, at least "
        f"{t['legit_success']:.0%} of legitimate infers right, RSS within {t['rss_bound_mb']:.0f} MB of "
        f"idle. Server alive at the end: {res['server_alive']}."
    )


# Issue 63's cases: (its item, what the attack does) -> the attack family.
FRONT_DOOR: dict[tuple[int, str], str] = {
    (1, "short messages, 12 conns x 100 calls"): "short_messages",
    (1, "stalled calls, 12 conns x 100 calls"): "slow_streams",
    (2, "gzip bomb over HTTP (128 MiB in 130 KB)"): "http_gzip_bomb",
    (3, "slowloris, 1,100 heads past the cap"): "slowloris_1100",
    (4, "zero window, 12 conns"): "zero_window_12",
    (4, "HEADERS on closed streams"): "headers_on_closed_streams",
    (4, "odd stream ids"): "odd_stream_ids",
    (4, "CONTINUATION flood"): "continuation_flood",
    (4, "SETTINGS flood"): "settings_flood",
    (5, "HPACK bomb"): "hpack_amplification",
    (5, "PING flood"): "ping_flood",
    (5, "rapid reset"): "rapid_reset",
}
# Issue 63's targets, per case against the same run's quiet baseline.
HEALTH_P99_SLACK_MS = 50.0
LEGIT_SUCCESS = 0.95
RSS_GROWTH_MB = 64.0
GRPC_P50_RATIO = 2.0
# Legitimate infers a second on each protocol: a client within the front proxy's default per-client
# rate (200, which counts the prober's connections as well), so the proxy refuses none of them.
LEGIT_CALLS_PER_SECOND = 100.0
QUIET_FRESH = "quiet_fresh"  # the baseline of cases whose legitimate clients are new ones (a connection each)


def baseline_of(family: str) -> str:
    """The quiet baseline a case is judged against: one whose legitimate clients connect as its do."""
    return QUIET_FRESH if family in FRESH_CLIENT_FAMILIES else "quiet"


def front_door_verdicts(case: dict[str, Any], quiet: dict[str, Any]) -> dict[str, bool]:
    """Which of issue 63's targets `case` (an Outcome summary) met against `quiet` (pure)."""
    return {
        "health": case["health_p99_ms"] <= quiet["health_p99_ms"] + HEALTH_P99_SLACK_MS,
        "legit": min(case["http_success_rate"], case["grpc_success_rate"]) >= LEGIT_SUCCESS,
        "rss": case["rss_peak_above_idle_mb"] - case["rss_start_above_idle_mb"] <= RSS_GROWTH_MB,
        "grpc_p50": case["grpc_p50_ms"] <= GRPC_P50_RATIO * quiet["grpc_p50_ms"],
        "alive": bool(case["alive"]),
    }


ATTACKER_SOURCE = "127.0.0.2"  # the attackers' address: a front proxy's per-client limits tell them apart


def run_front_door(a: argparse.Namespace) -> dict[str, Any]:
    """The front-door cases against the server alone and, with ``--front-proxy haproxy``, then against
    a fresh server of the same flags behind HAProxy (the chart's sidecar config, from the operator's
    one template), each against its own quiet baseline."""
    out = {"server": _front_door_once(a, proxy=None)}
    if a.front_proxy:
        out[a.front_proxy] = _front_door_once(a, proxy=a.front_proxy)
    return {**out["server"], "runs": out}


def _start_haproxy(a: argparse.Namespace, work: Path, ports: tuple[int, int], inner: tuple[int, int]) -> Any:
    """HAProxy on `ports` (HTTP, gRPC) in front of the runtime on `inner`, pinned beside the server."""
    from trtforge_operator.apply.front_proxy import FrontProxyLimits, haproxy_config

    cfg = work / "haproxy.cfg"
    limits = FrontProxyLimits()
    cfg.write_text(
        haproxy_config(
            limits,
            http_port=ports[0],
            grpc_port=ports[1],
            runtime_http_port=inner[0],
            runtime_grpc_port=inner[1],
            bind="127.0.0.1",
        )
    )
    return start(taskset(a.server_cpus, ["haproxy", "-db", "-f", str(cfg)]), work / "haproxy.log", {})


def _front_door_once(a: argparse.Namespace, proxy: str | None) -> dict[str, Any]:
    """The quiet baseline, then each of the front-door cases for ``--family-seconds``, against one server
    of the suite's MLP with the runtime's default limits (gRPC on), behind `proxy` if given."""
    from trtforge_dev.serve_engines import env_for, make_mlp_bed, run_ort

    CACHE.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="hostile-front-door-", dir=CACHE))
    bed = make_mlp_bed(work, mlp_seed=63)
    port, grpc_port, inner_port, inner_grpc = free_ports(4)
    serve_port, serve_grpc = (inner_port, inner_grpc) if proxy else (port, grpc_port)
    flags = ("--grpc-port", str(serve_grpc), *a.serve_flag)
    cmd = taskset(
        a.server_cpus, serve_cmd(str(bed.store), bed.key, "mlp", serve_port, work / "cache", *flags)
    )
    proc = start(cmd, work / "serve.log", env_for(bed.gpu_file, work / "termination"))
    front = _start_haproxy(a, work, (port, grpc_port), (inner_port, inner_grpc)) if proxy else None
    x = np.random.default_rng(63).standard_normal((2, 64)).astype(np.float32)
    reference = run_ort(bed.mlp, {"x": x})["y"]
    target = Target("127.0.0.1", grpc_port, port, "mlp", "x", x, source=ATTACKER_SOURCE)
    cases: list[dict[str, Any]] = []
    proxy_rss_mb = None
    try:
        wait_http_ok(f"http://127.0.0.1:{port}/v2/health/ready", 300, proc)
        os.sched_setaffinity(0, _cpus(a.attack_cpus))
        time.sleep(1.0)
        idle_kb = rss_kb(proc.pid, "VmRSS")

        def one(family: str, fresh_clients: bool | None = None) -> dict[str, Any]:
            out = under_attack(
                family,
                target,
                pid=proc.pid,
                idle_rss_kb=idle_kb,
                output="y",
                reference=reference,
                probe_out=work / f"probe-{family}.log",
                seconds=a.family_seconds,
                probe_cpus=a.probe_cpus,
                fresh_clients=fresh_clients,
                legit_rate=LEGIT_CALLS_PER_SECOND,
            )
            log(
                f"{proxy or 'server'}: {family}{' (fresh clients)' if fresh_clients else ''}: {out.summary()}"
            )
            time.sleep(1.0)  # the server settles before the next case
            return out.summary()

        baselines = {"quiet": one(QUIET), QUIET_FRESH: one(QUIET, fresh_clients=True)}
        for (item, what), family in FRONT_DOOR.items():
            r = one(family)
            base = baseline_of(family)
            met = front_door_verdicts(r, baselines[base])
            cases.append({"item": item, "case": what, "family": family, **r, "baseline": base, "met": met})
            if not r["alive"]:
                break
        alive = proc.poll() is None
        if front is not None:
            proxy_rss_mb = round(rss_kb(front.pid, "VmHWM") / 1024, 1)
            alive = alive and front.poll() is None
    finally:
        if front is not None:
            stop(front)
        stop(proc)
    return {
        "front_proxy": proxy,
        "cpus": {"server": a.server_cpus, "probe": a.probe_cpus, "attack": a.attack_cpus},
        "model": "the suite's MLP (x: 2 x 64 FP32 -> y: 2 x 10), ONNX Runtime backend",
        "family_seconds": a.family_seconds,
        "serve_flags": a.serve_flag,
        "attacker_source": ATTACKER_SOURCE,
        "proxy_peak_rss_mb": proxy_rss_mb,
        "legit_calls_per_second": LEGIT_CALLS_PER_SECOND,
        **baselines,
        "cases": cases,
        "server_alive": alive,
        "targets": {
            "health_p99_slack_ms": HEALTH_P99_SLACK_MS,
            "legit_success": LEGIT_SUCCESS,
            "rss_growth_mb": RSS_GROWTH_MB,
            "grpc_p50_ratio": GRPC_P50_RATIO,
        },
    }


def render_front_door(res: dict[str, Any]) -> str:
    """The front-door run: one table, or, with a proxy run, the server alone beside the proxy."""
    runs = res.get("runs", {})
    if len(runs) > 1:
        return render_front_door_compared(runs)
    return render_front_door_run(res)


def render_front_door_compared(runs: dict[str, dict[str, Any]]) -> str:
    """Per case, each figure of the server alone and then behind the proxy (``alone / proxy``)."""
    alone, (proxy, behind) = runs["server"], next((k, v) for k, v in runs.items() if k != "server")
    by_family = {c["family"]: c for c in behind["cases"]}

    def cell(
        a: dict[str, Any],
        b: dict[str, Any] | None,
        fmt: Callable[[dict[str, Any], dict[str, Any]], str],
        key: str,
    ) -> str:
        def one(c: dict[str, Any] | None, run: dict[str, Any]) -> str:
            return "-" if c is None else fmt(c, _baseline(run, c)) + ("" if c["met"][key] else " ✗")

        return f"{one(a, alone)} / {one(b, behind)}"

    rows = []
    for c in alone["cases"]:
        b = by_family.get(c["family"])
        rows.append(
            [
                c["item"],
                c["case"],
                cell(c, b, lambda x, q: f"{x['health_p99_ms']:.0f}", "health"),
                cell(
                    c, b, lambda x, q: f"{min(x['http_success_rate'], x['grpc_success_rate']):.0%}", "legit"
                ),
                cell(
                    c,
                    b,
                    lambda x, q: f"{x['rss_peak_above_idle_mb'] - x['rss_start_above_idle_mb']:.0f}",
                    "rss",
                ),
                cell(c, b, lambda x, q: f"{x['grpc_p50_ms'] / q['grpc_p50_ms']:.1f}x", "grpc_p50"),
            ]
        )
    qa, qb, cpus = alone["quiet"], behind["quiet"], alone["cpus"]
    fa, fb = alone.get(QUIET_FRESH), behind.get(QUIET_FRESH)
    fresh = (
        ""
        if fa is None or fb is None
        else f" (with a new connection for every infer, the baseline of "
        f"{', '.join(sorted(FRESH_CLIENT_FAMILIES & set(FRONT_DOOR.values())))}: health p99 "
        f"{fa['health_p99_ms']} / {fb['health_p99_ms']} ms, gRPC p50 {fa['grpc_p50_ms']} / "
        f"{fb['grpc_p50_ms']} ms)"
    )
    rate = alone.get("legit_calls_per_second")
    return (
        f"Front-door cases, {alone['family_seconds']:.0f} s each, each cell the server alone / behind "
        f"{proxy} (a fresh server; HAProxy pinned with it): server on CPUs {cpus['server'] or 'any'}, "
        f"prober on {cpus['probe'] or 'any'}, attackers (from {alone.get('attacker_source', '127.0.0.1')}) "
        f"and legitimate clients (127.0.0.1{f', {rate:.0f} infers a second on each protocol' if rate else ''}"
        f") on {cpus['attack'] or 'any'}. Quiet: health p99 "
        f"{qa['health_p99_ms']} / {qb['health_p99_ms']} ms, gRPC p50 {qa['grpc_p50_ms']} / "
        f"{qb['grpc_p50_ms']} ms{fresh}; {proxy} peak RSS {behind.get('proxy_peak_rss_mb')} MB. "
        "✗: a target missed.\n"
        + table(
            ["item", "case", "health p99 ms", "legit (lower of HTTP, gRPC)", "RSS MB", "gRPC p50 / quiet"],
            rows,
        )
        + f"\nAlive at the end: {alone['server_alive']} / {behind['server_alive']}."
    )


def _baseline(run: dict[str, Any], case: dict[str, Any]) -> dict[str, Any]:
    """The quiet summary `case` was judged against (results written before QUIET_FRESH: quiet)."""
    return run.get(case.get("baseline", "quiet")) or run["quiet"]


def render_front_door_run(res: dict[str, Any]) -> str:
    """Per front-door case: health p99 against quiet, legitimate success, RSS growth, gRPC p50."""
    q = res["quiet"]

    def mark(ok: bool) -> str:
        return "" if ok else " ✗"

    rows = []
    for c in res["cases"]:
        m = c["met"]
        rows.append(
            [
                c["item"],
                c["case"],
                f"{c['health_p99_ms']}{mark(m['health'])}",
                f"{c['http_success_rate']:.1%} / {c['grpc_success_rate']:.1%}{mark(m['legit'])}",
                f"{c['rss_peak_above_idle_mb'] - c['rss_start_above_idle_mb']:.0f}{mark(m['rss'])}",
                f"{c['grpc_p50_ms'] / _baseline(res, c)['grpc_p50_ms']:.1f}x{mark(m['grpc_p50'])}",
                "yes" if c["alive"] else "no ✗",
            ]
        )
    t = res["targets"]
    cpus = res["cpus"]
    where = f"behind {res['front_proxy']}" if res.get("front_proxy") else "the server alone"
    return (
        f"Front-door cases, {res['family_seconds']:.0f} s each, "
        f"{where}: server on CPUs {cpus['server'] or 'any'}, "
        f"prober on {cpus['probe'] or 'any'}, attackers and legitimate clients on {cpus['attack'] or 'any'}; "
        f"extra serve flags: {' '.join(res['serve_flags']) or 'none'}. Quiet: health p99 "
        f"{q['health_p99_ms']} ms, gRPC p50 {q['grpc_p50_ms']} ms. ✗: a target missed.\n"
        + table(["item", "case", "health p99 ms", "legit HTTP / gRPC", "RSS MB", "gRPC p50", "alive"], rows)
        + f"\nTargets: health p99 within {t['health_p99_slack_ms']:.0f} ms of quiet, at least "
        f"{t['legit_success']:.0%} of legitimate infers right over each protocol, RSS growth at most "
        f"{t['rss_growth_mb']:.0f} MB, gRPC p50 at most {t['grpc_p50_ratio']:.0f}x quiet. Server alive at "
        f"the end: {res['server_alive']}."
    )


def _cpus(spec: str | None) -> set[int]:
    if not spec:
        return set(os.sched_getaffinity(0))
    out: set[int] = set()
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def render(res: dict[str, Any]) -> str:
    """The result as docs/benchmarks.md shows it: probe latency per phase, then the verdicts."""
    cols = ("probes", "failed", "p50_ms", "p99_ms", "max_ms")
    phases = [*res["phases"].items(), ("overall", res["overall"])]
    rows = [[name, *(st.get(k, "") for k in cols)] for name, st in phases]
    t = res["targets"]
    cpus = res["cpus"]
    return (
        f"Liveness under hostile load: server on CPUs {cpus['server'] or 'any'}, prober on "
        f"{cpus['probe'] or 'any'}, attackers on {cpus['attack'] or 'any'}; {res['rounds']} rounds.\n"
        + table(["phase", "probes", "failed", "p50 ms", "p99 ms", "max ms"], rows)
        + f"\nEvery probe within {t['liveness_p99_ms']:.0f} ms and none failed: "
        f"{'met' if t['liveness_met'] else 'missed'}. Peak RSS {res['peak_rss_above_idle_mb']} MB above "
        f"idle (bound {t['rss_bound_mb']:.0f} MB: {'met' if t['rss_met'] else 'missed'}). Half-open "
        f"connections closed by the server: {res['half_open_closed']}. Valid requests that failed: "
        f"{res['valid_failures']}. Server alive at the end: {res['server_alive']}."
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--server-cpus", default=None, help="taskset list for the server (default: any)")
    p.add_argument("--probe-cpus", default=None, help="taskset list for the liveness prober")
    p.add_argument("--attack-cpus", default=None, help="CPUs for the attackers (this process)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--parallel", type=int, default=4, help="60 MB bodies sent at once")
    p.add_argument("--half-open", type=int, default=500)
    p.add_argument("--idle-timeout", type=float, default=2.0, help="the server's --idle-timeout")
    p.add_argument("--request-timeout", type=float, default=30.0, help="client socket timeout per attack")
    p.add_argument("--part", choices=("all", "catalogue", "families", "front-door"), default="all")
    p.add_argument(
        "--front-proxy",
        choices=("haproxy",),
        default=None,
        help="front-door: also run every case against a fresh server behind this proxy",
    )
    p.add_argument("--families", default="all", help=f"comma-separated, of: {', '.join(FAMILIES)}")
    p.add_argument("--family-seconds", type=float, default=20.0, help="how long each family attacks")
    p.add_argument(
        "--serve-flag",
        action="append",
        default=[],
        help="a flag for the families' server (repeat), e.g. --serve-flag=--max-request-bytes=8388608",
    )
    a = p.parse_args(argv)
    ok = True
    if a.part in ("all", "catalogue"):
        res = run(a)
        write_result("hostile", res)
        print(render(res))
        ok = ok and res["server_alive"] and res["valid_failures"] == 0
    if a.part in ("all", "families"):
        fam = run_families(a)
        write_result("hostile_families", fam)
        print(render_families(fam))
        ok = ok and fam["server_alive"]
    if a.part in ("all", "front-door"):
        door = run_front_door(a)
        write_result("hostile_front_door", door)
        for run_ in door["runs"].values():
            print(render_front_door_run(run_))
            ok = ok and run_["server_alive"]
        if len(door["runs"]) > 1:
            print(render_front_door(door))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
