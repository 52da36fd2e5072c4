"""The native group backend's pass over one grouped target, pure (docs/llm.md §"Groups"): which rank
pods to create, label and delete, and each group's Services, from the pods observed.

Level-based and idempotent: a group's names are derived (planning/groups.py), pods are created only
when absent, a group is recreated only once every pod of its previous life is gone, and the leader
is created once every worker has an address. Killing the operator between any two writes leaves a
state the next pass reads and finishes: no duplicate group (the names are taken), none lost (a
missing pod is created again). No I/O.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trtforge.contract.llm import Parallelism
from trtforge_operator import pod_spec
from trtforge_operator.api import FaultRecord
from trtforge_operator.apply import children, group_network, group_pods, group_rbac, group_services
from trtforge_operator.labels import ANNOTATION_SPEC_HASH
from trtforge_operator.observe.views import PodView
from trtforge_operator.planning import groups
from trtforge_operator.planning.groups import (
    LABEL_GROUP,
    LABEL_GROUP_WHOLE,
    GroupAssessment,
    GroupShape,
    GroupState,
)


class GroupPhase(enum.StrEnum):
    """A group as the Groups condition counts it."""

    WHOLE = "Whole"
    FORMING = "Forming"
    TEARING_DOWN = "TearingDown"  # its pods are being deleted; recreated once all are gone


@dataclass(frozen=True)
class GroupTarget:
    """One grouped target of an InferenceDeployment, as its pass sees it."""

    namespace: str
    infd: str
    infd_uid: str
    shape: GroupShape
    groups: int  # groups wanted (replicas count groups)
    # The target's runtime Deployment as it would be: the pods' template. Empty while it can't be
    # rendered (its engine being rebuilt): the groups are held (nothing made), broken ones torn down.
    deployment: Mapping[str, Any]
    gpu_resource: str | None
    probe_port: int
    openai_port: int
    pods: Sequence[PodView]  # the deployment's pods labelled as this target's
    known_faults: Sequence[FaultRecord] = ()
    avoid_nodes: frozenset[str] = frozenset()
    node_labels: Sequence[Mapping[str, str]] = ()  # of the nodes that host the target (clique)
    now: float = 0.0
    form_limit_s: float = 900.0
    # A group whose rank ended (no GPU fault) is torn down this long after the end: a rank that ends
    # at once (a bad argument, a missing file) recreates its group at this pace, not in a hot loop.
    teardown_delay_s: float = 10.0
    # A trtllm-serve group's mapping (the mpirun path): its ranks' flags, and its leader's account
    # and Role (pods/exec on its workers). None: llama.cpp's RPC path.
    trtllm: Parallelism | None = None


@dataclass
class GroupsPlan:
    """What one pass does to one target's groups, and what it saw."""

    create_pods: list[dict[str, Any]] = field(default_factory=list)
    delete_pods: list[str] = field(default_factory=list)
    label_pods: list[tuple[str, dict[str, str | None]]] = field(default_factory=list)
    services: list[dict[str, Any]] = field(default_factory=list)  # headless, one per group
    policies: list[dict[str, Any]] = field(default_factory=list)  # the rank port's, one per group
    delete_services: list[str] = field(default_factory=list)
    delete_policies: list[str] = field(default_factory=list)
    # a trtllm-serve leader's ServiceAccount, Role and RoleBinding, per group (apply/group_rbac.py)
    access: list[dict[str, Any]] = field(default_factory=list)
    delete_access: list[str] = field(default_factory=list)  # their one name, per group scaled away
    phases: dict[str, GroupPhase] = field(default_factory=dict)  # wanted group -> phase
    torn_down: list[tuple[str, str]] = field(default_factory=list)  # (group, why), this pass
    waiting: list[tuple[str, str]] = field(default_factory=list)  # (group, what it waits for)
    squatted: list[str] = field(default_factory=list)  # our names held by pods we do not own
    current: int = 0  # wanted groups with any pod
    updated: int = 0  # wanted groups whose every rank runs the current template
    rolled_out: bool = False  # every wanted group whole on the current template, none on an avoided node
    recheck_in: float | None = None  # seconds until a held teardown is due

    @property
    def whole(self) -> int:
        return sum(1 for p in self.phases.values() if p is GroupPhase.WHOLE)


def owned(pod: PodView, infd_uid: str) -> bool:
    """The operator's own rank pod: controlled by the InferenceDeployment (uid). Acting on a group
    needs this; believing a fault report needs more (:func:`believed`)."""
    return pod.controller == ("InferenceDeployment", infd_uid)


def believed(pod: PodView, desired: Mapping[str, Any], infd_uid: str) -> bool:
    """A rank pod whose fault report counts: owned, under its derived name, running exactly what the
    operator renders for that rank (labels and owner references prove nothing on their own)."""
    return (
        owned(pod, infd_uid)
        and pod.name == desired["metadata"]["name"]
        and pod.spec_fingerprint == pod_spec.fingerprint(desired["spec"])
    )


