"""Rank groups of an LLM replica, pure (docs/llm.md §"Groups"): how many pods a replica is, their
stable identities and names, the gang rules (a group serves whole or not at all), affinity to one
GPU clique, and what a fault under any rank does to the whole group. No I/O.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trtforge.contract.gpu import GPUTarget
from trtforge.contract.llm import Parallelism
from trtforge_operator.api import FaultRecord
from trtforge_operator.apply.children import dns_name
from trtforge_operator.observe.views import NodeView, PodView
from trtforge_operator.planning import faults

LABEL_GROUP = "trtforge.io/group"  # the group's name: one per replica
LABEL_RANK = "trtforge.io/rank"  # "0" leads
LABEL_GROUP_WHOLE = "trtforge.io/group-whole"  # "true" on a leader only while every rank is ready
CLIQUE_LABEL = "nvidia.com/gpu.clique"  # GFD: nodes whose GPUs share one NVLink domain
RANK_PORT = 50052  # a worker's rank port (llama.cpp's ggml-rpc-server default)
PROBE_PORT = 8000  # every rank's supervisor (the container port named http)


class GroupShapeError(ValueError):
    """A mapping that can't be laid out on the target's nodes; the message names it."""


@dataclass(frozen=True)
class GroupShape:
    """One replica: `ranks` pods of `gpus_per_rank` GPUs each (ranks 1: one pod, no group)."""

    ranks: int
    gpus_per_rank: int

    @property
    def is_group(self) -> bool:
        return self.ranks > 1


def group_shape(tensor: int, pipeline: int, gpus_per_node: int) -> GroupShape:
    """tensor x pipeline GPUs: on one node when they fit (one pod with several GPUs), else a group
    of tensor x pipeline / GPUs-per-node pods with a whole node's GPUs each."""
    for name, v in (("tensor", tensor), ("pipeline", pipeline), ("GPUs per node", gpus_per_node)):
        if v < 1:
            raise GroupShapeError(f"parallelism {name} {v}: must be at least 1")
    world = tensor * pipeline
    if world <= gpus_per_node:
        return GroupShape(1, world)
    if world % gpus_per_node:
        raise GroupShapeError(
            f"parallelism tensor {tensor} x pipeline {pipeline} = {world} GPUs does not split into whole "
            f"nodes of {gpus_per_node} GPUs; expected a multiple of {gpus_per_node}"
        )
    return GroupShape(world // gpus_per_node, gpus_per_node)


@dataclass(frozen=True)
class RankIdentity:
    """A rank's stable identity: the same name and hostname every time its group is recreated."""

    deployment: str
    replica: int
    rank: int
    group: str  # the group's name (LABEL_GROUP)
    pod: str  # the pod's name, also its hostname under the group's headless Service
    subdomain: str  # the group's headless Service

    @property
    def leader(self) -> bool:
        return self.rank == 0

    @property
    def host(self) -> str:
        """The rank's DNS name inside the namespace (hostname.subdomain)."""
        return f"{self.pod}.{self.subdomain}"

    def labels(self) -> dict[str, str]:
        return {LABEL_GROUP: self.group, LABEL_RANK: str(self.rank)}


def group_name(deployment: str, replica: int) -> str:
    # Room for "-<rank>" after it in a pod name (63 characters).
    return dns_name(f"{deployment}-g{replica}", max_len=56)


def rank_identities(deployment: str, replica: int, shape: GroupShape) -> list[RankIdentity]:
    g = group_name(deployment, replica)
    return [RankIdentity(deployment, replica, r, g, f"{g}-{r}", g) for r in range(shape.ranks)]


def rank_arguments(
    me: RankIdentity,
    group: Sequence[RankIdentity],
    addresses: Mapping[int, str] | None = None,
    probe_port: int = PROBE_PORT,
) -> list[str]:
    """The `trtforge serve-llm` arguments of one rank: the leader names every worker (rank port and
    supervisor), a worker its rank (llama.cpp's RPC: the leader connects to the workers).
    `addresses`: a worker's address by rank (its pod IP) in place of its DNS name."""
    world = ["--world-size", str(len(group))]
    if me.leader:
        out = world
        for w in sorted(group, key=lambda i: i.rank)[1:]:
            host = (addresses or {}).get(w.rank) or w.host
            out += ["--worker", f"{host}:{RANK_PORT}:{probe_port}"]
        return out
    return ["--rank", str(me.rank), *world, "--rank-port", str(RANK_PORT)]


def gpus_per_node(target: GPUTarget, nodes: Sequence[NodeView]) -> int:
    """The most GPUs (of the target's resource) one Ready node that hosts `target` offers; 0 for a
    CPU target or where no node hosts it."""
    res = target.resource_name()
    if res is None:
        return 0
    return max((n.allocatable.get(res, 0) for n in nodes if n.ready and n.hosts(target)), default=0)


def tune_gpus(parallelism: Parallelism, target: GPUTarget, nodes: Sequence[NodeView]) -> int:
    """The GPUs a tune Job takes: the whole mapping where it fits one node, else one node's (one
    rank's share of a group); 0 (the mapping's) where no node says."""
    per_node = gpus_per_node(target, nodes)
    world = parallelism.world_size
    return min(world, per_node) if per_node > 0 else 0


def replica_shape(tensor: int, pipeline: int, per_node: int) -> GroupShape:
    """:func:`group_shape`, where no node (or a CPU target) says how many GPUs a node has: one pod."""
    if per_node < 1:
        return GroupShape(1, tensor * pipeline)
    return group_shape(tensor, pipeline, per_node)


class GroupState(enum.Enum):
    WHOLE = "whole"  # every rank has its pod, all ready: the group may serve
    FORMING = "forming"  # ranks still starting or waiting to meet; not serving
    BROKEN = "broken"  # a rank died, faulted or went away: the whole group is torn down


@dataclass(frozen=True)
class GroupAssessment:
    state: GroupState
    missing: tuple[int, ...] = ()  # ranks without a ready pod
    faulted: tuple[faults.DetectedFault, ...] = ()
    reason: str = ""

    @property
    def serves(self) -> bool:
        """Gang rule: the group's Service sends traffic only to a whole group."""
        return self.state is GroupState.WHOLE


def _restarted(p: PodView) -> bool:
    return any(c.restart_count > 0 for c in p.containers) or p.phase in ("Failed", "Succeeded")


def assess_group(
    group: str,
    shape: GroupShape,
    pods: Sequence[PodView],
    known_faults: Sequence[FaultRecord],
    now: float,
    form_limit_s: float = 900.0,
) -> GroupAssessment:
    """Whole, forming or broken, from the pods labelled as `group`'s. A group never serves with fewer
    ranks than its mapping: a rank pod that restarted, failed, is being deleted or reported a GPU
    fault breaks the group, and so does a group that has not become whole within `form_limit_s` of
    its oldest pod (no rank runs alone for long)."""
    by_rank: dict[int, PodView] = {}
    for p in pods:
        if p.labels.get(LABEL_GROUP) != group:
            continue  # only the group's pods; the caller passes pods it owns (labels prove nothing)
        try:
            by_rank[int(p.labels.get(LABEL_RANK, ""))] = p
        except ValueError:
            continue
    found = tuple(faults.detect_pod_faults(list(by_rank.values()), known_faults, now))
    if found:
        gpu = [f for f in found if f.node_suspect]
        first = (gpu or list(found))[0].record
        what = f"Xid {first.xid} on GPU {first.gpu}" if first.xid is not None else (first.reason or "fault")
        return GroupAssessment(
            GroupState.BROKEN, faulted=found, reason=f"{what} under pod {first.pod} on node {first.node}"
        )
    broken = sorted(r for r, p in by_rank.items() if p.deleting or _restarted(p))
    if broken:
        names = ", ".join(f"rank {r} ({by_rank[r].name})" for r in broken)
        return GroupAssessment(GroupState.BROKEN, tuple(broken), reason=f"rank died or went away: {names}")
    missing = tuple(r for r in range(shape.ranks) if r not in by_rank or not by_rank[r].ready)
    if not missing:
        return GroupAssessment(GroupState.WHOLE)
    created = [p.created for p in by_rank.values() if p.created is not None]
    if created and now - min(created) > form_limit_s:
        return GroupAssessment(
            GroupState.BROKEN,
            missing,
            reason=f"ranks {list(missing)} not ready {now - min(created):.0f} s after the group started "
            f"(limit {form_limit_s:.0f} s)",
        )
    return GroupAssessment(GroupState.FORMING, missing, reason=f"waiting for ranks {list(missing)}")


@dataclass(frozen=True)
class GroupRecovery:
    """What the operator does about a broken group: delete every pod of it (recreated whole by the
    next pass), keeping the faulted nodes and GPUs out."""

    delete_pods: tuple[str, ...]
    avoid_nodes: frozenset[str]
    avoid_gpus: frozenset[str]
    records: tuple[FaultRecord, ...]


def plan_recovery(
    assessment: GroupAssessment, pods: Sequence[PodView], already_avoided: Iterable[str] = ()
) -> GroupRecovery | None:
    """None unless the group is broken. No group re-shards onto its survivors: every rank goes."""
    if assessment.state is not GroupState.BROKEN:
        return None
    suspect = [f.record for f in assessment.faulted if f.node_suspect]
    return GroupRecovery(
        delete_pods=tuple(sorted(p.name for p in pods if not p.deleting)),
        avoid_nodes=frozenset(already_avoided) | {r.node for r in suspect if r.node},
        avoid_gpus=frozenset(r.gpu for r in suspect if r.gpu),
        records=tuple(f.record for f in assessment.faulted),
    )


def leader_whole_label(assessment: GroupAssessment) -> dict[str, str | None]:
    """The leader's label patch: the Service selects LABEL_GROUP_WHOLE=true, so a group that is not
    whole gets no traffic even before its leader's readiness drops (None removes the label)."""
    return {LABEL_GROUP_WHOLE: "true" if assessment.serves else None}


def clique_affinity(group: str, node_labels: Iterable[Mapping[str, str]]) -> dict[str, Any] | None:
    """Where the target's nodes carry `nvidia.com/gpu.clique`: every rank of the group on nodes of one
    clique (pod affinity on that topology key, to the group's own pods; the first rank places the
    group) and only on nodes that have one. None where no node has the label."""
    if not any(CLIQUE_LABEL in labels for labels in node_labels):
        return None
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": CLIQUE_LABEL, "operator": "Exists"}]}]
            }
        },
        "podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {LABEL_GROUP: group}}, "topologyKey": CLIQUE_LABEL}
            ]
        },
    }


def avoid_affinity(avoid_nodes: Iterable[str]) -> dict[str, Any] | None:
    """A node affinity term keeping a recreated group off the faulted nodes."""
    nodes = sorted(set(avoid_nodes))
    if not nodes:
        return None
    return {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": nodes}


def scale_selector(deployment_labels: Mapping[str, str]) -> str:
    """The scale subresource's ``status.selector`` for a grouped deployment: its leaders only, so the
    HPA and KEDA average the server's queue over groups (one leader each) and their replica count is
    a count of groups, as LeaderWorkerSet's ``hpaPodSelector`` does."""
    return ",".join(f"{k}={v}" for k, v in sorted({**deployment_labels, LABEL_RANK: "0"}.items()))


def groups_to_run(desired: int, current: int, rolling_out: bool) -> int:
    """Groups are added or removed whole, and not during a rollout (the count waits for it)."""
    if desired < 0:
        raise ValueError(f"replicas {desired}: must not be negative")
    return current if rolling_out else desired
