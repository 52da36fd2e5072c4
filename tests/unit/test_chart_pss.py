"""Every pod the chart and the operator make passes the Pod Security Standards "restricted" profile.

The 1.20 test bed has no PodSecurity admission, so the check is a reading of the profile's rules
(test_chart_helpers.pss_restricted_violations), tested here against bad pods too so that it cannot
pass vacuously.
"""

from __future__ import annotations

from typing import Any

import pytest
from test_chart_helpers import TEMPLATES, pss_restricted_violations, skeleton


def _restricted_container() -> dict[str, Any]:
    return {
        "name": "c",
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "runAsNonRoot": True,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }


def test_checker_passes_a_restricted_pod() -> None:
    assert pss_restricted_violations({"containers": [_restricted_container()]}) == []


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda p: p.update(hostNetwork=True), "hostNetwork"),
        (lambda p: p.update(volumes=[{"name": "h", "hostPath": {"path": "/"}}]), "hostPath"),
        (lambda p: p["containers"][0]["securityContext"].update(privileged=True), "privileged"),
        (
            lambda p: p["containers"][0]["securityContext"].pop("allowPrivilegeEscalation"),
            "allowPrivilegeEscalation",
        ),
        (lambda p: p["containers"][0]["securityContext"].update(capabilities={"drop": ["NET_RAW"]}), "drop"),
        (
            lambda p: p["containers"][0]["securityContext"]["capabilities"].update(add=["SYS_ADMIN"]),
            "SYS_ADMIN",
        ),
        (lambda p: p["containers"][0]["securityContext"].pop("runAsNonRoot"), "runAsNonRoot"),
        (lambda p: p["containers"][0]["securityContext"].update(runAsUser=0), "runAsUser is 0"),
        (lambda p: p["containers"][0]["securityContext"].pop("seccompProfile"), "seccompProfile"),
        (
            lambda p: p["containers"][0]["securityContext"].update(seccompProfile={"type": "Unconfined"}),
            "seccomp",
        ),
        (lambda p: p["containers"][0].update(ports=[{"containerPort": 80, "hostPort": 80}]), "hostPort"),
        (lambda p: p.update(initContainers=[{"name": "init"}]), "initContainers[init]"),
        (
            lambda p: p.update(securityContext={"sysctls": [{"name": "kernel.msgmax", "value": "1"}]}),
            "sysctl",
        ),
    ],
)
def test_checker_catches(mutate: Any, needle: str) -> None:
    pod: dict[str, Any] = {"containers": [_restricted_container()]}
    mutate(pod)
    violations = pss_restricted_violations(pod)
    assert any(needle in v for v in violations), violations


def test_pod_level_settings_count_for_every_container() -> None:
    pod = {
        "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [
            {
                "name": "c",
                "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
            }
        ],
    }
    assert pss_restricted_violations(pod) == []


# --- The chart's operator pod


def _operator_pod() -> tuple[dict[str, Any], dict[str, Any]]:
    (dep,) = skeleton((TEMPLATES / "deployment.yaml").read_text())
    tmpl = dep["spec"]["template"]
    return tmpl["spec"], tmpl["metadata"].get("annotations") or {}


def test_operator_pod_is_restricted() -> None:
    pod, annotations = _operator_pod()
    assert pss_restricted_violations(pod, annotations, where="operator") == []


def test_broker_pod_is_restricted_and_literal() -> None:
    (dep,) = skeleton((TEMPLATES / "broker-deployment.yaml").read_text())
    tmpl = dep["spec"]["template"]
    pod = tmpl["spec"]
    assert pss_restricted_violations(pod, tmpl["metadata"].get("annotations") or {}, where="broker") == []
    (c,) = pod["containers"]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False


def test_operator_pod_security_is_literal_and_read_only() -> None:
    pod, _ = _operator_pod()
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (c,) = pod["containers"]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["privileged"] is False
    text = (TEMPLATES / "deployment.yaml").read_text()
    # runAsUser comes from values, which the schema keeps >= 1.
    assert "runAsUser: {{ .Values.operator.podSecurityContext.runAsUser }}" in text


