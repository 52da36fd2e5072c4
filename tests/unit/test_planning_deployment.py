"""InferenceDeployment planning: a Deployment per Ready target, rollouts on new engines, the fault loop."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest
from trtforge_operator.api import FaultRecord, InferenceDeployment, TRTEngine, VerifiedModel, get_condition
from trtforge_operator.apply import children
from trtforge_operator.config import OperatorConfig
from trtforge_operator.labels import (
    ANNOTATION_ENGINE_SHA256,
    APP_MANAGED_BY,
    LABEL_BUILD_KIND,
    LABEL_TARGET,
    MANAGED_BY,
)
from trtforge_operator.observe.views import AutoscalerView, DeploymentView, JobView, NodeView, PodView
from trtforge_operator.planning import faults
from trtforge_operator.planning.autoscaling import AutoscalingApis, HpaApi
from trtforge_operator.planning.deployment import DeploymentObserved, plan_deployment
from trtforge_operator.planning.pruned import LAST_APPLIED, UNKNOWN_FIELDS
from trtforge_operator.planning.rebuild import rebuild_job
from trtforge_operator.pod_spec import fingerprint

from tests.fakes import default_nodes, deployment_observed, gpu_node, iso, job
from trtforge.contract.gpu import GPUTarget

NOW = 1_800_000_000.0
CFG = OperatorConfig(
    backends={"gpu": "onnxruntime"},
    broker={"url": "http://broker:8081"},
)
H100 = GPUTarget(gpu="NVIDIA-H100-80GB-HBM3")
MIG = GPUTarget(gpu="NVIDIA-B200", mig="3g.90gb")
KEY_H, KEY_M = "1" * 64, "2" * 64


def engine(sha_h: str = "a" * 64, phase_h: str = "Ready", model: dict[str, Any] | None = None) -> TRTEngine:
    return TRTEngine.model_validate(
        {
            "metadata": {"name": "resnet", "namespace": "team-a"},
            "spec": {
                "model": model or {"uri": "pvc://models/r.onnx", "sha256": "f" * 64},
                "targets": [{"gpu": H100.gpu}, {"gpu": MIG.gpu, "mig": MIG.mig}],
            },
            "status": {
                "model": {"sha256": "f" * 64},  # the namespace proved it holds the model
                "targets": [
                    {
                        "name": H100.name,
                        "gpu": H100.gpu,
                        "phase": phase_h,
                        "engineKey": KEY_H,
                        "sha256": sha_h,
                    },
                    {
                        "name": MIG.name,
                        "gpu": MIG.gpu,
                        "mig": MIG.mig,
                        "phase": "Ready",
                        "engineKey": KEY_M,
                        "sha256": "b" * 64,
                    },
                ],
            },
        }
    )


def infd(status: dict[str, Any] | None = None, **spec: Any) -> InferenceDeployment:
    return InferenceDeployment.model_validate(
        {
            "metadata": {"name": "resnet", "namespace": "team-a", "uid": "uid-1", "generation": 1},
            "spec": {"engineRef": {"name": "resnet"}, **spec},
            "status": status or {},
        }
    )


def observed(
    d: InferenceDeployment,
    e: TRTEngine | None,
    *,
    deployments: Sequence[dict[str, Any]] = (),
    pods: Sequence[dict[str, Any]] = (),
    nodes: list[dict[str, Any]] | None = None,
    jobs: Sequence[dict[str, Any]] = (),
    now: float = NOW,
    autoscalers: Sequence[AutoscalerView] = (),
    hpa_api: HpaApi | None = None,
    keda: bool = False,
) -> DeploymentObserved:
    if pods and not deployments and e is not None:  # pods come from the operator's Deployments
        deployments = [
            live(o)
            for o in plan_deployment(observed(d, e, nodes=nodes), CFG).apply
            if o["kind"] == "Deployment"
        ]
    deployments = [
        {**x, "metadata": {**x["metadata"], "uid": f"dep-{x['metadata']['name']}"}} for x in deployments
    ]
    # Each pod's ReplicaSet (rs-<target>) is one of its target's Deployment (planning/fault_trust.py).
    owners = {
        f"rs-{t.name}": (f"dep-{children.deployment_name('resnet', t)}", fingerprint({})) for t in (H100, MIG)
    }
    return deployment_observed(
        d,
        e,
        now,
        deployments=[DeploymentView.from_k8s(x) for x in deployments],
        pods=[PodView.from_k8s(p) for p in pods],
        nodes=[NodeView.from_k8s(n) for n in (nodes or default_nodes())],
        jobs=[JobView.from_k8s(j) for j in jobs],
        autoscalers=autoscalers,
        apis=AutoscalingApis(hpa=hpa_api, keda=keda),
        replica_sets=owners,
    )


def live(dep: dict[str, Any], *, ready: int | None = None) -> dict[str, Any]:
    """A Deployment as the apiserver shows it once its rollout finished (or with `ready` pods)."""
    d = json.loads(json.dumps(dep))
    n = d["spec"]["replicas"]
    d["metadata"]["generation"] = 1
    d["status"] = {
        "observedGeneration": 1,
        "replicas": n,
        "updatedReplicas": n,
        "readyReplicas": n if ready is None else ready,
        "availableReplicas": n,
    }
    return d


def pod(
    name: str,
    node: str,
    target: GPUTarget = H100,
    *,
    terminated: dict[str, Any] | None = None,
    last: dict[str, Any] | None = None,
) -> dict[str, Any]:
    cs: dict[str, Any] = {
        "name": "serve",
        "ready": terminated is None,
        "restartCount": 1 if last else 0,
        "state": {"terminated": terminated} if terminated else {"running": {}},
    }
    if last:
        cs["lastState"] = {"terminated": last}
    return {
        "metadata": {
            "name": name,
            "namespace": "team-a",
            "uid": f"u-{name}",
            "labels": {**children.selector_labels("resnet", target), APP_MANAGED_BY: MANAGED_BY},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": "rs",
                    "uid": f"rs-{target.name}",
                    "controller": True,
                }
            ],
        },
        "spec": {"nodeName": node},
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [cs],
        },
    }


def gpu_fault(xid: int = 79, at: float = NOW - 2) -> dict[str, Any]:
    msg = json.dumps(
        {
            "reason": "GPUFault",
            "message": "Xid",
            "xid": xid,
            "gpu": "GPU-1234",
            "gpus": ["GPU-1234"],
            "time": at,
        }
    )
    return {"exitCode": 86, "reason": "Error", "message": msg, "finishedAt": iso(at)}


def test_one_deployment_per_ready_target_and_one_service() -> None:
    plan = plan_deployment(observed(infd(), engine()), CFG)
    deps = [o for o in plan.apply if o["kind"] == "Deployment"]
    svcs = [o for o in plan.apply if o["kind"] == "Service"]
    assert len(deps) == 2 and len(svcs) == 1
    by_target = {d["metadata"]["labels"][LABEL_TARGET]: d for d in deps}
    h = by_target[H100.name]["spec"]["template"]["spec"]
    assert h["nodeSelector"]["nvidia.com/gpu.product"] == H100.gpu
    assert h["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    m = by_target[MIG.name]["spec"]["template"]["spec"]
    assert m["containers"][0]["resources"]["limits"] == {"nvidia.com/mig-3g.90gb": "1"}
    cmd = h["containers"][0]["command"]
    assert cmd[:2] == ["trtforge", "serve"] and cmd[cmd.index("--engine") + 1] == KEY_H
    assert cmd[cmd.index("--store") + 1] == "http://broker:8081"
    assert h["containers"][0]["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert cmd[cmd.index("--grpc-port") + 1] == "8001"
    assert [(p["name"], p["containerPort"]) for p in h["containers"][0]["ports"]] == [
        ("http", 8000),
        ("grpc", 8001),
    ]
    assert [(p["name"], p["port"]) for p in svcs[0]["spec"]["ports"]] == [("http", 8000), ("grpc", 8001)]
    strategy = by_target[H100.name]["spec"]["strategy"]["rollingUpdate"]
    assert strategy["maxUnavailable"] == 0  # the old engine keeps serving until the new one is Ready
    assert any(v.get("projected") for v in h["volumes"])  # the broker token, not store credentials
    assert by_target[H100.name]["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert get_condition(plan.status.conditions, "Ready").status == "False"  # type: ignore[union-attr]


def test_instances_and_workers_pass_through_and_are_left_to_the_runtime_when_unset() -> None:
    def cmd(d: InferenceDeployment) -> list[str]:
        dep = next(o for o in plan_deployment(observed(d, engine()), CFG).apply if o["kind"] == "Deployment")
        return list(dep["spec"]["template"]["spec"]["containers"][0]["command"])

    unset = cmd(infd())
    assert "--instances" not in unset and "--workers" not in unset  # the runtime sizes itself
    got = cmd(infd(runtime={"instances": 2, "workers": 3}))
    assert got[got.index("--instances") + 1] == "2" and got[got.index("--workers") + 1] == "3"


def test_ready_when_every_target_has_its_replicas_and_stable_after() -> None:
    first = plan_deployment(observed(infd(replicas=4), engine()), CFG)
    deps = [live(o) for o in first.apply if o["kind"] == "Deployment"]
    plan = plan_deployment(observed(infd(replicas=4), engine(), deployments=deps), CFG)
    assert [o["kind"] for o in plan.apply] == ["Service"]  # Deployments unchanged: nothing to write
    ready = get_condition(plan.status.conditions, "Ready")
    assert ready is not None and ready.status == "True" and plan.status.ready == "4/4"
    again = plan_deployment(
        observed(infd(replicas=4, status=plan.status.to_wire()), engine(), deployments=deps, now=NOW + 100),
        CFG,
    )
    assert again.status.to_wire() == plan.status.to_wire()


def test_a_rebuilt_artifact_rolls_the_template() -> None:
    first = plan_deployment(observed(infd(), engine()), CFG)
    deps = [live(o) for o in first.apply if o["kind"] == "Deployment"]
    plan = plan_deployment(observed(infd(), engine(sha_h="c" * 64), deployments=deps), CFG)
    (changed,) = [o for o in plan.apply if o["kind"] == "Deployment"]
    assert changed["spec"]["template"]["metadata"]["annotations"][ANNOTATION_ENGINE_SHA256] == "c" * 64
    assert get_condition(plan.status.conditions, "Progressing").status == "True"  # type: ignore[union-attr]


def test_while_an_engine_builds_the_old_deployment_is_left_alone() -> None:
    first = plan_deployment(observed(infd(), engine()), CFG)
    deps = [live(o) for o in first.apply if o["kind"] == "Deployment"]
    plan = plan_deployment(observed(infd(), engine(phase_h="Building"), deployments=deps), CFG)
    assert [o for o in plan.apply if o["kind"] == "Deployment"] == []
    assert plan.delete_deployments == []
    assert get_condition(plan.status.conditions, "Ready").reason == "EngineNotReady"  # type: ignore[union-attr]


def test_subset_of_targets_and_missing_engine() -> None:
    plan = plan_deployment(
        observed(infd(replicas=3, targets=[{"gpu": MIG.gpu, "mig": MIG.mig, "replicas": 2}]), engine()), CFG
    )
    (dep,) = [o for o in plan.apply if o["kind"] == "Deployment"]
    assert dep["spec"]["replicas"] == 3 and dep["metadata"]["labels"][LABEL_TARGET] == MIG.name
    missing = plan_deployment(observed(infd(), None), CFG)
    assert missing.apply == []
    assert get_condition(missing.status.conditions, "Ready").reason == "EngineNotFound"  # type: ignore[union-attr]


def test_gpu_fault_moves_the_pod_records_it_and_rebuilds() -> None:
    first = plan_deployment(observed(infd(), engine()), CFG)
    deps = [live(o) for o in first.apply if o["kind"] == "Deployment"]
    pods = [pod("p-h100", "gpu-h100-0", last=gpu_fault()), pod("p-mig", "gpu-b200-mig-0", MIG)]
    nodes = [gpu_node("gpu-h100-0", H100.gpu, 8, allocatable={"nvidia.com/gpu": 7}), *default_nodes()[1:]]
    plan = plan_deployment(observed(infd(), engine(), deployments=deps, pods=pods, nodes=nodes), CFG)
    (f,) = plan.status.faults
    assert (f.pod, f.node, f.xid, f.gpu, f.target, f.action) == (
        "p-h100",
        "gpu-h100-0",
        79,
        "GPU-1234",
        H100.name,
        faults.FaultAction.MOVED_REBUILD,
    )
    assert f.recovered_seconds is None
    assert plan.delete_pods == ["p-h100"]
    # Only the H100 Deployment changes: it now keeps off the faulty node.
    (dep,) = [o for o in plan.apply if o["kind"] == "Deployment"]
    terms = dep["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert terms == [
        {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["gpu-h100-0"]}]}
    ]
    # The deployment asks its TRTEngine for the rebuild; the engine's planner makes this Job.
    (rq,) = plan.rebuild_requests
    assert (rq.requester, rq.target, rq.engine_key) == ("team-a/resnet", H100.name, KEY_H)
    rb = rebuild_job(
        engine().spec,
        engine().status,
        "team-a/resnet",
        observed(infd(), engine(), nodes=nodes).nodes,
        CFG,
        rq,
    )
    assert rb is not None
    assert rb["metadata"]["labels"][LABEL_BUILD_KIND] == "rebuild"
    assert "--rebuild" in rb["spec"]["template"]["spec"]["containers"][0]["command"]
    assert "gpu-h100-0" in json.dumps(rb["spec"]["template"]["spec"]["affinity"])  # built on a healthy node
    assert get_condition(plan.status.conditions, "Degraded").reason == "GPUFault"  # type: ignore[union-attr]

    # Next pass: the fault is known (no second record, no second rebuild Job while it runs).
    d2 = infd(status=plan.status.to_wire())
    rb_running = job(rb, at=NOW)
    plan2 = plan_deployment(
        observed(d2, engine(), deployments=deps, pods=pods, nodes=nodes, jobs=[rb_running], now=NOW + 3), CFG
    )
    assert len(plan2.status.faults) == 1 and plan2.rebuild_requests == [rq]  # the same request, still

    # The rebuild published, the H100 pods run elsewhere on the new template: recovered, with the time.
    done = job(rb, state="complete", at=NOW, result={"key": KEY_H, "sha256": "a" * 64, "cacheHit": False})
    moved = [pod("p-h100-new", "gpu-h100-1"), pod("p-mig", "gpu-b200-mig-0", MIG)]
    moved_h100 = [live(o) for o in plan.apply if o["kind"] == "Deployment"]
    deps3 = moved_h100 + [d for d in deps if d["metadata"]["labels"][LABEL_TARGET] == MIG.name]
    plan3 = plan_deployment(
        observed(
            infd(status=plan2.status.to_wire()),
            engine(),
            deployments=deps3,
            pods=moved,
            nodes=nodes,
            jobs=[done],
            now=NOW + 20,
        ),
        CFG,
    )
    (f3,) = plan3.status.faults
    assert f3.recovered_seconds == 22.0
    assert get_condition(plan3.status.conditions, "Ready").status == "True"  # type: ignore[union-attr]
    assert get_condition(plan3.status.conditions, "Degraded").status == "False"  # type: ignore[union-attr]


def test_a_rebuild_reads_the_verified_staged_model_not_the_tenants_secret() -> None:

    private = {"uri": "s3://models/r.onnx", "secretRef": {"name": "s3-creds"}}
    e = engine(model=private)
    e = e.model_copy(update={"status": e.status.model_copy(update={"model": VerifiedModel(sha256="d" * 64)})})
    pods = [pod("p-h100", "gpu-h100-0", terminated=gpu_fault())]
    plan = plan_deployment(observed(infd(), e, pods=pods), CFG)
    (rq,) = plan.rebuild_requests
    rb = rebuild_job(
        e.spec, e.status, "team-a/resnet", observed(infd(), engine()).nodes, CFG, rq, cache_scope="ns:team-a"
    )
    assert rb is not None
    c = rb["spec"]["template"]["spec"]["containers"][0]
    assert "envFrom" not in c  # the build never holds the tenant's credentials
    cmd = c["command"]
    assert cmd[cmd.index("--sha256") + 1] == "d" * 64 and "--staged-model" in cmd
    assert cmd[cmd.index("--cache-scope") + 1] == "ns:team-a" and "--rebuild" in cmd
    # Not proven (no status.model): no rebuild of a model the namespace has not shown it holds.
    unproven = e.model_copy(update={"status": e.status.model_copy(update={"model": None})})
    assert (
        rebuild_job(
            unproven.spec, unproven.status, "team-a/resnet", observed(infd(), engine()).nodes, CFG, rq
        )
        is None
    )


def test_rebuild_disabled_still_moves_the_pod() -> None:
    d = infd(faultPolicy={"rebuildOnGPUFault": False})
    pods = [pod("p-h100", "gpu-h100-0", terminated=gpu_fault())]
    plan = plan_deployment(observed(d, engine(), pods=pods), CFG)
    assert plan.status.faults[0].action == faults.FaultAction.MOVED_REBUILD_DISABLED
    assert plan.rebuild_requests == [] and plan.delete_pods == ["p-h100"]


def test_rebuilds_are_rate_limited_per_hour() -> None:
    past = [
        FaultRecord(
            time=f"2027-01-15T09:{m:02d}:00Z",
            pod=f"old-{m}",
            node="gpu-h100-1",
            target=H100.name,
            xid=79,
            action=faults.FaultAction.MOVED_REBUILD,
            recovered_seconds=10,
        )
        for m in (30, 40, 50)
    ]
    d = infd(status={"faults": [p.to_wire() for p in past]}, faultPolicy={"maxRebuildsPerHour": 3})
    now = past[-1].time.timestamp() + 60
    plan = plan_deployment(
        observed(d, engine(), pods=[pod("p", "gpu-h100-0", terminated=gpu_fault(at=now))], now=now), CFG
    )
    assert (
        plan.status.faults[-1].action == faults.FaultAction.MOVED_RATE_LIMITED and plan.rebuild_requests == []
    )


def test_node_losing_a_gpu_is_a_fault_for_the_pods_on_it() -> None:
    nodes = [gpu_node("gpu-h100-0", H100.gpu, 8, allocatable={"nvidia.com/gpu": 7}), *default_nodes()[1:]]
    plan = plan_deployment(observed(infd(), engine(), pods=[pod("p", "gpu-h100-0")], nodes=nodes), CFG)
    (f,) = plan.status.faults
    assert f.node == "gpu-h100-0" and f.node_problem == "AllocatableDropped"
    # The Ready pod is not deleted (that would fight the Deployment controller): the template now keeps
    # off the node, and the rollout replaces the pod once its successor is Ready elsewhere.
    assert plan.delete_pods == []
    (dep,) = [
        o
        for o in plan.apply
        if o["kind"] == "Deployment" and o["metadata"]["labels"][LABEL_TARGET] == H100.name
    ]
    assert "gpu-h100-0" in json.dumps(dep["spec"]["template"]["spec"]["affinity"])


def test_engine_load_failure_rebuilds_without_blaming_the_node() -> None:
    msg = json.dumps({"reason": "EngineLoadFailed", "message": "TensorRT version mismatch"})
    p = pod(
        "p",
        "gpu-h100-0",
        last={"exitCode": 83, "reason": "Error", "message": msg, "finishedAt": iso(NOW - 1)},
    )
    plan = plan_deployment(observed(infd(), engine(), pods=[p]), CFG)
    (f,) = plan.status.faults
    assert (f.reason, f.action) == ("EngineLoadFailed", faults.FaultAction.REBUILD)
    assert plan.delete_pods == [] and len(plan.rebuild_requests) == 1
    assert faults.avoid_nodes(plan.status.faults, [], NOW, 3600) == set()


def test_several_suspect_nodes_each_get_their_own_field_selector() -> None:
    """The apiserver takes exactly one value per node field selector requirement."""
    req = children.RuntimeRequest(
        namespace="n",
        infd="x",
        infd_uid="u",
        target=H100,
        engine_key=KEY_H,
        engine_sha256="a" * 64,
        replicas=1,
        node_selector={},
        image="i",
        image_pull_policy="Never",
        avoid_nodes=("b", "a"),
    )
    dep = children.runtime_deployment(req, CFG)
    (term,) = dep["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert term["matchFields"] == [
        {"key": "metadata.name", "operator": "NotIn", "values": ["a"]},
        {"key": "metadata.name", "operator": "NotIn", "values": ["b"]},
    ]


def test_a_fault_recorded_by_an_inferencedeployment_becomes_its_trtengines_rebuild_job() -> None:
    """The deployment records the fault in its status; the engine's planner plans the rebuild from that
    record (its own status's engine key, the faulty node avoided) and creates the Job, once."""
    from trtforge_operator.observe.views import Capacity, EngineObserved
    from trtforge_operator.planning.engine import plan_engine
    from trtforge_operator.planning.rebuild import ObservedFaults

    nodes = [gpu_node("gpu-h100-0", H100.gpu, 8, allocatable={"nvidia.com/gpu": 7}), *default_nodes()[1:]]
    pods = [pod("p-h100", "gpu-h100-0", terminated=gpu_fault())]
    obs = observed(infd(), engine(), pods=pods, nodes=nodes)
    plan = plan_deployment(obs, CFG)
    assert not hasattr(plan, "jobs_to_create"), "the deployment planner never makes build Jobs"
    (request,) = plan.rebuild_requests
    recorded = ObservedFaults("team-a/resnet", tuple(plan.status.faults))

    def engine_pass(jobs: list[JobView], observed_faults: list[ObservedFaults]) -> list[dict[str, Any]]:
        e = engine()
        eo = EngineObserved(
            namespace="team-a",
            name=e.metadata.name,
            generation=1,
            spec=e.spec,
            status=e.status,
            nodes=obs.nodes,
            jobs=jobs,
            capacity=Capacity(0, 0, 10, 10),
            now=NOW,
            observed_faults=observed_faults,
        )
        return [
            j
            for j in plan_engine(eo, CFG).jobs_to_create
            if j["metadata"]["labels"][LABEL_BUILD_KIND] == "rebuild"
        ]

    (created,) = engine_pass([], [recorded])
    assert created["metadata"]["name"] == request.job_name
    assert created["metadata"]["annotations"]["trtforge.io/engine-key"] == KEY_H
    assert "gpu-h100-0" in json.dumps(created["spec"]["template"]["spec"]["affinity"])
    assert engine_pass([JobView.from_k8s(job(created, at=NOW))], [recorded]) == [], "create-if-absent"
    assert engine_pass([], []) == [], "no recorded fault: no rebuild"
    # A fault recorded by an InferenceDeployment of another namespace never counts here.
    assert engine_pass([], [ObservedFaults("team-b/resnet", recorded.records)]) == []


@pytest.mark.parametrize(
    "suspect,enabled,engine_known,limited,expected",
    [
        (True, True, True, False, faults.FaultAction.MOVED_REBUILD),
        (False, True, True, False, faults.FaultAction.REBUILD),
        (True, True, True, True, faults.FaultAction.MOVED_RATE_LIMITED),
        (False, True, True, True, faults.FaultAction.REBUILD_RATE_LIMITED),
        (True, False, True, False, faults.FaultAction.MOVED_REBUILD_DISABLED),
        (False, False, True, False, faults.FaultAction.REBUILD_DISABLED),
        # No engine key is its own cause, not a rate limit.
        (True, True, False, False, faults.FaultAction.MOVED_NO_ENGINE_KEY),
        (False, True, False, True, faults.FaultAction.NO_ENGINE_KEY),
    ],
)
def test_fault_actions_come_from_one_table(
    suspect: bool, enabled: bool, engine_known: bool, limited: bool, expected: faults.FaultAction
) -> None:
    got = faults.fault_action(
        node_suspect=suspect, rebuild_enabled=enabled, has_engine=engine_known, rate_limited=limited
    )
    assert got is expected


def test_a_node_level_fault_learns_its_xid_from_the_pod_by_its_typed_cause_not_its_text() -> None:
    from trtforge_operator.api.inferencedeployment import NodeProblem
    from trtforge_operator.observe.views import PodView

    terminated = PodView.from_k8s(pod("p", "gpu-h100-0", terminated=gpu_fault(xid=48)))

    def rec(problem: NodeProblem | None, reason: str) -> FaultRecord:
        return FaultRecord(
            time="2027-01-15T09:00:00Z",
            pod="p",
            node="gpu-h100-0",
            reason=reason,
            node_problem=problem,
            action=faults.FaultAction.MOVED,
        )

    node_level, not_ready, pod_level = faults.enrich_from_pods(
        [
            rec(NodeProblem.ALLOCATABLE_DROPPED, "AllocatableDropped nvidia.com/gpu 7/8"),
            rec(NodeProblem.NOT_READY, "NodeNotReady"),
            rec(None, "AllocatableDropped (text alone decides nothing)"),
        ],
        [terminated],
    )
    assert (node_level.xid, node_level.gpu, node_level.reason) == (48, "GPU-1234", None)
    assert node_level.node_problem == NodeProblem.ALLOCATABLE_DROPPED
    assert not_ready.xid is None and pod_level.xid is None


def test_a_field_the_apiserver_pruned_is_named_in_a_condition() -> None:
    applied = {"spec": {"engineRef": {"name": "resnet"}, "replica": 3}}
    obs = replace(observed(infd(), engine()), annotations={LAST_APPLIED: json.dumps(applied)})
    c = get_condition(plan_deployment(obs, CFG).status.conditions, UNKNOWN_FIELDS)
    assert c is not None and c.status == "True" and "spec.replica (did you mean spec.replicas?)" in c.message
    assert (
        get_condition(plan_deployment(observed(infd(), engine()), CFG).status.conditions, UNKNOWN_FIELDS)
        is None
    )
