"""Fill the generated tables of docs/benchmarks.md from benchmarks/results/*.json.

The page keeps its prose; only the text between ``<!-- results:NAME -->`` and
``<!-- /results:NAME -->`` is replaced (NAME: machine, serving, serving-paired, manycore, coldstart,
controlplane, recovery).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from typing import Any

from benchmarks.common import ROOT, log, read_result, table
from benchmarks.serving import MET_VERDICTS

DOC = ROOT / "docs" / "benchmarks.md"


def machine(res: dict[str, Any]) -> str:
    m = res["machine"]
    rows = [
        ["CPU", f"{m['cpu_model']}, {m['cpus']} vCPUs ({m['hypervisor']} guest)"],
        ["memory", f"{m['memory_gib']} GiB"],
        ["kernel", m["kernel"]],
        ["Python", m["python"]],
        ["ONNX Runtime (trtforge, ceiling)", m["onnxruntime"]],
        ["aiohttp (trtforge serve)", m["aiohttp"]],
        # runs before the fourteenth session's drove HTTP with aiohttp and did not record httptools
        ["httptools (trtforge serve's fast path, HTTP load generator)", m.get("httptools", "not recorded")],
        ["grpcio (trtforge serve)", m.get("grpcio")],
        # the gRPC load generator was grpcio's client before the fourteenth session
        [
            "hpack (trtforge serve's gRPC front end, gRPC load generator), tritonclient",
            f"{m.get('hpack', 'not recorded')}, {m.get('tritonclient')}",
        ],
    ]
    for name, versions in (m.get("peers") or {}).items():
        rows.append([f"{name} venv", ", ".join(f"{d} {v}" for d, v in versions.items())])
    rows += [
        ["trtforge commit", m["trtforge_commit"]],
        ["run finished (UTC)", res["finished_utc"]],
        [
            "1-min load average before / after the serving run",
            " / ".join(f"{x[0]:.2f}" for x in (res.get("loadavg_before"), res.get("loadavg_after")) if x)
            or m["loadavg_at_start"],
        ],
    ]
    return table(["", ""], rows)


def _met(ok: bool | None) -> str:
    return "-" if ok is None else "**met**" if ok else "**missed**"


# A grid row whose point the paired rounds measured again (docs/benchmarks.md, "Which rows decide").
SHOWN = "shown (one window; the paired rounds decide)"
# A row that is no target of its own: gRPC's share of the ceiling (its target is its ratio to HTTP).
INFO = "shown"


def paired_decides(grid_points: list[dict[str, Any]], paired: dict[str, Any] | None, model: str) -> bool:
    """Whether `model`'s serving rows are decided by the paired rounds rather than by the grid's single
    windows: the paired rounds measured the model, and their peer is the grid's best peer at every
    point (a point where another peer led is judged in the grid)."""
    if not paired or model not in (paired.get("models") or {}):
        return False
    return all(p["best_peer"]["server"] == paired.get("peer") for p in grid_points)


def _grid_met(ok: bool, by_paired: bool) -> str:
    """A grid row's status: met or missed, or shown where the paired rounds decide its model."""
    return SHOWN if by_paired else _met(ok)


