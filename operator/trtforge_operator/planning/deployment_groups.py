"""The rank-group part of an InferenceDeployment pass, pure (docs/llm.md §"Groups"): a target's shape,
its groups under the native backend (with their faults) or its LeaderWorkerSet under lws, the
Service's leader selector and the Groups condition. planning/deployment.py calls these per target."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Literal

from trtforge.contract.gpu import GPUTarget
from trtforge_operator.api import Condition, FaultRecord, GroupBackend, LLMServing, set_condition
from trtforge_operator.apply import children, group_pods, group_services, lws
from trtforge_operator.apply.llm_children import LLMRuntime
from trtforge_operator.observe.views import DeploymentObserved, NodeView, utc
from trtforge_operator.planning import fault_trust, faults, groups
from trtforge_operator.planning.events import Event
from trtforge_operator.planning.group_plan import GroupsPlan, GroupTarget, believed_rank_pods, plan_groups
from trtforge_operator.planning.llm_serving import LLMProblem
from trtforge_operator.planning.text import one_line

GROUPS = "Groups"  # the condition type, present while a target is grouped
GROUPS_WHOLE = "GroupsWhole"
GROUPS_FORMING = "GroupsForming"
GROUP_TORN_DOWN = "GroupTornDown"
GROUP_SHAPE_INVALID = "GroupShapeInvalid"
RANK_EXEC_NOT_GRANTED = "RankExecNotGranted"
LWS_TRTLLM_UNSUPPORTED = "LeaderWorkerSetTrtllmUnsupported"
# nothing is made
REFUSALS = (lws.CRD_MISSING, GROUP_SHAPE_INVALID, RANK_EXEC_NOT_GRANTED, LWS_TRTLLM_UNSUPPORTED)

GroupState = GroupsPlan | lws.Readiness | None  # None: grouped, nothing to serve yet


def group_shape(
    obs: DeploymentObserved, llm: LLMRuntime | LLMProblem | None, target: GPUTarget
) -> tuple[groups.GroupShape | None, str]:
    """(the target's replica shape, or None for an ONNX target; why its mapping can't be laid out)."""
    if not isinstance(llm, LLMRuntime) or obs.engine is None:
        return None, ""
    par = obs.engine.spec.parallelism_of(target)
    try:
        return groups.replica_shape(par.tensor, par.pipeline, groups.gpus_per_node(target, obs.nodes)), ""
    except groups.GroupShapeError as e:
        return None, str(e)


def rank_exec_refusal(gt: GroupTarget, granted: bool) -> lws.Readiness | None:
    """A trtllm-serve group of several pods launches its ranks with mpirun, whose launcher execs into
    the workers: refused unless the operator may grant its leader that (config groups.rank_exec)."""
    if gt.trtllm is None or gt.shape.ranks < 2 or granted:
        return None
    return lws.Readiness(
        False,
        RANK_EXEC_NOT_GRANTED,
        f"trtllm-serve across {gt.shape.ranks} pods launches its ranks with mpirun, which execs into the "
        "worker pods, and the operator is not allowed to grant its leader pods/exec: install the chart "
        "with rbac.rankExec=true (operator config groups.rank_exec), or serve this target with llama.cpp",
    )


def lws_trtllm_refusal(gt: GroupTarget) -> lws.Readiness | None:
    """The lws backend starts llama.cpp's RPC ranks only: a trtllm-serve group (mpirun across the
    pods) is refused rather than rendered into pods that would not meet."""
    if gt.trtllm is None:
        return None
    return lws.Readiness(
        False,
        LWS_TRTLLM_UNSUPPORTED,
        f"groupBackend lws does not launch trtllm-serve's ranks (mpirun across {gt.shape.ranks} pods); "
        "use groupBackend native for this target",
    )


def _current_life(records: Sequence[FaultRecord], gt: GroupTarget) -> list[FaultRecord]:
    """The records, less those of an earlier life of a rank pod's name (a recreated rank keeps it)."""
    created = {p.name: p.created for p in gt.pods}
    return [
        r
        for r in records
        if not (r.pod in created and (c := created[r.pod]) is not None and r.time.timestamp() < c)
    ]


def native_groups(
    gt: GroupTarget, records: Sequence[FaultRecord], nodes: Sequence[NodeView], ttl: float
) -> tuple[GroupsPlan, list[faults.DetectedFault], list[Event]]:
    """One target's groups: the pods to create, label and delete (planning/group_plan.py), the new
    faults their pods report (believed only from the operator's own rank pods; the caller records
    them), and the Events to post."""
    events: list[Event] = []
    yes, no = believed_rank_pods(gt)
    foreign = [i for p in yes if (i := fault_trust.foreign_gpu(p)) is not None]
    events += [Event("Warning", "FaultIgnored", i.message) for i in foreign]
    yes = [p for p in yes if p.name not in {i.pod for i in foreign}]
    events += [
        Event(
            "Warning",
            "FaultIgnored",
            f"pod {p.name} carries a group's labels but is not a rank pod the operator made and runs as "
            "rendered; its fault report is ignored",
        )
        for p in no
        if fault_trust.reports_fault(p)
    ]
    known = _current_life(records, gt)
    new = faults.detect_pod_faults(yes, known, gt.now)
    new += faults.detect_node_faults(yes, nodes, [*known, *(d.record for d in new)], gt.now, ttl)
    names = {p.name for p in gt.pods}
    # The group's own records left out: assess_group names the fault that breaks it.
    out = plan_groups(replace(gt, known_faults=[r for r in records if r.pod not in names]))
    events += [Event("Warning", GROUP_TORN_DOWN, f"group {g} torn down: {why}") for g, why in out.torn_down]
    events += [
        Event("Warning", "GroupPodNameTaken", f"pod {n} is not the operator's; its group waits for the name")
        for n in out.squatted
    ]
    return out, new, events


