"""How many CPUs this runtime may use, and how many worker processes `serve --workers auto` starts.

A pod's CPUs come in two forms: the CPUs it may run on (its affinity: the whole node unless the
kubelet's static CPU manager pinned it) and its CPU limit (the cgroup's CFS quota). A pod limited to
4 CPUs on a 64-core node has an affinity of 64 CPUs and a quota of 4: sizing thread pools from the
affinity would start 64 threads that the quota then throttles. The runtime uses the smaller of the
two, rounded up (:func:`usable_cpus`). The supervisor of ``--workers`` hands each unpinned worker its
share through ``TRTFORGE_CPUS``.

Why one worker per :data:`CPUS_PER_WORKER` CPUs: docs/design.md, "Many cores: worker processes".
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CPUS_ENV = "TRTFORGE_CPUS"
# the CPUs a worker of ``--workers`` is pinned to, comma-separated (lifecycle.workers sets it)
WORKER_CPUS_ENV = "TRTFORGE_WORKER_CPUS"
CPUS_PER_WORKER = 4
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


def usable_cpus() -> int:
    """The CPUs this runtime sizes its instances and threads for.

    ``TRTFORGE_CPUS`` (set by the ``--workers`` supervisor for a worker's share) wins; otherwise the
    affinity capped by the cgroup's CPU limit."""
    share = os.environ.get(CPUS_ENV)
    if share:
        return max(1, int(share))
    return effective_cpus(len(affinity()), cgroup_cpu_limit())


def auto_workers(cpus: int) -> int:
    """Worker processes for `cpus` CPUs: one below 8 CPUs, else one per :data:`CPUS_PER_WORKER`
    rounded to the nearest (halves up: 14 CPUs get 4 workers, not 3)."""
    if cpus < 2 * CPUS_PER_WORKER:
        return 1
    return (cpus + CPUS_PER_WORKER // 2) // CPUS_PER_WORKER


def pin_worker() -> None:
    """In a worker: keep to the CPUs its supervisor gave it (``$TRTFORGE_WORKER_CPUS``), before any
    thread exists, so every thread the runtime starts inherits them; nothing without that variable."""
    cpus = os.environ.get(WORKER_CPUS_ENV)
    if cpus:
        os.sched_setaffinity(0, {int(c) for c in cpus.split(",")})
