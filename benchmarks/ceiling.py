"""The backend's own ceiling: batched ``session.run`` in-process, no server, no client.

Same session settings as trtforge's ONNX Runtime backend. Run under ``taskset`` on the server's cores
it says how many images per second those cores can compute at each batch size, with one session of
all the threads and (with more than one thread) with one single-thread session per thread side by
side, as a server with one execution instance per core would run. The best of all of those is the
ceiling a server on the same cores is measured against. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import ROOT, taskset
from benchmarks.models import io_names, sample_input


def ort_session(path: str, threads: int) -> object:
    """An ONNX Runtime session with trtforge's backend settings."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.log_severity_level = 3
    return ort.InferenceSession(path, sess_options=opts, providers=["CPUExecutionProvider"])


def measure(path: str, threads: int, batches: list[int], seconds: float) -> dict[str, object]:
    from pathlib import Path

    sess = ort_session(path, threads)
    in_name, out_name = io_names(Path(path))
    per_batch = []
    for b in batches:
        x = sample_input(b, seed=1)
        run = sess.run  # type: ignore[attr-defined]
        run([out_name], {in_name: x})  # warm-up
        n, t0 = 0, time.perf_counter()
        while True:
            run([out_name], {in_name: x})
            n += 1
            el = time.perf_counter() - t0
            if (el >= seconds and n >= 3) or n >= 10_000:
                break
        per_batch.append(
            {"batch": b, "images_per_s": round(n * b / el, 2), "ms_per_batch": round(el / n * 1000, 2)}
        )
    parallel = []
    if threads > 1:
        # `threads` sessions of one thread each, run side by side (ONNX Runtime releases the GIL):
        # how a server with one execution instance per core uses the same cores.
        sessions = [ort_session(path, 1) for _ in range(threads)]
        for b in [b for b in batches if b <= 16]:
            parallel.append(
                {"batch": b, "sessions": threads, **_parallel(sessions, in_name, out_name, b, seconds)}
            )
    cands = per_batch + parallel
    best = max(cands, key=lambda r: float(r["images_per_s"]))  # type: ignore[arg-type]
    return {"threads": threads, "per_batch": per_batch, "parallel_sessions": parallel, "best": best}


def _parallel(
    sessions: list[object], in_name: str, out_name: str, b: int, seconds: float
) -> dict[str, float]:
    import threading

    x = sample_input(b, seed=1)
    counts = [0] * len(sessions)
    for s in sessions:
        s.run([out_name], {in_name: x})  # type: ignore[attr-defined]
    t0 = time.perf_counter()

    def loop(i: int) -> None:
        run = sessions[i].run  # type: ignore[attr-defined]
        while time.perf_counter() - t0 < seconds or counts[i] < 3:
            run([out_name], {in_name: x})
            counts[i] += 1

    ts = [threading.Thread(target=loop, args=(i,)) for i in range(len(sessions))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    el = time.perf_counter() - t0
    return {
        "images_per_s": round(sum(counts) * b / el, 2),
        "ms_per_batch": round(el / max(1, max(counts)) * 1000, 2),
    }


def run_pinned(model_file: Path, cpus: str, threads: int, seconds: float, batches: str) -> dict[str, Any]:
    """This module run as a process of its own, pinned to `cpus`: its JSON result."""
    cmd = taskset(
        cpus,
        [
            sys.executable,
            "-m",
            "benchmarks.ceiling",
            "--model-file",
            str(model_file),
            "--threads",
            str(threads),
            "--seconds",
            str(seconds),
            "--batches",
            batches,
        ],
    )
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=900)
    if r.returncode != 0:
        raise RuntimeError(f"ceiling failed: {r.stderr[-2000:]}")
    res: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model-file", required=True)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batches", default="1,2,4,8,16,32")
    p.add_argument("--seconds", type=float, default=3.0, help="per batch size")
    a = p.parse_args(argv)
    res = measure(a.model_file, a.threads, [int(b) for b in a.batches.split(",")], a.seconds)
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
