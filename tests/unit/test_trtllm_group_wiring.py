"""A trtllm-serve group on the mpirun path, as the operator renders it (apply/group_pods.py,
apply/group_rbac.py, planning/group_plan.py): each rank's mapping flags, workers that fetch what the
leader names, and the leader's own ServiceAccount, Role (pods/exec on its workers by name) and
RoleBinding, made before the leader and gone with its group."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from trtforge_operator.api import GroupBackend, InferenceDeployment, LLMServer, TRTEngine
from trtforge_operator.apply import children, group_pods, group_rbac, llm_children
from trtforge_operator.apply.llm_children import LLMRuntime
from trtforge_operator.config import GroupSettings, OperatorConfig
from trtforge_operator.observe.views import PodView
from trtforge_operator.planning import groups
from trtforge_operator.planning.deployment import plan_deployment
from trtforge_operator.planning.deployment_actions import (
    ApplyLeaderWorkerSet,
    ApplyRankExecAccess,
    ChildKind,
    CreatePod,
    DeleteChild,
)
from trtforge_operator.planning.group_plan import GroupTarget, plan_groups
from trtforge_operator.planning.groups import GroupShape

from tests.fakes import deployment_observed, iso, runtime_request
from trtforge.contract.gpu import GPUTarget
from trtforge.contract.llm import Parallelism

H100 = GPUTarget(gpu="NVIDIA-H100-80GB-HBM3")
CKPT, TUNE = "c" * 64, "t" * 64
NOW = 1_800_000_000.0
CFG = OperatorConfig(backends={"gpu": "onnxruntime"}, broker={"url": "http://broker:8081"})
GRANTED = CFG.model_copy(update={"groups": GroupSettings(rank_exec=True)})
TP16 = Parallelism(tensor=16)
OWNER = children.owner_reference("InferenceDeployment", "chat", "uid-1")


def _deployment(server: LLMServer = LLMServer.TRTLLM_SERVE) -> dict[str, Any]:
    req = runtime_request(H100, CKPT)
    return llm_children.llm_runtime_deployment(req, LLMRuntime(server, CKPT, TUNE), CFG)


def _target(pods: list[PodView], groups_: int = 1, trtllm: Parallelism | None = TP16) -> GroupTarget:
    server = LLMServer.TRTLLM_SERVE if trtllm is not None else LLMServer.LLAMA_CPP
    return GroupTarget(
        namespace="team-a",
        infd="chat",
        infd_uid="uid-1",
        shape=GroupShape(2, 8),
        groups=groups_,
        deployment=_deployment(server),
        gpu_resource="nvidia.com/gpu",
        probe_port=8000,
        openai_port=8080,
        pods=pods,
        now=NOW,
        trtllm=trtllm,
    )


def _running(manifest: dict[str, Any], ip: str) -> PodView:
    obj = copy.deepcopy(manifest)
    obj["metadata"]["uid"], obj["metadata"]["creationTimestamp"] = "uid-x", iso(NOW - 60)
    obj["spec"]["nodeName"] = "gpu-h100-1"
    obj["status"] = {
        "phase": "Running",
        "podIP": ip,
        "conditions": [{"type": "Ready", "status": "True"}],
        "containerStatuses": [{"name": "serve", "ready": True, "restartCount": 0, "state": {"running": {}}}],
    }
    return PodView.from_k8s(obj)


def _value(command: list[str], flag: str) -> str:
    return command[command.index(flag) + 1]


def test_the_leader_and_worker_carry_the_mapping_and_the_worker_fetches_what_the_leader_names() -> None:
    ids = groups.rank_identities("chat", 0, GroupShape(2, 8))
    dep = _deployment()
    kw: dict[str, Any] = {"gpus": 8, "gpu_resource": "nvidia.com/gpu", "probe_port": 8000, "trtllm": TP16}
    leader = group_pods.rank_pod(dep, ids[0], ids, addresses={1: "10.0.0.7"}, **kw)
    worker = group_pods.rank_pod(dep, ids[1], ids, **kw)
    (lc,), (wc,) = leader["spec"]["containers"], worker["spec"]["containers"]
    lcmd, wcmd = lc["command"], wc["command"]
    assert _value(lcmd, "--worker") == "10.0.0.7:50052:8000"
    for cmd in (lcmd, wcmd):
        assert (_value(cmd, "--tensor-parallel"), _value(cmd, "--pipeline-parallel")) == ("16", "1")
        assert _value(cmd, "--gpus-per-rank") == "8" and _value(cmd, "--server") == "trtllm-serve"
    assert _value(wcmd, "--rank") == "1"
    for flag in ("--store", "--checkpoint", "--tuning", "--cache-dir"):  # the same verified paths
        assert _value(wcmd, flag) == _value(lcmd, flag), flag
    assert "--port" not in wcmd and "--model-name" not in wcmd
    # The leader alone runs as its group's account, with a token and its namespace.
    assert leader["spec"]["serviceAccountName"] == "chat-g0-rank-exec"
    assert leader["spec"]["automountServiceAccountToken"] is True
    assert {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}} in lc[
        "env"
    ]
    assert worker["spec"]["serviceAccountName"] == dep["spec"]["template"]["spec"]["serviceAccountName"]
    assert worker["spec"]["automountServiceAccountToken"] is False
    assert "POD_NAMESPACE" not in {e["name"] for e in wc["env"]}


def test_a_llama_cpp_group_is_as_before() -> None:
    ids = groups.rank_identities("chat", 0, GroupShape(2, 8))
    dep = _deployment(LLMServer.LLAMA_CPP)
    kw: dict[str, Any] = {"gpus": 8, "gpu_resource": "nvidia.com/gpu", "probe_port": 8000}
    leader = group_pods.rank_pod(dep, ids[0], ids, **kw)
    worker = group_pods.rank_pod(dep, ids[1], ids, **kw)
    assert "--tensor-parallel" not in leader["spec"]["containers"][0]["command"]
    assert "--checkpoint" not in worker["spec"]["containers"][0]["command"]  # it fetches nothing
    assert leader["spec"]["automountServiceAccountToken"] is False
    assert not plan_groups(_target([], trtllm=None)).access


def test_the_leaders_account_role_and_binding_grant_exec_on_its_workers_only() -> None:
    ids = groups.rank_identities("chat", 0, GroupShape(3, 8))
    sa, role, binding = group_rbac.rank_exec_access(ids, "team-a", OWNER)
    assert [o["kind"] for o in (sa, role, binding)] == ["ServiceAccount", "Role", "RoleBinding"]
    for o in (sa, role, binding):
        assert o["metadata"]["name"] == "chat-g0-rank-exec" and o["metadata"]["namespace"] == "team-a"
        assert o["metadata"]["ownerReferences"] == [OWNER]
    assert sa["automountServiceAccountToken"] is False  # only the leader's pod asks for a token
    assert role["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["pods/exec"],
            "resourceNames": ["chat-g0-1", "chat-g0-2"],
            "verbs": ["create"],
        }
    ]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "chat-g0-rank-exec",
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "chat-g0-rank-exec", "namespace": "team-a"}
    ]


def test_a_forming_group_applies_its_access_and_a_group_scaled_away_deletes_it() -> None:
    first = plan_groups(_target([]))
    assert [o["kind"] for o in first.access] == ["ServiceAccount", "Role", "RoleBinding"]
    (worker,) = first.create_pods
    second = plan_groups(_target([_running(worker, "10.0.0.7")]))
    (leader,) = second.create_pods
    assert leader["spec"]["serviceAccountName"] == "chat-g0-rank-exec"
    assert second.access == first.access  # the same objects each pass: applied on a hash difference
    gone = plan_groups(_target([_running(worker, "10.0.0.7")], groups_=0))
    assert gone.delete_access == ["chat-g0-rank-exec"]


def _engine() -> TRTEngine:
    return TRTEngine.model_validate(
        {
            "metadata": {"name": "smollm2", "namespace": "team-a"},
            "spec": {
                "llm": {"source": {"uri": "pvc://models/smollm2", "sha256": "f" * 64}, "recipe": "bf16"},
                "targets": [{"gpu": H100.gpu, "parallelism": {"tensor": 16}}],
            },
            "status": {
                "checkpoint": {"phase": "Ready", "checkpointKey": CKPT},
                "targets": [{"name": H100.name, "gpu": H100.gpu, "phase": "Ready", "tuningKey": TUNE}],
            },
        }
    )


def test_the_pass_applies_the_leaders_access_before_any_rank_pod() -> None:
    d = InferenceDeployment.model_validate(
        {
            "metadata": {"name": "chat", "namespace": "team-a", "uid": "uid-1", "generation": 1},
            "spec": {"engineRef": {"name": "smollm2"}, "llm": {"server": "trtllm-serve"}},
        }
    )
    obs = deployment_observed(d, _engine(), NOW)
    actions = plan_deployment(obs, GRANTED).actions
    access = [i for i, a in enumerate(actions) if isinstance(a, ApplyRankExecAccess)]
    pods = [i for i, a in enumerate(actions) if isinstance(a, CreatePod)]
    assert len(access) == 3 and pods and max(access) < min(pods)
    (worker,) = [a.manifest for a in actions if isinstance(a, CreatePod)]
    assert _value(worker["spec"]["containers"][0]["command"], "--tensor-parallel") == "16"
    assert not any(isinstance(a, DeleteChild) and a.kind is ChildKind.RANK_EXEC_ACCESS for a in actions)

    # Not granted (the chart's default): refused in the Groups condition, naming the value; no
    # account, Role or pod is made.
    refused = plan_deployment(obs, CFG)
    assert not any(isinstance(a, ApplyRankExecAccess | CreatePod) for a in refused.actions)
    groups_cond = next(c for c in refused.status.conditions if c.type == "Groups")
    assert (groups_cond.status, groups_cond.reason) == ("False", "RankExecNotGranted")
    assert "rbac.rankExec=true" in groups_cond.message and "pods/exec" in groups_cond.message

    # Made while granted, then the grant withdrawn: the group goes whole; its leader's account and
    # Role stay for the InferenceDeployment's deletion (the operator may no longer delete them).
    made = _running(dict(worker), "10.0.0.7")
    withdrawn = plan_deployment(dataclasses.replace(obs, pods=[made]), CFG).actions
    assert DeleteChild(ChildKind.POD, made.name) in withdrawn
    assert not any(isinstance(a, DeleteChild) and a.kind is ChildKind.RANK_EXEC_ACCESS for a in withdrawn)

    # groupBackend lws starts llama.cpp's ranks only: a trtllm-serve group there is refused, with
    # no LeaderWorkerSet rendered.
    assert d.spec.llm is not None
    on_lws = d.spec.model_copy(
        update={"llm": d.spec.llm.model_copy(update={"group_backend": GroupBackend.LWS})}
    )
    lws_plan = plan_deployment(dataclasses.replace(obs, spec=on_lws, lws_served=True), GRANTED)
    assert not any(isinstance(a, ApplyLeaderWorkerSet | CreatePod) for a in lws_plan.actions)
    lws_cond = next(c for c in lws_plan.status.conditions if c.type == "Groups")
    assert (lws_cond.status, lws_cond.reason) == ("False", "LeaderWorkerSetTrtllmUnsupported")
    assert "groupBackend native" in lws_cond.message


def test_a_trtllm_groups_pods_reach_each_other_on_any_port_and_others_only_the_open_ones() -> None:
    (policy,) = plan_groups(_target([])).policies
    members = {"podSelector": {"matchLabels": {groups.LABEL_GROUP: "chat-g0"}}}
    assert policy["spec"]["ingress"] == [
        {"from": [members]},  # OpenMPI's daemons and NCCL pick their ports at run time
        {"ports": [{"protocol": "TCP", "port": 8000}, {"protocol": "TCP", "port": 8080}]},
    ]
    (rpc,) = plan_groups(_target([], trtllm=None)).policies
    assert rpc["spec"]["ingress"][0]["ports"] == [{"protocol": "TCP", "port": 50052}]
