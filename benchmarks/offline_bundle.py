"""An offline bundle: what the many-core benchmark needs on a host with no package index (a GPU node
behind an air gap, or a lent machine that reaches nothing), in one folder that travels beside a copy
of the checkout.

It holds the runtime's and the benchmark client's wheels for the host's Python (pinned to the
versions of this venv, so both sides run the same code), our own distributions as wheels,
``perf_analyzer``'s wheels (``tritonclient`` 2.40.0 and the CUDA 12 runtime, :mod:`benchmarks.perf`)
and Debian's ``libb64-0d`` it links, each model's ONNX file and its engine store, and ``run.sh``,
which installs all of it under ``/tmp`` and the checkout's ``.cache`` and then runs its arguments:

    python -m benchmarks.offline_bundle --models squeezenet          # here: .cache/offline-bundle
    .cache/offline-bundle/run.sh python3 -m benchmarks.manycore --cores 14 --models squeezenet \\
        --protocols http,grpc --concurrency 28,56                    # there, in the checkout's root

The host's own numpy and ONNX Runtime are used (the serving venv's ONNX Runtime on both sides).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path

from benchmarks.common import CACHE, ROOT, log

# What `trtforge serve` imports and what the benchmark's own client (tritonclient, answers checked
# before a run) imports, by distribution; numpy and onnxruntime come with the host.
RUNTIME = (
    "aiohttp", "aiohappyeyeballs", "aiosignal", "attrs", "frozenlist", "multidict", "propcache", "yarl",
    "idna", "prometheus-client", "protobuf", "grpcio", "pydantic", "pydantic-core", "typing-extensions",
    "annotated-types", "typing-inspection", "pyyaml", "nvidia-ml-py",
)  # fmt: skip
CLIENT = (
    "tritonclient", "geventhttpclient", "gevent", "greenlet", "brotli", "certifi", "zope.event",
    "zope.interface", "python-rapidjson", "packaging", "urllib3",
)  # fmt: skip
# Left out of the bundle: what the host has (ONNX Runtime and what it needs), and the S3 client's,
# since the benchmark's store is a directory.
HOST = ("numpy", "onnx", "onnxruntime", "flatbuffers", "ml-dtypes")
S3_ONLY = ("botocore", "jmespath", "python-dateutil", "six")
OURS = (ROOT, ROOT / "runtime_image")  # trtforge and trtforge-runtime (their entry points)
LIBB64 = "libb64-0d"
PLATFORMS = (
    "manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
    "manylinux_2_5_x86_64", "manylinux1_x86_64", "any",
)  # fmt: skip

RUN_SH = """#!/bin/bash
# Installs this bundle (wheels under /tmp/site, perf_analyzer's venv and the engine stores under the
# checkout's .cache) and runs "$@" from the checkout's root (benchmarks/offline_bundle.py).
set -eo pipefail
B=$(cd "$(dirname "$0")" && pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site "$B"/wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD:$PWD/dev PYTHONUNBUFFERED=1
VENV=$PWD/.cache/bench-perf-analyzer-venv
if [ ! -x "$VENV/bin/perf_analyzer" ]; then
  python3 -m venv --without-pip "$VENV"
  python3 -m pip install -q --no-index --no-deps --no-compile --prefix "$VENV" "$B"/perf-analyzer/*.whl
fi
python3 -c "from benchmarks.perf import PERF_ANALYZER as v; v.stamp().touch()"
mkdir -p /tmp/libb64 && dpkg -x "$B"/debs/*.deb /tmp/libb64
export LD_LIBRARY_PATH=/tmp/libb64/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
mkdir -p .cache/bench && cp -r "$B"/bench/. .cache/bench/
echo "offline bundle installed: $(nproc) CPUs, $(python3 --version)"
"$@"
"""


def pins(names: Sequence[str], version: Callable[[str], str] = metadata.version) -> list[str]:
    """``name==version`` for each distribution, at this environment's version (`version` looks it up),
    so the host runs what was measured here."""
    return [f"{n}=={version(n)}" for n in names]


def pip_download(requirements: Sequence[str], dest: Path, python_version: str) -> None:
    """Binary wheels of `requirements` (no dependencies: the lists name them all) for the host."""
    platforms = [a for p in PLATFORMS for a in ("--platform", p)]
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
         "--python-version", python_version, "--implementation", "cp", *platforms, "-d", str(dest),
         *requirements],
        check=True,
    )  # fmt: skip


def build(out: Path, models: Sequence[str], python_version: str) -> Path:
    """Write the bundle into `out` (replacing it); returns its run script."""
    from benchmarks.engines import ensure_engine, store_dir
    from benchmarks.models import model_file
    from benchmarks.perf import PERF_ANALYZER

    if out.exists():
        shutil.rmtree(out)
    wheels, pa, debs, bench = out / "wheels", out / "perf-analyzer", out / "debs", out / "bench"
    for d in (wheels, pa, debs, bench / "models"):
        d.mkdir(parents=True)
    log(f"wheels for Python {python_version}: the runtime's and the client's, at this venv's versions")
    pip_download(pins([*RUNTIME, *CLIENT]), wheels, python_version)
    pip_download(PERF_ANALYZER.packages, pa, python_version)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheels),
         *map(str, OURS)],
        check=True,
    )  # fmt: skip
    subprocess.run(["apt-get", "download", LIBB64], cwd=debs, check=True, capture_output=True)
    for name in models:
        src, store = model_file(name), store_dir(name)
        key, who = ensure_engine(src, store)
        log(f"{name}: engine {key[:12]} ({who})")
        shutil.copy2(src, bench / "models" / src.name)
        shutil.copytree(store, bench / store.relative_to(CACHE))
    run = out / "run.sh"
    run.write_text(RUN_SH)
    run.chmod(0o755)
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    there = run.relative_to(ROOT) if run.is_relative_to(ROOT) else run
    log(f"offline bundle: {out} ({size / 2**20:.1f} MiB); there, in the checkout's root: {there} COMMAND...")
    return run


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="squeezenet", help="comma-separated model names")
    p.add_argument("--python-version", default="3.12", help="the host's Python, major.minor")
    p.add_argument("--out", default=str(CACHE.parent / "offline-bundle"))
    a = p.parse_args(argv)
    build(Path(a.out), [m for m in a.models.split(",") if m], a.python_version)
    return 0


if __name__ == "__main__":
    sys.exit(main())
