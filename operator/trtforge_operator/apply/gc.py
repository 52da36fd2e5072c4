"""Apply: carry out an engine GC pass's plan (planning/gc.py) in the store: the unreferenced engines,
then the possession records, the staged models they named and the expired verify grants."""

from __future__ import annotations

import asyncio
import logging

from trtforge.contract.possession import possession_path, staged_model_path, verify_grant_path
from trtforge_operator.planning.gc import ModelGCPlan, StoreGCPlan
from trtforge_operator.state import State

log = logging.getLogger(__name__)


async def apply_store_gc(state: State, plan: StoreGCPlan) -> list[str]:
    """Delete what the plan names; returns the deleted engines' keys."""
    for k in plan.engines:
        await asyncio.to_thread(state.store.delete_engine, k)
        state.metrics.gc_deleted.inc()
        log.info("gc: deleted unreferenced engine %s", k)
    await asyncio.to_thread(_delete_verify_side, state, plan.models)
    return plan.engines


def _delete_verify_side(state: State, plan: ModelGCPlan) -> None:
    store = state.store.store
    for ns, fp in plan.proofs:  # records before the models they name
        store.delete(possession_path(ns, fp))
        state.store.invalidate_possession(ns, fp)
        log.info("gc: deleted possession record %s/%s", ns, fp[:12])
    for sha in plan.models:
        store.delete(staged_model_path(sha))
        log.info("gc: deleted staged model %s", sha[:12])
    for ns, job in plan.grants:
        store.delete(verify_grant_path(ns, job))
