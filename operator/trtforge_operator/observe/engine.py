"""Observe: everything one TRTEngine pass plans from, gathered once into typed, immutable views.

The only place an engine pass reads: the TRTEngine (its status as last written), its build Jobs by
build id and what their pods reported, the verify Jobs of its namespace and their pods, Nodes, the
namespace's cache scope, the InferenceDeployments' recorded faults (all from kopf's indices, looked up
by key, never listed), the store's possession record, request records and manifests (read once per
pass, in a worker thread), and the build slots. The planners get this as data (observe/views.py) and do no
I/O (docs/design.md §"Observe, plan, apply").

The build capacity is read last, after the final await, so the caller plans and admits in the same
synchronous step: no other pass can take a slot between the count and the admission.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from trtforge.contract.build_result import BuildFailure
from trtforge.contract.engine_key import RequestRecord
from trtforge.contract.llm import ArtefactKind, ArtefactManifest
from trtforge.contract.manifest import Manifest
from trtforge.contract.possession import source_fingerprint
from trtforge.store import StoreError
from trtforge.store.artefacts import read_manifest
from trtforge_operator.api import TRTEngine, TRTEngineSpec, TRTEngineStatus
from trtforge_operator.api.common import field_error
from trtforge_operator.apply.children import JOB_PREFIX
from trtforge_operator.config import OperatorConfig
from trtforge_operator.kinds import Kind
from trtforge_operator.observe.claim_view import StoreBlockedEngine
from trtforge_operator.observe.keys import key_inputs, resolve_targets
from trtforge_operator.observe.llm_keys import (
    checkpoint_backend,
    engine_checkpoint_key,
    llm_backend,
    quantize_id,
    tune_id,
)
from trtforge_operator.observe.views import (
    EngineObserved,
    JobView,
    NodeView,
    ObservedFaults,
    PodView,
    Reported,
    RequesterView,
    UnreadableEngine,
    built_key,
    one_line,
    request_builds,
)
from trtforge_operator.state import State, parsed_status, plain
from trtforge_operator.store_reader import StoreReader

log = logging.getLogger(__name__)
INFD_FAULTS_IDX = "infd_faults_idx"  # (namespace, engine) -> the faults its InferenceDeployments recorded


async def observe_engine(
    state: State, body: Mapping[str, Any], indices: Mapping[str, Any]
) -> EngineObserved | UnreadableEngine | StoreBlockedEngine:
    """One TRTEngine pass's observation (see the module docstring). While the store's claim is not
    bound there is no store to read: the pass sees only that (docs/design.md §"Store claim that
    cannot bind")."""
    body = plain(body)
    meta = body["metadata"]
    ns, name, gen = meta["namespace"], meta["name"], int(meta.get("generation") or 1)
    old = state.statuses.current(Kind.TRTENGINE, body)
    try:
        obj = TRTEngine.model_validate({**body, "status": old})
    except ValidationError as e:
        status = parsed_status(TRTEngineStatus, old)
        return UnreadableEngine(ns, name, gen, status, old, field_error(e), time.time())
    claim = state.store_claim
    if claim is not None and not claim.bound:
        return StoreBlockedEngine(ns, name, gen, obj.status, old, claim, time.time())
    cfg, spec = state.cfg, obj.spec
    nodes = state.nodes(indices)
    m = spec.source
    fingerprint = source_fingerprint(m.uri, m.secret_ref.name if m.secret_ref else None, m.sha256)
    possession = await asyncio.to_thread(state.store.possession, ns, fingerprint)
    verified = (
        possession.sha256
        if possession is not None and possession.proves(ns, fingerprint, m.sha256 or None)
        else None
    )
    cache_scope = _cache_scope(cfg, indices, ns)
    verify_jobs = [j for j in list(indices["vjobs_idx"].get(ns, [])) if isinstance(j, JobView)]
    jobs_idx: Mapping[str, Any] = indices["jobs_idx"]  # by build id: looked up per key, never scanned
    bpods: Mapping[str, Any] = indices["bpods_idx"]
    request_keys = [] if spec.llm is not None else _request_keys(spec, nodes, cfg, verified, cache_scope)
    jobs = _jobs(jobs_idx, bpods, {rk[:20] for rk in request_keys})
    by_id = {bid: list(js) for bid, js in jobs.items()}
    unresolved = [rk for rk in request_keys if built_key(request_builds(by_id, rk)) is None]
    engine_keys = {k for rk in request_keys if (k := built_key(request_builds(by_id, rk)))}
    engine_keys |= {t.engine_key for t in obj.status.targets if t.engine_key}
    requests, manifests = await asyncio.to_thread(
        _read_store, state.store, unresolved if (verified or m.sha256) else [], engine_keys
    )
    # Rebuilds are named by the engine key they rebuild: those Jobs too.
    more = {k[:20] for k in (*engine_keys, *(r.engine_key for r in requests.values()))} - set(jobs)
    jobs = {**jobs, **_jobs(jobs_idx, bpods, more)}
    checkpoint = None
    if spec.llm is not None and verified is not None:
        ckey, llm_ids = _llm_ids(spec, nodes, cfg, verified, cache_scope)
        jobs = {**jobs, **_jobs(jobs_idx, bpods, llm_ids)}
        checkpoint = await asyncio.to_thread(_read_checkpoint, state.store, ckey)
    return EngineObserved(
        checkpoint=checkpoint,
        namespace=ns,
        name=name,
        generation=gen,
        spec=spec,
        status=obj.status,
        nodes=nodes,
        jobs=jobs,
        manifests=manifests,
        requests=requests,
        now=time.time(),
        unschedulable=_unschedulable(bpods, {t.job_name for t in obj.status.targets if t.job_name}),
        observed_faults=[
            o for o in list(indices[INFD_FAULTS_IDX].get((ns, name), ())) if isinstance(o, ObservedFaults)
        ],
        annotations=dict(meta.get("annotations") or {}),
        uid=meta.get("uid", ""),
        possession=possession,
        verify_jobs=verify_jobs,
        verify_failures=_verify_failures(indices["vpods_idx"], ns, verify_jobs),
        verify_stuck=_verify_stuck(indices["vpods_idx"], ns, verify_jobs),
        cache_scope=cache_scope,
        status_wire=old,
        capacity=state.slots.capacity(ns),  # last, after every await (see the module docstring)
    )


def _request_keys(
    spec: TRTEngineSpec, nodes: Sequence[NodeView], cfg: OperatorConfig, verified: str | None, scope: str
) -> list[str]:
    """The request key of every resolvable target: the addresses this pass reads by (observe/keys.py)."""
    out: list[str] = []
    for target in resolve_targets(spec, nodes):
        try:
            out.append(
                key_inputs(spec, target, nodes, cfg, model_sha256=verified, cache_scope=scope).request_key
            )
        except ValueError:
            continue
    return out


def _llm_ids(
    spec: TRTEngineSpec, nodes: Sequence[NodeView], cfg: OperatorConfig, verified: str, scope: str
) -> tuple[str, set[str]]:
    """An LLM engine's checkpoint key, and the build ids of its quantize and tune Jobs."""
    targets = resolve_targets(spec, nodes)
    ckey = engine_checkpoint_key(spec, verified, checkpoint_backend(cfg, targets))
    qid = quantize_id(ckey, scope)
    ids = {qid}
    for t in targets:
        ids.add(tune_id(qid, t, spec.parallelism_of(t), llm_backend(cfg, t), cfg.builder_image))
    return ckey, ids


def _read_checkpoint(store: StoreReader, ckey: str) -> ArtefactManifest | None:
    """The checkpoint's committed manifest (in a worker thread); None when absent or unreadable."""
    try:
        return read_manifest(store.store, ArtefactKind.CHECKPOINT, ckey)
    except StoreError as e:
        log.warning("cannot read checkpoint manifest %s: %s", ckey[:12], e)
        return None


def _read_store(
    store: StoreReader, request_keys: Iterable[str], engine_keys: Iterable[str]
) -> tuple[dict[str, RequestRecord], dict[str, Manifest]]:
    """The request records of `request_keys` and the manifests of the engines they and
    `engine_keys` name (in a worker thread: the store is files or S3)."""
    requests = {rk: r for rk in request_keys if (r := store.request(rk)) is not None}
    keys = set(engine_keys) | {r.engine_key for r in requests.values()}
    manifests = {k: mf for k in sorted(keys) if (mf := store.manifest(k)) is not None}
    return requests, manifests


def _jobs(
    jobs_idx: Mapping[str, Any], bpods: Mapping[str, Any], ids: Iterable[str]
) -> dict[str, tuple[JobView, ...]]:
    """The build Jobs of these build ids, each with what its pod reported while the Job does not
    carry it yet."""
    out: dict[str, tuple[JobView, ...]] = {}
    for bid in ids:
        found = tuple(_with_result(j, bpods) for j in list(jobs_idx.get(bid, ())) if isinstance(j, JobView))
        if found:
            out[bid] = found
    return out


def _with_result(job: JobView, bpods: Mapping[str, Any]) -> JobView:
    if job.recorded:
        return job
    reported: list[Reported] = [
        p.reported for p in list(bpods.get(job.name, ())) if isinstance(p, PodView) and p.reported is not None
    ]
    if not reported:
        return job
    best = next((r for r in reported if not isinstance(r, BuildFailure)), reported[-1])
    return dataclasses.replace(job, reported=best)


def _unschedulable(bpods: Mapping[str, Any], job_names: Iterable[str]) -> dict[str, str]:
    """Build Job -> the scheduler's message while its pod waits for a node."""
    return {
        job: p.unschedulable
        for job in job_names
        for p in list(bpods.get(job, ()))
        if isinstance(p, PodView) and p.unschedulable and p.phase == "Pending"
    }


def _cache_scope(cfg: OperatorConfig, indices: Mapping[str, Any], namespace: str) -> str:
    """The cache scope of `namespace` under the configured sharing policy (its labels from the index)."""
    labels: dict[str, str] = {}
    for found in list(indices["ns_idx"].get(namespace, [])):
        labels = dict(found)
    return cfg.cache.scope(namespace, labels)


def _verify_failures(
    vpods: Mapping[Any, Any], namespace: str, jobs: list[JobView]
) -> dict[str, BuildFailure]:
    """Failed verify Jobs of `namespace` -> the failure their pod reported (parsed with the pod)."""
    out: dict[str, BuildFailure] = {}
    for j in jobs:
        for pod in list(vpods.get((namespace, j.name), [])):
            if isinstance(pod, PodView) and isinstance(pod.reported, BuildFailure):
                out[j.name] = pod.reported
    return out


def _verify_stuck(vpods: Mapping[Any, Any], namespace: str, jobs: list[JobView]) -> dict[str, str]:
    """Running verify Jobs of `namespace` whose pod cannot start -> the kubelet's or scheduler's reason."""
    out: dict[str, str] = {}
    for j in jobs:
        if not j.running:
            continue
        for pod in list(vpods.get((namespace, j.name), [])):
            if not isinstance(pod, PodView) or pod.deleting:
                continue
            w = pod.cannot_start()
            if w is not None:
                out[j.name] = one_line(f"{w.reason}: {w.message}" if w.message else w.reason)
            elif pod.unschedulable and pod.phase == "Pending":
                out[j.name] = one_line(f"Unschedulable: {pod.unschedulable}")
    return out


def observe_finished_jobs(indices: Mapping[str, Any]) -> tuple[list[JobView], dict[str, RequesterView]]:
    """Every build Job of the build namespace, and what each TRTEngine that a finished one names holds
    (from the index; an engine that is gone is missing): its status's targets, its annotations and its
    InferenceDeployments' recorded faults (planning/finished_jobs.py derives the rebuilds it wants)."""
    jobs = [j for store in list(indices["jobs_idx"].values()) for j in list(store) if isinstance(j, JobView)]
    names = {r for j in jobs if j.done for r in j.requesters()}
    out: dict[str, RequesterView] = {}
    for name in sorted(names):
        ns, _, n = name.partition("/")
        for e in list(indices["trte_idx"].get((ns, n), ())):
            if isinstance(e, TRTEngine):
                gen = e.metadata.generation or 1
                out[name] = RequesterView(
                    targets=e.status.targets,
                    current=e.status.observed_generation == gen,
                    annotations=dict(e.metadata.annotations or {}),
                    observed_faults=[
                        o
                        for o in list(indices.get(INFD_FAULTS_IDX, {}).get((ns, n), ()))
                        if isinstance(o, ObservedFaults)
                    ],
                )
    return jobs, out


def observe_release(body: Mapping[str, Any], indices: Mapping[str, Any]) -> tuple[str, list[JobView]]:
    """A deleted TRTEngine: its name as a requester, and the build Jobs its status names (by build id)."""
    meta = body["metadata"]
    status = parsed_status(TRTEngineStatus, plain(body.get("status") or {}))
    ids = {k[:20] for t in status.targets for k in (t.engine_key, t.request_key) if k}
    ids |= {t.job_name.removeprefix(JOB_PREFIX)[:20] for t in status.targets if t.job_name}
    jobs_idx: Mapping[str, Any] = indices["jobs_idx"]
    candidates = [j for bid in ids for j in list(jobs_idx.get(bid, ())) if isinstance(j, JobView)]
    return f"{meta['namespace']}/{meta['name']}", candidates
