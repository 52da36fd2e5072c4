"""The `lws` group backend, pure: one LeaderWorkerSet (``leaderworkerset.x-k8s.io/v1``) per LLM
deployment role, its readiness from its ``Available`` condition, and a semantic-equality check that
decides whether the live object needs an update (docs/llm.md §"Groups").

The shape follows KServe's LLMInferenceService multi-node workload (one expected LeaderWorkerSet per
role: size = ranks, ``RecreateGroupOnPodRestart``, ``LeaderCreated`` start-up, rolling updates; one
generic reconcile compares the expected object with the live one the way apimachinery's
``equality.Semantic.DeepDerivative`` does: fields the expected object leaves unset are the server's).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

GROUP = "leaderworkerset.x-k8s.io"
VERSION = "v1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "LeaderWorkerSet"
PLURAL = "leaderworkersets"
CRD_NAME = f"{PLURAL}.{GROUP}"

RESTART_RECREATE_GROUP = "RecreateGroupOnPodRestart"  # any rank's restart recreates the whole group
STARTUP_LEADER_CREATED = "LeaderCreated"  # workers are created once the leader pod exists
ROLLING_UPDATE = "RollingUpdate"
AVAILABLE = "Available"
CRD_MISSING = "LeaderWorkerSetCRDMissing"  # the condition reason when `lws` is asked for without it


@dataclass(frozen=True)
class GroupWorkload:
    """What the operator knows about one role's groups."""

    name: str
    namespace: str
    groups: int  # replicas: each one a group
    ranks: int  # pods per group (size)
    leader: Mapping[str, Any]  # pod spec of rank 0
    worker: Mapping[str, Any]  # pod spec of the other ranks
    labels: Mapping[str, str] = field(default_factory=dict)
    owner: Mapping[str, Any] | None = None  # the InferenceDeployment's controller reference
    max_unavailable: int = 1  # groups down at once during a rollout
    max_surge: int = 0  # extra groups during a rollout (GPUs are scarce: none by default)


def render(w: GroupWorkload) -> dict[str, Any]:
    """The expected LeaderWorkerSet; ValueError naming the field when the numbers are wrong."""
    if w.ranks < 2:
        raise ValueError(f"ranks {w.ranks}: a LeaderWorkerSet group has at least 2 (one pod is no group)")
    if w.groups < 0:
        raise ValueError(f"groups {w.groups}: must not be negative")
    if w.max_unavailable < 0 or w.max_surge < 0 or w.max_unavailable + w.max_surge == 0:
        raise ValueError(
            f"maxUnavailable {w.max_unavailable}, maxSurge {w.max_surge}: both at least 0, not both 0"
        )
    labels = dict(w.labels)
    meta: dict[str, Any] = {"name": w.name, "namespace": w.namespace, "labels": labels}
    if w.owner is not None:
        meta["ownerReferences"] = [dict(w.owner)]

    def template(role: str, spec: Mapping[str, Any]) -> dict[str, Any]:
        return {
            "metadata": {"labels": {**labels, "trtforge.io/group-role": role}},
            "spec": copy.deepcopy(dict(spec)),
        }

    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": meta,
        "spec": {
            "replicas": w.groups,
            "startupPolicy": STARTUP_LEADER_CREATED,
            "rolloutStrategy": {
                "type": ROLLING_UPDATE,
                "rollingUpdateConfiguration": {"maxUnavailable": w.max_unavailable, "maxSurge": w.max_surge},
            },
            "leaderWorkerTemplate": {
                "size": w.ranks,
                "restartPolicy": RESTART_RECREATE_GROUP,
                "leaderTemplate": template("leader", w.leader),
                "workerTemplate": template("worker", w.worker),
            },
        },
    }


@dataclass(frozen=True)
class Readiness:
    ready: bool
    reason: str
    message: str


def readiness(live: Mapping[str, Any] | None) -> Readiness:
    """The groups' readiness from the LeaderWorkerSet's ``Available`` condition (LWS sets it True
    once its groups are ready); Progressing while it has none yet, or is of an older generation."""
    if live is None:
        return Readiness(False, "Progressing", "the LeaderWorkerSet does not exist yet")
    status = live.get("status") or {}
    generation = (live.get("metadata") or {}).get("generation")
    observed = status.get("observedGeneration")
    for c in status.get("conditions") or ():
        if c.get("type") == AVAILABLE:
            if generation is not None and observed is not None and observed < generation:
                return Readiness(
                    False, "Progressing", f"generation {generation} not yet observed ({observed})"
                )
            return Readiness(
                c.get("status") == "True", str(c.get("reason") or ""), str(c.get("message") or "")
            )
    return Readiness(False, "Progressing", "the LeaderWorkerSet has no Available condition yet")


def _unset(v: Any) -> bool:
    return v is None or v == {} or v == [] or v == ""


def derivative(expected: Any, live: Any) -> bool:
    """Whether `live` matches `expected` where `expected` says anything (apimachinery's DeepDerivative):
    an unset field in `expected` is the server's (defaults), a set one must be equal."""
    if _unset(expected):
        return True
    if isinstance(expected, Mapping):
        return isinstance(live, Mapping) and all(derivative(v, live.get(k)) for k, v in expected.items())
    if isinstance(expected, list):
        return (
            isinstance(live, list)
            and len(expected) == len(live)
            and all(derivative(e, lv) for e, lv in zip(expected, live, strict=True))
        )
    return bool(expected == live)


def needs_update(expected: Mapping[str, Any], live: Mapping[str, Any]) -> bool:
    """Update when the spec, labels or annotations we set differ from the live object's."""
    em, lm = expected.get("metadata") or {}, live.get("metadata") or {}
    return not (
        derivative(expected.get("spec"), live.get("spec"))
        and derivative(em.get("labels"), lm.get("labels"))
        and derivative(em.get("annotations"), lm.get("annotations"))
    )


def update_body(expected: Mapping[str, Any], live: Mapping[str, Any]) -> dict[str, Any]:
    """The replacement: the expected object on the live one's resourceVersion (a conflict, not a lost
    write, when someone else changed it meanwhile)."""
    body = copy.deepcopy(dict(expected))
    body["metadata"] = {
        **body["metadata"],
        "resourceVersion": (live.get("metadata") or {}).get("resourceVersion"),
    }
    return body


def crd_refusal(crd_served: bool) -> Readiness | None:
    """`lws` asked for where the LeaderWorkerSet CRD is not served: the condition says so."""
    if crd_served:
        return None
    return Readiness(
        False,
        CRD_MISSING,
        f"groupBackend lws needs the LeaderWorkerSet CRD ({CRD_NAME}, {API_VERSION}); it is not installed: "
        "install LeaderWorkerSet (kubernetes-sigs/lws) or use groupBackend native",
    )
