"""What an InferenceDeployment pass (or its deletion) does, as typed actions. No I/O, no callables.

The planner (planning/deployment.py) and the deletion planner (:func:`cleanup_actions`) return these;
one applier (apply/deployment.py) carries them out, in order, through kube.py. That applier is the
one writer of an InferenceDeployment's children: its runtime Deployments, its Service, its
HorizontalPodAutoscalers and KEDA ScaledObjects, and the runtime pods it moves off a faulty GPU.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from trtforge_operator.observe.views import AutoscalerView
from trtforge_operator.planning.autoscaling import AutoscalerKind
from trtforge_operator.planning.events import Event


class ChildKind(enum.StrEnum):
    """The kinds of object an InferenceDeployment's applier writes."""

    DEPLOYMENT = "Deployment"
    SERVICE = "Service"
    CONFIG_MAP = "ConfigMap"
    LEADER_WORKER_SET = "LeaderWorkerSet"
    HPA = AutoscalerKind.HPA.value
    SCALED_OBJECT = AutoscalerKind.SCALED_OBJECT.value
    POD = "Pod"  # a runtime pod moved off a faulty GPU; a rank pod of a group torn down or scaled away
    NETWORK_POLICY = "NetworkPolicy"  # a group's rank port (apply/group_network.py)
    # a trtllm-serve group leader's account, Role and RoleBinding (apply/group_rbac.py), one name
    RANK_EXEC_ACCESS = "RankExecAccess"


@dataclass(frozen=True)
class WriteStatus:
    """Write the InferenceDeployment's status (only what changed; nothing when equal). First in a
    plan: faults and their actions are recorded before they are acted on, so a crash in between
    repeats the actions rather than losing them."""

    status: Mapping[str, Any]  # the whole new status, in its wire form
    old: Mapping[str, Any] = field(default_factory=dict)  # the status as read: the patch's base


@dataclass(frozen=True)
class ApplyDeployment:
    """Create a runtime Deployment, or replace it when its spec hash differs. ``keep_replicas``: an
    autoscaler owns its replicas, so a replace writes the count the Deployment has."""

    manifest: Mapping[str, Any]
    keep_replicas: bool = False

    @property
    def name(self) -> str:
        return str(self.manifest["metadata"]["name"])


@dataclass(frozen=True)
class ApplyConfigMap:
    """Create a runtime's front-proxy ConfigMap, or replace it when its data differs."""

    manifest: Mapping[str, Any]


@dataclass(frozen=True)
class ApplyService:
    """Create the InferenceDeployment's Service, or replace it when its spec hash differs."""

    manifest: Mapping[str, Any]


@dataclass(frozen=True)
class ApplyAutoscaler:
    """Create an HPA (in the apiVersion it names) or a KEDA ScaledObject, or replace it on hash."""

    manifest: Mapping[str, Any]

    @property
    def kind(self) -> AutoscalerKind:
        return AutoscalerKind(self.manifest["kind"])


@dataclass(frozen=True)
class CreatePod:
    """Create a rank pod of a group when absent (its derived name makes a second create a no-op)."""

    manifest: Mapping[str, Any]


@dataclass(frozen=True)
class LabelPod:
    """Set (or, with None, remove) labels of a rank pod: the leader's group-whole label."""

    name: str
    labels: Mapping[str, str | None]


@dataclass(frozen=True)
class ApplyNetworkPolicy:
    """Create a group's rank-port NetworkPolicy, or replace it when its spec hash differs."""

    manifest: Mapping[str, Any]


@dataclass(frozen=True)
class ApplyRankExecAccess:
    """Create a trtllm-serve group leader's ServiceAccount, Role or RoleBinding, or replace it when
    its spec hash differs."""

    manifest: Mapping[str, Any]


@dataclass(frozen=True)
class ApplyLeaderWorkerSet:
    """Create the LeaderWorkerSet of a target (backend lws), or update it when a field the operator
    sets differs from the live object (apply/lws.py's semantic equality)."""

    manifest: Mapping[str, Any]


@dataclass(frozen=True)
class DeleteChild:
    """Delete one child (gone already is fine)."""

    kind: ChildKind
    name: str


@dataclass(frozen=True)
class PatchEngineAnnotations:
    """Drop what an earlier version recorded on the served TRTEngine as annotations (the TRTEngine
    now reads rebuild requests from the InferenceDeployment's status)."""

    engine: str
    annotations: Mapping[str, str | None]


@dataclass(frozen=True)
class Emit:
    """Post an Event on the InferenceDeployment."""

    event: Event


Action = (
    WriteStatus
    | ApplyRankExecAccess
    | ApplyDeployment
    | ApplyService
    | ApplyConfigMap
    | ApplyAutoscaler
    | DeleteChild
    | CreatePod
    | LabelPod
    | ApplyNetworkPolicy
    | ApplyLeaderWorkerSet
    | PatchEngineAnnotations
    | Emit
)


def owned_autoscalers(views: Iterable[AutoscalerView]) -> list[AutoscalerView]:
    """The autoscalers with our labels that an InferenceDeployment owns: not the HPA KEDA makes for a
    ScaledObject (it carries the ScaledObject's labels, is owned by it, and is KEDA's to write)."""
    kinds = {k.value for k in AutoscalerKind}
    return [v for v in views if v.owner_kind == "InferenceDeployment" and v.kind in kinds]


def cleanup_actions(
    deployments: Iterable[str], autoscalers: Iterable[AutoscalerView], service: str
) -> list[DeleteChild]:
    """On an InferenceDeployment's deletion: its own autoscalers first (nothing scales a Deployment
    being deleted), then its Deployments and its Service."""
    refs = sorted({(v.kind, v.name) for v in owned_autoscalers(autoscalers)})
    out = [DeleteChild(ChildKind(kind), name) for kind, name in refs]
    out += [DeleteChild(ChildKind.DEPLOYMENT, d) for d in sorted(set(deployments))]
    out.append(DeleteChild(ChildKind.SERVICE, service))
    return out
