"""The native group backend's pure pass (planning/group_plan.py, planning/deployment_groups.py,
apply/group_pods.py): rank pods from the target's template, created if absent and the leader last,
torn down whole, held while the engine is rebuilt, rolled group by group, believed only when the
operator's own, and an InferenceDeployment whose target spans nodes planned as groups."""

from __future__ import annotations

import copy
import dataclasses
import itertools
from typing import Any

from trtforge_operator.api import InferenceDeployment, LLMServer, TRTEngine
from trtforge_operator.apply import group_pods, llm_children
from trtforge_operator.apply.llm_children import LLMRuntime
from trtforge_operator.config import OperatorConfig
from trtforge_operator.observe.views import NodeView, PodView
from trtforge_operator.planning import groups
from trtforge_operator.planning.autoscaling import AutoscalingApis
from trtforge_operator.planning.deployment import DeploymentObserved, plan_deployment
from trtforge_operator.planning.deployment_actions import (
    ApplyDeployment,
    ApplyNetworkPolicy,
    ApplyService,
    ChildKind,
    CreatePod,
    DeleteChild,
    LabelPod,
)
from trtforge_operator.planning.group_plan import GroupPhase, GroupTarget, believed_rank_pods, plan_groups
from trtforge_operator.planning.groups import LABEL_GROUP_WHOLE, GroupShape

from tests.fakes import default_nodes, deployment_observed, iso, runtime_request
from trtforge.contract.gpu import GPUTarget
from trtforge.contract.llm import Parallelism
from trtforge.contract.termination import TerminationMessage

H100 = GPUTarget(gpu="NVIDIA-H100-80GB-HBM3")
CKPT, TUNE = "c" * 64, "t" * 64
NOW = 1_800_000_000.0
CFG = OperatorConfig(backends={"gpu": "onnxruntime"}, broker={"url": "http://broker:8081"})
NODES = [NodeView.from_k8s(n) for n in default_nodes()]


def _deployment(avoid: tuple[str, ...] = (), ckpt: str = CKPT) -> dict[str, Any]:
    req = runtime_request(H100, ckpt, avoid_nodes=avoid)
    return llm_children.llm_runtime_deployment(req, LLMRuntime(LLMServer.LLAMA_CPP, ckpt, TUNE), CFG)


def _target(pods: list[PodView], groups_: int = 1, **kw: Any) -> GroupTarget:
    return GroupTarget(
        namespace="team-a",
        infd="chat",
        infd_uid="uid-1",
        shape=GroupShape(2, 8),
        groups=groups_,
        deployment=kw.pop("deployment", _deployment()),
        gpu_resource="nvidia.com/gpu",
        probe_port=8000,
        openai_port=8080,
        pods=pods,
        now=kw.pop("now", NOW),
        **kw,
    )


def _pod(
    manifest: dict[str, Any],
    *,
    ip: str | None = "10.0.0.1",
    ready: bool = True,
    node: str = "gpu-h100-0",
    restarts: int = 0,
    deleting: bool = False,
    labels: dict[str, str | None] | None = None,
    term: TerminationMessage | None = None,
) -> PodView:
    """The pod the apiserver shows once `manifest` was created and ran."""
    obj = copy.deepcopy(manifest)
    meta = obj["metadata"]
    meta["uid"], meta["creationTimestamp"] = f"uid-{meta['name']}", iso(NOW - 60)
    for k, v in (labels or {}).items():
        if v is None:
            meta["labels"].pop(k, None)
        else:
            meta["labels"][k] = v
    if deleting:
        meta["deletionTimestamp"] = iso(NOW)
    obj["spec"]["nodeName"] = node
    for c in obj["spec"]["containers"]:  # the apiserver's defaults, which trust must see past
        for e in c.get("env") or ():
            if "fieldRef" in e.get("valueFrom", {}):
                e["valueFrom"]["fieldRef"].setdefault("apiVersion", "v1")
    state: dict[str, Any] = {"running": {}}
    if term is not None:
        state = {
            "terminated": {
                "exitCode": term.exit_code,
                "message": term.model_dump_json(),
                "finishedAt": iso(NOW),
            }
        }
    obj["status"] = {
        "phase": "Failed" if term is not None else "Running",
        "podIP": ip,
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        "containerStatuses": [{"name": "serve", "ready": ready, "restartCount": restarts, "state": state}],
    }
    return PodView.from_k8s(obj)


