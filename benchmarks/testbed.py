"""The benchmarks' own test bed and operator metrics: shared by the control-plane and recovery runs."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

from benchmarks.common import TRTFORGE, http_get, write_result


def cluster(root: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    cmd = [*TRTFORGE, "cluster", "--root", str(root), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


class TestbedUnavailable(RuntimeError):
    """The benchmark's test bed could not be started."""


def ensure_testbed(root: Path) -> bool:
    """Start the test bed at `root` unless it is up; True when this call started it (stop it after)."""
    if cluster(root, "status").returncode == 0:
        return False
    up = cluster(root, "up")
    if up.returncode != 0:
        raise TestbedUnavailable(f"trtforge cluster up failed: {(up.stdout + up.stderr)[-1500:]}")
    return True


def not_measured(name: str, results: dict[str, Any], why: str, rc: int) -> int:
    """Record, write and print why benchmark `name` measured nothing; returns the exit code."""
    results["not_measured"]["all"] = why
    write_result(name, results)
    print(why)
    return rc


def operator_counters(port: int) -> dict[str, float]:
    status, body = http_get(f"http://127.0.0.1:{port}/metrics", timeout=5)
    out: dict[str, float] = {}
    if status != 200:
        return out
    for line in body.decode().splitlines():
        m = re.match(r"(trtforge_[a-zA-Z0-9_]+)(\{[^}]*\})? ([0-9.e+-]+)$", line)
        if not m or m.group(1).endswith(("_created", "_bucket")):  # creation timestamps, histograms
            continue
        out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out
