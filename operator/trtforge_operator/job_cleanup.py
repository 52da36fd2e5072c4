"""Deletes finished build Jobs once their TTL has run and every requester has recorded them.

A thin loop over the operator's own indices (no list calls): the Jobs of the build namespace and the
TRTEngines with their status; planning/finished_jobs.py decides (docs/design.md §"Finished build Jobs").
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes.client.rest import ApiException

from trtforge_operator.api import TRTEngine
from trtforge_operator.config import OperatorConfig
from trtforge_operator.kube import Kube
from trtforge_operator.metrics import Metrics
from trtforge_operator.observed import JobView
from trtforge_operator.planning.finished_jobs import Requester, expired_jobs
from trtforge_operator.planning.rebuild import ObservedFaults, plan_rebuilds

log = logging.getLogger(__name__)
INFD_FAULTS_IDX = "infd_faults_idx"  # (namespace, engine) -> the faults its InferenceDeployments recorded
INDICES = ("jobs_idx", "trte_idx", INFD_FAULTS_IDX)  # the kopf indices a pass reads


def requester_lookup(
    trte_idx: Mapping[Any, Any], faults_idx: Mapping[Any, Any] | None = None
) -> Callable[[str], Requester | None]:
    """`namespace/name` -> what that TRTEngine recorded (from the index), None when it is gone. Its
    rebuild Jobs are those it still wants: its InferenceDeployments' unrecovered faults and its own
    accepted rebuild annotations (planning/rebuild.py)."""

    def find(name: str) -> Requester | None:
        ns, _, n = name.partition("/")
        for e in list(trte_idx.get((ns, n), ())):
            if isinstance(e, TRTEngine):
                gen = e.metadata.generation or 1
                observed = [
                    o for o in list((faults_idx or {}).get((ns, n), ())) if isinstance(o, ObservedFaults)
                ]
                wanted = plan_rebuilds(
                    name, e.status.targets, e.metadata.annotations or {}, observed, (), 0.0, 0.0
                )
                return Requester(
                    targets=e.status.targets,
                    current=e.status.observed_generation == gen,
                    rebuild_jobs=frozenset(r.job_name for r in wanted.requests),
                )
        return None

    return find


async def clean_once(
    kube: Kube, metrics: Metrics, indices: Mapping[str, Any], ttl_seconds: float, now: float
) -> int:
    """One pass: delete the expired Jobs; returns how many went."""
    jobs = [j for store in list(indices["jobs_idx"].values()) for j in list(store) if isinstance(j, JobView)]
    gone = 0
    for j in expired_jobs(
        jobs, requester_lookup(indices["trte_idx"], indices.get(INFD_FAULTS_IDX)), now, ttl_seconds
    ):
        try:
            if await kube.delete("Job", j.namespace, j.name):
                metrics.finished_jobs_deleted.inc()
                gone += 1
        except ApiException as e:
            log.warning("could not delete finished Job %s: %s %s", j.name, e.status, e.reason)
    return gone


def interval_for(ttl_seconds: float) -> float:
    """How often to look: a quarter of the TTL, between 10 s and 5 min."""
    return max(10.0, min(300.0, ttl_seconds / 4))


async def run(
    cfg: OperatorConfig, kube: Kube, metrics: Metrics, indices: Callable[[], Mapping[str, Any] | None]
) -> None:
    """Until cancelled: every interval, one pass over the indices (once the handlers have seen them)."""
    ttl = cfg.build.finished_job_ttl_seconds
    while True:
        await asyncio.sleep(interval_for(ttl))
        found = indices()
        if found is None:
            continue
        try:
            await clean_once(kube, metrics, found, ttl, time.time())
        except Exception:
            log.exception("finished-Job cleanup failed; trying again next interval")
