"""Triton's ``perf_analyzer``: the load generator of the serving benchmarks.

``perf_analyzer`` is the field's standard client for the KServe v2 / Triton protocol, and what a
reader runs to check a number. It ships as ``bin/perf_analyzer`` inside the ``tritonclient==2.40.0``
wheel (the PyPI project ``perf-analyzer`` is an empty placeholder); the binary links Debian's
``libb64-0d`` (``make bench`` installs it) and ``libcudart.so.12``, which the
``nvidia-cuda-runtime-cu12`` wheel provides. Both wheels go into a venv of their own
(``.cache/bench-perf-analyzer-venv``), and ``LD_LIBRARY_PATH`` points at the CUDA runtime's
directory there.

Each point is one ``perf_analyzer`` run in concurrency mode (``--concurrency-range C:C``) with its
own measurement rules: windows of ``--measurement-interval`` milliseconds, repeated until
``--stability-percentage`` holds over three windows in a row (throughput and average latency each
within that percentage of their mean), at most ``--max-trials`` windows. The point is the average of
the three stable windows, read from its ``-f`` CSV report (:func:`parse_csv`). A point that does not
settle within the trials is a failed point, reported as such, never a number.
"""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import log
from benchmarks.servers.venvs import Venv, site_packages

PERF_ANALYZER = Venv(
    "perf-analyzer", ("tritonclient==2.40.0", "nvidia-cuda-runtime-cu12==12.9.79"), onnxruntime=False
)
PROTOCOLS = ("http", "grpc")


# perf_analyzer's exit status when no three windows in a row agreed within --max-trials
# (its STABILITY_ERROR); any other non-zero status is an error (a failed request, a refused option).
UNSTABLE_EXIT = 2


class PerfError(RuntimeError):
    """perf_analyzer failed at a point: `returncode` UNSTABLE_EXIT when the point did not settle."""

    def __init__(self, message: str, returncode: int | None = None) -> None:
        super().__init__(message)
        self.returncode = returncode

    @property
    def unstable(self) -> bool:
        return self.returncode == UNSTABLE_EXIT


@dataclass(frozen=True)
class Windows:
    """perf_analyzer's measurement rules for one point."""

    interval_ms: int = 5000  # --measurement-interval
    stability_pct: int = 10  # --stability-percentage
    max_trials: int = 10  # --max-trials

    def flags(self) -> list[str]:
        return [
            f"--measurement-interval={self.interval_ms}",
            f"--stability-percentage={self.stability_pct}",
            f"--max-trials={self.max_trials}",
        ]


@dataclass(frozen=True)
class Point:
    """One concurrency level as perf_analyzer reports it (latencies in milliseconds)."""

    concurrency: int
    throughput: float  # inferences per second
    p50_ms: float
    p90_ms: float
    p95_ms: float
    p99_ms: float
    avg_ms: float | None  # only in a verbose report
    server_queue_ms: float | None  # from the server's statistics extension, where it has one
    server_compute_ms: float | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _ms(row: dict[str, str], column: str) -> float | None:
    v = (row.get(column) or "").strip()
    return round(float(v) / 1000.0, 3) if v else None


def parse_csv(text: str) -> list[Point]:
    """The points of a perf_analyzer ``-f`` report. Its columns are read by name: the server-side
    ones (queue, compute) are there only for servers with Triton's statistics extension
    (``/v2/models/NAME/stats``), the average latency only in a verbose report; latencies are in
    microseconds. Raises ValueError on a report without its throughput or latency columns."""
    lines = text.strip().splitlines()
    # After the table, a blank line may start a second block (server metrics): the table ends there.
    if "" in lines:
        lines = lines[: lines.index("")]
    rows = list(csv.DictReader(io.StringIO("\n".join(lines))))
    need = ("Concurrency", "Inferences/Second", "p50 latency", "p99 latency")
    if not rows or any(c not in rows[0] for c in need):
        raise ValueError(f"not a perf_analyzer concurrency report (columns {need} expected): {text[:300]!r}")
    out = []
    for r in rows:
        infer = [_ms(r, c) for c in ("Server Compute Input", "Server Compute Infer", "Server Compute Output")]
        out.append(
            Point(
                concurrency=int(r["Concurrency"]),
                throughput=round(float(r["Inferences/Second"]), 2),
                p50_ms=_ms(r, "p50 latency") or 0.0,
                p90_ms=_ms(r, "p90 latency") or 0.0,
                p95_ms=_ms(r, "p95 latency") or 0.0,
                p99_ms=_ms(r, "p99 latency") or 0.0,
                avg_ms=_ms(r, "Avg latency"),
                server_queue_ms=_ms(r, "Server Queue"),
                server_compute_ms=(
                    round(sum(v for v in infer if v is not None), 3)
                    if any(v is not None for v in infer)
                    else None
                ),
            )
        )
    return out


def binary() -> Path:
    return PERF_ANALYZER.path / "bin" / "perf_analyzer"


def env() -> dict[str, str]:
    """perf_analyzer's environment: the CUDA runtime library of its venv on ``LD_LIBRARY_PATH``."""
    cudart = site_packages(PERF_ANALYZER) / "nvidia" / "cuda_runtime" / "lib"
    prior = os.environ.get("LD_LIBRARY_PATH")
    return {**os.environ, "LD_LIBRARY_PATH": os.pathsep.join(filter(None, [str(cudart), prior]))}


def input_file(path: Path, input_name: str, x: np.ndarray) -> Path:
    """A perf_analyzer ``--input-data`` file holding one request of `x` (its batch of one dropped),
    so that every server computes on the same real input."""
    row = np.asarray(x, dtype=np.float32).reshape(x.shape[1:])
    doc = {"data": [{input_name: {"content": row.ravel().tolist(), "shape": list(row.shape)}}]}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


def command(
    address: str,
    protocol: str,
    model: str,
    concurrency: int,
    windows: Windows,
    report: Path,
    data: Path,
    json_tensors: bool = False,
) -> list[str]:
    """The perf_analyzer command for one point: `address` is host:port of the server's `protocol`
    endpoint; `json_tensors` sends and asks for JSON tensors over HTTP (for a server without binary
    tensors)."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol {protocol!r}: expected one of {PROTOCOLS}")
    cmd = [
        str(binary()),
        "-m",
        model,
        "-u",
        address,
        "-i",
        protocol,
        "-b",
        "1",
        f"--concurrency-range={concurrency}:{concurrency}",
        *windows.flags(),
        f"--input-data={data}",
        "-f",
        str(report),
    ]
    if json_tensors and protocol == "http":
        cmd += ["--input-tensor-format=json", "--output-tensor-format=json"]
    return cmd


def measure(cmd: list[str], report: Path, timeout: float) -> Point:
    """Run one perf_analyzer point; its parsed report, or PerfError with perf_analyzer's last words."""
    report.unlink(missing_ok=True)
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, env=env(), timeout=timeout)
    except subprocess.TimeoutExpired:
        raise PerfError(f"perf_analyzer did not finish in {timeout:.0f}s") from None
    tail = "\n".join((r.stdout + r.stderr).strip().splitlines()[-6:])
    if r.returncode != 0 or not report.exists():
        raise PerfError(f"perf_analyzer exited {r.returncode}: {tail}", r.returncode)
    try:
        points = parse_csv(report.read_text())
    except ValueError as e:
        raise PerfError(str(e)) from None
    if len(points) != 1:
        raise PerfError(f"perf_analyzer reported {len(points)} points for one concurrency: {tail}")
    log(f"      {' '.join(cmd)}")
    return points[0]


def version() -> str:
    return PERF_ANALYZER.version("tritonclient")