def _created(plan: Any) -> dict[str, dict[str, Any]]:
    return {m["metadata"]["name"]: m for m in plan.create_pods}


def test_a_new_group_makes_its_workers_first_and_its_leader_once_they_have_addresses() -> None:
    first = plan_groups(_target([]))
    assert sorted(_created(first)) == ["chat-g0-1"]
    assert [s["metadata"]["name"] for s in first.services] == ["chat-g0"]
    assert [p["metadata"]["name"] for p in first.policies] == ["chat-g0-ranks"]
    assert first.phases == {"chat-g0": GroupPhase.FORMING} and not first.rolled_out

    worker = _pod(_created(first)["chat-g0-1"], ip=None, ready=False)
    assert plan_groups(_target([worker])).create_pods == []  # no address yet: the leader waits
    worker = _pod(_created(first)["chat-g0-1"], ip="10.0.0.7", ready=False)
    second = plan_groups(_target([worker]))
    (leader,) = second.create_pods
    cmd = leader["spec"]["containers"][0]["command"]
    assert cmd[cmd.index("--worker") + 1] == "10.0.0.7:50052:8000"
    assert cmd[cmd.index("--world-size") + 1] == "2" and cmd[cmd.index("--checkpoint") + 1] == CKPT


def test_rank_pods_come_from_the_template_with_a_nodes_gpus_and_never_restart() -> None:
    dep = _deployment(avoid=("bad-node",))
    ids = groups.rank_identities("chat", 0, GroupShape(2, 8))
    clique = groups.clique_affinity("chat-g0", [{groups.CLIQUE_LABEL: "a"}])
    worker = group_pods.rank_pod(
        dep, ids[1], ids, gpus=8, gpu_resource="nvidia.com/gpu", probe_port=8000, clique=clique
    )
    spec = worker["spec"]
    (c,) = spec["containers"]
    flags = dict(itertools.pairwise(c["command"]))
    assert c["command"][:2] == ["trtforge", "serve-llm"] and "--checkpoint" not in flags
    assert flags["--rank"] == "1" and flags["--rank-port"] == "50052" and flags["--probe-port"] == "8000"
    assert {p["name"] for p in c["ports"]} == {"http", "rank"}  # no OpenAI port on a worker
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert (spec["hostname"], spec["subdomain"], spec["restartPolicy"]) == ("chat-g0-1", "chat-g0", "Never")
    # the faulted node stays out AND the clique holds: one term with both
    (term,) = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert term["matchFields"][0]["values"] == ["bad-node"]
    assert term["matchExpressions"] == [{"key": groups.CLIQUE_LABEL, "operator": "Exists"}]
    assert spec["affinity"]["podAffinity"] == clique["podAffinity"]  # type: ignore[index]
    meta = worker["metadata"]
    assert meta["labels"][groups.LABEL_GROUP] == "chat-g0" and meta["labels"][groups.LABEL_RANK] == "1"
    assert (
        meta["ownerReferences"][0]["kind"] == "InferenceDeployment"
        and LABEL_GROUP_WHOLE not in meta["labels"]
    )
    lws = group_pods.rank_pod(
        dep, ids[1], ids, gpus=8, gpu_resource="nvidia.com/gpu", probe_port=8000, lws=True
    )
    assert "--lws" in lws["spec"]["containers"][0]["command"] and "hostname" not in lws["spec"]


def _whole_group(**kw: Any) -> list[PodView]:
    made = plan_groups(_target([]))
    worker = _pod(_created(made)["chat-g0-1"], ip="10.0.0.7", node="gpu-h100-1")
    leader_manifest = plan_groups(_target([worker])).create_pods[0]
    return [_pod(leader_manifest, ip="10.0.0.6", **kw), worker]


