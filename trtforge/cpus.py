"""How many CPUs this process may use: its affinity capped by its container's CPU limit.

A pod's CPUs come in two forms: the CPUs it may run on (its affinity: the whole node unless the
kubelet's static CPU manager pinned it) and its CPU limit (the cgroup's CFS quota). A pod limited to
4 CPUs on a 64-core node has an affinity of 64 CPUs and a quota of 4: sizing thread pools from the
affinity would start 64 threads that the quota then throttles. :func:`available_cpus` takes the
smaller of the two, rounded up. The runtime sizes its threads and workers with it, the builder its
llama.cpp thread counts.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def quota_cpus(
    cpu_max: str | None = None, cfs_quota_us: str | None = None, cfs_period_us: str | None = None
) -> float | None:
    """The CPU limit a cgroup sets, in CPUs; None when it sets none.

    `cpu_max` is cgroup v2's ``cpu.max`` ("max 100000" or "400000 100000"); `cfs_quota_us` and
    `cfs_period_us` are cgroup v1's files (quota -1: no limit)."""
    if cpu_max is not None:
        parts = cpu_max.split()
        if len(parts) != 2 or parts[0] == "max":
            return None
        quota, period = int(parts[0]), int(parts[1])
    elif cfs_quota_us is not None and cfs_period_us is not None:
        quota, period = int(cfs_quota_us), int(cfs_period_us)
    else:
        return None
    if quota <= 0 or period <= 0:
        return None
    return quota / period


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def cgroup_cpu_limit(root: Path = CGROUP_ROOT) -> float | None:
    """This container's CPU limit in CPUs (cgroup v2, else v1), or None."""
    try:
        v2 = quota_cpus(cpu_max=_read(root / "cpu.max"))
        if v2 is not None:
            return v2
        for v1 in (root / "cpu", root / "cpu,cpuacct"):
            got = quota_cpus(
                cfs_quota_us=_read(v1 / "cpu.cfs_quota_us"), cfs_period_us=_read(v1 / "cpu.cfs_period_us")
            )
            if got is not None:
                return got
    except ValueError:
        return None  # a file we do not understand: no limit rather than a wrong one
    return None


def affinity() -> list[int]:
    """The CPUs this process may run on."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def effective_cpus(affinity_count: int, limit: float | None) -> int:
    """CPUs worth of threads: the affinity, capped by the quota rounded up (at least 1)."""
    if limit is None:
        return max(1, affinity_count)
    return max(1, min(affinity_count, math.ceil(limit - 1e-9)))


def available_cpus(cgroup_root: Path = CGROUP_ROOT) -> int:
    """The CPUs this process may use: its affinity capped by the CPU limit under `cgroup_root`."""
    return effective_cpus(len(affinity()), cgroup_cpu_limit(cgroup_root))