def _hashed(manifest: dict[str, Any]) -> dict[str, Any]:
    """A Service or NetworkPolicy with the spec-hash annotation its applier compares."""
    meta = manifest["metadata"]
    meta["annotations"] = {
        **(meta.get("annotations") or {}),
        ANNOTATION_SPEC_HASH: children.spec_hash(manifest["spec"]),
    }
    return manifest


def desired_pods(t: GroupTarget, replica: int, addresses: Mapping[int, str]) -> list[dict[str, Any]]:
    """Every rank pod of group `replica` as the operator renders it (the leader with `addresses`)."""
    ids = groups.rank_identities(t.infd, replica, t.shape)
    clique = groups.clique_affinity(ids[0].group, t.node_labels)
    return [
        group_pods.rank_pod(
            t.deployment,
            me,
            ids,
            gpus=t.shape.gpus_per_rank,
            gpu_resource=t.gpu_resource,
            probe_port=t.probe_port,
            addresses=addresses,
            clique=clique,
            trtllm=t.trtllm,
        )
        for me in ids
    ]


def _group_index(group: str, infd: str) -> int | None:
    prefix = groups.group_name(infd, 0)[:-1]  # "<deployment>-g"
    tail = group.removeprefix(prefix) if group.startswith(prefix) else ""
    return int(tail) if tail.isdigit() else None


def _known(records: Sequence[FaultRecord], pods: Sequence[PodView]) -> list[FaultRecord]:
    """The records that do not speak of these pods' current lives (a recreated rank has its old name)."""
    created = {p.name: p.created for p in pods}
    return [r for r in records if r.pod not in created]


def plan_groups(t: GroupTarget) -> GroupsPlan:
    """The pass over one grouped target (see the module docstring)."""
    out = GroupsPlan()
    owner = children.owner_reference("InferenceDeployment", t.infd, t.infd_uid)
    hold = not t.deployment
    template = "" if hold else group_pods.template_hash(t.deployment, t.shape.gpus_per_rank)
    seen = {g for p in t.pods if (g := p.labels.get(LABEL_GROUP)) and owned(p, t.infd_uid)}
    indices = {i for g in seen if (i := _group_index(g, t.infd)) is not None}
    top = max([t.groups - 1, *indices])
    stale: list[int] = []
    for i in range(top + 1):
        ids = groups.rank_identities(t.infd, i, t.shape)
        name = ids[0].group
        names = {me.pod for me in ids}
        mine = sorted(
            (p for p in t.pods if p.labels.get(LABEL_GROUP) == name and owned(p, t.infd_uid)),
            key=lambda p: p.name,
        )
        theirs = {p.name for p in t.pods if p.name in names and not owned(p, t.infd_uid)}
        out.squatted += sorted(theirs)
        if i >= t.groups:  # scaled down: the group goes whole, then its Services
            out.delete_pods += [p.name for p in mine if not p.deleting]
            out.delete_services.append(name)
            out.delete_policies.append(group_network.policy_name(name))
            if t.trtllm is not None:
                out.delete_access.append(group_rbac.rank_exec_name(name))
            continue
        if mine:
            out.current += 1
        if any(p.deleting for p in mine):  # recreated whole once every pod of its last life is gone
            out.phases[name] = GroupPhase.TEARING_DOWN
            out.delete_pods += [p.name for p in mine if not p.deleting]
            out.waiting.append((name, "its previous pods to go"))
            continue
        assessment = groups.assess_group(
            name, t.shape, mine, _known(t.known_faults, mine), t.now, t.form_limit_s
        )
        on_avoided = sorted({p.node for p in mine if p.node in t.avoid_nodes and p.node})
        if assessment.state is not GroupState.BROKEN and on_avoided:
            assessment = GroupAssessment(
                GroupState.BROKEN, reason=f"a rank runs on node {on_avoided[0]}, whose GPU faulted"
            )
        leader = next((p for p in mine if p.labels.get(groups.LABEL_RANK) == "0"), None)
        if leader is not None and leader.labels.get(LABEL_GROUP_WHOLE) != (
            "true" if assessment.serves else None
        ):
            out.label_pods.append((leader.name, groups.leader_whole_label(assessment)))
        up_to_date = bool(mine) and all(
            p.annotations.get(group_pods.ANNOTATION_GROUP_TEMPLATE) == template for p in mine
        )
        due = _teardown_due(t, assessment, mine)
        if assessment.state is GroupState.BROKEN and due > 0:
            out.phases[name] = GroupPhase.FORMING
            out.waiting.append((name, f"{assessment.reason}; torn down in {due:.0f} s"))
            out.recheck_in = min(due, out.recheck_in or due)
            continue
        if assessment.state is GroupState.BROKEN:
            out.phases[name] = GroupPhase.TEARING_DOWN
            out.delete_pods += [p.name for p in mine]
            out.torn_down.append((name, assessment.reason))
            continue
        if mine and not up_to_date:
            stale.append(i)
        if up_to_date and len(mine) == t.shape.ranks:
            out.updated += 1
        out.phases[name] = GroupPhase.WHOLE if assessment.serves else GroupPhase.FORMING
        if not assessment.serves:
            out.waiting.append((name, assessment.reason))
        if not hold and not assessment.serves:  # a whole group has them: no writes in steady state
            out.services.append(_hashed(group_services.rank_service(name, t.namespace, owner)))
            policy = group_network.rank_port_policy(
                name, t.namespace, [t.probe_port, t.openai_port], owner=owner, mpi=t.trtllm is not None
            )
            out.policies.append(_hashed(policy))
            if t.trtllm is not None:
                out.access += group_rbac.rank_exec_access(ids, t.namespace, owner)
            _create_missing(t, i, mine, theirs, out)
    if not hold:
        _roll_one(t, stale, out)
    out.rolled_out = out.updated == t.groups and out.whole == t.groups
    return out