def test_a_whole_group_gets_its_leader_labelled_and_nothing_else_to_do() -> None:
    pods = _whole_group()
    plan = plan_groups(_target(pods))
    assert plan.create_pods == [] and plan.delete_pods == [] and plan.services == plan.policies == []
    assert plan.label_pods == [("chat-g0-0", {LABEL_GROUP_WHOLE: "true"})]
    assert plan.phases == {"chat-g0": GroupPhase.WHOLE} and plan.whole == 1 and plan.rolled_out
    labelled = _whole_group(labels={LABEL_GROUP_WHOLE: "true"})
    assert plan_groups(_target(labelled)).label_pods == []  # written only on change


def test_a_rank_that_died_tears_the_whole_group_down_and_its_leader_leaves_the_service_first() -> None:
    leader, _worker = _whole_group(labels={LABEL_GROUP_WHOLE: "true"})
    dead = _pod(
        plan_groups(_target([])).create_pods[0], ip="10.0.0.7", node="gpu-h100-1", restarts=1, ready=False
    )
    plan = plan_groups(_target([leader, dead]))
    assert plan.label_pods == [("chat-g0-0", {LABEL_GROUP_WHOLE: None})]
    assert sorted(plan.delete_pods) == ["chat-g0-0", "chat-g0-1"] and plan.create_pods == []
    assert plan.torn_down and "rank 1" in plan.torn_down[0][1]
    # while any pod of its last life is still going, nothing is made under its names
    going = [_pod(plan_groups(_target([])).create_pods[0], deleting=True)]
    waiting = plan_groups(_target(going))
    assert waiting.create_pods == [] and waiting.phases == {"chat-g0": GroupPhase.TEARING_DOWN}


def test_a_rank_on_an_avoided_node_breaks_its_group() -> None:
    pods = _whole_group()
    plan = plan_groups(_target(pods, avoid_nodes=frozenset({"gpu-h100-1"})))
    assert sorted(plan.delete_pods) == ["chat-g0-0", "chat-g0-1"]
    assert "gpu-h100-1" in plan.torn_down[0][1]


def test_a_gpu_fault_under_a_rank_is_named_and_believed_only_from_the_operators_own_pod() -> None:
    leader, _worker = _whole_group()
    msg = TerminationMessage(reason="GPUFault", message="Xid 79", gpu="GPU-1", gpus=["GPU-1"], xid=79)
    faulted = _pod(plan_groups(_target([])).create_pods[0], ip="10.0.0.7", node="gpu-h100-1", term=msg)
    plan = plan_groups(_target([leader, faulted]))
    assert "Xid 79 on GPU GPU-1" in plan.torn_down[0][1]
    yes, no = believed_rank_pods(_target([leader, faulted]))
    assert {p.name for p in yes} == {"chat-g0-0", "chat-g0-1"} and not no
    # another command under the same name and labels, or no owner: not believed
    forged_manifest = copy.deepcopy(plan_groups(_target([])).create_pods[0])
    forged_manifest["spec"]["containers"][0]["command"] = ["sh", "-c", "exit 75"]
    forged = _pod(forged_manifest, node="gpu-h100-1", term=msg)
    orphan_manifest = copy.deepcopy(plan_groups(_target([])).create_pods[0])
    orphan_manifest["metadata"]["ownerReferences"] = []
    orphan = _pod(orphan_manifest, node="gpu-h100-1", term=msg)
    for p in (forged, orphan):
        yes, no = believed_rank_pods(_target([leader, p]))
        assert p.name in {x.name for x in no}
    # an orphan is not the operator's: it is neither counted nor deleted, and its name is reported
    plan = plan_groups(_target([leader, orphan]))
    assert "chat-g0-1" not in plan.delete_pods and plan.squatted == ["chat-g0-1"]


def test_groups_are_added_and_removed_whole() -> None:
    pods = _whole_group(labels={LABEL_GROUP_WHOLE: "true"})
    up = plan_groups(_target(pods, groups_=2))
    assert sorted(_created(up)) == ["chat-g1-1"] and up.whole == 1
    assert [m["metadata"]["name"] for m in up.services] == ["chat-g1"]  # g0, whole, has its own
    down = plan_groups(_target(pods, groups_=0))
    assert sorted(down.delete_pods) == ["chat-g0-0", "chat-g0-1"]
    assert down.delete_services == ["chat-g0"] and down.delete_policies == ["chat-g0-ranks"]
    assert down.services == [] and down.create_pods == []