def test_no_template_makes_a_privileged_pod() -> None:
    for path in TEMPLATES.glob("*.yaml"):
        text = path.read_text()
        for bad in ("hostPath", "hostNetwork: true", "privileged: true", "hostPID", "hostIPC", "hostPort"):
            assert bad not in text, f"{path.name}: {bad}"


# --- The operator's pods: build Jobs and runtime Deployments (operator/trtforge_operator/apply/children.py)


def _children() -> Any:
    return pytest.importorskip(
        "trtforge_operator.apply.children", reason="the operator's pod builders are not here yet"
    )


def _configs() -> list[Any]:
    from trtforge_operator.config import OperatorConfig

    return [
        OperatorConfig(),  # PVC store, runtime through the broker
        OperatorConfig(
            store_uri="s3://engines/prod",
            store_credentials_secret="trtforge-store-s3",
            build_namespace="trtforge-builds",
            build={"env": {"AWS_REGION": "eu-west-1"}},
        ),
        OperatorConfig(runtime_store_uri="pvc://trtforge-store/"),  # runtime reads a store itself
    ]


def _targets() -> list[Any]:
    from trtforge.contract.gpu import GPUTarget

    return [
        GPUTarget(gpu="NVIDIA-H100-80GB-HBM3"),
        GPUTarget(gpu="NVIDIA-H100-80GB-HBM3", mig="1g.10gb"),
        GPUTarget(gpu="NVIDIA-GH200-480GB"),
        GPUTarget(gpu="cpu"),
    ]


def test_build_job_pods_are_restricted() -> None:
    children = _children()
    from trtforge.contract.engine_key import BuildConfig

    n = 0
    for cfg in _configs():
        for target in _targets():
            for model_uri in ("s3://models/resnet50.onnx", "pvc://models/resnet50.onnx"):
                req = children.BuildRequest(
                    target=target,
                    model_uri=model_uri,
                    model_sha256="a" * 64,
                    build=BuildConfig(),
                    engine_key="b" * 64,
                    request_digest="c" * 64,
                    node_selector={"nvidia.com/gpu.product": target.gpu},
                    requester="team-a/resnet",
                    avoid_nodes=("node-1",),
                )
                job = children.build_job(req, cfg)
                pod = job["spec"]["template"]["spec"]
                where = f"build Job {job['metadata']['name']} ({target.name}, {model_uri})"
                assert pss_restricted_violations(pod, where=where) == []
                assert pod["automountServiceAccountToken"] is False, "build pods never talk to the API"
                assert pod["serviceAccountName"] == cfg.build_service_account
                for c in pod["containers"]:
                    assert c["securityContext"].get("readOnlyRootFilesystem") is True
                assert job["metadata"]["namespace"] == cfg.build_namespace
                n += 1
    assert n == 24


def test_runtime_pods_are_restricted_and_hold_no_store_credentials() -> None:
    children = _children()
    for cfg in _configs():
        for target in _targets():
            req = children.RuntimeRequest(
                namespace="team-a",
                infd="resnet",
                infd_uid="uid-1",
                target=target,
                engine_key="b" * 64,
                engine_sha256="d" * 64,
                replicas=2,
                node_selector={"nvidia.com/gpu.product": target.gpu},
                image="ghcr.io/trtforge/trtforge-runtime:0.1.0",
                image_pull_policy="IfNotPresent",
                resources={"limits": {"memory": "8Gi"}},
                avoid_nodes=("node-1",),
            )
            dep = children.runtime_deployment(req, cfg)
            pod = dep["spec"]["template"]["spec"]
            assert pss_restricted_violations(pod, where=f"runtime {dep['metadata']['name']}") == []
            assert pod["automountServiceAccountToken"] is False
            for c in pod["containers"]:
                assert c["securityContext"].get("readOnlyRootFilesystem") is True
            for vol in pod.get("volumes") or []:
                assert "secret" not in vol, "runtime pods in tenant namespaces never mount store credentials"
                if cfg.runtime_store_uri is None:
                    assert "persistentVolumeClaim" not in vol, (
                        "with the broker, runtime pods never mount the store"
                    )
