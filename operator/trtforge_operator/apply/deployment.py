"""The one writer of an InferenceDeployment's children: carries out the typed actions of its plan
(planning/deployment.py) or of its deletion (planning/deployment_actions.cleanup_actions), in order,
through kube.py.

Runtime Deployments, their front-proxy ConfigMaps, the Service, HorizontalPodAutoscalers and KEDA
ScaledObjects are created, replaced and deleted here and nowhere else; so are the runtime pods moved
off a faulty GPU, and rank groups' pods, Services, NetworkPolicies and LeaderWorkerSets. Every
write is idempotent (kube.py), so a pass cut short at any action is repeated whole by the next one.
A write refused by the apiserver is logged and left to the next pass; a refused autoscaler write
with 404 (its API version gone) makes discovery look again (autoscaling_discovery.py). Its status
and Events go through apply/writes.py.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from kubernetes.client.rest import ApiException

from trtforge.logs import fields
from trtforge_operator.apply import lws
from trtforge_operator.apply.writes import post_event, write_status
from trtforge_operator.kinds import Kind
from trtforge_operator.kube import Kube
from trtforge_operator.labels import INFERENCEDEPLOYMENTS
from trtforge_operator.observe.views import DeploymentObserved, UnreadableDeployment
from trtforge_operator.planning.deployment import DeploymentPlan
from trtforge_operator.planning.deployment_actions import (
    Action,
    ApplyAutoscaler,
    ApplyConfigMap,
    ApplyDeployment,
    ApplyLeaderWorkerSet,
    ApplyNetworkPolicy,
    ApplyRankExecAccess,
    ApplyService,
    ChildKind,
    CreatePod,
    DeleteChild,
    Emit,
    LabelPod,
    PatchEngineAnnotations,
    WriteStatus,
)
from trtforge_operator.state import State

log = logging.getLogger(__name__)

AUTOSCALER_KINDS = (ChildKind.HPA, ChildKind.SCALED_OBJECT)


async def apply_deployment(
    state: State,
    body: Mapping[str, Any],
    obs: DeploymentObserved | UnreadableDeployment,
    plan: DeploymentPlan,
) -> float | None:
    """Carry out one pass's plan, and count what it shows: its status, new faults, recoveries.
    Returns the seconds until the plan wants its next pass (a group's held teardown), else None."""
    if isinstance(obs, DeploymentObserved):
        state.metrics.observe_deployment(obs.namespace, obs.name, plan.status)
    await apply_deployment_actions(state, body, plan.actions)
    if isinstance(obs, DeploymentObserved):
        _count_faults(state, obs, plan)
    return plan.recheck_in


async def apply_deployment_actions(state: State, body: Mapping[str, Any], actions: Iterable[Action]) -> None:
    """Carry out ``actions`` for the InferenceDeployment ``body``, in order."""
    kube, ns = state.kube, body["metadata"]["namespace"]
    for action in actions:
        match action:
            case WriteStatus():
                await write_status(
                    state,
                    Kind.INFERENCEDEPLOYMENT,
                    INFERENCEDEPLOYMENTS,
                    body,
                    action.old,
                    dict(action.status),
                )
            case ApplyDeployment():
                await _apply(kube, ns, action.manifest, keep_replicas=action.keep_replicas)
            case ApplyService():
                await _apply(kube, ns, action.manifest)
            case ApplyConfigMap():
                try:
                    await kube.apply_config_map(action.manifest)
                except ApiException as e:
                    _refused(ns, action.manifest, e)
            case ApplyAutoscaler():
                try:
                    await kube.apply_autoscaler(action.manifest)
                except ApiException as e:
                    if e.status == 404:
                        state.discovery.write_refused()
                    _refused(ns, action.manifest, e)
            case DeleteChild(kind=kind, name=name) if kind in AUTOSCALER_KINDS:
                await kube.delete_autoscaler(ns, name, kind.value)
            # One literal kind per delete, so tests/unit/test_writers.py can name what each call writes.
            case DeleteChild(kind=ChildKind.DEPLOYMENT, name=name):
                await kube.delete("Deployment", ns, name)
            case DeleteChild(kind=ChildKind.SERVICE, name=name):
                await kube.delete("Service", ns, name)
            case DeleteChild(kind=ChildKind.CONFIG_MAP, name=name):
                await kube.delete("ConfigMap", ns, name)
            case DeleteChild(kind=ChildKind.POD, name=name):
                await kube.delete("Pod", ns, name)
            case DeleteChild(kind=ChildKind.NETWORK_POLICY, name=name):
                await kube.delete("NetworkPolicy", ns, name)
            case DeleteChild(kind=ChildKind.RANK_EXEC_ACCESS, name=name):  # the grant before the account
                await kube.delete("RoleBinding", ns, name)
                await kube.delete("Role", ns, name)
                await kube.delete("ServiceAccount", ns, name)
            case CreatePod():  # a rank pod: create-if-absent under its derived name
                try:
                    await kube.create_pod(action.manifest)
                except ApiException as e:
                    _refused(ns, action.manifest, e)
            case LabelPod():
                await kube.label_pod(ns, action.name, action.labels)
            case ApplyNetworkPolicy():
                try:
                    await kube.apply_network_policy(action.manifest)
                except ApiException as e:
                    _refused(ns, action.manifest, e)
            case ApplyRankExecAccess():
                try:
                    await kube.apply_rank_exec_access(action.manifest)
                except ApiException as e:
                    _refused(ns, action.manifest, e)
            case ApplyLeaderWorkerSet():
                try:
                    await kube.apply_leader_worker_set(action.manifest, lws.needs_update)
                except ApiException as e:
                    _refused(ns, action.manifest, e)
            case PatchEngineAnnotations():
                await kube.annotate("TRTEngine", ns, action.engine, action.annotations)
            case Emit(event=ev):
                await post_event(kube, body, ev)


def _count_faults(state: State, obs: DeploymentObserved, plan: DeploymentPlan) -> None:
    """The faults this pass recorded first, by action, and the recoveries it recorded first."""
    known = {(f.pod, f.time) for f in obs.status.faults}
    recovered = {(f.pod, f.time) for f in obs.status.faults if f.recovered_seconds is not None}
    for f in plan.status.faults:
        if (f.pod, f.time) not in known:
            state.metrics.faults.labels(f.action).inc()
        if f.recovered_seconds is not None and (f.pod, f.time) not in recovered:
            state.metrics.recovery_seconds.observe(f.recovered_seconds)


async def _apply(kube: Kube, ns: str, manifest: Mapping[str, Any], *, keep_replicas: bool = False) -> None:
    try:
        await kube.apply_owned(manifest, keep_replicas=keep_replicas)
    except ApiException as e:
        _refused(ns, manifest, e)


def _refused(ns: str, manifest: Mapping[str, Any], e: ApiException) -> None:
    kind, name = manifest["kind"], manifest["metadata"]["name"]
    log.warning(
        "could not apply %s %s/%s: %s %s",
        kind,
        ns,
        name,
        e.status,
        e.reason,
        extra=fields(kind=kind, namespace=ns, name=name, status=e.status),
    )