def _create_missing(
    t: GroupTarget, replica: int, mine: Sequence[PodView], theirs: set[str], out: GroupsPlan
) -> None:
    """Create the group's absent pods: the workers, then the leader once every worker has an
    address (it is given their pod IPs: the group's addresses are fixed for its life, since losing
    any rank recreates the whole group)."""
    have = {p.name: p for p in mine}
    addresses = _worker_addresses(mine)
    wanted = desired_pods(t, replica, addresses)
    for pod in wanted[1:]:
        if pod["metadata"]["name"] not in have and pod["metadata"]["name"] not in theirs:
            out.create_pods.append(pod)
    leader = wanted[0]
    if leader["metadata"]["name"] in have or leader["metadata"]["name"] in theirs:
        return
    if len(addresses) == t.shape.ranks - 1:
        out.create_pods.append(leader)


def _teardown_due(t: GroupTarget, a: GroupAssessment, pods: Sequence[PodView]) -> float:
    """Seconds until a group broken by a rank's end (not a GPU fault, not a deletion) is torn down."""
    if a.state is not GroupState.BROKEN or a.faulted:
        return 0.0
    ended = [x.finished_at for p in pods for x in p.terminations() if x.finished_at is not None]
    return max(0.0, max(ended) + t.teardown_delay_s - t.now) if ended else 0.0


def _worker_addresses(pods: Sequence[PodView]) -> dict[int, str]:
    """rank -> pod IP of the workers (rank above 0) that have one."""
    out: dict[int, str] = {}
    for p in pods:
        rank = p.labels.get(groups.LABEL_RANK, "")
        if rank.isdigit() and int(rank) > 0 and p.ip:
            out[int(rank)] = p.ip
    return out


def _roll_one(t: GroupTarget, stale: Sequence[int], out: GroupsPlan) -> None:
    """A new template rolls group by group: one stale group is torn down (and recreated on the new
    template) only while every other wanted group is whole."""
    if not stale:
        return
    i = stale[0]
    name = groups.group_name(t.infd, i)
    others = [p for g, p in out.phases.items() if g != name]
    if any(p is not GroupPhase.WHOLE for p in others):
        return
    ids = {me.pod for me in groups.rank_identities(t.infd, i, t.shape)}
    out.create_pods = [p for p in out.create_pods if p["metadata"]["name"] not in ids]
    out.delete_pods += sorted(
        p.name for p in t.pods if p.name in ids and owned(p, t.infd_uid) and not p.deleting
    )
    out.phases[name] = GroupPhase.TEARING_DOWN
    out.torn_down.append((name, "a new template rolls out"))


def believed_rank_pods(t: GroupTarget) -> tuple[list[PodView], list[PodView]]:
    """(the rank pods whose fault reports count, those whose reports do not), matched against what
    the operator renders for each one's rank."""
    yes: list[PodView] = []
    no: list[PodView] = []
    by_group: dict[int, list[PodView]] = {}
    for p in t.pods:
        i = _group_index(p.labels.get(LABEL_GROUP, ""), t.infd)
        if i is None:
            no.append(p)
        else:
            by_group.setdefault(i, []).append(p)
    for i, pods in by_group.items():
        if not t.deployment:
            no += pods  # nothing rendered to hold them to
            continue
        desired = {d["metadata"]["name"]: d for d in desired_pods(t, i, _worker_addresses(pods))}
        for p in pods:
            d = desired.get(p.name)
            (yes if d is not None and believed(p, d, t.infd_uid) else no).append(p)
    return yes, no
