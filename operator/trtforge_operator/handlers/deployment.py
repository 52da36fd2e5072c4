"""The InferenceDeployment's handlers: one level-based pass, and cleanup on deletion."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from trtforge_operator import children
from trtforge_operator.api import (
    InferenceDeployment,
    InferenceDeploymentStatus,
    TRTEngine,
)
from trtforge_operator.api.common import field_error
from trtforge_operator.deployment_applier import apply_deployment_actions
from trtforge_operator.kinds import Kind
from trtforge_operator.labels import (
    APP_MANAGED_BY,
    INFERENCEDEPLOYMENTS,
    LABEL_INFERENCEDEPLOYMENT,
    MANAGED_BY,
)
from trtforge_operator.observed import AutoscalerView, DeploymentView, JobView, PodView
from trtforge_operator.planning import fault_trust
from trtforge_operator.planning.autoscaling import AutoscalingApis
from trtforge_operator.planning.deployment import (
    DeploymentObserved,
    invalid_deployment_status,
    plan_deployment,
)
from trtforge_operator.planning.deployment_actions import cleanup_actions
from trtforge_operator.state import State, forget, parsed_status, plain
from trtforge_operator.writes import post_events, write_status

log = logging.getLogger(__name__)
_plain = plain
_parsed_status = parsed_status
_write_status = write_status
_post_events = post_events


def _current_status(state: State, kind: Kind, body: Mapping[str, Any]) -> dict[str, Any]:
    return state.statuses.current(kind, body)


_forget = forget


async def reconcile_deployment(state: State, body: Mapping[str, Any], indices: Mapping[str, Any]) -> None:
    body = _plain(body)
    meta = body["metadata"]
    ns, name, gen, uid = (
        meta["namespace"],
        meta["name"],
        int(meta.get("generation") or 1),
        meta.get("uid", ""),
    )
    old = _current_status(state, Kind.INFERENCEDEPLOYMENT, body)
    old_status = _parsed_status(InferenceDeploymentStatus, old)
    try:
        obj = InferenceDeployment.model_validate({**body, "status": old})
    except ValidationError as e:
        message = f"invalid spec: {field_error(e)}"
        log.warning("InferenceDeployment %s/%s: %s", ns, name, message)
        status = invalid_deployment_status(old_status, gen, message, time.time())
        await _write_status(
            state, Kind.INFERENCEDEPLOYMENT, INFERENCEDEPLOYMENTS, body, old, status.to_wire()
        )
        return
    engine_name = obj.spec.engine_ref.name
    state.queue.set_engine_ref(ns, name, engine_name)
    engine: TRTEngine | None = None
    problem = None
    for found in list(indices["trte_idx"].get((ns, engine_name), [])):
        engine = found
    if engine is None:
        problem = f"TRTEngine {engine_name} not found in namespace {ns} (references stay in the namespace)"
    label = children.dns_name(name)
    deployments = [v for v in list(indices["deps_idx"].get((ns, label), [])) if isinstance(v, DeploymentView)]
    pods = [v for v in list(indices["rpods_idx"].get((ns, label), [])) if isinstance(v, PodView)]
    autos = [obj.spec.autoscaling, *(t.autoscaling for t in obj.spec.targets)]
    apis = await state.discovery.current(autos)
    autoscalers = await _autoscalers(state, indices, ns, label, apis)
    nodes = state.nodes(indices)
    owners: dict[str, tuple[str, str]] = {}
    if fault_trust.needs_owners(pods, nodes):  # whose fault reports count (planning/fault_trust.py)
        owners = await state.kube.replica_set_owners(ns, f"{LABEL_INFERENCEDEPLOYMENT}={label}")
    # The engine's own build and rebuild Jobs, by build id (rebuilds share the engine key's id).
    ids = {t.engine_key[:20] for t in (engine.status.targets if engine is not None else []) if t.engine_key}
    jobs = [j for bid in ids for j in list(indices["jobs_idx"].get(bid, ())) if isinstance(j, JobView)]
    obs = DeploymentObserved(
        namespace=ns,
        name=name,
        uid=uid,
        generation=gen,
        spec=obj.spec,
        status=obj.status,
        engine=engine,
        deployments=deployments,
        pods=pods,
        nodes=nodes,
        jobs=jobs,
        now=time.time(),
        engine_problem=problem,
        autoscalers=autoscalers,
        apis=apis,
        replica_sets=owners,
        annotations=dict(meta.get("annotations") or {}),
    )
    plan = plan_deployment(obs, state.cfg)
    state.metrics.observe_deployment(ns, name, plan.status)
    old_norm = old_status.to_wire() if old else {}

    async def write_new_status(new: Mapping[str, Any]) -> None:
        await _write_status(state, Kind.INFERENCEDEPLOYMENT, INFERENCEDEPLOYMENTS, body, old_norm, dict(new))

    await apply_deployment_actions(state.kube, state.discovery, body, plan.actions, write_new_status)
    known = {(f.pod, f.time) for f in old_status.faults}
    for f in plan.status.faults:
        if (f.pod, f.time) not in known:
            state.metrics.faults.labels(f.action).inc()
    old_faults = {(f.pod, f.time) for f in old_status.faults if f.recovered_seconds is not None}
    for f in plan.status.faults:
        if f.recovered_seconds is not None and (f.pod, f.time) not in old_faults:
            state.metrics.recovery_seconds.observe(f.recovered_seconds)


async def cleanup_deployment(state: State, body: Mapping[str, Any], indices: Mapping[str, Any]) -> None:
    """On deletion: delete the HPAs, the runtime Deployments and the Service (ownerRefs would too,
    eventually)."""
    meta = body["metadata"]
    ns, name = meta["namespace"], meta["name"]
    label = children.dns_name(name)
    autoscalers = await _autoscalers(state, indices, ns, label, await state.discovery.current([]))
    deployments = [
        d.name for d in list(indices["deps_idx"].get((ns, label), [])) if isinstance(d, DeploymentView)
    ]
    actions = cleanup_actions(deployments, autoscalers, children.service_name(name))
    await apply_deployment_actions(state.kube, state.discovery, body, actions)
    _forget(state, Kind.INFERENCEDEPLOYMENT, ns, name)


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
