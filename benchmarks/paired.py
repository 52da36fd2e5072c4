"""Paired rounds: trtforge and its best peer measured back to back, point by point, several times.

Why: on a shared 2-core machine the same server in the same setting answers 101 to 145 SqueezeNet
requests per second from one 6 s window to the next, while its instance threads get the same CPU
time (docs/benchmarks.md §1c). The serving grid measures each server minutes after the others, so
its verdicts at margins of a few per cent say more about the machine's minute than the servers.

Here every server in its chosen settings (the serving grid's result file says which) is started
once, all at the same time, pinned to the same cores; the idle ones wait on their sockets. Each
round then measures every grid point (concurrency x protocol) on every server, one window right
after the other, in an order that rotates from round to round. Right before each of trtforge's
windows the in-process ceiling is timed again at its best configuration (a ceiling process pinned to
the same cores keeps its sessions between timings): the ceiling moves with the machine's minute as
much as the servers do. A point's result is the median of its rounds; each round also gives a
*paired* ratio (trtforge over the peer, the two windows seconds apart) and trtforge's share of the
ceiling timed next to its window.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.ceiling import PinnedCeiling, run_pinned
from benchmarks.common import CACHE, RESULTS, log, tree_cpu_seconds, write_result
from benchmarks.loadgen import CLIENTS
from benchmarks.models import model_info
from benchmarks.servers import Kind, Setting, kinds
from benchmarks.serving import (
    HIGH_BAND,
    MIN_STREAM_ANSWERS,
    PROTOCOL_TITLES,
    Server,
    Windows,
    check_answers,
    layouts,
    load,
    reachable_share,
    reference_output,
    verdict,
)


def rotation(items: list[str], round_index: int) -> list[str]:
    """`items` in the order of round `round_index`: rotated by one per round, so no server is always
    measured first (or always right after another)."""
    if not items:
        return []
    k = round_index % len(items)
    return items[k:] + items[:k]


def setting_for(kind: Kind, threads: int, label: str, small_batch: int = 4) -> Setting:
    """The setting of `kind`'s sweep (with the grid's small max batch) whose label the serving grid
    recorded as chosen (trtforge's labels may carry a suffix, such as "+ solo session", after the
    setting's own)."""
    for s in kind.sweep(threads, small_batch):
        if label == s.label or label.startswith(s.label + ","):
            return s
    raise ValueError(f"{kind.name}: no setting of its sweep is labelled {label!r}")


def median(xs: list[float]) -> float:
    return float(statistics.median(xs)) if xs else float("nan")


def summarize_point(
    samples: dict[str, list[dict[str, Any]]], peer: str, reachable: float = 1.0
) -> dict[str, Any]:
    """One grid point's rounds (`samples[server]`, round order) reduced to medians, the paired
    ratios (trtforge over `peer` in the same round) and trtforge's share of the ceiling timed next
    to each of its windows (its samples' ``ceiling``). `reachable`: the share of that ceiling the
    point's concurrency can reach (:func:`~benchmarks.serving.reachable_share`), which the verdict's
    "near the ceiling" is judged against."""
    tf, pr = samples["trtforge"], samples[peer]
    ceilings = [float(x["ceiling"]) for x in tf]
    rounds = min(len(tf), len(pr))
    ratios = [tf[i]["throughput"] / max(pr[i]["throughput"], 1e-9) for i in range(rounds)]
    shares = [100 * tf[i]["throughput"] / ceilings[i] for i in range(rounds)]
    med = {
        k: {
            "throughput": round(median([s["throughput"] for s in v]), 2),
            "p99_ms": round(median([s["p99_ms"] for s in v]), 1),
            "errors": sum(int(s.get("errors", 0)) for s in v),
        }
        for k, v in samples.items()
    }
    return {
        "median": med,
        "paired_ratio": {
            "median": round(median(ratios), 3),
            "min": round(min(ratios), 3) if ratios else None,
            "max": round(max(ratios), 3) if ratios else None,
            "rounds_at_or_above": sum(r >= 1 for r in ratios),
            "rounds": rounds,
        },
        "ceiling": {
            "median": round(median(ceilings[:rounds]), 2),
            "min": min(ceilings[:rounds], default=None),
            "reachable_share": round(reachable, 3),  # of it, at this concurrency
        },
        "pct_of_ceiling": {
            "median": round(median(shares), 1),
            "min": round(min(shares), 1) if shares else None,
        },
        "verdict": verdict(med["trtforge"], med[peer], reachable * median(ceilings[:rounds])),
    }


def best_per_round(by_protocol: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One server's windows at one concurrency, by protocol (each in round order), reduced to its best
    window of each round (the highest throughput), tagged with that window's protocol: how the grid's
    verdict compares servers, each at its best protocol."""
    rounds = min((len(v) for v in by_protocol.values()), default=0)
    out = []
    for r in range(rounds):
        proto, best = max(((p, v[r]) for p, v in by_protocol.items()), key=lambda pv: pv[1]["throughput"])
        out.append({**best, "protocol": proto})
    return out


@dataclass(frozen=True)
class Point:
    concurrency: int
    protocol: str

    @property
    def key(self) -> str:
        return f"{self.protocol}:{self.concurrency}"


def run_model(
    name: str,
    kinds_to_run: list[Kind],
    chosen: dict[str, dict[str, str]],
    small_batch: int,
    a: argparse.Namespace,
) -> dict[str, Any]:
    lay = layouts(a.client)[a.layout]
    model = model_info(name)
    slow = a.slow_factor if name != "squeezenet" else 1.0
    ref = reference_output(model)
    full = run_pinned(model.file, lay.server_cpus, lay.threads, a.ceiling_seconds * slow, a.ceiling_batches)
    best = full["best"]
    win = Windows(a.seconds * slow, a.warmup * slow, float(best["images_per_s"]), a.stream_answers)
    log(f"  {name}: ceiling {best['images_per_s']} img/s at {best}")
    concs = [int(c) for c in a.concurrency.split(",")]
    log_dir = CACHE / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    servers: dict[tuple[str, str], Server] = {}
    ceiling = PinnedCeiling(model.file, lay.server_cpus, lay.threads, best, a.window_ceiling_seconds * slow)
    try:
        for kind in kinds_to_run:
            for side in ("low", "high"):
                label = chosen[kind.name][side]
                if (kind.name, label) not in servers:
                    setting = setting_for(kind, lay.threads, label, small_batch)
                    srv = Server(kind, model, lay, setting, log_dir)
                    servers[(kind.name, label)] = srv
                    check_answers(srv, ref)
                    log(f"    {kind.name} [{label}] ready in {srv.ready_s}s, answers checked")
        protocols = sorted(
            {p for s in servers.values() for p in s.protocols if p in a.protocols.split(",")},
            key=a.protocols.split(",").index,
        )
        points = [Point(c, p) for c in concs for p in protocols]
        names = [k.name for k in kinds_to_run]
        samples: dict[str, dict[str, list[dict[str, Any]]]] = {
            pt.key: {n: [] for n in names} for pt in points
        }
        idle_cpu_max = 0.0
        for r in range(a.rounds):
            log(f"  {name} round {r + 1}/{a.rounds}")
            for i, pt in enumerate(points):
                for kname in rotation(names, r + i):
                    srv = servers[(kname, chosen[kname]["low" if pt.concurrency < HIGH_BAND else "high"])]
                    if pt.protocol not in srv.protocols:
                        continue
                    # trtforge's window is judged against the ceiling of the same minute
                    ceil = ceiling.measure() if kname == "trtforge" else None
                    idlers = [s.proc.pid for s in servers.values() if s is not srv] + [ceiling.pid]
                    idle0 = {pid: tree_cpu_seconds(pid) for pid in idlers}
                    t0 = time.monotonic()
                    c = pt.concurrency
                    res = load(srv, pt.protocol, c, win.window(c), win.warm(c))
                    el = time.monotonic() - t0
                    idle = max((tree_cpu_seconds(pid) - idle0[pid]) / el for pid in idlers)
                    idle_cpu_max = max(idle_cpu_max, idle)
                    res["round"] = r + 1
                    if ceil is not None:
                        res["ceiling"] = ceil
                    samples[pt.key][kname].append(res)
                    log(
                        f"    r{r + 1} {kname:8s} {pt.protocol:4s} c={pt.concurrency:<3d}"
                        f" {res['throughput']:8.1f} req/s  p99 {res['p99_ms']:8.1f} ms"
                        f"  errors {res['errors']}" + (f"  ceiling {ceil} img/s" if ceil is not None else "")
                    )
    finally:
        for srv in servers.values():
            srv.close()
        ceiling.close()
    peer = a.peer
    out_points = []
    for pt in points:
        s = samples[pt.key]
        if not s.get("trtforge") or not s.get(peer):
            continue
        out_points.append(
            {
                "concurrency": pt.concurrency,
                "protocol": pt.protocol,
                **summarize_point(s, peer, reachable_share(full, pt.concurrency)),
                "samples": {k: [_slim(x) for x in v] for k, v in s.items()},
            }
        )
    best_points = []
    for c in concs:
        best = {
            n: best_per_round(
                {
                    pt.protocol: samples[pt.key][n]
                    for pt in points
                    if pt.concurrency == c and samples[pt.key][n]
                }
            )
            for n in names
        }
        if best.get("trtforge") and best.get(peer):
            protos = {n: statistics.mode(w["protocol"] for w in best[n]) for n in ("trtforge", peer)}
            best_points.append(
                {
                    "concurrency": c,
                    "protocols": protos,
                    **summarize_point(best, peer, reachable_share(full, c)),
                }
            )
    grpc_http = []
    for r in range(a.rounds):
        h = [x for x in samples.get("http:32", {}).get("trtforge", []) if x["round"] == r + 1]
        g = [x for x in samples.get("grpc:32", {}).get("trtforge", []) if x["round"] == r + 1]
        if h and g:
            grpc_http.append(g[0]["throughput"] / max(h[0]["throughput"], 1e-9))
    ceilings = [float(x["ceiling"]) for pt in points for x in samples[pt.key].get("trtforge", [])]
    return {
        "ceiling_full": full,
        "ceilings": {"median": round(median(ceilings), 2), "min": min(ceilings), "max": max(ceilings)},
        "windows": win.as_dict(concs),
        "chosen": {k.name: chosen[k.name] for k in kinds_to_run},
        "idle_servers_cpu_max": round(idle_cpu_max, 3),
        "points": out_points,
        "best_protocol_points": best_points,
        "trtforge_grpc_over_http_c32": {
            "median": round(median(grpc_http), 3) if grpc_http else None,
            "rounds": [round(x, 3) for x in grpc_http],
        },
    }


def _slim(res: dict[str, Any]) -> dict[str, Any]:
    keys = ("round", "throughput", "p50_ms", "p99_ms", "errors", "server_cpu_util", "mean_batch", "ceiling")
    keys += ("window_throughput", "stream_throughput", "stream_answers_min", "stream_answers_max")
    return {k: res[k] for k in keys if k in res}


def _windows_text(w: dict[str, Any]) -> str:
    """ "10 s after 2.5 s", and the concurrencies whose windows grew (serving.Windows)."""
    base = (w["seconds"], w["warmup"])
    grown = [
        f"c={c}: {win:g} s after {warm:g} s"
        for c, (win, warm) in w.get("by_concurrency", {}).items()
        if (win, warm) != base
    ]
    return f"{base[0]:g} s after {base[1]:g} s" + (f" ({'; '.join(grown)})" if grown else "")


def render(results: dict[str, Any]) -> str:
    peer = results["peer"]
    parts = [
        f"Paired rounds: {results['rounds']} rounds; in each, every point on every server back to back"
        f" (the order rotates), and the ceiling timed at its best configuration right before each of"
        f" trtforge's windows. Servers in the"
        f" serving grid's chosen settings, all started at once; the idle ones (and the ceiling's"
        f" process) used at most"
        f" {max(m['idle_servers_cpu_max'] for m in results['models'].values()):.3f} of a core during"
        f" another's window. 1-min load average before {results['loadavg_before'][0]:.2f}, after"
        f" {results['loadavg_after'][0]:.2f}."
    ]
    for model, m in results["models"].items():
        ceil = m["ceilings"]
        parts.append(
            f"**{model}**: ceiling next to trtforge's windows {ceil['min']:g}-{ceil['max']:g} img/s"
            f" (median {ceil['median']:g}); windows {_windows_text(m['windows'])}."
            f" trtforge gRPC over HTTP at c=32, median of rounds:"
            f" {m['trtforge_grpc_over_http_c32']['median']} ({m['trtforge_grpc_over_http_c32']['rounds']})."
        )
        bhead = (
            f"| conc | trtforge at its best protocol, req/s (p99 ms) | {peer} at its best, req/s (p99 ms) |"
            f" paired ratio, median (min-max) | rounds trtforge >= {peer} |"
            " trtforge of the ceiling next to its window, median (min) | verdict on medians |"
        )
        brows = [bhead, "|" + "---|" * 7]
        for p in m["best_protocol_points"]:
            t, q = p["median"]["trtforge"], p["median"][peer]
            pr, sh, pp = p["paired_ratio"], p["pct_of_ceiling"], p["protocols"]
            brows.append(
                f"| {p['concurrency']} | {t['throughput']:.1f} ({t['p99_ms']:.0f}) {pp['trtforge']} |"
                f" {q['throughput']:.1f} ({q['p99_ms']:.0f}) {pp[peer]} |"
                f" {pr['median']:.2f} ({pr['min']:.2f}-{pr['max']:.2f}) |"
                f" {pr['rounds_at_or_above']} of {pr['rounds']} | {sh['median']:.1f}% ({sh['min']:.1f}%) |"
                f" {p['verdict']} |"
            )
        parts.append("Each server at its best protocol in each round:\n\n" + "\n".join(brows))
        head = (
            "| conc | protocol | trtforge req/s (p99 ms) | "
            f"{peer} req/s (p99 ms) | paired ratio, median (min-max) | rounds trtforge >= {peer} |"
            " trtforge of the ceiling next to its window, median (min) | verdict on medians |"
        )
        rows = [head, "|" + "---|" * 8]
        for p in m["points"]:
            t, q = p["median"]["trtforge"], p["median"][peer]
            pr, sh = p["paired_ratio"], p["pct_of_ceiling"]
            rows.append(
                f"| {p['concurrency']} | {PROTOCOL_TITLES.get(p['protocol'], p['protocol'])} |"
                f" {t['throughput']:.1f} ({t['p99_ms']:.0f}) | {q['throughput']:.1f} ({q['p99_ms']:.0f}) |"
                f" {pr['median']:.2f} ({pr['min']:.2f}-{pr['max']:.2f}) |"
                f" {pr['rounds_at_or_above']} of {pr['rounds']} | {sh['median']:.1f}% ({sh['min']:.1f}%) |"
                f" {p['verdict']} |"
            )
        parts.append("Protocol by protocol:\n\n" + "\n".join(rows))
    return "\n\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="squeezenet,resnet50")
    p.add_argument("--servers", default="trtforge,triton", help="trtforge first; the rest are peers")
    p.add_argument("--peer", default="triton", help="the peer of the paired ratios and verdicts")
    p.add_argument("--protocols", default="http,grpc")
    p.add_argument("--concurrency", default="1,8,32,64")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--layout", default="shared", choices=sorted(layouts()))
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--slow-factor", type=float, default=2.5, help="window multiplier for ResNet-50")
    p.add_argument(
        "--stream-answers",
        type=int,
        default=MIN_STREAM_ANSWERS,
        help="windows grow until each worker gets this many answers at the ceiling's rate (0: fixed)",
    )
    p.add_argument("--ceiling-seconds", type=float, default=1.0, help="per configuration, full ceiling run")
    p.add_argument(
        "--window-ceiling-seconds",
        type=float,
        default=2.0,
        help="the ceiling timed before each trtforge window (its best configuration only)",
    )
    p.add_argument("--ceiling-batches", default="1,2,4,8,16,32")
    p.add_argument("--chosen-from", default=str(RESULTS / "serving.json"), help="the serving grid's result")
    p.add_argument("--name", default="serving-paired")
    p.add_argument("--client", choices=CLIENTS, default="native", help="see benchmarks.loadgen")
    a = p.parse_args(argv)
    if a.rounds < 1:
        p.error("--rounds must be at least 1")
    all_kinds = kinds()
    names = a.servers.split(",")
    unknown = [n for n in names if n not in all_kinds]
    if unknown or names[0] != "trtforge" or a.peer not in names:
        p.error(f"--servers {a.servers!r}: trtforge first, then known peers including --peer {a.peer!r}")
    grid = json.loads(Path(a.chosen_from).read_text())
    results: dict[str, Any] = {
        "config": vars(a),
        "peer": a.peer,
        "rounds": a.rounds,
        "layout": vars(layouts(a.client)[a.layout]),
        "loadavg_before": list(os.getloadavg()),
        "chosen_from": {"file": a.chosen_from, "finished_utc": grid.get("finished_utc")},
        "models": {},
    }
    t0 = time.monotonic()
    for name in a.models.split(","):
        chosen = {n: grid["models"][name]["servers"][n]["chosen"] for n in names}
        small = int(grid["models"][name].get("sweep_small_batch", 4))  # grids before it had 4
        results["models"][name] = run_model(name, [all_kinds[n] for n in names], chosen, small, a)
        write_result(a.name, {**results, "partial": True, "loadavg_after": list(os.getloadavg())})
    results["loadavg_after"] = list(os.getloadavg())
    results["wall_s"] = round(time.monotonic() - t0, 1)
    write_result(a.name, results)
    print(render(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
