"""Shared helpers: paths, machine description, result files, tables, processes, CPU accounting."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import platform
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# One port picker for the project's processes, the test bed's: a process's ports come from one call.
from trtforge_dev.testbed.procs import free_port as free_port
from trtforge_dev.testbed.procs import free_ports as free_ports

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
CACHE = ROOT / ".cache" / "bench"
# `BENCH_TRTFORGE` replaces the command, e.g. where the distributions are not installed (a device
# machine that gets the source tree only).
TRTFORGE = shlex.split(os.environ.get("BENCH_TRTFORGE", "")) or [sys.executable, "-m", "trtforge.cli"]
CLK_TCK = os.sysconf("SC_CLK_TCK")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --- the machine ------------------------------------------------------------------------------
def cmd_output(args: Sequence[str]) -> str:
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=30, check=False).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""


def pkg_version(python: Path | str, module: str) -> str:
    out = cmd_output(
        [str(python), "-c", f"from importlib.metadata import version; print(version({module!r}))"]
    )
    return out.splitlines()[-1] if out else "absent"


def machine_info() -> dict[str, Any]:
    lscpu = cmd_output(["lscpu"])
    model = re.search(r"Model name:\s*(.+)", lscpu)
    hyper = re.search(r"Hypervisor vendor:\s*(.+)", lscpu)
    mem_kb = 0
    with contextlib.suppress(OSError):
        m = re.search(r"MemTotal:\s*(\d+)", Path("/proc/meminfo").read_text())
        mem_kb = int(m.group(1)) if m else 0
    return {
        "cpu_model": model.group(1).strip() if model else platform.processor(),
        "cpus": os.cpu_count(),
        "hypervisor": hyper.group(1).strip() if hyper else "none",
        "memory_gib": round(mem_kb / 2**20, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "onnxruntime": pkg_version(sys.executable, "onnxruntime"),
        "aiohttp": pkg_version(sys.executable, "aiohttp"),
        "grpcio": pkg_version(sys.executable, "grpcio"),
        "tritonclient": pkg_version(sys.executable, "tritonclient"),
        # BENCH_COMMIT: the commit the files are, where the checkout's .git is not (a copy of the
        # working tree whose .git is older than its files).
        "trtforge_commit": os.environ.get("BENCH_COMMIT")
        or cmd_output(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"]),
        "loadavg_at_start": os.getloadavg()[0],
    }


def write_result(name: str, payload: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    doc = {
        "benchmark": name,
        "finished_utc": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": machine_info(),
        **payload,
    }
    path = RESULTS / f"{name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=False) + "\n")
    os.replace(tmp, path)
    log(f"wrote {path.relative_to(ROOT)}")
    return path


def read_result(name: str) -> dict[str, Any] | None:
    path = RESULTS / f"{name}.json"
    if not path.exists():
        return None
    doc: dict[str, Any] = json.loads(path.read_text())
    return doc


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain-text table (also valid Markdown)."""

    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 10 else f"{v:.1f}" if abs(v) < 1000 else f"{v:.0f}"
        return "-" if v is None else str(v)

    cells = [[fmt(v) for v in r] for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h) for i, h in enumerate(headers)]
    line = "| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)) + " |"
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    body = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in cells]
    return "\n".join([line, sep, *body])


# --- processes ----------------------------------------------------------------------------------
def serve_cmd(
    store: str,
    key: str,
    model: str,
    port: int,
    cache_dir: Path,
    *flags: str,
    json_logs: bool = True,
    trtforge: Sequence[str] = TRTFORGE,
) -> list[str]:
    """``trtforge serve`` of engine `key` from `store` (a path or a store URI) as model `model` on
    127.0.0.1:`port`, with `cache_dir` as its cache; `flags` follow (the benchmarks' one spelling).
    `trtforge`: the command that runs it (default: this interpreter's, or ``$BENCH_TRTFORGE``)."""
    return [
        *trtforge,
        *(["--log-format", "json"] if json_logs else []),
        "serve",
        "--store",
        store,
        "--engine",
        key,
        "--model-name",
        model,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--cache-dir",
        str(cache_dir),
        *flags,
    ]


def taskset(cpus: str | None, cmd: Sequence[str]) -> list[str]:
    return ["taskset", "-c", cpus, *cmd] if cpus else list(cmd)


def start(cmd: Sequence[str], log_path: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as f:
        return subprocess.Popen(
            list(cmd),
            stdout=f,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            cwd=ROOT,
            start_new_session=True,  # its own process group, so stop() reaches worker processes
        )


def stop(p: subprocess.Popen[bytes], timeout: float = 15.0) -> int | None:
    """SIGTERM the process group we started, then SIGKILL it if it lingers."""
    if p.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(5)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(p.pid, signal.SIGKILL)  # stragglers of the group (uvicorn workers)
    return p.returncode


def http_get(url: str, timeout: float = 2.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except (urllib.error.URLError, OSError):
        return 0, b""


def wait_http_ok(
    url: str, timeout: float, proc: subprocess.Popen[bytes] | None = None, interval: float = 0.005
) -> float:
    """Seconds until GET url answers 200; raises if the process dies or time runs out."""
    t0 = time.monotonic()
    while True:
        status, _ = http_get(url, timeout=1.0)
        if status == 200:
            return time.monotonic() - t0
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before {url} was ready")
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"{url} not ready after {timeout:.0f}s")
        time.sleep(interval)


def descendants(pid: int) -> list[int]:
    """`pid` and every live process below it (from /proc)."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def cpu_ticks(stat_path: str) -> int | None:
    """utime + stime of a /proc stat file (a process's or a thread's), in clock ticks; None when the
    process or thread is gone."""
    try:
        fields = Path(stat_path).read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[11]) + int(fields[12])


def tree_cpu_seconds(pid: int) -> float:
    """User+system CPU seconds of a process and all its live descendants."""
    total = 0
    for p in descendants(pid):
        total += cpu_ticks(f"/proc/{p}/stat") or 0
    return total / CLK_TCK


def tree_rss_bytes(pid: int) -> int:
    total = 0
    for p in descendants(pid):
        with contextlib.suppress(OSError):
            m = re.search(r"VmRSS:\s*(\d+) kB", Path(f"/proc/{p}/status").read_text())
            total += int(m.group(1)) * 1024 if m else 0
    return total


def peak_rss_bytes(pid: int) -> int:
    """VmHWM (peak resident set) of one process."""
    with contextlib.suppress(OSError):
        m = re.search(r"VmHWM:\s*(\d+) kB", Path(f"/proc/{pid}/status").read_text())
        return int(m.group(1)) * 1024 if m else 0
    return 0
