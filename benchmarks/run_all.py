"""``make bench``: every benchmark in turn, then the plots and the tables of docs/benchmarks.md.

The serving peers are installed each into its own virtual environment under ``.cache/``
(:mod:`benchmarks.servers.venvs`: KServe, Triton from ``nvidia-pytriton``, MLServer; each with the
project's own onnxruntime version), so their pins never touch the project's ``.venv`` or each other;
so is the load generator, ``perf_analyzer`` from the ``tritonclient==2.40.0`` wheel
(:mod:`benchmarks.perf`).
The control-plane and recovery benchmarks share one test bed of their own (``.cache/bench/cluster``),
brought up here and down at the end, as do the LLM deployment and group benchmarks (``--only
llm_deployment,llm_groups``).
The many-core benchmark (:mod:`benchmarks.manycore`) runs only with ``--only manycore`` on a host with
at least 16 cores.

``--quick`` runs short windows (a smoke test of the harness, not numbers to publish).
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from collections.abc import Callable

from benchmarks.common import CACHE, log


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--only",
        default="serving,coldstart,hostile,controlplane,recovery",
        help="also: manycore, llm, llm_deployment, llm_groups",
    )
    p.add_argument("--quick", action="store_true", help="short runs to check the harness")
    a = p.parse_args(argv)
    only = a.only.split(",")
    root = str(CACHE / "cluster")
    from benchmarks import (
        coldstart,
        controlplane,
        hostile,
        llm,
        llm_deployment,
        llm_groups,
        manycore,
        perf,
        plots,
        recovery,
        report,
        serving,
        testbed,
    )
    from benchmarks.servers import venvs

    q = a.quick
    steps: list[tuple[str, Callable[[list[str]], int], list[str]]] = [
        (
            "serving",
            serving.main,
            ["--concurrency", "1,8", "--interval-ms", "1000", "--max-trials", "4", "--stability", "20"]
            if q
            else [],
        ),
        ("coldstart", coldstart.main, ["--reps", "1"] if q else []),
        (
            "hostile",
            hostile.main,
            ["--rounds", "1", "--half-open", "50", "--family-seconds", "5"] if q else [],
        ),
        (
            "controlplane",
            controlplane.main,
            ["--root", root, "--keep-cluster", *(["--n", "10", "--runs", "1", "--quiet", "20"] if q else [])],
        ),
        ("recovery", recovery.main, ["--root", root, "--keep-cluster", *(["--reps", "1"] if q else [])]),
        ("manycore", manycore.main, ["--cores", "2,4", "--seconds", "2"] if q else []),
        ("llm", llm.main, ["--quick"] if q else []),
        ("llm_deployment", llm_deployment.main, ["--root", root, *(["--quick"] if q else [])]),
        ("llm_groups", llm_groups.main, ["--root", root, *(["--concurrency", "1"] if q else [])]),
    ]
    failed = []
    cluster_used = False
    for name, fn, args in steps:
        if name not in only:
            continue
        if name in ("serving", "manycore"):
            perf.PERF_ANALYZER.ensure()
        if name == "serving":
            venvs.main([])
        cluster_used |= name in ("controlplane", "recovery", "llm_deployment", "llm_groups")
        log(f"=== {name} {' '.join(args)}")
        t0 = time.monotonic()
        try:
            rc = fn(args)
        except Exception:
            traceback.print_exc()
            rc = 1
        log(f"=== {name}: exit {rc} after {time.monotonic() - t0:.0f}s")
        if rc:
            failed.append(name)
    if cluster_used:
        testbed.cluster(CACHE / "cluster", "down")
    plots.main([])
    report.main([])
    if failed:
        log(f"failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
