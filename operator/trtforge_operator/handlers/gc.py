"""The opt-in engine GC loop (``gc.enabled``): gather what references engines, plan, delete.

The decision is planning.gc's; this module only lists the cluster and the store and applies it.
Only the leader runs it (cli._act).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from trtforge.contract.possession import (
    GRANTS,
    MODELS,
    POSSESSION,
    STAGED_MODEL_FILE,
    PossessionRecord,
    VerifyGrant,
    possession_path,
    source_fingerprint,
    staged_model_path,
    verify_grant_path,
)
from trtforge.store import ObjectNotFound
from trtforge_operator.labels import ANNOTATION_ENGINE_KEY, APP_MANAGED_BY, MANAGED_BY, TRTENGINES
from trtforge_operator.observe.views import JobView
from trtforge_operator.planning.gc import (
    ModelGCPlan,
    StoredEngine,
    StoredGrant,
    StoredProof,
    plan_gc,
    plan_model_gc,
    referenced_keys,
    unrecorded_requests,
)

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
    listed_at = time.time()
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
    statuses = [e.get("status") or {} for e in engines]
    unrecorded = unrecorded_requests(statuses)
    recorded_filed = await asyncio.to_thread(
        lambda: {rk: k for rk in sorted(unrecorded) if (k := resolve(rk))}
    )
    refs = await asyncio.to_thread(
        referenced_keys,
        statuses,
        tkeys,
        # a rebuild still running may publish; a finished build may not be recorded by any status yet
        [v.engine_key for v in views if v.running] + [k for k in filed.values() if k],
        recorded_filed,
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
    build_models = {m for j in jobs.items if (m := _model_of(j)) is not None and not _done(j)}
    await asyncio.to_thread(_collect_models, state, engines, build_models, listed_at)
    return deleted


def _model_of(job: Any) -> str | None:
    """The model digest a build Job reads from the staging area (its ``--sha256`` argument)."""
    for c in job.spec.template.spec.containers or []:
        argv = [*(c.command or []), *(c.args or [])]
        if "--sha256" in argv[:-1]:
            return str(argv[argv.index("--sha256") + 1])
    return None


def _done(job: Any) -> bool:
    st = job.status
    return bool(st and (st.succeeded or (st.failed and not st.active)))


def _model_gc_inputs(state: Any) -> tuple[list[str], list[StoredProof], list[StoredGrant]]:
    """The staged models, possession records and verify grants in the store."""
    store = state.store.store
    models = sorted(
        {p.split("/")[1] for p in store.list(f"{MODELS}/") if p.endswith(f"/{STAGED_MODEL_FILE}")}
    )
    proofs: list[StoredProof] = []
    for p in store.list(f"{POSSESSION}/"):
        try:
            rec = PossessionRecord.from_json(store.read_bytes(p))
        except (ObjectNotFound, ValueError):
            continue
        if possession_path(rec.namespace, rec.fingerprint) == p:
            proofs.append(StoredProof(rec.namespace, rec.fingerprint, rec.sha256, rec.verified_at))
    grants: list[StoredGrant] = []
    for p in store.list(f"{GRANTS}/"):
        try:
            g = VerifyGrant.from_json(store.read_bytes(p))
        except (ObjectNotFound, ValueError):
            continue
        if verify_grant_path(g.namespace, g.job) == p:
            grants.append(StoredGrant(g.namespace, g.job, g.expires_at))
    return models, proofs, grants


def _collect_models(
    state: Any, engines: list[dict[str, Any]], build_models: set[str], listed_at: float
) -> ModelGCPlan:
    """Delete the possession records, staged models and expired grants planning.gc picks."""
    models, proofs, grants = _model_gc_inputs(state)
    current = set()
    for e in engines:
        m = (e.get("spec") or {}).get("model") or {}
        secret = (m.get("secretRef") or {}).get("name")
        fp = source_fingerprint(str(m.get("uri") or ""), secret or None, m.get("sha256") or None)
        current.add((str(e["metadata"]["namespace"]), fp))
    watched = state.cfg.watched_namespaces()
    plan = plan_model_gc(
        models,
        proofs,
        grants,
        current,
        build_models,
        time.time(),
        state.cfg.gc,
        listed_at,
        namespaces=frozenset(watched) if watched else None,
    )
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
    return plan


async def gc_loop(state: Any) -> None:
    """Every ``gc.interval_seconds``, one pass; a failed pass is logged and tried again next time."""
    while True:
        await asyncio.sleep(state.cfg.gc.interval_seconds)
        try:
            await gc_pass(state)
        except Exception:
            log.exception("gc pass failed; trying again next interval")
