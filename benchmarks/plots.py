"""PNG plots for docs/benchmarks.md from the JSON in benchmarks/results/ (docs/img/bench-*.png)."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

from benchmarks.common import ROOT, log, read_result
from benchmarks.controlplane_summary import medians
from benchmarks.serving import PROTOCOL_TITLES

IMG = ROOT / "docs" / "img"
COLORS = {
    "trtforge": "#1f77b4",
    "triton": "#2ca02c",
    "mlserver": "#ff7f0e",
    "kserve": "#d62728",
    "ceiling": "#555555",
}
LABELS = {"trtforge": "trtforge serve", "triton": "Triton", "mlserver": "MLServer", "kserve": "KServe"}
PROTOCOL_STYLES = {"http": "o-", "grpc": "s--", "json": "^:"}
TITLES = {"squeezenet": "SqueezeNet", "resnet50": "ResNet-50"}


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": 10, "axes.grid": True, "grid.alpha": 0.3})
    return plt


def _save(fig: Any, name: str) -> Path:
    IMG.mkdir(parents=True, exist_ok=True)
    path = IMG / name
    fig.savefig(path, dpi=110, bbox_inches="tight")
    log(f"wrote {path.relative_to(ROOT)}")
    return path


def serving(res: dict[str, Any]) -> list[Path]:
    """Throughput and p99 against concurrency: one panel per model, one line per server and protocol."""
    plt = _plt()
    models = list(res["models"])
    out = []
    for metric, ylabel, fname, logy in (
        ("throughput", "inferences / s", "bench-serving-throughput.png", False),
        ("p99_ms", "p99 latency (ms, log scale)", "bench-serving-p99.png", True),
    ):
        fig, axes = plt.subplots(1, len(models), figsize=(6.2 * len(models), 4.4), squeeze=False)
        for j, model in enumerate(models):
            ax = axes[0][j]
            m = res["models"][model]
            for kind, srv in m["servers"].items():
                for proto, style in PROTOCOL_STYLES.items():
                    pts = sorted(
                        (p for p in srv["points"] if p["protocol"] == proto), key=lambda p: p["concurrency"]
                    )
                    if not pts:
                        continue
                    xs = [p["concurrency"] for p in pts]
                    ys = [p[metric] for p in pts]
                    ax.plot(
                        xs,
                        ys,
                        style,
                        color=COLORS.get(kind, "#777777"),
                        label=f"{LABELS.get(kind, kind)}, {proto}",
                    )
            if metric == "throughput":
                _ceiling(ax, m)
                ax.set_ylim(bottom=0)
            if logy:
                ax.set_yscale("log")
            ax.set_xscale("log", base=2)
            concs = sorted({p["concurrency"] for s in m["servers"].values() for p in s["points"]})
            ax.set_xticks(concs)
            ax.get_xaxis().set_major_formatter(plt.matplotlib.ticker.ScalarFormatter())
            ax.set_title(
                f"{TITLES.get(model, model)}: perf_analyzer, servers and client on cpus {res['cpus']}",
                fontsize=9,
            )
            ax.set_xlabel("concurrency (perf_analyzer --concurrency-range)")
            ax.set_ylabel(ylabel)
            ax.legend(fontsize=6.5, loc="best", ncol=2)
        fig.tight_layout()
        out.append(_save(fig, fname))
        plt.close(fig)
    return out


def _ceiling(ax: Any, model: dict[str, Any]) -> None:
    """The model's in-process ceiling and 90% of it."""
    c = model["ceiling"]["best"]["images_per_s"]
    ax.axhline(c, ls="--", color=COLORS["ceiling"], label=f"in-process ceiling ({c:.0f}/s)")
    ax.axhline(0.9 * c, ls=":", color=COLORS["ceiling"], label="90% of ceiling")