def test_a_new_template_rolls_one_group_at_a_time_while_the_others_are_whole() -> None:
    g0 = _whole_group(labels={LABEL_GROUP_WHOLE: "true"})
    g1_manifests = plan_groups(_target([], groups_=2)).create_pods  # g0-1 and g1-1
    g1_worker = _pod(next(m for m in g1_manifests if m["metadata"]["name"] == "chat-g1-1"), ip="10.0.0.9")
    g1_leader = _pod(plan_groups(_target([*g0, g1_worker], groups_=2)).create_pods[0], ip="10.0.0.8")
    assert g1_leader.name == "chat-g1-0"
    pods = [*g0, g1_worker, g1_leader]
    new = _deployment(ckpt="d" * 64)
    plan = plan_groups(_target(pods, groups_=2, deployment=new))
    assert sorted(plan.delete_pods) == ["chat-g0-0", "chat-g0-1"]  # one group only
    assert plan.torn_down == [("chat-g0", "a new template rolls out")] and not plan.rolled_out
    # with a group not whole, none rolls
    forming = [*g0, g1_worker]
    assert plan_groups(_target(forming, groups_=2, deployment=new)).delete_pods == []


def test_a_group_is_held_while_its_target_cannot_be_rendered_and_a_broken_one_still_goes() -> None:
    pods = _whole_group()
    held = plan_groups(_target(pods, deployment={}))
    assert held.create_pods == [] and held.services == [] and held.delete_pods == []
    held = plan_groups(_target(pods[:1], deployment={}))
    assert held.create_pods == []  # the missing worker is not made from nothing
    dead = _whole_group(restarts=2)
    assert sorted(plan_groups(_target(dead, deployment={})).delete_pods) == ["chat-g0-0", "chat-g0-1"]


def test_killing_the_operator_between_any_two_writes_makes_no_duplicate_and_loses_no_group() -> None:
    """Every prefix of a pass's creates, then a fresh pass: each rank name is made at most once over
    the whole run, and the group ends whole."""
    made: dict[str, PodView] = {}
    for cut in itertools.count():
        plan = plan_groups(_target(list(made.values())))
        if plan.rolled_out:
            break
        for m in plan.create_pods[: cut % 2 + 1]:  # cut short after one or two creates
            assert m["metadata"]["name"] not in made, "created twice"
            ip = f"10.0.0.{len(made) + 5}"
            made[m["metadata"]["name"]] = _pod(m, ip=ip)
        assert cut < 10
    assert sorted(made) == ["chat-g0-0", "chat-g0-1"]


def test_a_grouped_mapping_and_its_tune_job_take_whole_nodes() -> None:
    assert groups.gpus_per_node(H100, NODES) == 8
    assert groups.gpus_per_node(GPUTarget(gpu="cpu"), NODES) == 0
    assert groups.replica_shape(16, 1, 8) == GroupShape(2, 8)
    assert groups.replica_shape(16, 1, 0) == GroupShape(1, 16)  # no node says: one pod
    assert groups.tune_gpus(Parallelism(tensor=16), H100, NODES) == 8
    assert groups.tune_gpus(Parallelism(tensor=2), H100, NODES) == 2
    assert groups.tune_gpus(Parallelism(tensor=2), H100, []) == 0


# ------------------------------------------------------------------- the InferenceDeployment's pass


def _engine(tensor: int = 16) -> TRTEngine:
    return TRTEngine.model_validate(
        {
            "metadata": {"name": "smollm2", "namespace": "team-a"},
            "spec": {
                "llm": {"source": {"uri": "pvc://models/smollm2.gguf", "sha256": "f" * 64}, "recipe": "bf16"},
                "targets": [{"gpu": H100.gpu, "parallelism": {"tensor": tensor}}],
            },
            "status": {
                "checkpoint": {"phase": "Ready", "checkpointKey": CKPT},
                "targets": [
                    {
                        "name": H100.name,
                        "gpu": H100.gpu,
                        "phase": "Ready",
                        "tuningKey": TUNE,
                        "engineKey": CKPT,
                    }
                ],
            },
        }
    )


