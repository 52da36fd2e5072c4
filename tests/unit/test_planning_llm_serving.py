"""Serving an LLM engine: the server and its command per target, the typed reasons a target waits,
the Deployment (probes on `http`, the server's own OpenAI port) and the Service (no hop on the token
path), and the API's refusals."""

from __future__ import annotations

import dataclasses
import itertools
import json
from typing import Any

import pytest
from pydantic import ValidationError
from trtforge_operator.api import (
    InferenceDeployment,
    InferenceDeploymentSpec,
    LLMServer,
    LLMServing,
    TRTEngine,
)
from trtforge_operator.apply import children, group_pods, llm_children
from trtforge_operator.apply.llm_children import LLMRuntime
from trtforge_operator.config import OperatorConfig
from trtforge_operator.labels import ANNOTATION_ENGINE_KEY, ANNOTATION_SPEC_HASH, APP_MANAGED_BY, MANAGED_BY
from trtforge_operator.observe.views import DeploymentView, NodeView, PodView
from trtforge_operator.planning import faults, groups
from trtforge_operator.planning.autoscaling import AutoscalingApis, HpaApi
from trtforge_operator.planning.deployment import DeploymentObserved, plan_deployment
from trtforge_operator.planning.deployment_actions import CreatePod
from trtforge_operator.planning.host_cache import DEFAULT_POD_BASE_BYTES_PER_GPU
from trtforge_operator.planning.llm_serving import LLMEngineFacts, LLMProblem, llm_runtime
from trtforge_operator.pod_spec import fingerprint

from tests.fakes import deployment_observed, gpu_node, runtime_request
from trtforge.contract.gpu import GPUTarget

CPU = GPUTarget(gpu="cpu")
H100 = GPUTarget(gpu="NVIDIA-H100-80GB-HBM3")
CKPT, TUNE = "c" * 64, "t" * 64
NOW = 1_800_000_000.0
FACTS = LLMEngineFacts(
    checkpoint_key=CKPT, canary_prompt="The capital of France is", tuning_keys={CPU.name: TUNE}
)
CFG = OperatorConfig(
    backends={"gpu": "onnxruntime"},
    broker={"url": "http://broker:8081"},
    runtime_store_uri="s3://llm/store",
    groups={"rank_exec": True},  # trtllm-serve groups (the GH200 case) launch ranks through pods/exec
)
S3 = "s3://llm/store"


def _request(target: GPUTarget = CPU, **kw: Any) -> children.RuntimeRequest:
    return runtime_request(target, CKPT, **kw)


def test_an_onnx_engine_is_served_as_before_and_llm_settings_on_it_are_refused() -> None:
    assert llm_runtime(None, None, H100) is None
    assert llm_runtime(LLMServing(), None, H100) == LLMProblem.NOT_AN_LLM_ENGINE


def test_the_server_defaults_by_target_and_takes_the_engines_keys() -> None:
    cpu = llm_runtime(None, FACTS, CPU)
    assert cpu == LLMRuntime(LLMServer.LLAMA_CPP, CKPT, TUNE, 8080, ())
    gpu = llm_runtime(LLMServing(args=["--kv_cache_free_gpu_memory_fraction", "0.8"], port=9000), FACTS, H100)
    assert isinstance(gpu, LLMRuntime)
    assert gpu.server == LLMServer.TRTLLM_SERVE and gpu.tuning_key is None and gpu.openai_port == 9000
    assert gpu.server_args == ("--kv_cache_free_gpu_memory_fraction", "0.8")
    explicit = llm_runtime(LLMServing(server=LLMServer.LLAMA_CPP), FACTS, H100)
    assert isinstance(explicit, LLMRuntime) and explicit.server == LLMServer.LLAMA_CPP


def test_a_target_waits_with_a_typed_reason() -> None:
    unpublished = LLMEngineFacts(checkpoint_key=None, canary_prompt="p")
    assert llm_runtime(None, unpublished, CPU) == LLMProblem.NO_CHECKPOINT
    on_cpu = LLMServing(server=LLMServer.TRTLLM_SERVE)
    assert llm_runtime(on_cpu, FACTS, CPU) == LLMProblem.SERVER_NEEDS_GPU
    assert llm_runtime(LLMServing(canary_prompt="Other"), FACTS, CPU) == LLMProblem.CANARY_PROMPT_MISMATCH
    same = LLMServing(canary_prompt=FACTS.canary_prompt)
    assert isinstance(llm_runtime(same, FACTS, CPU), LLMRuntime)


