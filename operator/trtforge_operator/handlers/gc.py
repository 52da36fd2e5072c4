"""The opt-in engine GC loop (``gc.enabled``): a pass is observe (observe/gc.py) -> plan
(planning/gc.py) -> apply (apply/gc.py). Only the leader runs it (cli._act)."""

from __future__ import annotations

import asyncio
import logging
import time

from trtforge_operator.apply.gc import apply_store_gc
from trtforge_operator.observe.gc import observe_store_gc
from trtforge_operator.planning.gc import plan_store_gc
from trtforge_operator.state import State

log = logging.getLogger(__name__)


async def gc_pass(state: State) -> list[str]:
    """One pass: delete what planning.gc picks; returns the deleted engines' keys. Planned in a worker
    thread (it walks every status and stored engine)."""
    if state.store_claim is not None and not state.store_claim.bound:
        log.info("gc: the store's claim is not bound; no pass")
        return []
    obs = await observe_store_gc(state)
    plan = await asyncio.to_thread(plan_store_gc, obs, state.cfg.gc, time.time())
    return await apply_store_gc(state, plan)


async def gc_loop(state: State) -> None:
    """Every ``gc.interval_seconds``, one pass; a failed pass is logged and tried again next time."""
    while True:
        await asyncio.sleep(state.cfg.gc.interval_seconds)
        try:
            await gc_pass(state)
        except Exception:
            log.exception("gc pass failed; trying again next interval")
