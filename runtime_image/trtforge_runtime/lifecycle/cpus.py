"""How many CPUs this runtime may use, and how many worker processes `serve --workers auto` starts.

The runtime sizes itself for its affinity capped by its CPU limit, rounded up
(:func:`trtforge.cpus.available_cpus`, shared with the builder). The supervisor of
``--workers`` hands each unpinned worker its share through ``TRTFORGE_CPUS``.

Why one worker per :data:`CPUS_PER_WORKER` CPUs: docs/design.md, "Many cores: worker processes".
"""

from __future__ import annotations

import os

from trtforge.cpus import available_cpus

CPUS_ENV = "TRTFORGE_CPUS"
# the CPUs a worker of ``--workers`` is pinned to, comma-separated (lifecycle.workers sets it)
WORKER_CPUS_ENV = "TRTFORGE_WORKER_CPUS"
CPUS_PER_WORKER = 4


def usable_cpus() -> int:
    """The CPUs this runtime sizes its instances and threads for.

    ``TRTFORGE_CPUS`` (set by the ``--workers`` supervisor for a worker's share) wins; otherwise the
    affinity capped by the cgroup's CPU limit."""
    share = os.environ.get(CPUS_ENV)
    if share:
        return max(1, int(share))
    return available_cpus()


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
