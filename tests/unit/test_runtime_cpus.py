"""The CPUs a runtime sizes itself for (affinity capped by the cgroup's CPU limit) and the worker plan
of `serve --workers`, as pure functions over the values the kernel gives."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from trtforge_runtime.lifecycle.cpus import (
    auto_workers,
    cgroup_cpu_limit,
    effective_cpus,
    quota_cpus,
    usable_cpus,
)
from trtforge_runtime.lifecycle.workers import WorkerCpus, plan_cpus


def test_quota_from_cgroup_v2_and_v1() -> None:
    assert quota_cpus(cpu_max="max 100000") is None
    assert quota_cpus(cpu_max="400000 100000") == 4.0
    assert quota_cpus(cpu_max="150000 100000") == 1.5
    assert quota_cpus(cfs_quota_us="-1", cfs_period_us="100000") is None
    assert quota_cpus(cfs_quota_us="200000", cfs_period_us="100000") == 2.0
    assert quota_cpus() is None


def test_cgroup_files_are_read_v2_first(tmp_path: Path) -> None:
    assert cgroup_cpu_limit(tmp_path) is None  # no files: no limit
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("300000\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_cpu_limit(tmp_path) == 3.0
    (tmp_path / "cpu.max").write_text("800000 100000\n")
    assert cgroup_cpu_limit(tmp_path) == 8.0
    (tmp_path / "cpu.max").write_text("garbage\n")  # not understood: v1, not a wrong number
    assert cgroup_cpu_limit(tmp_path) == 3.0


def test_the_limit_caps_the_affinity_rounded_up() -> None:
    assert effective_cpus(64, None) == 64
    assert effective_cpus(64, 4.0) == 4
    assert effective_cpus(64, 1.5) == 2
    assert effective_cpus(64, 0.25) == 1
    assert effective_cpus(2, 8.0) == 2  # pinned to fewer CPUs than the limit


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