def test_llm_pods_read_through_the_broker_by_default() -> None:
    brokered = OperatorConfig(backends={"gpu": "onnxruntime"}, broker={"url": "http://broker:8081"})
    plan = plan_deployment(_observed(_infd(), _llm_engine()), brokered)
    dep = next(m for m in plan.apply if m["kind"] == "Deployment")
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    flags = dict(itertools.pairwise(c["command"]))
    assert flags["--store"] == "http://broker:8081" and flags["--checkpoint"] == CKPT
    # the pod presents its projected token for the broker's audience, as engine pods do
    assert children.TOKEN_ENV in {e["name"] for e in c.get("env") or []}


def test_the_deployment_runs_serve_llm_with_probes_and_metrics_on_http() -> None:
    llm = LLMRuntime(LLMServer.LLAMA_CPP, CKPT, TUNE, 8080, ("--ctx-size", "1024"))
    dep = llm_children.llm_runtime_deployment(_request(port=8000), llm, CFG)
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    cmd = c["command"]
    assert cmd[:2] == ["trtforge", "serve-llm"]
    flags = dict(itertools.pairwise(cmd))
    assert flags["--server"] == "llama.cpp" and flags["--checkpoint"] == CKPT and flags["--tuning"] == TUNE
    assert flags["--store"] == S3 and flags["--probe-port"] == "8000"
    assert flags["--port"] == "8080" and flags["--host"] == "$(POD_IP)"
    assert cmd[cmd.index("--") + 1 :] == ["--ctx-size", "1024"]
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"http": 8000, "openai": 8080}
    assert c["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": 8000}
    assert c["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": 8000}
    annotations = dep["spec"]["template"]["metadata"]["annotations"]
    assert annotations[ANNOTATION_ENGINE_KEY] == CKPT
    assert annotations[llm_children.ANNOTATION_TUNING_KEY] == TUNE
    assert "resources" not in c or "nvidia.com/gpu" not in c["resources"].get("limits", {})


def test_a_new_checkpoint_tuning_record_or_server_rolls_the_pods() -> None:
    base = LLMRuntime(LLMServer.LLAMA_CPP, CKPT, TUNE)

    def hashed(llm: LLMRuntime) -> str:
        dep = llm_children.llm_runtime_deployment(_request(), llm, CFG)
        return str(dep["metadata"]["annotations"][ANNOTATION_SPEC_HASH])

    variants = [
        LLMRuntime(LLMServer.LLAMA_CPP, "d" * 64, TUNE),
        LLMRuntime(LLMServer.LLAMA_CPP, CKPT, "u" * 64),
        LLMRuntime(LLMServer.LLAMA_CPP, CKPT, None),
        LLMRuntime(LLMServer.TRTLLM_SERVE, CKPT, TUNE),
        LLMRuntime(LLMServer.LLAMA_CPP, CKPT, TUNE, server_args=("--ctx-size", "4096")),
    ]
    assert len({hashed(base), *(hashed(v) for v in variants)}) == 1 + len(variants)
    assert hashed(base) == hashed(LLMRuntime(LLMServer.LLAMA_CPP, CKPT, TUNE))


def test_a_gpu_target_asks_for_its_gpu() -> None:
    dep = llm_children.llm_runtime_deployment(
        _request(H100), LLMRuntime(LLMServer.TRTLLM_SERVE, CKPT, None), CFG
    )
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert "--tuning" not in c["command"]


def test_the_onnx_runtime_deployment_is_unchanged_by_the_llm_branch() -> None:
    (c,) = children.runtime_deployment(_request(), CFG)["spec"]["template"]["spec"]["containers"]
    assert c["command"][:2] == ["trtforge", "serve"]
    assert [p["name"] for p in c["ports"]] == ["http", "grpc"]


def test_the_service_sends_openai_straight_to_the_server() -> None:
    svc = llm_children.llm_service("team-a", "chat", "uid-1", 8000, 8080)
    ports = {p["name"]: (p["port"], p["targetPort"]) for p in svc["spec"]["ports"]}
    assert ports == {"openai": (8080, 8080), "http": (8000, 8000)}
    assert svc["spec"]["selector"] == children.selector_labels("chat")
    assert llm_children.openai_endpoint("chat", "team-a", 8080) == "http://chat.team-a.svc:8080/v1"


