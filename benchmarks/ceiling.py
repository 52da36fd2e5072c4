"""The backend's own ceiling: batched ``session.run`` in-process, no server, no client.

Same session settings as trtforge's ONNX Runtime backend. Run under ``taskset`` on the server's cores
it says how many images per second those cores can compute at each batch size, with one session of
all the threads and (with more than one thread) with one single-thread session per thread side by
side, as a server with one execution instance per core would run. The best of all of those is the
ceiling a server on the same cores is measured against. Prints one JSON object.

With ``--serve`` it builds only the sessions of one configuration (a ``best`` of the full run) and
then times that configuration once per line it reads, printing one JSON object per line, until its
input ends: a ceiling that can be timed again next to each of a server's windows, the same minute,
without building sessions again (:class:`PinnedCeiling`).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import IO, Any

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
        per_batch.append({"batch": b, **_single(sess, in_name, out_name, b, seconds)})
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


def serve(path: str, threads: int, sessions: int, batch: int, seconds: float) -> None:
    """Build the sessions of one configuration (`sessions` > 1: that many single-thread sessions side
    by side, else one session of `threads` threads), then time it for `seconds` once per line of
    stdin, printing ``{"images_per_s": ...}`` for each, until stdin ends."""
    in_name, out_name = io_names(Path(path))
    side_by_side = sessions > 1
    pool = [ort_session(path, 1 if side_by_side else threads) for _ in range(sessions)]
    print(json.dumps({"ready": True}), flush=True)
    for _ in sys.stdin:
        if side_by_side:
            res = _parallel(pool, in_name, out_name, batch, seconds)
        else:
            res = _single(pool[0], in_name, out_name, batch, seconds)
        print(json.dumps(res), flush=True)


def _single(sess: object, in_name: str, out_name: str, b: int, seconds: float) -> dict[str, float]:
    """One session run at batch `b`, back to back, for `seconds` (at least 3 runs)."""
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
    return {"images_per_s": round(n * b / el, 2), "ms_per_batch": round(el / n * 1000, 2)}


class PinnedCeiling:
    """This module's ``--serve`` as a process of its own, pinned to `cpus`, for configuration `best`
    (an entry of :func:`measure`'s result: its ``batch``, and ``sessions`` when side by side); each
    :meth:`measure` times it once more. Its sessions sit idle (no spinning threads) in between."""

    def __init__(self, model_file: Path, cpus: str, threads: int, best: dict[str, Any], seconds: float):
        cmd = taskset(
            cpus,
            [
                sys.executable,
                "-m",
                "benchmarks.ceiling",
                "--serve",
                "--model-file",
                str(model_file),
                "--threads",
                str(threads),
                "--sessions",
                str(int(best.get("sessions", 1))),
                "--batches",
                str(int(best["batch"])),
                "--seconds",
                str(seconds),
            ],
        )
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1
        )
        self._read()  # {"ready": true} once its sessions are built

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read(self) -> dict[str, Any]:
        out: IO[str] | None = self.proc.stdout
        line = out.readline() if out is not None else ""
        if not line:
            code = self.proc.wait(timeout=60)
            raise RuntimeError(f"the pinned ceiling process ended (exit code {code}); see its stderr")
        res: dict[str, Any] = json.loads(line)
        return res

    def measure(self) -> float:
        """Images per second of one more timing of the configuration."""
        assert self.proc.stdin is not None
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        return float(self._read()["images_per_s"])

    def close(self) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> PinnedCeiling:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model-file", required=True)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batches", default="1,2,4,8,16,32")
    p.add_argument("--seconds", type=float, default=3.0, help="per batch size")
    p.add_argument("--serve", action="store_true", help="time one configuration once per stdin line")
    p.add_argument("--sessions", type=int, default=1, help="--serve: single-thread sessions side by side")
    a = p.parse_args(argv)
    if a.serve:
        serve(a.model_file, a.threads, a.sessions, int(a.batches.split(",")[0]), a.seconds)
        return 0
    res = measure(a.model_file, a.threads, [int(b) for b in a.batches.split(",")], a.seconds)
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
