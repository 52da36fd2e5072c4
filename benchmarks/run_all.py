"""``make bench``: every benchmark in turn, then the plots and the tables of docs/benchmarks.md.

KServe, the serving peer, is installed into its own virtual environment
(``.cache/bench-kserve-venv``: kserve 0.21 and the project's own onnxruntime version), so its pins
never touch the project's ``.venv``. The control-plane and recovery benchmarks share one test bed of
their own (``.cache/bench/cluster``), brought up here and down at the end.

``--quick`` runs short windows (a smoke test of the harness, not numbers to publish).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
import traceback
from collections.abc import Callable

from benchmarks.common import CACHE, KSERVE_VENV, log

KSERVE_VERSION = "0.21.0"


def ensure_kserve_venv() -> None:
    import onnxruntime

    py = KSERVE_VENV / "bin" / "python"
    stamp = KSERVE_VENV / f".installed-kserve-{KSERVE_VERSION}-ort-{onnxruntime.__version__}"
    if stamp.exists():
        return
    log(f"creating {KSERVE_VENV} (kserve {KSERVE_VERSION}, onnxruntime {onnxruntime.__version__})")
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(KSERVE_VENV)], check=True)
    pip = [str(py), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "--upgrade", "pip"], check=True)
    subprocess.run([*pip, f"kserve=={KSERVE_VERSION}", f"onnxruntime=={onnxruntime.__version__}"], check=True)
    stamp.touch()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default="serving,coldstart,controlplane,recovery")
    p.add_argument("--quick", action="store_true", help="short runs to check the harness")
    a = p.parse_args(argv)
    only = a.only.split(",")
    root = str(CACHE / "cluster")
    from benchmarks import coldstart, controlplane, plots, recovery, report, serving

    q = a.quick
    steps: list[tuple[str, Callable[[list[str]], int], list[str]]] = [
        (
            "serving",
            serving.main,
            ["--seconds", "3", "--warmup", "1", "--ceiling-seconds", "0.5", "--concurrency", "1,32"]
            if q
            else [],
        ),
        ("coldstart", coldstart.main, ["--reps", "1"] if q else []),
        (
            "controlplane",
            controlplane.main,
            ["--root", root, "--keep-cluster", *(["--n", "10", "--quiet", "20"] if q else [])],
        ),
        ("recovery", recovery.main, ["--root", root, "--keep-cluster", *(["--reps", "1"] if q else [])]),
    ]
    failed = []
    cluster_used = False
    for name, fn, args in steps:
        if name not in only:
            continue
        if name == "serving":
            ensure_kserve_venv()
        cluster_used |= name in ("controlplane", "recovery")
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
        controlplane.cluster(CACHE / "cluster", "down")
    plots.main([])
    report.main([])
    if failed:
        log(f"failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