def enriched(records: list[FaultRecord], gt: GroupTarget) -> list[FaultRecord]:
    """The records, a node-level one learning the Xid and GPU from its rank pod's own termination
    message once it arrives (believed pods only), as for runtime pods."""
    yes, _ = believed_rank_pods(gt)
    return faults.enrich_from_pods(records, yes)


def leader_worker_set(
    obs: DeploymentObserved, gt: GroupTarget, name: str, out: list[dict[str, object]]
) -> lws.Readiness:
    """The lws backend: refused with CRD_MISSING where the CRD is not served (nothing made); else the
    expected LeaderWorkerSet (appended to `out`) and its readiness from the live one."""
    refusal = lws.crd_refusal(bool(obs.lws_served))
    if refusal is not None:
        return refusal
    ids = groups.rank_identities(gt.infd, 0, gt.shape)

    def pod_spec(rank: int) -> dict[str, object]:
        pod = group_pods.rank_pod(
            gt.deployment,
            ids[rank],
            ids,
            gpus=gt.shape.gpus_per_rank,
            gpu_resource=gt.gpu_resource,
            probe_port=gt.probe_port,
            lws=True,
        )
        return dict(pod["spec"])

    labels = dict(gt.deployment["spec"]["template"]["metadata"]["labels"])
    workload = lws.GroupWorkload(
        name=name,
        namespace=gt.namespace,
        groups=gt.groups,
        ranks=gt.shape.ranks,
        leader=pod_spec(0),
        worker=pod_spec(1),
        labels=labels,
        owner=children.owner_reference("InferenceDeployment", gt.infd, gt.infd_uid),
    )
    manifest = lws.render(workload)
    leader_labels = manifest["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["metadata"]["labels"]
    leader_labels[groups.LABEL_RANK] = "0"  # the Service and the scale selector pick leaders by it
    out.append(manifest)
    return lws.readiness(obs.leader_worker_sets.get(name))


def leader_selector(obs: DeploymentObserved, states: Mapping[str, GroupState]) -> dict[str, str] | None:
    """The Service's selector while a target is grouped: whole groups' leaders (native; LWS's leader
    readiness waits for every rank), else None (every runtime pod)."""
    if not states:
        return None
    base = children.selector_labels(obs.name)
    if (obs.spec.llm or LLMServing()).group_backend is GroupBackend.LWS:
        return {**base, groups.LABEL_RANK: "0"}
    return group_services.leader_selector(base)


REASON_ORDER = (*REFUSALS, GROUP_TORN_DOWN, GROUPS_FORMING, GROUPS_WHOLE)


def _target_groups(target: str, st: GroupState) -> tuple[str, list[str]]:
    """(the reason one grouped target gives the Groups condition, what to say of it)."""
    if st is None:
        return GROUPS_FORMING, [f"{target}: waiting for its engine"]
    if isinstance(st, lws.Readiness):
        if st.ready:
            return GROUPS_WHOLE, [f"{target}: LeaderWorkerSet available"]
        reason = st.reason if st.reason in REFUSALS else GROUPS_FORMING
        return reason, [f"{target}: {st.message or st.reason}"]
    if st.torn_down:
        return GROUP_TORN_DOWN, [f"{target}: group {g} torn down: {why}" for g, why in st.torn_down]
    said = [f"{target}: {st.whole}/{len(st.phases)} groups whole"]
    if st.whole < len(st.phases):
        return GROUPS_FORMING, said + [f"group {g}: {what}" for g, what in st.waiting]
    return GROUPS_WHOLE, said


def groups_condition(
    conds: list[Condition], obs: DeploymentObserved, states: Mapping[str, GroupState]
) -> list[Condition]:
    """Groups: True while every grouped target's groups are whole; else False with the first of a
    refusal (CRD missing, a mapping that does not split), a group torn down this pass, or groups
    still forming; absent without grouped targets."""
    if not states:
        return [c for c in conds if c.type != GROUPS]
    found = [_target_groups(t, st) for t, st in sorted(states.items())]
    reason = min((r for r, _ in found), key=REASON_ORDER.index)
    message = one_line("; ".join(m for _, said in found for m in said), 1000)
    status: Literal["True", "False"] = "True" if reason == GROUPS_WHOLE else "False"
    return set_condition(
        conds, GROUPS, status, reason, message, observed_generation=obs.generation, at=utc(obs.now)
    )