def _observed(
    llm: dict[str, Any] | None = None, *, lws_served: bool | None = None, **kw: Any
) -> DeploymentObserved:
    d = InferenceDeployment.model_validate(
        {
            "metadata": {"name": "chat", "namespace": "team-a", "uid": "uid-1", "generation": 1},
            "spec": {"engineRef": {"name": "smollm2"}, "llm": {"server": "llama.cpp", **(llm or {})}},
        }
    )
    engine = kw.pop("engine", _engine())
    return deployment_observed(d, engine, NOW, nodes=NODES, lws_served=lws_served, **kw)


def _condition(plan: Any, type_: str) -> Any:
    return next(c for c in plan.status.conditions if c.type == type_)


def test_a_target_spanning_nodes_is_served_by_groups_not_a_deployment() -> None:
    plan = plan_deployment(_observed(), CFG)
    assert not [a for a in plan.actions if isinstance(a, ApplyDeployment)]
    (create,) = [a for a in plan.actions if isinstance(a, CreatePod)]
    assert create.manifest["metadata"]["name"] == "chat-g0-1"
    assert [a for a in plan.actions if isinstance(a, ApplyNetworkPolicy)]
    svc = next(
        a.manifest
        for a in plan.actions
        if isinstance(a, ApplyService) and a.manifest["metadata"]["name"] == "chat"
    )
    assert (
        svc["spec"]["selector"][groups.LABEL_RANK] == "0"
        and svc["spec"]["selector"][LABEL_GROUP_WHOLE] == "true"
    )
    assert (
        plan.status.selector
        == "app.kubernetes.io/name=trtforge,trtforge.io/inferencedeployment=chat,trtforge.io/rank=0"
    )
    groups_cond = _condition(plan, "Groups")
    assert (groups_cond.status, groups_cond.reason) == ("False", "GroupsForming")
    assert plan.status.targets[0].deployment_name is None
    # a mapping that fits one node stays one Deployment, with no Groups condition
    single = plan_deployment(_observed(engine=_engine(tensor=8)), CFG)
    assert [a for a in single.actions if isinstance(a, ApplyDeployment)]
    assert not [c for c in single.status.conditions if c.type == "Groups"]


def test_the_pass_over_a_whole_group_is_ready_and_a_faulted_rank_is_recorded_and_tears_it_down() -> None:
    creates = [a.manifest for a in plan_deployment(_observed(), CFG).actions if isinstance(a, CreatePod)]
    worker = _pod(creates[0], ip="10.0.0.7", node="gpu-h100-1")
    (leader_m,) = [
        a.manifest for a in plan_deployment(_observed(pods=[worker]), CFG).actions if isinstance(a, CreatePod)
    ]
    leader = _pod(leader_m, ip="10.0.0.6", labels={LABEL_GROUP_WHOLE: "true"})
    plan = plan_deployment(_observed(pods=[leader, worker]), CFG)
    assert _condition(plan, "Groups").reason == "GroupsWhole" and _condition(plan, "Ready").status == "True"
    assert plan.status.ready_replicas == 1 and not [
        a for a in plan.actions if isinstance(a, CreatePod | DeleteChild)
    ]

    msg = TerminationMessage(reason="GPUFault", message="Xid 79", gpu="GPU-3", gpus=["GPU-3"], xid=79)
    faulted = _pod(creates[0], ip="10.0.0.7", node="gpu-h100-1", term=msg)
    plan = plan_deployment(_observed(pods=[leader, faulted]), CFG)
    (rec,) = plan.status.faults
    assert (rec.pod, rec.node, rec.gpu, rec.xid, rec.action) == (
        "chat-g0-1",
        "gpu-h100-1",
        "GPU-3",
        79,
        "PodMovedAndRebuild",
    )
    labels = [a for a in plan.actions if isinstance(a, LabelPod)]
    deletes = [a.name for a in plan.actions if isinstance(a, DeleteChild) and a.kind is ChildKind.POD]
    assert labels == [LabelPod("chat-g0-0", {LABEL_GROUP_WHOLE: None})] and sorted(deletes) == [
        "chat-g0-0",
        "chat-g0-1",
    ]
    assert plan.actions.index(labels[0]) < min(
        i for i, a in enumerate(plan.actions) if isinstance(a, DeleteChild)
    )
    assert _condition(plan, "Groups").reason == "GroupTornDown"
    assert plan.rebuild_requests == [] or plan.rebuild_requests[0].target == H100.name


