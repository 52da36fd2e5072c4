"""The opt-in engine GC loop (``gc.enabled``): gather what references engines, plan, delete.

The decision is planning.gc's; this module only lists the cluster and the store and applies it.
Only the leader runs it (cli._act).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from trtforge_operator.labels import ANNOTATION_ENGINE_KEY, APP_MANAGED_BY, MANAGED_BY, TRTENGINES
from trtforge_operator.observed import JobView
from trtforge_operator.planning.gc import StoredEngine, plan_gc, referenced_keys

log = logging.getLogger(__name__)


async def gc_pass(state: Any) -> list[str]:
    """One pass: delete the engines planning.gc picks; returns their keys."""
    cfg = state.cfg
    selector = f"{APP_MANAGED_BY}={MANAGED_BY}"
    # The store first: every engine in this listing was published before the references below were
    # read, so a build that finishes meanwhile is seen through its Job or its requester's status.
    stored = []
    for k in await asyncio.to_thread(state.store.keys):
        m = await asyncio.to_thread(state.store.manifest, k)
        if m is not None:
            stored.append(StoredEngine(k, m.created_at))
    # Only where the operator watches when it watches some namespaces: its rights end there.
    watched = cfg.watched_namespaces()
    if watched:
        engines = [e for ns in watched for e in await state.kube.list_custom(TRTENGINES, ns)]
        deps = [
            d
            for ns in watched
            for d in (
                await asyncio.to_thread(
                    state.kube.apps.list_namespaced_deployment, ns, label_selector=selector
                )
            ).items
        ]
    else:
        engines = await state.kube.list_custom(TRTENGINES)
        deps = (
            await asyncio.to_thread(
                state.kube.apps.list_deployment_for_all_namespaces, label_selector=selector
            )
        ).items
    jobs = await asyncio.to_thread(
        state.kube.batch.list_namespaced_job, cfg.build_namespace, label_selector=selector
    )
    tkeys = [(d.spec.template.metadata.annotations or {}).get(ANNOTATION_ENGINE_KEY, "") for d in deps]
    views = [JobView.from_k8s(state.kube.api.sanitize_for_serialization(j)) for j in jobs.items]

    def resolve(request_key: str) -> str | None:
        state.store.invalidate_request(request_key)  # a miss cached a moment ago may be filed now
        filed = state.store.request(request_key)
        return filed.engine_key if filed is not None else None

    live = [v for v in views if not v.deleting]
    filed = {
        v.request_digest: await asyncio.to_thread(resolve, v.request_digest) for v in live if v.request_digest
    }
    refs = await asyncio.to_thread(
        referenced_keys,
        [e.get("status") or {} for e in engines],
        tkeys,
        # a rebuild still running may publish; a finished build may not be recorded by any status yet
        [v.engine_key for v in views if v.running] + [k for k in filed.values() if k],
        resolve,
    )
    starts = [
        v.started or v.created or 0.0
        for v in views
        if v.running and not (v.request_digest and filed.get(v.request_digest))
    ]
    deleted = plan_gc(stored, refs, time.time(), cfg.gc, min(starts) if starts else None)
    for k in deleted:
        await asyncio.to_thread(state.store.delete_engine, k)
        state.metrics.gc_deleted.inc()
        log.info("gc: deleted unreferenced engine %s", k)
    return deleted


async def gc_loop(state: Any) -> None:
    """Every ``gc.interval_seconds``, one pass; a failed pass is logged and tried again next time."""
    while True:
        await asyncio.sleep(state.cfg.gc.interval_seconds)
        try:
            await gc_pass(state)
        except Exception:
            log.exception("gc pass failed; trying again next interval")
