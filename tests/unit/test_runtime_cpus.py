"""The CPUs a runtime sizes itself for (a worker's share, else trtforge.cpus: tests/unit/
test_cpus.py) and the worker plan of `serve --workers`, as pure functions over the values the kernel
gives."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from trtforge_runtime.lifecycle.cpus import auto_workers, usable_cpus
from trtforge_runtime.lifecycle.workers import WorkerCpus, plan_cpus


def test_a_workers_share_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRTFORGE_CPUS", "3")
    assert usable_cpus() == 3


def test_auto_workers_one_per_four_cpus_rounded_to_the_nearest() -> None:
    cpus = (1, 2, 3, 4, 7, 8, 9, 10, 13, 14, 16, 64)
    assert [auto_workers(n) for n in cpus] == [1, 1, 1, 1, 1, 2, 2, 3, 3, 4, 4, 16]


def test_workers_are_pinned_unless_a_cpu_limit_is_below_the_affinity() -> None:
    assert plan_cpus(range(14), 14, 3) == [
        WorkerCpus(5, [0, 1, 2, 3, 4]),
        WorkerCpus(5, [5, 6, 7, 8, 9]),
        WorkerCpus(4, [10, 11, 12, 13]),
    ]
    # 8 CPUs' quota on a 64-core node: the quota is the pod's, so no pinning, 4 CPUs' threads each
    assert plan_cpus(range(64), 8, 2) == [WorkerCpus(4, None), WorkerCpus(4, None)]
    with pytest.raises(ValueError, match="3 workers need at least 3 CPUs"):
        plan_cpus(range(64), 2, 3)


def test_shared_workers_are_not_pinned_and_each_is_sized_for_every_cpu() -> None:
    assert plan_cpus(range(14), 14, 4, shared=True) == [WorkerCpus(14, None)] * 4
    assert plan_cpus(range(64), 8, 2, shared=True) == [WorkerCpus(8, None)] * 2
    with pytest.raises(ValueError, match="3 workers need at least 3 CPUs"):
        plan_cpus(range(64), 2, 3, shared=True)


def test_a_worker_keeps_to_the_cpus_its_supervisor_gave_it() -> None:
    """In a subprocess: pinning changes the affinity of the process that calls it."""
    code = (
        "import os; from trtforge_runtime.lifecycle import cpus\n"
        "before = os.sched_getaffinity(0); cpus.pin_worker(); assert os.sched_getaffinity(0) == before\n"
        "one = min(before); os.environ[cpus.WORKER_CPUS_ENV] = str(one); cpus.pin_worker()\n"
        "print(os.sched_getaffinity(0) == {one})\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRTFORGE_WORKER_CPUS"}  # not a worker here
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert out.stdout.strip() == "True"