@pytest.mark.parametrize("arg", ["--port", "--host=0.0.0.0", "-m", "--metrics", "--tp_size"])
def test_flags_the_supervisor_sets_are_refused_naming_the_field(arg: str) -> None:
    with pytest.raises(ValidationError, match=r"llm.args: .* is set by trtforge serve-llm itself"):
        LLMServing(args=[arg, "1"])


def test_the_openai_port_must_differ_from_the_probe_port() -> None:
    with pytest.raises(ValidationError, match=r"llm\.port must differ from runtime\.port"):
        InferenceDeploymentSpec.model_validate({"engineRef": {"name": "e"}, "llm": {"port": 8000}})


# ------------------------------------------------------------------ the whole pass, with an LLM engine


def _llm_engine(checkpoint_phase: str = "Ready") -> TRTEngine:
    return TRTEngine.model_validate(
        {
            "metadata": {"name": "smollm2", "namespace": "team-a"},
            "spec": {
                "llm": {"source": {"uri": "pvc://models/smollm2.gguf", "sha256": "f" * 64}, "recipe": "bf16"},
                "targets": [{"gpu": "cpu"}],
            },
            "status": {
                "checkpoint": {"phase": checkpoint_phase, "checkpointKey": CKPT},
                "targets": [{"name": CPU.name, "gpu": "cpu", "phase": "Ready", "tuningKey": TUNE}],
            },
        }
    )


def _infd(**spec: Any) -> InferenceDeployment:
    return InferenceDeployment.model_validate(
        {
            "metadata": {"name": "chat", "namespace": "team-a", "uid": "uid-1", "generation": 1},
            "spec": {"engineRef": {"name": "smollm2"}, **spec},
        }
    )


def _observed(d: InferenceDeployment, e: TRTEngine, hpa_api: HpaApi | None = None) -> DeploymentObserved:
    return deployment_observed(d, e, NOW, apis=AutoscalingApis(hpa=hpa_api, keda=False))


def test_an_llm_engine_gets_a_serve_llm_deployment_an_openai_service_and_its_endpoint() -> None:
    plan = plan_deployment(_observed(_infd(llm={"args": ["--ctx-size", "1024"]}), _llm_engine()), CFG)
    dep, svc = plan.apply
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    assert c["command"][:2] == ["trtforge", "serve-llm"]
    assert c["command"][c["command"].index("--checkpoint") + 1] == CKPT
    assert c["command"][c["command"].index("--tuning") + 1] == TUNE
    assert c["command"][-3:] == ["--", "--ctx-size", "1024"]
    assert [p["name"] for p in svc["spec"]["ports"]] == ["openai", "http"]
    assert plan.status.endpoint == "http://chat.team-a.svc:8080/v1"
    assert plan.status.server == LLMServer.LLAMA_CPP
    assert plan.status.targets[0].engine_key is None  # no Deployment seen yet


def test_an_unpublished_checkpoint_makes_no_deployment_and_says_why() -> None:
    plan = plan_deployment(_observed(_infd(), _llm_engine(checkpoint_phase="Building")), CFG)
    assert [m["kind"] for m in plan.apply] == ["Service"]
    assert "publish its quantized checkpoint" in (plan.status.targets[0].message or "")


def test_llm_settings_on_an_onnx_engine_make_no_deployment_and_say_why() -> None:
    onnx = TRTEngine.model_validate(
        {
            "metadata": {"name": "smollm2", "namespace": "team-a"},
            "spec": {
                "model": {"uri": "pvc://models/r.onnx", "sha256": "f" * 64},
                "targets": [{"gpu": "cpu"}],
            },
            "status": {
                "targets": [
                    {"name": CPU.name, "gpu": "cpu", "phase": "Ready", "engineKey": CKPT, "sha256": "a" * 64}
                ]
            },
        }
    )
    plan = plan_deployment(_observed(_infd(llm={}), onnx), CFG)
    assert [m["kind"] for m in plan.apply] == ["Service"]
    assert "is not an LLM engine" in (plan.status.targets[0].message or "")
    assert plan.status.server is None


def test_an_llm_deployment_autoscales_on_waiting_requests() -> None:
    auto = {"minReplicas": 1, "maxReplicas": 2, "metric": "QueueDepth", "targetValue": "500m"}
    plan = plan_deployment(_observed(_infd(autoscaling=auto), _llm_engine(), HpaApi.V2), CFG)
    (hpa,) = plan.apply_autoscalers
    assert hpa["spec"]["metrics"][0]["pods"]["metric"]["name"] == "trtforge_runtime_queue_depth"
    assert hpa["spec"]["scaleTargetRef"]["name"] == plan.apply[0]["metadata"]["name"]


