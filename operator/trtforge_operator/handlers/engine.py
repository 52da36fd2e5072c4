"""The TRTEngine's handlers: a pass is observe (observe/engine.py) -> plan (planning/engine.py) -> apply
(apply/engine.py), and nothing else (docs/design.md §"Observe, plan, apply")."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trtforge_operator.apply.engine import apply_engine, apply_job_actions
from trtforge_operator.kinds import Kind
from trtforge_operator.observe.engine import observe_engine, observe_release
from trtforge_operator.planning.cleanup import plan_release
from trtforge_operator.planning.engine import plan_engine_pass
from trtforge_operator.state import State, forget


async def reconcile_engine(state: State, body: Mapping[str, Any], indices: Mapping[str, Any]) -> float | None:
    """One level-based pass over a TRTEngine: observe, plan, apply; returns seconds until it wants
    to run again (backoff). Planning and slot admission run in one synchronous step after the last
    read (docs/design.md §"Observe, plan, apply")."""
    obs = await observe_engine(state, body, indices)
    plan = plan_engine_pass(obs, state.cfg)
    return await apply_engine(state, body, obs, plan)


async def cleanup_engine(state: State, body: Mapping[str, Any], indices: Mapping[str, Any]) -> None:
    """On deletion: leave every build Job this engine requested. A Job whose requester annotations
    name no one else is deleted; one that another requester still names only loses our annotation
    (judged from the Job's own annotations, never from other engines' status). Engines stay in the
    store (a cache)."""
    requester, jobs = observe_release(body, indices)
    await apply_job_actions(state, plan_release(requester, jobs))
    meta = body["metadata"]
    forget(state, Kind.TRTENGINE, meta["namespace"], meta["name"])
