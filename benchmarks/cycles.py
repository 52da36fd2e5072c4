"""Where the cores go while ``trtforge serve`` works: ``perf`` samples of the whole machine, by role and code.

A serving window's throughput against a ceiling timed a minute apart moves with the host (on the
2-core machine the ceiling read 518-628 img/s within one hour), so a few per cent of front-end work
hide in that noise. Where the cycles go inside one window needs no second window. For the
in-process ceiling (one single-thread session per core side by side, as in ``benchmarks/ceiling.py``)
and then for ``trtforge serve`` under the load generator at each point, all on the same cores, this
runs ``perf record -a`` (the cpu-clock event) over a window and puts each sample in
- a role: the ceiling's process; the server's event loop (its main thread) or its other threads
  (the instances); the client (this process runs the load generator, and the native HTTP client's
  process, ``v2load``, when it drives the load); idle (the idle task); other;
- a kind of code, by shared object: the backend (ONNX Runtime's), libc (memcpy, malloc), the Python
  interpreter, the kernel, other.

The server's share of the ceiling is then (the backend's share of the samples in the server / in
the ceiling) x (the ceiling's backend CPU per image / the server's): the first factor is what the
front end, the client and idle time take from the backend, the second how fast the backend computes
each image inside the server. The machine's idle time by ``/proc/stat`` is reported beside perf's
(the two can disagree under a hypervisor). Needs ``perf`` and the right to sample every CPU
(``perf_event_paranoid`` ≤ 0, or root); not part of ``make bench``. docs/benchmarks.md §1 has a run.

    python -m benchmarks.cycles --model squeezenet --points http:8,http:32 --cpus 0,1
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import (
    CACHE,
    ROOT,
    free_ports,
    log,
    serve_cmd,
    start,
    stop,
    taskset,
    wait_http_ok,
    write_result,
)
from benchmarks.loadgen import CLIENTS

HZ = 1999  # samples per second per CPU (not a multiple of the kernel's tick)
NATIVE_CLIENT_COMM = "v2load"  # the native HTTP client's process name (benchmarks/native_client.py)
ROLES = ("ceiling", "loop", "instances", "client", "idle", "other")
KINDS = ("backend", "libc", "python", "kernel", "other")
_ROW = re.compile(r"^\s*(\d+)\s+(\d+):(.*?)\s{2,}(.+?)\s*$")
_STAT_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


@dataclass(frozen=True)
class Row:
    """One line of ``perf report --sort pid,dso -F sample,pid,dso``: samples of one thread in one object."""

    samples: int
    tid: int
    comm: str
    dso: str


def parse_report(text: str) -> list[Row]:
    """The rows of a ``perf report --stdio -g none --sort pid,dso -F sample,pid,dso`` (pure); comment
    lines and lines of another shape are skipped."""
    rows = []
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            continue
        m = _ROW.match(line)
        if m:
            rows.append(Row(int(m.group(1)), int(m.group(2)), m.group(3).strip(), m.group(4)))
    return rows


def code_kind(dso: str) -> str:
    """The kind of code a shared object holds (pure): one of :data:`KINDS`."""
    name = dso.rsplit("/", 1)[-1]
    if "onnxruntime" in name:
        return "backend"
    if name.startswith("[kernel") or name == "[vdso]":
        return "kernel"
    if name.startswith("libc.so") or name.startswith("libc-"):
        return "libc"
    if name.startswith("libpython") or name.startswith("python"):
        return "python"
    return "other"


def attribute(rows: Iterable[Row], role_of: Callable[[Row], str]) -> dict[str, dict[str, int]]:
    """Samples by role, then by kind of code (pure); every role and kind appears, zero if none."""
    acc = {r: dict.fromkeys(KINDS, 0) for r in ROLES}
    for row in rows:
        acc[role_of(row)][code_kind(row.dso)] += row.samples
    return acc


def role_by_threads(
    ceiling: set[int], loop: int | None, server: set[int], client: set[int]
) -> Callable[[Row], str]:
    """The role of a row, from the thread ids each process had during the window (pure)."""

    def role(row: Row) -> str:
        if row.tid == 0 or row.comm == "swapper":
            return "idle"
        if row.tid in ceiling:
            return "ceiling"
        if loop is not None and row.tid == loop:
            return "loop"
        if row.tid in server:
            return "instances"
        if row.tid in client or row.comm.startswith(NATIVE_CLIENT_COMM):
            return "client"
        return "other"

    return role


def window_summary(acc: dict[str, dict[str, int]], images: float, cpus: int) -> dict[str, Any]:
    """Shares (per cent of all samples) by role and code, and the backend's CPU ms per image (pure).
    `images`: images computed inside the window; `cpus`: the CPUs sampled (the window's samples
    cover cpus x its length)."""
    total = sum(sum(k.values()) for k in acc.values()) or 1
    backend = sum(k["backend"] for k in acc.values())
    shares = {
        f"{role}/{kind}": round(100 * n / total, 2)
        for role, kinds in acc.items()
        for kind, n in kinds.items()
        if n
    }
    seconds_of_cpu = total / HZ
    return {
        "samples": total,
        "backend_share_pct": round(100 * backend / total, 2),
        "backend_cpu_ms_per_image": round(1000 * seconds_of_cpu * backend / total / max(images, 1e-9), 3),
        "by_role_pct": {r: round(100 * sum(k.values()) / total, 2) for r, k in acc.items()},
        "shares_pct": dict(sorted(shares.items(), key=lambda kv: -kv[1])),
        "cpus": cpus,
    }


def share_factors(server: dict[str, Any], ceiling: dict[str, Any]) -> dict[str, float]:
    """The server's share of the ceiling split into its two factors (pure; see the module docstring)."""
    cycles = server["backend_share_pct"] / ceiling["backend_share_pct"]
    speed = ceiling["backend_cpu_ms_per_image"] / server["backend_cpu_ms_per_image"]
    return {
        "cycles_factor": round(cycles, 3),
        "speed_factor": round(speed, 3),
        "product": round(cycles * speed, 3),
    }