def test_an_xid_under_an_llm_pod_moves_it_off_the_node_as_for_engines() -> None:
    e = TRTEngine.model_validate(
        {
            "metadata": {"name": "smollm2", "namespace": "team-a"},
            "spec": {
                "llm": {"source": {"uri": "pvc://models/m", "sha256": "f" * 64}, "recipe": "fp8"},
                "targets": [{"gpu": H100.gpu}],
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
    first = plan_deployment(_observed(_infd(), e), CFG)
    (dep,) = [o for o in first.apply if o["kind"] == "Deployment"]
    assert "trtllm-serve" in dep["spec"]["template"]["spec"]["containers"][0]["command"]
    msg = json.dumps(
        {
            "reason": "GPUFault",
            "message": "Xid",
            "xid": 79,
            "gpu": "GPU-1",
            "gpus": ["GPU-1"],
            "time": NOW - 2,
        }
    )
    faulted = {
        "metadata": {
            "name": "chat-h100-x",
            "namespace": "team-a",
            "uid": "u-1",
            "labels": {**children.selector_labels("chat", H100), APP_MANAGED_BY: MANAGED_BY},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": "rs",
                    "uid": "rs-1",
                    "controller": True,
                }
            ],
        },
        "spec": {"nodeName": "gpu-h100-0"},
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "False"}],
            "containerStatuses": [
                {
                    "name": "serve",
                    "ready": False,
                    "restartCount": 1,
                    "state": {"running": {}},
                    "lastState": {"terminated": {"exitCode": 86, "reason": "Error", "message": msg}},
                }
            ],
        },
    }
    # The pod is the operator's: its ReplicaSet's controller is the Deployment the operator made.
    live = json.loads(json.dumps(dep))
    live["metadata"].update(uid="dep-1", generation=1)
    live["status"] = {"observedGeneration": 1, "replicas": 1, "updatedReplicas": 1, "readyReplicas": 0}
    obs = dataclasses.replace(
        _observed(_infd(), e),
        pods=[PodView.from_k8s(faulted)],
        deployments=[DeploymentView.from_k8s(live)],
        replica_sets={"rs-1": ("dep-1", fingerprint({}))},
    )
    plan = plan_deployment(obs, CFG)
    (f,) = plan.status.faults
    assert (f.pod, f.xid, f.target, f.action) == ("chat-h100-x", 79, H100.name, "PodMovedAndRebuild")
    assert plan.delete_pods == ["chat-h100-x"]
    (moved,) = [o for o in plan.apply if o["kind"] == "Deployment"]
    assert "gpu-h100-0" in json.dumps(moved["spec"]["template"]["spec"]["affinity"])
    # It asks its TRTEngine to rebuild the target's checkpoint key: the engine re-runs that target's
    # tune Job under this name (planning/llm_engine.py), and the fault recovers once it is done.
    (rq,) = plan.rebuild_requests
    assert (rq.target, rq.engine_key, rq.avoid_nodes) == (H100.name, CKPT, ("gpu-h100-0",))
    assert rq.job_name == children.job_name(CKPT[:20], rebuild_of=faults.fault_id(f))


def test_the_front_proxy_never_sits_on_an_llms_token_path() -> None:
    proxied = CFG.model_copy(update={"front_proxy": CFG.front_proxy.model_copy(update={"enabled": True})})
    plan = plan_deployment(_observed(_infd(), _llm_engine()), proxied)
    dep, svc = plan.apply
    assert [c["name"] for c in dep["spec"]["template"]["spec"]["containers"]] == ["serve"]
    assert not [a for a in plan.actions if type(a).__name__ == "ApplyConfigMap"]
    assert {p["name"]: p["targetPort"] for p in svc["spec"]["ports"]}["openai"] == 8080


GH200 = GPUTarget(gpu="NVIDIA-GH200-480GB")
GiB = 1 << 30


def _gh200_engine(tensor: int = 1, overflow_mib: int | None = None) -> TRTEngine:
    target: dict[str, Any] = {"gpu": GH200.gpu, **({"parallelism": {"tensor": tensor}} if tensor > 1 else {})}
    status: dict[str, Any] = {"name": GH200.name, "gpu": GH200.gpu, "phase": "Ready", "tuningKey": TUNE}
    if overflow_mib is not None:
        status["weightsOverflowMiB"] = overflow_mib
    return TRTEngine.model_validate(
        {
            "metadata": {"name": "smollm2", "namespace": "team-a"},
            "spec": {
                "llm": {"source": {"uri": "pvc://models/smollm2", "sha256": "f" * 64}, "recipe": "bf16"},
                "targets": [target],
            },
            "status": {"checkpoint": {"phase": "Ready", "checkpointKey": CKPT}, "targets": [status]},
        }
    )