def targets(
    serving: dict[str, Any] | None,
    coldstart: dict[str, Any] | None,
    manycore: dict[str, Any] | None,
    paired: dict[str, Any] | None = None,
) -> str:
    """The issue's targets against the result files, one row each (computed, not written by hand).
    Rows marked "paired rounds" come from benchmarks/paired.py: medians of rounds in which trtforge
    and the peer were measured back to back. Where those rounds measured a model, they decide its
    serving rows; its grid rows are shown beside them, each from one window."""
    rows: list[list[Any]] = []
    summ = (serving or {}).get("summary") or {}
    for model, s in summ.items():
        pts = s.get("points") or []
        by_paired = paired_decides(pts, paired, model)
        if pts:
            verdicts = [p["verdict"] for p in pts]
            detail = ", ".join(
                f"c={p['concurrency']}: {p['ratio']}x {p['best_peer']['server']} ({p['verdict']})"
                for p in pts
            )
            ok = all(v in MET_VERDICTS for v in verdicts)
            rows.append(
                [
                    f"{model}: trtforge ≥ the best of Triton and MLServer, p99 no higher",
                    detail,
                    _grid_met(ok, by_paired),
                ]
            )
        for proto in ("http", "grpc"):
            v = s.get(f"min_pct_of_ceiling_c_ge_8_{proto}")
            if v is not None:
                # the share's target is HTTP binary's; gRPC's own is "within 10% of HTTP binary"
                met = _grid_met(v >= 90, by_paired) if proto == "http" else INFO
                rows.append([f"{model}: ≥ 90% of the ceiling at c ≥ 8 ({proto})", f"lowest {v}%", met])
        g = s.get("grpc_vs_http_c32")
        if g is not None:
            within = _grid_met(g >= 0.9, by_paired)
            rows.append([f"{model}: gRPC within 10% of HTTP binary at c=32", f"gRPC = {g:.2f}x HTTP", within])
    for model, m in ((paired or {}).get("models") or {}).items():
        peer = (paired or {}).get("peer", "peer")
        pts = m.get("best_protocol_points") or []
        if pts:
            detail = ", ".join(
                f"c={p['concurrency']}: {(r := p['paired_ratio'])['median']}x"
                f" ({r['rounds_at_or_above']}/{r['rounds']} rounds, {p['verdict']})"
                for p in pts
            )
            ok = all(p["verdict"] in MET_VERDICTS for p in pts)
            rows.append([f"{model}: trtforge ≥ {peer}, p99 no higher (paired rounds)", detail, _met(ok)])
        for proto in ("http", "grpc"):
            ge8 = [
                p["pct_of_ceiling"]["median"]
                for p in m.get("points") or []
                if p["concurrency"] >= 8 and p["protocol"] == proto
            ]
            if ge8:
                rows.append(
                    [
                        f"{model}: ≥ 90% of the ceiling at c ≥ 8 ({proto}, paired rounds)",
                        f"lowest {min(ge8)}%",
                        _met(min(ge8) >= 90) if proto == "http" else INFO,
                    ]
                )
        g = (m.get("trtforge_grpc_over_http_c32") or {}).get("median")
        if g is not None:
            rows.append(
                [
                    f"{model}: gRPC within 10% of HTTP binary at c=32 (paired rounds)",
                    f"gRPC = {g:.2f}x HTTP",
                    _met(g >= 0.9),
                ]
            )
    for src, e in ((coldstart or {}).get("sources") or {}).items():
        r = e.get("ratio_cold")
        if r is not None:
            rows.append([f"cold start ≤ 1.25x the floor ({src}://)", f"{r}x", _met(r <= 1.25)])
    # The many-core targets are HTTP binary's (the protocol every many-core run has).
    runs = [r for r in (manycore or {}).get("runs") or [] if r.get("protocol", "http") == "http"]
    for model, want in (("squeezenet", 85.0), ("resnet50", 90.0)):
        at14 = [r for r in runs if r["model"] == model and r["n"] == max((x["n"] for x in runs), default=0)]
        if at14:
            best = max(at14, key=_manycore_share)
            share = _manycore_share(best)
            against = "its round's ceiling, median round" if "round_shares" in best else "the ceiling"
            rows.append(
                [
                    f"{model}: ≥ {want:.0f}% of the same-run ceiling on {best['n']} server cores",
                    f"{share}% of {against} ({best['setting']}, errors {best['errors']})",
                    _met(share >= want and not best["errors"]),
                ]
            )
    return table(["target", "result", ""], rows) if rows else "(no results)"


def _manycore_share(run: dict[str, Any]) -> float:
    """A many-core row's share: of its own round's ceiling (median round) where it ran in rounds, else
    of the run's one ceiling (results from before the rounds)."""
    return float(run["round_shares"]["median"] if "round_shares" in run else run["pct_of_ceiling"])


def _wrap(text: str) -> str:
    """Plain tables pass through; prose lines from render() become paragraphs."""
    out = []
    for line in text.strip().splitlines():
        out.append(line if line.startswith("|") else f"\n{line}\n")
    return "\n".join(out).strip()


def main(argv: list[str] | None = None) -> int:
    from benchmarks import coldstart, controlplane, hostile, manycore, paired, recovery, serving

    if not DOC.exists():
        log(f"{DOC} does not exist; nothing to fill")
        return 0
    doc = DOC.read_text()
    renderers: dict[str, tuple[str, Callable[[dict[str, Any]], str]]] = {
        "machine": ("serving", machine),
        "serving": ("serving", serving.render),
        "serving-paired": ("serving-paired", paired.render),
        "manycore": ("manycore", manycore.render),
        "manycore-workers": ("manycore-workers", manycore.render),
        "hostile": ("hostile", hostile.render),
        "coldstart": ("coldstart", coldstart.render),
        "coldstart-h200": ("coldstart-h200", coldstart.render),
        "controlplane": ("controlplane", controlplane.render),
        "recovery": ("recovery", recovery.render),
    }
    try:
        body = targets(
            read_result("serving"),
            read_result("coldstart"),
            read_result("manycore"),
            read_result("serving-paired"),
        )
    except KeyError as e:
        body = f"(a result file is from an older harness: no {e})"
    doc = re.sub(
        r"(<!-- results:targets -->).*?(<!-- /results:targets -->)",
        lambda m: f"{m.group(1)}\n{body}\n{m.group(2)}",
        doc,
        flags=re.S,
    )
    for marker, (name, fn) in renderers.items():
        res = read_result(name)
        if res is None:
            continue
        try:
            body = _wrap(fn(res))
        except KeyError as e:
            log(f"results/{name}.json is from an older harness (no {e}); its table is left as it was")
            continue
        pat = re.compile(rf"(<!-- results:{marker} -->).*?(<!-- /results:{marker} -->)", re.S)
        if pat.search(doc):
            doc = pat.sub(lambda m, b=body: f"{m.group(1)}\n{b}\n{m.group(2)}", doc)
    DOC.write_text(re.sub(r"\n{3,}", "\n\n", doc))
    log(f"filled the tables of {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
