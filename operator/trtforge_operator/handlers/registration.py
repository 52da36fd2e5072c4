"""Registration: kopf's settings, the indices (complete before any handler runs: a restart sees
every Job it made), the wake-ups, one daemon per resource and the deletion handlers."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

import kopf
from pydantic import ValidationError

from trtforge_operator.api import (
    TRTEngine,
)
from trtforge_operator.handlers.deployment import cleanup_deployment
from trtforge_operator.handlers.engine import cleanup_engine
from trtforge_operator.handlers.finished_jobs import run as run_job_cleanup
from trtforge_operator.handlers.loop import loop
from trtforge_operator.handlers.store_claim import refresh_store_claim
from trtforge_operator.handlers.store_claim import run as watch_store_claim
from trtforge_operator.handlers.wakeups import build_pod_job, register_wakeups
from trtforge_operator.kinds import Kind
from trtforge_operator.labels import (
    APP_COMPONENT,
    APP_MANAGED_BY,
    COMPONENT_BUILDER,
    COMPONENT_RUNTIME,
    COMPONENT_VERIFIER,
    FINALIZER,
    GROUP,
    INFERENCEDEPLOYMENTS,
    LABEL_INFERENCEDEPLOYMENT,
    MANAGED_BY,
    TRTENGINES,
    VERSION,
)
from trtforge_operator.observe.claim_view import store_claim_name
from trtforge_operator.observe.engine import INFD_FAULTS_IDX
from trtforge_operator.observe.views import AutoscalerView, DeploymentView, JobView, NodeView, PodView
from trtforge_operator.planning.rebuild import parse_observed
from trtforge_operator.state import State, plain

MANAGED = {APP_MANAGED_BY: MANAGED_BY}


class NoDiffBase(kopf.DiffBaseStorage):
    """Keep no diff-base: the only changing handlers are deletions, which need none. Kopf's default
    writes a last-handled-configuration annotation on every new object: one more write of each
    TRTEngine for nothing (docs/design.md §"Scale"). Every event then reads as a creation with no
    creation handler: nothing runs and nothing is written."""

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        """An empty essence: kopf builds one (a deep copy of the body, copied again to clear it) on
        every event of every watched kind, only to diff it for change handlers we do not have. At
        N = 1000 that was an eighth of the event loop (docs/design.md §"Scale")."""
        return kopf.BodyEssence()


def register(state: State, registry: kopf.OperatorRegistry) -> None:
    """Register every handler on `registry` (no import-time side effects)."""
    cfg = state.cfg

    def _build_pod_job(namespace: str, labels: Mapping[str, str]) -> str | None:
        return build_pod_job(cfg.build_namespace, namespace, labels)

    @kopf.on.startup(registry=registry)
    def _settings(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.persistence.finalizer = FINALIZER
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="trtforge.io")
        settings.persistence.diffbase_storage = NoDiffBase()
        settings.watching.server_timeout = 300
        settings.watching.client_timeout = 310
        settings.watching.connect_timeout = 30
        settings.networking.request_timeout = 60
        settings.posting.level = logging.WARNING  # our own Events go through Kube.event
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)  # one line per handled event is noise

    @kopf.on.startup(registry=registry)
    async def _start_job_cleanup(**_: Any) -> None:
        if cfg.build.finished_job_ttl_seconds > 0:
            state.tasks.append(asyncio.create_task(run_job_cleanup(state)))

    @kopf.on.startup(registry=registry)
    async def _start_store_claim(**_: Any) -> None:
        """Before any pass: the store's claim, read once, then kept in view (pvc:// stores only)."""
        if store_claim_name(cfg.store_uri) is not None:
            await refresh_store_claim(state)
            state.tasks.append(asyncio.create_task(watch_store_claim(state)))

    @kopf.on.cleanup(registry=registry)
    async def _stop_job_cleanup(**_: Any) -> None:
        for t in state.tasks:
            t.cancel()

    # --- indices (complete before any handler runs: a restart sees every Job it made)
    @kopf.index("batch", "v1", "jobs", id="jobs_idx", labels=MANAGED, registry=registry)
    def _jobs_idx(**kw: Any) -> Any:
        body, namespace = kw["body"], kw["namespace"]
        if namespace != cfg.build_namespace:
            return None
        j = JobView.from_k8s(body)
        return {j.build_id: j}

    @kopf.index(
        "batch",
        "v1",
        "jobs",
        id="vjobs_idx",
        labels={**MANAGED, APP_COMPONENT: COMPONENT_VERIFIER},
        registry=registry,
    )
    def _vjobs_idx(**kw: Any) -> Any:
        return {kw["namespace"]: JobView.from_k8s(kw["body"])}

    @kopf.index(
        "v1",
        "pods",
        id="vpods_idx",
        labels={**MANAGED, APP_COMPONENT: COMPONENT_VERIFIER},
        registry=registry,
    )
    def _vpods_idx(**kw: Any) -> Any:
        job = kw["labels"].get("job-name") or kw["labels"].get("batch.kubernetes.io/job-name")
        return {(kw["namespace"], job): PodView.from_verify_pod(kw["body"])} if job else None

    @kopf.index("v1", "namespaces", id="ns_idx", registry=registry)
    def _ns_idx(**kw: Any) -> Any:
        return {kw["name"]: dict(kw["labels"] or {})}

    @kopf.index("v1", "nodes", id="nodes_idx", registry=registry)
    def _nodes_idx(**kw: Any) -> Any:
        body, name = kw["body"], kw["name"]
        return {name: NodeView.from_k8s(body)}

    @kopf.index(
        "v1",
        "pods",
        id="bpods_idx",
        labels={**MANAGED, APP_COMPONENT: COMPONENT_BUILDER},
        registry=registry,
    )
    def _bpods_idx(**kw: Any) -> Any:
        job = _build_pod_job(kw["namespace"], kw["labels"])
        return {job: PodView.from_build_pod(kw["body"])} if job else None

    @kopf.index(
        "v1",
        "pods",
        id="rpods_idx",
        labels={**MANAGED, APP_COMPONENT: COMPONENT_RUNTIME},
        registry=registry,
    )
    def _rpods_idx(**kw: Any) -> Any:
        body, namespace, labels = kw["body"], kw["namespace"], kw["labels"]
        return {(namespace, labels.get(LABEL_INFERENCEDEPLOYMENT, "")): PodView.from_k8s(body)}

    @kopf.index("apps", "v1", "deployments", id="deps_idx", labels=MANAGED, registry=registry)
    def _deps_idx(**kw: Any) -> Any:
        body, namespace, labels = kw["body"], kw["namespace"], kw["labels"]
        return {(namespace, labels.get(LABEL_INFERENCEDEPLOYMENT, "")): DeploymentView.from_k8s(body)}

    @kopf.index(GROUP, VERSION, INFERENCEDEPLOYMENTS, id=INFD_FAULTS_IDX, registry=registry)
    def _infd_faults_idx(**kw: Any) -> Any:
        """The faults an InferenceDeployment's status records, by the engine it serves (same namespace)."""
        namespace, name, body = kw["namespace"], kw["name"], kw["body"]
        ref = ((body.get("spec") or {}).get("engineRef") or {}).get("name")
        observed = parse_observed(f"{namespace}/{name}", plain(body.get("status") or {}))
        return {(namespace, str(ref)): observed} if ref and observed is not None else None

    # Read through autoscaling/v1 (served by every version): metadata, target and counts are all a
    # pass needs; the operator writes them in v2 or v2beta2 (planning/autoscaling.py).
    @kopf.index(
        "autoscaling", "v1", "horizontalpodautoscalers", id="hpas_idx", labels=MANAGED, registry=registry
    )
    def _hpas_idx(**kw: Any) -> Any:
        body, namespace, labels = kw["body"], kw["namespace"], kw["labels"]
        return {(namespace, labels.get(LABEL_INFERENCEDEPLOYMENT, "")): AutoscalerView.from_k8s(body)}

    @kopf.index(GROUP, VERSION, TRTENGINES, id="trte_idx", registry=registry)
    def _trte_idx(**kw: Any) -> Any:
        body, namespace, name = kw["body"], kw["namespace"], kw["name"]
        try:
            return {(namespace, name): TRTEngine.model_validate(plain(body))}
        except ValidationError:
            return None

    register_wakeups(state, registry)

    # --- the level-based loops, one per resource
    @kopf.daemon(GROUP, VERSION, TRTENGINES, id="reconcile", cancellation_timeout=1.0, registry=registry)
    async def _engine_daemon(body: Any, stopped: Any, **kwargs: Any) -> None:
        await loop(state, Kind.TRTENGINE, body, stopped, kwargs)

    @kopf.daemon(
        GROUP,
        VERSION,
        INFERENCEDEPLOYMENTS,
        id="reconcile",
        cancellation_timeout=1.0,
        registry=registry,
    )
    async def _infd_daemon(body: Any, stopped: Any, **kwargs: Any) -> None:
        await loop(state, Kind.INFERENCEDEPLOYMENT, body, stopped, kwargs)

    # --- deletion (our finalizer holds the object until these succeed)
    @kopf.on.delete(GROUP, VERSION, TRTENGINES, id="cleanup", registry=registry)
    async def _engine_deleted(body: Any, **kwargs: Any) -> None:
        await cleanup_engine(state, body, kwargs)

    @kopf.on.delete(GROUP, VERSION, INFERENCEDEPLOYMENTS, id="cleanup", registry=registry)
    async def _infd_deleted(body: Any, **kwargs: Any) -> None:
        await cleanup_deployment(state, body, kwargs)
