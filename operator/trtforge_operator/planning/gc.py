"""Engine garbage collection: which stored engines no resource references any more. No I/O.

Engines are a cache shared by every namespace, so nothing is removed when a TRTEngine goes; GC is an
opt-in policy (``gc.enabled``) that deletes engines no TRTEngine status, runtime Deployment or running
build Job references, once they are older than ``gc.minAgeSeconds``, keeping the ``gc.keepLatest``
newest unreferenced ones.

The same policy collects the verify side of the store (:func:`plan_model_gc`): staged models
(``models/<sha256>/``) and possession records no TRTEngine's current source needs, and expired
verify grants.

An engine is also referenced through a *request key* (docs/design.md "Engine keys"): a build that has
just published its engine, but whose TRTEngine has not yet recorded the engine key, is named only by
the request key on its Job and in the target's status. The store's request index resolves those.
A builder files that index entry just after the manifest, so while a build runs whose request the
index does not answer yet, every engine created since that build began is kept for this pass.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from trtforge_operator.config import GCSettings
from trtforge_operator.observe.views import (
    StoredEngine,
    StoredGrant,
    StoredProof,
    StoreGCObserved,
    unrecorded_requests,
)


def plan_gc(
    stored: Iterable[StoredEngine],
    referenced: Iterable[str],
    now: float,
    policy: GCSettings,
    unresolved_build_started: float | None = None,
) -> list[str]:
    """Keys to delete, oldest first.

    ``unresolved_build_started``: the earliest start of a running build whose engine the request
    index does not name yet; engines created since then may be its output and are not candidates."""
    refs = set(referenced)
    guard = None if unresolved_build_started is None else unresolved_build_started - policy.clock_skew_seconds
    candidates = sorted(
        (e for e in stored if e.key not in refs and (guard is None or e.created_at < guard)),
        key=lambda e: e.created_at,
        reverse=True,
    )
    keep = candidates[: policy.keep_latest]
    kept = {e.key for e in keep}
    out = [e for e in candidates if e.key not in kept and now - e.created_at >= policy.min_age_seconds]
    return [e.key for e in sorted(out, key=lambda e: e.created_at)]


def referenced_keys(
    engine_statuses: Iterable[Mapping[str, object]],
    template_keys: Iterable[str],
    job_keys: Iterable[str],
    filed: Mapping[str, str] | None = None,
) -> set[str]:
    """Every engine key some TRTEngine status, runtime pod template or build Job still uses.

    ``job_keys``: the engine keys build Jobs name or produced; ``filed``: the store's request index
    for the request keys of targets with no engine key yet (:func:`unrecorded_requests`; request key
    -> engine key, absent when none is filed)."""
    out = {str(k) for k in template_keys if k} | {str(k) for k in job_keys if k}
    for st in engine_statuses:
        for t in st.get("targets") or []:  # type: ignore[attr-defined]
            if isinstance(t, Mapping) and (k := t.get("engineKey")):
                out.add(str(k))
    for rk in sorted(unrecorded_requests(engine_statuses)):
        if k := (filed or {}).get(rk):
            out.add(k)
    return out


# ------------------------------------------------------------------------------------ models/ and proofs


@dataclass(frozen=True)
class ModelGCPlan:
    proofs: list[tuple[str, str]]  # (namespace, fingerprint), records first
    models: list[str]  # staged model digests, after the records that named them
    grants: list[tuple[str, str]]  # (namespace, job): expired, useless to the broker


def plan_model_gc(
    models: Iterable[str],
    proofs: Iterable[StoredProof],
    grants: Iterable[StoredGrant],
    current_sources: Iterable[tuple[str, str]],
    build_models: Iterable[str],
    now: float,
    policy: GCSettings,
    sources_listed_at: float | None = None,
    namespaces: frozenset[str] | None = None,
) -> ModelGCPlan:
    """What of the verify side of the store nothing references any more. Pure.

    - A possession record goes once no TRTEngine of its namespace names its source
      (``current_sources``: (namespace, source fingerprint) of every TRTEngine) and it is older than
      ``gc.minAgeSeconds``: the broker only ever honours the record of a TRTEngine's current source.
      A record written after the TRTEngines were listed (``sources_listed_at``) may be of one created
      meanwhile: it stays this pass.
    - A staged model goes once no remaining record names it and no running build Job reads it
      (``build_models``), and no verification is pending anywhere (an unexpired grant): an upload
      stages its model before it writes its record, and may find a staged copy it relies on.
    - An expired grant goes: the broker refuses it anyway.

    ``namespaces``: where the TRTEngines were listed (the watched namespaces), None for everywhere. A
    record of any other namespace is outside what this operator sees, so it stays, and so do the
    models it names."""
    current = set(current_sources)
    kept_digests: set[str] = set()
    drop: list[StoredProof] = []
    for p in proofs:
        fresh = (
            sources_listed_at is not None and p.verified_at >= sources_listed_at - policy.clock_skew_seconds
        )
        seen = namespaces is None or p.namespace in namespaces
        if (
            seen
            and (p.namespace, p.fingerprint) not in current
            and not fresh
            and now - p.verified_at >= policy.min_age_seconds
        ):
            drop.append(p)
        else:
            kept_digests.add(p.sha256)
    all_grants = list(grants)
    pending = any(g.expires_at >= now for g in all_grants)
    keep = kept_digests | set(build_models)
    dead_models = [] if pending else sorted(m for m in set(models) if m not in keep)
    return ModelGCPlan(
        proofs=sorted((p.namespace, p.fingerprint) for p in drop),
        models=dead_models,
        grants=sorted((g.namespace, g.job) for g in all_grants if g.expires_at < now),
    )


@dataclass(frozen=True)
class StoreGCPlan:
    """One GC pass: the engines to delete, oldest first, and the verify side's deletions."""

    engines: list[str]
    models: ModelGCPlan


def plan_store_gc(obs: StoreGCObserved, policy: GCSettings, now: float) -> StoreGCPlan:
    """What one GC pass deletes (:func:`plan_gc`, :func:`plan_model_gc`)."""
    running = [v for v in obs.jobs if v.running]
    refs = referenced_keys(
        obs.engine_statuses,
        obs.template_keys,
        # a rebuild still running may publish; a finished build may not be recorded by any status yet
        [v.engine_key for v in running] + [k for k in obs.filed.values() if k],
        obs.recorded_filed,
    )
    starts = [
        v.started or v.created or 0.0
        for v in running
        if not (v.request_digest and obs.filed.get(v.request_digest))
    ]
    engines = plan_gc(obs.stored, refs, now, policy, min(starts) if starts else None)
    models = plan_model_gc(
        obs.models,
        obs.proofs,
        obs.grants,
        obs.engine_sources,
        obs.build_models,
        now,
        policy,
        obs.listed_at,
        namespaces=obs.namespaces,
    )
    return StoreGCPlan(engines, models)