def _gh200_nodes(*memory: int) -> list[NodeView]:
    return [
        NodeView.from_k8s(gpu_node(f"gh-{i}", GH200.gpu, 1, allocatable={"memory": m}))
        for i, m in enumerate(memory)
    ]


def test_a_gh200_deployment_of_trtllm_serve_gets_the_host_tier_flag_and_its_memory() -> None:
    obs = dataclasses.replace(
        _observed(_infd(), _gh200_engine(overflow_mib=10 * 1024)), nodes=_gh200_nodes(472 * GiB, 600 * GiB)
    )
    dep = plan_deployment(obs, CFG).apply[0]
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    assert (
        c["command"][1] == "serve-llm" and c["command"][c["command"].index("--server") + 1] == "trtllm-serve"
    )
    per_rank = int(c["command"][c["command"].index("--host-cache-bytes") + 1])
    base = DEFAULT_POD_BASE_BYTES_PER_GPU
    assert per_rank == (472 * GiB - base - 10 * GiB) // 2  # the smaller node, less the spilled weights
    assert c["resources"]["requests"]["memory"] == c["resources"]["limits"]["memory"] == str(base + per_rank)
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"
    # llama.cpp on the same nodes: the pod as before
    plain = dataclasses.replace(
        _observed(_infd(llm={"server": "llama.cpp"}), _gh200_engine()), nodes=obs.nodes
    )
    (p,) = plan_deployment(plain, CFG).apply[0]["spec"]["template"]["spec"]["containers"]
    assert "--host-cache-bytes" not in p["command"] and "memory" not in p["resources"].get("limits", {})


def test_a_gh200_groups_leader_carries_the_flag_and_every_rank_the_memory() -> None:
    nodes = _gh200_nodes(472 * GiB, 472 * GiB)
    obs = dataclasses.replace(_observed(_infd(), _gh200_engine(tensor=2)), nodes=nodes)
    plan = plan_deployment(obs, CFG)
    (worker,) = [a.manifest for a in plan.actions if isinstance(a, CreatePod)]  # the leader comes later
    (w,) = worker["spec"]["containers"]
    base = DEFAULT_POD_BASE_BYTES_PER_GPU
    per_rank = (472 * GiB - base) // 2
    assert w["resources"]["requests"]["memory"] == str(base + per_rank)
    assert "--host-cache-bytes" not in w["command"]  # its MPI ranks take the leader's --config
    dep = llm_children.llm_runtime_deployment(
        _request(GH200),
        LLMRuntime(LLMServer.TRTLLM_SERVE, CKPT, TUNE, supervisor_args=("--host-cache-bytes", str(per_rank))),
        CFG,
    )
    ids = groups.rank_identities("chat", 0, groups.GroupShape(2, 1))
    leader = group_pods.rank_pod(dep, ids[0], ids, gpus=1, gpu_resource="nvidia.com/gpu", probe_port=8000)
    cmd = leader["spec"]["containers"][0]["command"]
    assert cmd[cmd.index("--host-cache-bytes") + 1] == str(per_rank) and "--world-size" in cmd


def _h100_engine(tensor: int) -> TRTEngine:
    return TRTEngine.model_validate(
        {
            "metadata": {"name": "smollm2", "namespace": "team-a"},
            "spec": {
                "llm": {"source": {"uri": "pvc://models/smollm2", "sha256": "f" * 64}, "recipe": "bf16"},
                "targets": [{"gpu": H100.gpu, "parallelism": {"tensor": tensor}}],
            },
            "status": {
                "checkpoint": {"phase": "Ready", "checkpointKey": CKPT},
                "targets": [{"name": H100.name, "gpu": H100.gpu, "phase": "Ready", "tuningKey": TUNE}],
            },
        }
    )


@pytest.mark.parametrize("tensor", [1, 4, 8])
def test_a_mapping_that_fits_one_node_is_one_pod_with_all_its_gpus(tensor: int) -> None:
    """tensor x pipeline up to a node's 8 H100s: one pod per replica asking for every GPU of it."""
    dep = plan_deployment(_observed(_infd(targets=[{"gpu": H100.gpu}]), _h100_engine(tensor)), CFG).apply[0]
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == str(tensor)