def test_lws_is_refused_without_its_crd_and_rendered_with_it() -> None:
    refused = plan_deployment(_observed({"groupBackend": "lws"}, lws_served=False), CFG)
    cond = _condition(refused, "Groups")
    assert (cond.status, cond.reason) == ("False", "LeaderWorkerSetCRDMissing")
    assert not [a for a in refused.actions if isinstance(a, CreatePod | ApplyDeployment)]
    from trtforge_operator.planning.deployment_actions import ApplyLeaderWorkerSet

    assert not [a for a in refused.actions if isinstance(a, ApplyLeaderWorkerSet)]
    served = plan_deployment(_observed({"groupBackend": "lws"}, lws_served=True), CFG)
    (lws,) = [a.manifest for a in served.actions if isinstance(a, ApplyLeaderWorkerSet)]
    tpl = lws["spec"]["leaderWorkerTemplate"]
    assert (
        tpl["size"] == 2
        and tpl["restartPolicy"] == "RecreateGroupOnPodRestart"
        and lws["spec"]["replicas"] == 1
    )
    assert tpl["leaderTemplate"]["metadata"]["labels"][groups.LABEL_RANK] == "0"
    assert "--lws" in tpl["workerTemplate"]["spec"]["containers"][0]["command"]
    assert _condition(served, "Groups").reason == "GroupsForming"
    assert not [a for a in served.actions if isinstance(a, CreatePod)]


def test_a_grouped_targets_autoscaler_scales_the_inferencedeployment_whose_replicas_count_groups() -> None:
    from trtforge_operator.observe.views import HpaApi

    auto = {"autoscaling": {"minReplicas": 1, "maxReplicas": 3, "metric": "QueueDepth", "targetValue": "1"}}
    d = InferenceDeployment.model_validate(
        {
            "metadata": {"name": "chat", "namespace": "team-a", "uid": "uid-1", "generation": 1},
            "spec": {"engineRef": {"name": "smollm2"}, "replicas": 2, "llm": {"server": "llama.cpp"}, **auto},
        }
    )
    obs = dataclasses.replace(_observed(), spec=d.spec, apis=AutoscalingApis(hpa=HpaApi.V2, keda=False))
    plan = plan_deployment(obs, CFG)
    (hpa,) = plan.apply_autoscalers
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "trtforge.io/v1alpha1",
        "kind": "InferenceDeployment",
        "name": "chat",
    }
    # two groups wanted (spec.replicas, which the HPA sets through the scale subresource): each whole
    made = sorted(a.manifest["metadata"]["name"] for a in plan.actions if isinstance(a, CreatePod))
    assert made == ["chat-g0-1", "chat-g1-1"]
    assert plan.status.desired_replicas == 2


def test_a_group_whose_rank_ended_is_torn_down_after_a_pause_not_in_a_hot_loop() -> None:
    leader, worker = _whole_group(labels={LABEL_GROUP_WHOLE: "true"})
    ended = TerminationMessage(reason="Error", message="bad argument")
    quit_ = _pod(plan_groups(_target([])).create_pods[0], ip="10.0.0.7", node="gpu-h100-1", term=ended)
    held = plan_groups(_target([leader, quit_]))  # it ended at NOW
    assert held.delete_pods == [] and held.create_pods == [] and held.recheck_in == 10.0
    assert held.label_pods == [("chat-g0-0", {LABEL_GROUP_WHOLE: None})]  # out of the Service at once
    assert held.phases == {"chat-g0": GroupPhase.FORMING} and "torn down in 10 s" in held.waiting[0][1]
    later = plan_groups(_target([leader, quit_], now=NOW + 10))
    assert sorted(later.delete_pods) == ["chat-g0-0", "chat-g0-1"] and later.recheck_in is None
    assert worker.name == "chat-g0-1"


