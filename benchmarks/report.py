"""Fill the generated tables of docs/benchmarks.md from benchmarks/results/*.json.

The page keeps its prose; only the text between ``<!-- results:NAME -->`` and
``<!-- /results:NAME -->`` is replaced (NAME: machine, serving, manycore, hostile, hostile_families,
hostile_front_door, coldstart, coldstart-h200, controlplane, recovery, ha, and targets).
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
    """The serving run's machine and versions, one paragraph."""
    m = res["machine"]
    served = {
        s["versions"].get("trtforge")
        for mod in res["models"].values()
        for k, s in mod["servers"].items()
        if k == "trtforge" and "versions" in s
    }
    # the peers' venvs: the serving result's own record (older files kept them under "machine")
    peers = res.get("peer_versions") or m.get("peers") or {}
    venvs = "; ".join(f"{n}: " + ", ".join(f"{d} {v}" for d, v in vs.items()) for n, vs in peers.items())
    load = " / ".join(f"{x[0]:.2f}" for x in (res.get("loadavg_before"), res.get("loadavg_after")) if x)
    return (
        f"**Machine:** {m['cpu_model']}, {m['cpus']} vCPUs ({m['hypervisor']} guest), {m['memory_gib']} GiB,"
        f" kernel {m['kernel']}, Python {m['python']}. **trtforge serve and the ceiling:** ONNX Runtime"
        f" {m['onnxruntime']}, aiohttp {m['aiohttp']}, grpcio {m.get('grpcio')}. **Load generator:**"
        f" perf_analyzer of tritonclient {res['load_generator']['tritonclient']}."
        + (f" **Peers' venvs:** {venvs}." if venvs else "")
        + f" **Harness commit / trtforge serve measured:** {m['trtforge_commit']} /"
        f" {', '.join(sorted(v for v in served if v)) or m['trtforge_commit']}. **Finished (UTC):**"
        f" {res['finished_utc']}; 1-min load average before / after the serving run"
        f" {load or m['loadavg_at_start']}."
    )


def _met(ok: bool | None) -> str:
    return "-" if ok is None else "**met**" if ok else "**missed**"


def _trtforge_points(serving: dict[str, Any], model: str, protocol: str) -> dict[int, dict[str, Any]]:
    return _points(serving, model, "trtforge", protocol)


def _points(serving: dict[str, Any], model: str, server: str, protocol: str) -> dict[int, dict[str, Any]]:
    srv = serving["models"][model]["servers"].get(server) or {}
    return {p["concurrency"]: p for p in srv.get("points", []) if p["protocol"] == protocol}


# trtforge against Triton over the same protocol, at every concurrency of the run: at least this share.
SAME_PROTOCOL_SHARE = {"http": 0.95, "grpc": 0.85}


def _against_triton(serving: dict[str, Any], model: str, protocol: str) -> list[Any] | None:
    """A targets row: trtforge's throughput over `protocol` against Triton's over the same protocol."""
    ours, theirs = _points(serving, model, "trtforge", protocol), _points(serving, model, "triton", protocol)
    conc = sorted(set(ours) & set(theirs))
    if not conc:
        return None
    ratios = {c: ours[c]["throughput"] / max(theirs[c]["throughput"], 1e-9) for c in conc}
    want = SAME_PROTOCOL_SHARE[protocol]
    name = "HTTP binary" if protocol == "http" else "gRPC"
    return [
        f"{model}: trtforge {name} ≥ {want}x Triton's {name} at every concurrency",
        ", ".join(f"c={c}: {r:.2f}x" for c, r in ratios.items()),
        _met(min(ratios.values()) >= want),
    ]


