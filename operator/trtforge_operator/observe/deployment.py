"""Observe: everything one InferenceDeployment pass plans from, gathered once into typed views.

The only place a deployment pass reads: the InferenceDeployment (its status as last written), the
TRTEngine it references, its runtime Deployments, pods and autoscalers, the Nodes and the build Jobs
of its engine (all from kopf's indices, looked up by key, never listed), the autoscaling APIs the
apiserver serves (discovery) and, where KEDA is served, its ScaledObjects (Kube.scaled_objects says
why not from a watch). The planner gets this as data (observe/views.py) and does no I/O
(docs/design.md §"Observe, plan, apply").
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from trtforge_operator.api import GroupBackend, InferenceDeployment, InferenceDeploymentStatus, TRTEngine
from trtforge_operator.api.common import field_error
from trtforge_operator.apply import lws
from trtforge_operator.apply.children import dns_name
from trtforge_operator.kinds import Kind
from trtforge_operator.labels import APP_MANAGED_BY, LABEL_INFERENCEDEPLOYMENT, MANAGED_BY
from trtforge_operator.observe.views import (
    AutoscalerView,
    AutoscalingApis,
    DeploymentChildren,
    DeploymentObserved,
    DeploymentView,
    JobView,
    PodView,
    UnreadableDeployment,
)
from trtforge_operator.planning import fault_trust
from trtforge_operator.state import State, parsed_status, plain

log = logging.getLogger(__name__)


async def observe_deployment(
    state: State, body: Mapping[str, Any], indices: Mapping[str, Any]
) -> DeploymentObserved | UnreadableDeployment:
    """One InferenceDeployment pass's observation (see the module docstring)."""
    body = plain(body)
    meta = body["metadata"]
    ns, name, gen = meta["namespace"], meta["name"], int(meta.get("generation") or 1)
    old = state.statuses.current(Kind.INFERENCEDEPLOYMENT, body)
    try:
        obj = InferenceDeployment.model_validate({**body, "status": old})
    except ValidationError as e:
        error = field_error(e)
        log.warning("InferenceDeployment %s/%s: invalid spec: %s", ns, name, error)
        status = parsed_status(InferenceDeploymentStatus, old)
        return UnreadableDeployment(ns, name, gen, status, old, error, time.time())
    engine_name = obj.spec.engine_ref.name
    # The engine this pass reads: its events wake this InferenceDeployment from now on (workqueue.py).
    state.queue.set_engine_ref(ns, name, engine_name)
    engine: TRTEngine | None = None
    for found in list(indices["trte_idx"].get((ns, engine_name), [])):
        engine = found
    label = dns_name(name)
    deployments = _deployments(indices, ns, label)
    pods = [v for v in list(indices["rpods_idx"].get((ns, label), [])) if isinstance(v, PodView)]
    apis = await state.discovery.current([obj.spec.autoscaling, *(t.autoscaling for t in obj.spec.targets)])
    autoscalers = await _autoscalers(state, indices, ns, label, apis)
    nodes = state.nodes(indices)
    owners: dict[str, tuple[str, str]] = {}
    if fault_trust.needs_owners(pods, nodes):  # whose fault reports count (planning/fault_trust.py)
        owners = await state.kube.replica_set_owners(ns, f"{LABEL_INFERENCEDEPLOYMENT}={label}")
    lws_served, lws = await _leader_worker_sets(state, obj, ns, label)
    # The engine's own build and rebuild Jobs, by build id (rebuilds share the engine key's id).
    ids = {t.engine_key[:20] for t in (engine.status.targets if engine is not None else []) if t.engine_key}
    return DeploymentObserved(
        namespace=ns,
        name=name,
        uid=meta.get("uid", ""),
        generation=gen,
        spec=obj.spec,
        status=obj.status,
        engine=engine,
        deployments=deployments,
        pods=pods,
        nodes=nodes,
        jobs=[j for bid in ids for j in list(indices["jobs_idx"].get(bid, ())) if isinstance(j, JobView)],
        now=time.time(),
        engine_problem=None
        if engine is not None
        else f"TRTEngine {engine_name} not found in namespace {ns} (references stay in the namespace)",
        autoscalers=autoscalers,
        apis=apis,
        status_wire=old,
        replica_sets=owners,
        annotations=dict(meta.get("annotations") or {}),
        lws_served=lws_served,
        leader_worker_sets=lws,
    )


async def _leader_worker_sets(
    state: State, obj: InferenceDeployment, ns: str, label: str
) -> tuple[bool | None, dict[str, dict[str, Any]]]:
    """With group backend lws: whether LeaderWorkerSets are served (discovery) and ours, read from the
    apiserver (as KEDA's ScaledObjects: a CRD installed later needs no watch restart)."""
    if obj.spec.llm is None or obj.spec.llm.group_backend is not GroupBackend.LWS:
        return None, {}
    if lws.PLURAL not in await state.kube.served_resources(lws.API_VERSION):
        return False, {}
    selector = f"{APP_MANAGED_BY}={MANAGED_BY},{LABEL_INFERENCEDEPLOYMENT}={label}"
    found = await state.kube.leader_worker_sets(ns, selector)
    return True, {o["metadata"]["name"]: o for o in found}


async def observe_deployment_children(
    state: State, body: Mapping[str, Any], indices: Mapping[str, Any]
) -> DeploymentChildren:
    """A deleted InferenceDeployment's runtime Deployments and autoscalers."""
    meta = body["metadata"]
    ns, name = meta["namespace"], meta["name"]
    label = dns_name(name)
    autoscalers = await _autoscalers(state, indices, ns, label, await state.discovery.current([]))
    return DeploymentChildren(name, [d.name for d in _deployments(indices, ns, label)], autoscalers)


def _deployments(indices: Mapping[str, Any], ns: str, label: str) -> list[DeploymentView]:
    return [v for v in list(indices["deps_idx"].get((ns, label), [])) if isinstance(v, DeploymentView)]


async def _autoscalers(
    state: State, indices: Mapping[str, Any], ns: str, label: str, apis: AutoscalingApis
) -> list[AutoscalerView]:
    """The InferenceDeployment's autoscalers: its HPAs from the index, and, where KEDA is served, its
    ScaledObjects read from the apiserver (Kube.scaled_objects says why not from a watch)."""
    hpas = [v for v in list(indices["hpas_idx"].get((ns, label), [])) if isinstance(v, AutoscalerView)]
    if not apis.keda:
        return hpas
    selector = f"{APP_MANAGED_BY}={MANAGED_BY},{LABEL_INFERENCEDEPLOYMENT}={label}"
    scaled = await state.kube.scaled_objects(ns, selector)
    return [*hpas, *(AutoscalerView.from_k8s({"kind": "ScaledObject", **o}) for o in scaled)]