def _tids(pid: int) -> set[int]:
    try:
        return {int(t) for t in os.listdir(f"/proc/{pid}/task")}
    except FileNotFoundError:
        return set()


def _stat_pct(before: str, after: str) -> dict[str, float]:
    """Per cent of CPU time by state between two ``cpu`` lines of /proc/stat (pure)."""
    d = [int(y) - int(x) for x, y in zip(before.split()[1:9], after.split()[1:9], strict=True)]
    total = sum(d) or 1
    return {n: round(100 * v / total, 1) for n, v in zip(_STAT_FIELDS, d, strict=True) if v}


class _Perf:
    """``perf record -a`` over `seconds`, starting `delay` seconds from now (inside a load window
    that outlasts it on both sides), with /proc/stat read at the sampling's edges."""

    def __init__(self, seconds: float, delay: float, workdir: Path) -> None:
        self.data = workdir / f"perf-{time.monotonic_ns()}.data"
        record = f"perf record -q -F {HZ} -a -o {self.data}"
        window = f"head -1 /proc/stat; sleep {seconds}; head -1 /proc/stat"
        cmd = f"sleep {delay}; exec {record} -- sh -c '{window}'"
        self.proc = subprocess.Popen(
            ["sh", "-c", cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )

    def rows(self) -> tuple[list[Row], dict[str, float]]:
        """The window's rows and /proc/stat's split of its CPU time (waits for the window's end)."""
        out, err = self.proc.communicate(timeout=300)
        lines = [ln for ln in out.splitlines() if ln.startswith("cpu ")]
        if self.proc.returncode != 0 or len(lines) != 2:
            raise RuntimeError(f"perf record failed (rc {self.proc.returncode}): {err[-800:]}")
        report = subprocess.run(
            [
                *("perf", "report", "-i", str(self.data), "--no-children", "--stdio", "-g", "none"),
                *("--sort", "pid,dso", "-F", "sample,pid,dso"),
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        self.data.unlink(missing_ok=True)
        return parse_report(report), _stat_pct(lines[0], lines[1])


_CEILING_CHILD = """
import json, sys
sys.path.insert(0, {root!r})
from benchmarks.ceiling import _parallel, ort_session
from benchmarks.models import io_names
from pathlib import Path
i, o = io_names(Path({model!r}))
sessions = [ort_session({model!r}, 1) for _ in range({n})]
_parallel(sessions, i, o, {batch}, 1.0)
print("GO", flush=True)
print(json.dumps(_parallel(sessions, i, o, {batch}, {seconds})), flush=True)
"""


def ceiling_window(model: Path, cpus: str, batch: int, seconds: float, workdir: Path) -> dict[str, Any]:
    """The ceiling's sessions (one per CPU in `cpus`, batch `batch`) sampled for `seconds`."""
    n = len(cpus.split(","))
    code = _CEILING_CHILD.format(root=str(ROOT), model=str(model), n=n, batch=batch, seconds=seconds + 2)
    child = subprocess.Popen(taskset(cpus, [sys.executable, "-c", code]), stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    if child.stdout.readline().strip() != "GO":
        raise RuntimeError("the ceiling's child did not start")
    perf = _Perf(seconds, 0.5, workdir)
    time.sleep(0.5 + min(1.0, seconds / 2))
    ceiling_tids = _tids(child.pid)
    rows, stat = perf.rows()
    result = json.loads(child.stdout.readline())
    child.wait()
    acc = attribute(rows, role_by_threads(ceiling_tids, None, set(), set()))
    summary = window_summary(acc, result["images_per_s"] * seconds, n)
    return {"batch": batch, "images_per_s": result["images_per_s"], "procstat_pct": stat, **summary}


def serve_windows(
    model: str,
    flags: list[str],
    points: list[str],
    cpus: str,
    seconds: float,
    workdir: Path,
    client: str = "native",
) -> dict[str, Any]:
    """``trtforge serve`` (HTTP and gRPC, `flags`) under the load generator at each point, sampled;
    every answer of a sampled window is compared with ONNX Runtime's (a mismatch counts as an error)."""
    from benchmarks.engines import ensure_engine, store_dir
    from benchmarks.loadgen import Check, run_load
    from benchmarks.models import model_info, sample_input
    from benchmarks.serving import reference_output

    info = model_info(model)
    in_name, out_name = info.input, info.output
    store = store_dir(model)
    key, _ = ensure_engine(info.file, store)
    port, grpc_port = free_ports(2)
    cmd = serve_cmd(str(store), key, model, port, CACHE / "cycles", "--grpc-port", str(grpc_port), *flags)
    proc = start(taskset(cpus, cmd), CACHE / "logs" / "cycles-serve.log", {"TRTFORGE_GPU_PROBE": "none"})
    out: dict[str, Any] = {}
    try:
        wait_http_ok(f"http://127.0.0.1:{port}/v2/health/ready", timeout=240, proc=proc)
        x = sample_input(1)
        check = Check(out_name, reference_output(info))  # every answer of the sampled windows, as in the grid
        for point in points:
            protocol, _, conc = point.partition(":")
            url = f"grpc://127.0.0.1:{grpc_port}" if protocol == "grpc" else f"http://127.0.0.1:{port}"
            run_load(protocol, url, model, in_name, out_name, x, int(conc), 1.5, 0.5, client=client)  # settle
            # The load runs 1 s longer than the sampling on each side; the rate is the load's.
            perf = _Perf(seconds, 1.0, workdir)
            server_tids = _tids(proc.pid)
            res, _ = run_load(
                protocol,
                url,
                model,
                in_name,
                out_name,
                x,
                int(conc),
                seconds + 2.0,
                0.0,
                check=check,
                client=client,
            )
            rows, stat = perf.rows()
            acc = attribute(rows, role_by_threads(set(), proc.pid, server_tids, _tids(os.getpid())))
            summary = window_summary(acc, res.throughput * seconds, len(cpus.split(",")))
            out[point] = {
                "throughput": res.throughput,
                "errors": res.errors,
                "client": res.client,
                "procstat_pct": stat,
                **summary,
            }
            log(
                f"{point}: {res.throughput:.1f} req/s, backend {summary['backend_share_pct']}% of the samples"
            )
    finally:
        stop(proc)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="squeezenet")
    p.add_argument("--points", default="http:8,http:32", help="protocol:concurrency, comma-separated")
    p.add_argument("--serve-flags", default="--instances 2 --max-batch-size 32 --max-queue-delay-us 0")
    p.add_argument("--cpus", default="0,1", help="the server, the client and the ceiling share these")
    p.add_argument("--seconds", type=float, default=5.0, help="each sampled window")
    p.add_argument("--ceiling-batch", type=int, default=1)
    p.add_argument("--name", default=None, help="result name (default cycles-<model>)")
    p.add_argument("--client", choices=CLIENTS, default="native", help="as in benchmarks.loadgen")
    a = p.parse_args(argv)
    if shutil.which("perf") is None:
        p.error("perf is not installed (Debian: linux-perf)")
    from benchmarks.models import model_file

    with tempfile.TemporaryDirectory(prefix="trtforge-cycles-") as tmp:
        work = Path(tmp)
        log(f"ceiling: {len(a.cpus.split(','))} sessions, batch {a.ceiling_batch}")
        ceiling = ceiling_window(model_file(a.model), a.cpus, a.ceiling_batch, a.seconds, work)
        share = ceiling["backend_share_pct"]
        log(f"ceiling: {ceiling['images_per_s']} img/s, backend {share}% of the samples")
        served = serve_windows(
            a.model, a.serve_flags.split(), a.points.split(","), a.cpus, a.seconds, work, a.client
        )
    for w in served.values():
        w["of_ceiling"] = round(w["throughput"] / ceiling["images_per_s"], 3)
        w["factors"] = share_factors(w, ceiling)
    payload = {
        "config": vars(a),
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "ceiling": ceiling,
        "served": served,
    }
    write_result(a.name or f"cycles-{a.model}", payload)
    print(json.dumps({"ceiling": ceiling, "served": served}, indent=1))
    wrong = {point: w["errors"] for point, w in served.items() if w["errors"]}
    if wrong:
        log(f"errors or wrong answers in {wrong}: the split of those windows describes a broken server")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