def targets(
    serving: dict[str, Any] | None, coldstart: dict[str, Any] | None, manycore: dict[str, Any] | None
) -> str:
    """The targets against the result files, one row each (computed, not written by hand)."""
    rows: list[list[Any]] = []
    summ = (serving or {}).get("summary") or {}
    for model, s in summ.items():
        assert serving is not None
        pts = s.get("points") or []
        if pts:
            detail = ", ".join(
                f"c={p['concurrency']}: {p['ratio']}x {p['best_peer']['server']} ({p['verdict']})"
                for p in pts
            )
            ok = all(p["verdict"] in MET_VERDICTS for p in pts)
            rows.append(
                [f"{model}: trtforge ≥ the best of Triton and MLServer, p99 no higher", detail, _met(ok)]
            )
        http = _trtforge_points(serving, model, "http")
        ge8 = [p["pct_of_ceiling"] for c, p in http.items() if c >= 8 and "pct_of_ceiling" in p]
        if ge8:
            rows.append(
                [
                    f"{model}: ≥ 90% of the ceiling at c ≥ 8 (HTTP binary)",
                    f"lowest {min(ge8)}%",
                    _met(min(ge8) >= 90),
                ]
            )
        grpc = _trtforge_points(serving, model, "grpc")
        if 32 in http and 32 in grpc:
            g = grpc[32]["throughput"] / max(http[32]["throughput"], 1e-9)
            rows.append(
                [f"{model}: gRPC within 10% of HTTP binary at c=32", f"gRPC = {g:.2f}x HTTP", _met(g >= 0.9)]
            )
        for protocol in SAME_PROTOCOL_SHARE:
            if (row := _against_triton(serving, model, protocol)) is not None:
                rows.append(row)
    for src, e in ((coldstart or {}).get("sources") or {}).items():
        r = e.get("ratio_cold")
        if r is not None:
            rows.append([f"cold start ≤ 1.25x the floor ({src}://)", f"{r}x", _met(r <= 1.25)])
    # The many-core targets: each protocol at each concurrency on the most cores measured.
    runs = (manycore or {}).get("runs") or []
    for model, want in (("squeezenet", 85.0), ("resnet50", 90.0)):
        n = max((x["n"] for x in runs if x["model"] == model), default=0)
        for run in sorted(
            (r for r in runs if r["model"] == model and r["n"] == n),
            key=lambda r: (r.get("protocol", "http"), r["concurrency"], r["setting"]),
        ):
            share = _manycore_share(run)
            against = "its round's ceiling, median round" if "round_shares" in run else "the ceiling"
            rows.append(
                [
                    f"{model}: ≥ {want:.0f}% of the same-run ceiling on {n} server cores,"
                    f" {run.get('protocol', 'http')} at c={run['concurrency']}",
                    f"{share}% of {against} ({run['setting']}, errors {run['errors']})",
                    _met(share >= want and not run["errors"]),
                ]
            )
    return table(["target", "result", ""], rows) if rows else "(no results)"


def _manycore_share(run: dict[str, Any]) -> float:
    """A many-core row's share: of its own round's ceiling (median round) where it ran in rounds, else
    of the run's one ceiling."""
    return float(run["round_shares"]["median"] if "round_shares" in run else run["pct_of_ceiling"])


def provenance(res: dict[str, Any]) -> str:
    """Where and from which commit a result file comes, one line."""
    m = res.get("machine") or {}
    when = res.get("finished_utc") or res.get("finished") or "?"
    return (
        f"*Result file of {when}: {m.get('cpu_model', '?')}, {m.get('cpus', '?')} vCPUs"
        f" ({m.get('hypervisor', '?')} guest), trtforge at {m.get('trtforge_commit', '?')},"
        f" 1-min load average {float(m.get('loadavg_at_start') or 0):.2f} when written.*"
    )


def _wrap(text: str) -> str:
    """Plain tables pass through; prose lines from render() become paragraphs."""
    out = []
    for line in text.strip().splitlines():
        out.append(line if line.startswith("|") else f"\n{line}\n")
    return "\n".join(out).strip()


def main(argv: list[str] | None = None) -> int:
    from benchmarks import (
        coldstart,
        controlplane_summary,
        ha,
        hostile,
        llm_deployment,
        llm_groups,
        manycore,
        recovery,
        serving,
    )

    if not DOC.exists():
        log(f"{DOC} does not exist; nothing to fill")
        return 0
    doc = DOC.read_text()
    renderers: dict[str, tuple[str, Callable[[dict[str, Any]], str]]] = {
        "machine": ("serving", machine),
        "serving": ("serving", serving.render),
        "manycore": ("manycore", manycore.render),
        "hostile": ("hostile", hostile.render),
        "hostile_families": ("hostile_families", hostile.render_families),
        "hostile_front_door": ("hostile_front_door", hostile.render_front_door),
        "coldstart": ("coldstart", coldstart.render),
        "coldstart-h200": ("coldstart-h200", coldstart.render),
        "controlplane": ("controlplane", controlplane_summary.render),
        "recovery": ("recovery", recovery.render),
        "ha": ("ha", ha.render),
        "llm_deployment": ("llm_deployment", llm_deployment.render),
        "llm_groups": ("llm_groups", llm_groups.render),
    }
    try:
        body = targets(read_result("serving"), read_result("coldstart"), read_result("manycore"))
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
            text = fn(res)
            if marker not in ("machine", "serving"):  # the provenance opens the first paragraph
                text = f"{provenance(res)}{chr(10) if text.startswith('|') else ' '}{text}"
            body = _wrap(text)
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