def manycore(res: dict[str, Any]) -> list[Path]:
    """req/s and the same-run ceiling against the server's cores, per model."""
    plt = _plt()
    runs = res.get("runs", [])
    models = list(dict.fromkeys(r["model"] for r in runs))
    if not models:
        return []
    fig, axes = plt.subplots(1, len(models), figsize=(5.6 * len(models), 3.8), squeeze=False)
    for j, model in enumerate(models):
        ax = axes[0][j]
        rs = [r for r in runs if r["model"] == model]
        ns = sorted({r["n"] for r in rs})
        ceil = [next(r for r in rs if r["n"] == n)["ceiling"]["best"]["images_per_s"] for n in ns]
        ax.plot(ns, ceil, "s--", color=COLORS["ceiling"], label="in-process ceiling")
        ax.plot(ns, [0.9 * c for c in ceil], ":", color=COLORS["ceiling"], label="90% of ceiling")
        for setting, proto in dict.fromkeys((r["setting"], r.get("protocol", "http")) for r in rs):
            mine = [r for r in rs if r["setting"] == setting and r.get("protocol", "http") == proto]
            best = [
                max((r for r in mine if r["n"] == n), key=lambda r: r["throughput"])
                for n in ns
                if any(r["n"] == n for r in mine)
            ]
            xs = [r["n"] for r in best]
            label = f"trtforge serve ({setting}, {PROTOCOL_TITLES.get(proto, proto)})"
            ax.plot(xs, [r["throughput"] for r in best], "o-", label=label)
            for r in best:
                share = r["round_shares"]["median"] if "round_shares" in r else r["pct_of_ceiling"]
                ax.annotate(
                    f"{share:.0f}%",
                    (r["n"], r["throughput"]),
                    textcoords="offset points",
                    xytext=(0, 6),
                    ha="center",
                    fontsize=7,
                )
        ax.set_xticks(ns)
        ax.set_xlabel("server cores (client on the rest)")
        ax.set_ylabel("requests (images) / s")
        ax.set_ylim(bottom=0)
        note = " (labels: of each round's ceiling)" if any("round_shares" in r for r in rs) else ""
        ax.set_title(f"{TITLES.get(model, model)}: one pod on N cores{note}", fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path = _save(fig, "bench-manycore.png")
    plt.close(fig)
    return [path]


def coldstart(res: dict[str, Any], fname: str = "bench-coldstart.png") -> list[Path]:
    plt = _plt()
    bars: list[tuple[str, list[tuple[str, float]]]] = []
    for src, e in res["sources"].items():
        fl = e["floor"]
        bars.append(
            (
                f"{src}: floor",
                [
                    ("interpreter + import", (fl["interpreter_s"] or 0) + (fl["import_s"] or 0)),
                    ("fetch / read", fl["read_s"] or 0),
                    ("load / session", fl["session_s"] or 0),
                ],
            )
        )
        for key, label in (
            ("serve_cold", "trtforge serve, empty cache"),
            ("serve_restart", "trtforge serve, restart"),
        ):
            s = e.get(key)
            if not s:
                continue
            listening = s.get("to_listening_s") or 0.0
            if s.get("warm_done_s") is not None:
                # The warm start verifies and loads while the server imports: a timeline, not a sum.
                loaded = max(listening, s["warm_done_s"])
                canary = s.get("canary_s") or 0.0
                parts = [
                    ("interpreter + import", listening),
                    ("engine verify + load, past listening", loaded - listening),
                    ("canary", canary),
                    ("other", max(0.0, s["total_s"] - loaded - canary)),
                ]
            else:
                parts = [
                    ("interpreter + import", listening),
                    ("fetch / read", s.get("fetch_s") or 0),
                    ("load / session", s.get("load_s") or 0),
                    ("canary", s.get("canary_s") or 0),
                ]
                parts.append(("other", max(0.0, s["total_s"] - sum(v for _, v in parts))))
            bars.append((f"{src}: {label}", parts))
    colors = {
        "interpreter + import": "#9ecae1",
        "fetch / read": "#fdae6b",
        "load / session": "#74c476",
        "engine verify + load, past listening": "#31a354",
        "canary": "#d62728",
        "other": "#bdbdbd",
    }
    fig, ax = plt.subplots(figsize=(9, 0.6 * len(bars) + 1.5))
    seen: set[str] = set()
    for i, (_label, parts) in enumerate(bars):
        left = 0.0
        for name, v in parts:
            ax.barh(i, v, left=left, color=colors[name], label=None if name in seen else name)
            seen.add(name)
            left += v
        ax.text(left, i, f" {left:.2f} s", va="center", fontsize=8)
    ax.set_yticks(range(len(bars)))
    ax.set_yticklabels([b[0] for b in bars], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds from process start to ready (median)")
    where = f", {res['machine']['cpu_model']}, cpus {res['cpus']}" if res.get("machine") else ""
    ax.set_title(
        f"Cold start, {res['model']} ({res['artifact_bytes'] / 1e6:.0f} MB artifact{where})", fontsize=10
    )
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=3)
    ax.set_xlim(right=ax.get_xlim()[1] * 1.08)
    fig.tight_layout()
    path = _save(fig, fname)
    plt.close(fig)
    return [path]


def controlplane(res: dict[str, Any]) -> list[Path]:
    """Time from the first create against N, log-log, per scenario, with a slope-1 reference line."""
    plt = _plt()
    cases = [c for c in res.get("cases", []) if c.get("done_s")]
    if not cases:
        return []
    rows = [m for m in medians(res["cases"]) if m["median_s"] is not None and math.isfinite(m["median_s"])]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    for scenario, color in (("cache", "#1f77b4"), ("jobs", "#ff7f0e")):
        pts = sorted((m["n"], m["median_s"]) for m in rows if m["scenario"] == scenario)
        if not pts:
            continue
        xs, ys = [x for x, _ in pts], [y for _, y in pts]
        ax1.loglog(xs, ys, "o-", color=color, label=f"{scenario}: time from the first create (median)")
        ax1.loglog(xs, [ys[0] * x / xs[0] for x in xs], ":", color=color, label=f"{scenario}: slope 1")
        peak: dict[int, float] = {}  # the highest run of each N
        for c in cases:
            if c["scenario"] == scenario and c["operator_peak_rss_mb"]:
                peak[c["n"]] = max(peak.get(c["n"], 0.0), c["operator_peak_rss_mb"])
        rss = sorted(peak.items())
        ax2.plot([x for x, _ in rss], [y for _, y in rss], "o-", color=color, label=scenario)
    ax1.set_xlabel("TRTEngines (x 3 targets)")
    ax1.set_ylabel("seconds")
    ax1.set_title("All Ready (cache) / all Jobs exist (jobs)", fontsize=9)
    ax1.legend(fontsize=7)
    ax2.set_xlabel("TRTEngines (x 3 targets)")
    ax2.set_ylabel("operator peak RSS, MB")
    ax2.set_title("Operator memory (highest run)", fontsize=9)
    ax2.legend(fontsize=7)
    fig.tight_layout()
    path = _save(fig, "bench-controlplane.png")
    plt.close(fig)
    return [path]


def recovery(res: dict[str, Any]) -> list[Path]:
    plt = _plt()
    runs = [r for r in res.get("runs", []) if r.get("ready_again_s") is not None]
    if not runs:
        return []
    fig, ax = plt.subplots(figsize=(8, 0.5 * len(runs) + 1.8))
    labels = [f"{'rebuild' if r['rebuild'] else 'no rebuild'} #{i}" for i, r in enumerate(runs)]
    seen: set[str] = set()
    for i, r in enumerate(runs):
        det = r.get("detect_s") or 0.0
        ready = r["ready_again_s"]
        segs = [
            ("fault seen in status", 0.0, det, "#fdae6b"),
            ("pod moved, Ready again", det, ready, "#74c476"),
        ]
        end = ready
        if r.get("ready_after_rebuild_s") is not None:
            end = r["ready_after_rebuild_s"]
            segs.append(("rebuild done, Ready on it", ready, end, "#6baed6"))
        for name, a, b, color in segs:
            ax.barh(i, max(0.0, b - a), left=a, color=color, label=None if name in seen else name)
            seen.add(name)
        ax.text(end, i, f" {end:.1f} s", va="center", fontsize=8)
    ax.set_yticks(range(len(runs)))
    ax.set_yticklabels(labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds after `trtforge cluster fault` (Xid 79)")
    ax.set_title("Time to recover: InferenceDeployment Ready again", fontsize=10)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=3)
    ax.set_xlim(right=ax.get_xlim()[1] * 1.1)
    fig.tight_layout()
    path = _save(fig, "bench-recovery.png")
    plt.close(fig)
    return [path]


def main(argv: list[str] | None = None) -> int:
    made: list[Path] = []
    for name, fn in (
        ("serving", serving),
        ("manycore", manycore),
        ("coldstart", coldstart),
        ("coldstart-h200", lambda r: coldstart(r, "bench-coldstart-h200.png")),
        ("controlplane", controlplane),
        ("recovery", recovery),
    ):
        res = read_result(name)
        if res is None:
            log(f"no results/{name}.json; no plot")
            continue
        try:
            made += fn(res)
        except KeyError as e:
            log(f"results/{name}.json is from an older harness (no {e}); no plot")
    return 0 if made else 1


if __name__ == "__main__":
    sys.exit(main())