def test_switching_to_lws_takes_the_native_groups_down_whole() -> None:
    native = plan_deployment(_observed(), CFG)
    worker = _pod(next(a.manifest for a in native.actions if isinstance(a, CreatePod)), ip="10.0.0.7")
    plan = plan_deployment(_observed({"groupBackend": "lws"}, lws_served=True, pods=[worker]), CFG)
    deletes = [a for a in plan.actions if isinstance(a, DeleteChild)]
    assert DeleteChild(ChildKind.POD, "chat-g0-1") in deletes
    assert DeleteChild(ChildKind.NETWORK_POLICY, "chat-g0-ranks") in deletes
    assert not [a for a in plan.actions if isinstance(a, CreatePod)]


def test_a_grouped_targets_scaled_object_scales_the_inferencedeployment_on_its_leaders_series() -> None:
    auto = {
        "provider": "KEDA",
        "minReplicas": 1,
        "maxReplicas": 3,
        "metric": "QueueDepth",
        "targetValue": "1",
    }
    d = InferenceDeployment.model_validate(
        {
            "metadata": {"name": "chat", "namespace": "team-a", "uid": "uid-1", "generation": 1},
            "spec": {"engineRef": {"name": "smollm2"}, "llm": {"server": "llama.cpp"}, "autoscaling": auto},
        }
    )
    cfg = CFG.model_copy(
        update={
            "autoscaling": CFG.autoscaling.model_copy(update={"keda_prometheus_address": "http://p:9090"})
        }
    )
    obs = dataclasses.replace(_observed(), spec=d.spec, apis=AutoscalingApis(hpa=None, keda=True))
    (so,) = plan_deployment(obs, cfg).apply_autoscalers
    assert so["kind"] == "ScaledObject" and so["spec"]["scaleTargetRef"]["kind"] == "InferenceDeployment"
    query = so["spec"]["triggers"][0]["metadata"]["query"]
    assert 'pod=~"chat-g[0-9]+-0"' in query  # the leaders' series only


def test_the_groups_condition_names_the_weightiest_reason() -> None:
    from trtforge_operator.apply import lws
    from trtforge_operator.planning.deployment_groups import groups_condition
    from trtforge_operator.planning.group_plan import GroupsPlan

    obs = _observed()
    whole = GroupsPlan(phases={"chat-g0": GroupPhase.WHOLE})
    forming = GroupsPlan(
        phases={"chat-g0": GroupPhase.FORMING}, waiting=[("chat-g0", "waiting for ranks [1]")]
    )
    torn = GroupsPlan(torn_down=[("chat-g0", "rank died")])
    missing = lws.crd_refusal(False)

    def reason(states: dict[str, Any]) -> tuple[str, str]:
        (c,) = [c for c in groups_condition([], obs, states) if c.type == "Groups"]
        return c.status, c.reason

    assert reason({"a": whole}) == ("True", "GroupsWhole")
    assert reason({"a": whole, "b": forming}) == ("False", "GroupsForming")
    assert reason({"a": torn, "b": forming}) == ("False", "GroupTornDown")
    assert reason({"a": torn, "b": missing}) == ("False", "LeaderWorkerSetCRDMissing")
    assert reason({"a": None}) == ("False", "GroupsForming")
    assert groups_condition([], obs, {}) == []


def test_a_node_level_record_of_a_rank_learns_its_xid_from_the_ranks_termination_message() -> None:
    from trtforge_operator.api import FaultRecord, InferenceDeploymentStatus
    from trtforge_operator.observe.views import utc

    creates = [a.manifest for a in plan_deployment(_observed(), CFG).actions if isinstance(a, CreatePod)]
    msg = TerminationMessage(reason="GPUFault", message="Xid 79", gpu="GPU-3", gpus=["GPU-3"], xid=79)
    faulted = _pod(creates[0], ip="10.0.0.7", node="gpu-h100-1", term=msg)
    first = FaultRecord(
        time=utc(NOW - 1),
        pod="chat-g0-1",
        node="gpu-h100-1",
        target=H100.name,
        reason="nvidia.com/gpu 7/8",
        node_problem="AllocatableDropped",
        action="PodMovedAndRebuild",
    )
    obs = dataclasses.replace(_observed(pods=[faulted]), status=InferenceDeploymentStatus(faults=[first]))
    (rec,) = plan_deployment(obs, CFG).status.faults
    assert (rec.xid, rec.gpu, rec.node) == (79, "GPU-3", "gpu-h100-1")
