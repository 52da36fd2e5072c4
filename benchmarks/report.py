"""Fill the generated tables of docs/benchmarks.md from benchmarks/results/*.json.

The page keeps its prose; only the text between ``<!-- results:NAME -->`` and
``<!-- /results:NAME -->`` is replaced (NAME: machine, serving, manycore, coldstart, controlplane,
recovery).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from typing import Any

from benchmarks.common import ROOT, log, read_result, table

DOC = ROOT / "docs" / "benchmarks.md"


def machine(res: dict[str, Any]) -> str:
    m = res["machine"]
    rows = [
        ["CPU", f"{m['cpu_model']}, {m['cpus']} vCPUs ({m['hypervisor']} guest)"],
        ["memory", f"{m['memory_gib']} GiB"],
        ["kernel", m["kernel"]],
        ["Python", m["python"]],
        ["ONNX Runtime (trtforge, ceiling)", m["onnxruntime"]],
        ["aiohttp (trtforge serve, HTTP load generator)", m["aiohttp"]],
        ["grpcio, tritonclient (gRPC load generator)", f"{m.get('grpcio')}, {m.get('tritonclient')}"],
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


def _wrap(text: str) -> str:
    """Plain tables pass through; prose lines from render() become paragraphs."""
    out = []
    for line in text.strip().splitlines():
        out.append(line if line.startswith("|") else f"\n{line}\n")
    return "\n".join(out).strip()


def main(argv: list[str] | None = None) -> int:
    from benchmarks import coldstart, controlplane, manycore, recovery, serving

    if not DOC.exists():
        log(f"{DOC} does not exist; nothing to fill")
        return 0
    doc = DOC.read_text()
    renderers: dict[str, tuple[str, Callable[[dict[str, Any]], str]]] = {
        "machine": ("serving", machine),
        "serving": ("serving", serving.render),
        "manycore": ("manycore", manycore.render),
        "coldstart": ("coldstart", coldstart.render),
        "controlplane": ("controlplane", controlplane.render),
        "recovery": ("recovery", recovery.render),
    }
    for marker, (name, fn) in renderers.items():
        res = read_result(name)
        if res is None:
            continue
        body = _wrap(fn(res))
        pat = re.compile(rf"(<!-- results:{marker} -->).*?(<!-- /results:{marker} -->)", re.S)
        if pat.search(doc):
            doc = pat.sub(lambda m, b=body: f"{m.group(1)}\n{b}\n{m.group(2)}", doc)
    DOC.write_text(re.sub(r"\n{3,}", "\n\n", doc))
    log(f"filled the tables of {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
