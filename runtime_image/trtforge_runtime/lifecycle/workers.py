"""``trtforge serve --workers N``: N runtime processes on one port, each on its own CPUs.

One event loop and one GIL carry every request's Python work (body read, decode, encode) in a
single process; on many cores they, not the cores, become the limit. With ``--workers N`` this
process becomes a small supervisor that starts N ``trtforge serve`` workers. Each worker is a whole
runtime (fetch, verify, load, canary, HTTP and gRPC, batcher) pinned to its share of the CPUs
(:func:`split_cpus`), listening on the same HTTP and gRPC ports with ``SO_REUSEPORT``, so the
kernel spreads connections over them. Metrics are aggregated over the workers (prometheus_client's
multiprocess mode, in a directory the supervisor makes), so any worker's ``/metrics`` tells the
whole pod's story.

Start-up: worker 0 starts at once (it listens before it loads, so liveness answers during a cold
start); the others start when it is ready, so they find the engine verified in the cache and never
fetch it twice, and each binds the ports only once it is ready. The pod reports Ready only when
every worker is ready and listening (:class:`Pod`): a client that connects once the pod is Ready can
land on any worker, and keep-alive connections spread over all of them (``SO_REUSEPORT`` balances
connections, not requests).
A worker that ends ends the pod: the supervisor stops the others and exits with that worker's code
(128 + the signal's number if a signal killed it; its termination message is the one on file), so a
GPU fault still restarts the pod with its reason. SIGTERM is passed to every worker; each drains as
one runtime does.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from trtforge import cpus as shared_cpus
from trtforge.logs import fields
from trtforge_runtime.lifecycle import cpus as cpus_mod

log = logging.getLogger(__name__)

WORKER_INDEX_ENV = "TRTFORGE_WORKER_INDEX"
READY_DIR_ENV = "TRTFORGE_WORKER_READY_DIR"
WORKERS_ENV = "TRTFORGE_WORKERS"
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def split_cpus(cpus: Sequence[int], workers: int) -> list[list[int]]:
    """The CPUs of each worker: contiguous, as even as can be (the first ones get one more)."""
    if workers < 1:
        raise ValueError("workers must be at least 1")
    if workers > len(cpus):
        raise ValueError(f"{workers} workers need at least {workers} CPUs; this process may use {len(cpus)}")
    ordered = sorted(cpus)
    base, extra = divmod(len(ordered), workers)
    out, start = [], 0
    for i in range(workers):
        n = base + (1 if i < extra else 0)
        out.append(ordered[start : start + n])
        start += n
    return out


@dataclass(frozen=True)
class WorkerCpus:
    """One worker's CPUs: how many it sizes its threads for, and the CPUs it is pinned to (None: not
    pinned, when a CPU limit rather than the affinity bounds the pod)."""

    count: int
    pinned: list[int] | None


def plan_cpus(affinity: Sequence[int], usable: int, workers: int, shared: bool = False) -> list[WorkerCpus]:
    """Each worker's CPUs. `shared` (``--worker-cpus shared``): none pinned, each sized for every usable
    CPU, so a worker that holds more of the connections (``SO_REUSEPORT`` balances connections, not
    requests) may use the CPUs the others leave idle. With a CPU limit below the affinity (a pod with
    `resources.limits.cpu` on a bigger node) workers are not pinned (the quota is the pod's, not per
    CPU) and split the limit's CPUs; otherwise each is pinned to its contiguous share
    (:func:`split_cpus`)."""
    if workers > max(usable, 1):
        split_cpus(range(usable), workers)  # raises: more workers than CPUs
    if shared:
        return [WorkerCpus(usable, None) for _ in range(workers)]
    if usable < len(affinity):
        counts = [len(c) for c in split_cpus(range(usable), workers)]
        return [WorkerCpus(n, None) for n in counts]
    return [WorkerCpus(len(c), c) for c in split_cpus(affinity, workers)]


def worker_argv(argv: Sequence[str]) -> list[str]:
    """The worker's command line: the supervisor's own, with one worker."""
    return [sys.executable, "-m", "trtforge.cli", *argv, "--workers", "1"]


class Pod:
    """A worker's view of its pod: which workers are ready and listening (a file each, in a directory
    the supervisor made). Once all are, the pod stays ready (a worker that ends ends the pod)."""

    def __init__(self, ready_dir: Path, index: int, workers: int) -> None:
        self.ready_dir, self.index, self.workers = ready_dir, index, workers
        self._all = False

    @classmethod
    def from_env(cls) -> Pod | None:
        """This process's pod, when a supervisor started it (None: a runtime on its own)."""
        d, index = os.environ.get(READY_DIR_ENV), os.environ.get(WORKER_INDEX_ENV)
        if not d or index is None:
            return None
        return cls(Path(d), int(index), int(os.environ.get(WORKERS_ENV, "1")))

    def mark_ready(self) -> None:
        """This worker is ready and listens on every port."""
        (self.ready_dir / f"ready-{self.index}").touch()

    def ready_count(self) -> int:
        return sum((self.ready_dir / f"ready-{i}").exists() for i in range(self.workers))

    def all_ready(self) -> bool:
        if not self._all:
            self._all = self.ready_count() == self.workers
        return self._all


def supervise(argv: Sequence[str], workers: int, shared: bool = False) -> int:
    """Run `workers` workers of the command line `argv` (without the program name); their exit code.
    `shared`: the workers share every CPU (:func:`plan_cpus`)."""
    cpus = plan_cpus(shared_cpus.affinity(), cpus_mod.usable_cpus(), workers, shared)
    state = Path(tempfile.mkdtemp(prefix="trtforge-serve-"))
    metrics_dir = state / "metrics"
    metrics_dir.mkdir()
    procs: list[subprocess.Popen[bytes]] = []
    stopping = False

    def start(i: int) -> None:
        env = dict(os.environ)
        env.update(
            {
                WORKER_INDEX_ENV: str(i),
                READY_DIR_ENV: str(state),
                WORKERS_ENV: str(workers),
                MULTIPROC_ENV: str(metrics_dir),
                cpus_mod.CPUS_ENV: str(cpus[i].count),
                "TRTFORGE_REUSE_PORT": "1",
            }
        )
        pinned = cpus[i].pinned
        if pinned is not None:
            env[cpus_mod.WORKER_CPUS_ENV] = ",".join(map(str, pinned))
        else:
            env.pop(cpus_mod.WORKER_CPUS_ENV, None)
        procs.append(subprocess.Popen(worker_argv(argv), env=env))
        log.info(
            "worker started",
            extra=fields(worker=i, pid=procs[-1].pid, cpus=cpus[i].count, pinned=pinned),
        )

    def on_term(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    start(0)
    code: int | None = None
    while code is None:
        if len(procs) < workers and not stopping and (state / "ready-0").exists():
            for i in range(1, workers):
                start(i)
        for i, p in enumerate(procs):
            rc = p.poll()
            if rc is not None:
                code = rc
                if not stopping:
                    log.error("a worker ended; stopping the others", extra=fields(worker=i, exit_code=rc))
                    on_term(signal.SIGTERM, None)
                break
        time.sleep(0.05)
    for p in procs:
        try:
            p.wait()
        except KeyboardInterrupt:
            p.kill()
    shutil.rmtree(state, ignore_errors=True)
    codes = [p.returncode for p in procs]
    failed = [c for c in codes if c not in (0, -signal.SIGTERM)]
    if not failed:
        return 0
    return 128 - failed[0] if failed[0] < 0 else failed[0]  # killed by a signal: 128 + its number
