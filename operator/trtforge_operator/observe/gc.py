"""Observe: what one engine GC pass plans from (``gc.enabled``), read in the order that keeps it
safe: the store's engines first (every engine in that listing was published before the references
below were read, so a build that finishes meanwhile is seen through its Job or its requester's
status), then the TRTEngines, runtime Deployments and build Jobs that reference them (listed, only
in the watched namespaces when the operator watches some: its rights end there), the request index
for the keys they name, and the verify side of the store (docs/design.md §"Observe, plan, apply")."""

from __future__ import annotations

import asyncio
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
    verify_grant_path,
)
from trtforge.store import ObjectNotFound
from trtforge_operator.labels import ANNOTATION_ENGINE_KEY, APP_MANAGED_BY, MANAGED_BY, TRTENGINES
from trtforge_operator.observe.views import (
    JobView,
    StoredEngine,
    StoredGrant,
    StoredProof,
    StoreGCObserved,
    unrecorded_requests,
)
from trtforge_operator.state import State


async def observe_store_gc(state: State) -> StoreGCObserved:
    """One GC pass's observation (see the module docstring)."""
    cfg = state.cfg
    selector = f"{APP_MANAGED_BY}={MANAGED_BY}"
    stored = []
    for k in await asyncio.to_thread(state.store.keys):
        m = await asyncio.to_thread(state.store.manifest, k)
        if m is not None:
            stored.append(StoredEngine(k, m.created_at))
    listed_at = time.time()
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
    views = [JobView.from_k8s(state.kube.api.sanitize_for_serialization(j)) for j in jobs.items]

    def resolve(request_key: str) -> str | None:
        state.store.invalidate_request(request_key)  # a miss cached a moment ago may be filed now
        filed = state.store.request(request_key)
        return filed.engine_key if filed is not None else None

    filed = {
        v.request_digest: await asyncio.to_thread(resolve, v.request_digest)
        for v in views
        if not v.deleting and v.request_digest
    }
    statuses = [e.get("status") or {} for e in engines]
    unrecorded = unrecorded_requests(statuses)
    recorded_filed = await asyncio.to_thread(
        lambda: {rk: k for rk in sorted(unrecorded) if (k := resolve(rk))}
    )
    models, proofs, grants = await asyncio.to_thread(_verify_side, state)
    return StoreGCObserved(
        stored=stored,
        listed_at=listed_at,
        engine_statuses=statuses,
        engine_sources=frozenset(_source(e) for e in engines),
        template_keys=[_template_key(d) for d in deps],
        jobs=views,
        filed=filed,
        recorded_filed=recorded_filed,
        build_models=frozenset(sha for j in jobs.items if (sha := _model_of(j)) is not None and not _done(j)),
        models=models,
        proofs=proofs,
        grants=grants,
        namespaces=frozenset(watched) if watched else None,
    )


def _template_key(deployment: Any) -> str:
    """The engine key a runtime Deployment's pod template serves."""
    return str((deployment.spec.template.metadata.annotations or {}).get(ANNOTATION_ENGINE_KEY, ""))


def _source(engine: dict[str, Any]) -> tuple[str, str]:
    """A TRTEngine's namespace and current model source (its fingerprint)."""
    m = (engine.get("spec") or {}).get("model") or {}
    secret = (m.get("secretRef") or {}).get("name")
    fp = source_fingerprint(str(m.get("uri") or ""), secret or None, m.get("sha256") or None)
    return str(engine["metadata"]["namespace"]), fp


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


def _verify_side(state: State) -> tuple[list[str], list[StoredProof], list[StoredGrant]]:
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
