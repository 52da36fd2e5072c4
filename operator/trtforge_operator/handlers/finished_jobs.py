"""Deletes finished build Jobs once their TTL has run and every requester has recorded them.

A timer over the operator's own indices (no list calls): observe the Jobs of the build namespace and
what their requesters recorded (observe/engine.py), plan the deletions (planning/finished_jobs.py), apply
them through the engine applier, the one writer of build Jobs (docs/design.md §"Finished build Jobs").
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any

from trtforge_operator.apply.engine import apply_job_actions
from trtforge_operator.observe.engine import INFD_FAULTS_IDX, observe_finished_jobs
from trtforge_operator.planning.finished_jobs import plan_job_cleanup
from trtforge_operator.state import State

log = logging.getLogger(__name__)
INDICES = ("jobs_idx", "trte_idx", INFD_FAULTS_IDX)  # the kopf indices a pass reads


async def clean_once(state: State, indices: Mapping[str, Any], ttl_seconds: float, now: float) -> int:
    """One pass: delete the expired Jobs; returns how many went."""
    jobs, requesters = observe_finished_jobs(indices)
    return await apply_job_actions(state, plan_job_cleanup(jobs, requesters, now, ttl_seconds))


def interval_for(ttl_seconds: float) -> float:
    """How often to look: a quarter of the TTL, between 10 s and 5 min."""
    return max(10.0, min(300.0, ttl_seconds / 4))


async def run(state: State) -> None:
    """Until cancelled: every interval, one pass over the indices (once the handlers have seen them)."""
    ttl = state.cfg.build.finished_job_ttl_seconds
    while True:
        await asyncio.sleep(interval_for(ttl))
        found = state.indices
        if found is None:
            continue
        try:
            await clean_once(state, found, ttl, time.time())
        except Exception:
            log.exception("finished-Job cleanup failed; trying again next interval")
