"""Which runtime pods' fault reports the operator believes. Pure. docs/security.md, docs/design.md
§"What a tenant can forge".

A tenant with ``edit`` in its namespace can create a pod with any labels, on any node its nodeSelector
names, that exits with a ``GPUFault`` termination message. Labels prove nothing; ownership does: a
report counts only from a pod whose controller is a ReplicaSet whose controller is one of the
operator's runtime Deployments (its name, controlled by this InferenceDeployment's uid), matched by
uid at every step, and that runs the ReplicaSet's own template (a ReplicaSet adopts any orphan pod
its selector matches, a tenant's included: pod_spec.fingerprint). A GPU fault must also name a GPU
the pod was given: one of the uuids its runtime lists as its own devices (``TerminationMessage.gpus``,
the device plugin's ``NVIDIA_VISIBLE_DEVICES`` as the probe resolves it). The apiserver does not show
a pod's devices; the kubelet's pod-resources API on the node does, so a node agent could check this
claim independently (not shipped).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from trtforge.contract.termination import EXIT_GPU_FAULT
from trtforge_operator.observe.views import DeploymentView, NodeView, PodView
from trtforge_operator.planning.faults import GPU_FAULT, LOAD_FAILURES


class Distrust(StrEnum):
    """Why a pod's fault report is ignored."""

    NOT_OPERATOR_POD = "NotOperatorPod"  # no owner chain to the operator's Deployment
    NOT_ITS_GPU = "GPUNotAssigned"  # names a GPU the pod was not given


@dataclass(frozen=True)
class Ignored:
    pod: str
    why: Distrust
    message: str


def operator_deployment_uids(
    deployments: Sequence[DeploymentView], infd_uid: str, names: Collection[str]
) -> frozenset[str]:
    """The uids of the runtime Deployments the operator made for this InferenceDeployment: one of its
    names, controlled by the InferenceDeployment (uid)."""
    return frozenset(
        d.uid
        for d in deployments
        if d.uid and d.name in names and d.controller == ("InferenceDeployment", infd_uid)
    )


def from_operator(
    pod: PodView, deployment_uids: frozenset[str], rs_owner: Mapping[str, tuple[str, str]]
) -> bool:
    """`pod`'s controller is a ReplicaSet (uid) whose controller is one of `deployment_uids`, and the
    pod runs that ReplicaSet's template (a ReplicaSet adopts any orphan its selector matches).
    `rs_owner`: ReplicaSet uid -> (its controlling Deployment's uid, its template's fingerprint)."""
    kind, uid = pod.controller
    dep, template = rs_owner.get(uid, ("", "")) if kind == "ReplicaSet" and uid else ("", "")
    return bool(dep) and dep in deployment_uids and template == pod.spec_fingerprint


def reports_fault(pod: PodView) -> bool:
    """Whether `pod` ended in a way the fault loop acts on (a GPU fault or a load failure)."""
    return any(
        t.exit_code == EXIT_GPU_FAULT or t.trtforge_reason() in (GPU_FAULT, *LOAD_FAILURES)
        for t in pod.terminations()
    )


def distrust(
    pod: PodView, deployment_uids: frozenset[str], rs_owner: Mapping[str, tuple[str, str]]
) -> Ignored | None:
    """Why the operator ignores what `pod` reports (None: it believes it)."""
    if not from_operator(pod, deployment_uids, rs_owner):
        kind, uid = pod.controller
        owner = f"{kind} {uid}" if kind else "no controller"
        return Ignored(
            pod.name,
            Distrust.NOT_OPERATOR_POD,
            f"pod {pod.name} carries the runtime labels but is no pod of the operator's runtime "
            f"Deployments ({owner}), or does not run its ReplicaSet's template; its fault report is ignored",
        )
    return foreign_gpu(pod)


def foreign_gpu(pod: PodView) -> Ignored | None:
    """A GPU fault `pod` reports on a GPU it was not given (its runtime's own list), or None."""
    for t in pod.terminations():
        msg = t.termination()
        if msg is None or msg.gpu is None:
            continue
        if msg.gpu not in (msg.gpus or ()):
            return Ignored(
                pod.name,
                Distrust.NOT_ITS_GPU,
                f"pod {pod.name} reports a fault on GPU {msg.gpu}, which is not one it was given "
                f"({', '.join(msg.gpus or ()) or 'none listed'}); its fault report is ignored",
            )
    return None


def needs_owners(pods: Sequence[PodView], nodes: Sequence[NodeView]) -> bool:
    """Whether a pass must read the ReplicaSets to judge its pods: one reports a fault, or sits on a
    node whose GPUs look unhealthy (the node's fault is attributed through it)."""
    by_node = {n.name: n for n in nodes}
    return any(
        reports_fault(p) or (p.node in by_node and by_node[p.node].gpu_problem() is not None) for p in pods
    )


def split_pods(
    pods: Sequence[PodView], deployment_uids: frozenset[str], rs_owner: Mapping[str, tuple[str, str]]
) -> tuple[list[PodView], list[Ignored]]:
    """(the pods whose reports count, the fault reports ignored and why). A pod that reports nothing
    counts only when it is the operator's (node problems are attributed through it)."""
    believed: list[PodView] = []
    ignored: list[Ignored] = []
    for p in pods:
        why = distrust(p, deployment_uids, rs_owner)
        if why is None:
            believed.append(p)
        elif reports_fault(p):
            ignored.append(why)
        elif why.why is Distrust.NOT_ITS_GPU:
            believed.append(p)
    return believed, ignored
