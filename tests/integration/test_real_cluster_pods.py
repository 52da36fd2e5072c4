"""A GPU node as real clusters have them, on the test bed: tainted `nvidia.com/gpu:NoSchedule`, its
MIG under the GPU Operator's `single` strategy (GFD's `<product>-MIG-<profile>` label, each slice a
`nvidia.com/gpu`), and images pulled with a Secret. One engine is built for its slice, verified and
served: the build Job, verify Job and runtime pod all carry the operator's default tolerations and
the pull secret; the build and the runtime pod land on that node and ask for `nvidia.com/gpu`; the
runtime pod gets the full runtime image, since the engine is not version-compatible.

One module, one engine build, one runtime pod (CI time): tests/unit/test_real_clusters.py has the
planning decisions one by one.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from trtforge_dev.localdev import OperatorEnv, deployment_manifest, engine_manifest, tiny_model
from trtforge_dev.testbed.profile import MigSpec
from trtforge_dev.testbed.wait import wait_for
from trtforge_operator.config import GPU_TOLERATION
from trtforge_operator.labels import APP_COMPONENT, COMPONENT_RUNTIME, COMPONENT_VERIFIER, LABEL_TARGET

from trtforge.contract import images
from trtforge.contract.gpu import GPUTarget

pytestmark = [pytest.mark.integration, pytest.mark.slow]

NODE = "gpu-gh200-0"  # one GH200: re-sliced here into two 3g.48gb instances, then restored
TARGET = GPUTarget(gpu="NVIDIA-GH200-480GB", mig="3g.48gb")
SINGLE = MigSpec(strategy="single", config="all-3g.48gb", layout=[{"3g.48gb": 2}])
TAINT = {"key": "nvidia.com/gpu", "effect": "NoSchedule"}
PULL_SECRET = "regcred"


def _node(api: client.ApiClient) -> Any:
    core: Any = client.CoreV1Api(api)
    return core.read_node(NODE)


def _set_taints(api: client.ApiClient, taints: list[dict[str, str]]) -> None:
    core: Any = client.CoreV1Api(api)
    core.patch_node(NODE, {"spec": {"taints": taints or None}})


@pytest.fixture(scope="module")
def gpu_node(testbed: Any) -> Iterator[str]:
    """NODE tainted and under the single MIG strategy for this module; as it was afterwards."""
    api = testbed.api_client()
    testbed.set_mig(NODE, SINGLE)
    _set_taints(api, [TAINT])

    def resliced() -> bool:
        n = _node(api)
        labels = n.metadata.labels or {}
        return (
            labels.get("nvidia.com/gpu.product") == "NVIDIA-GH200-480GB-MIG-3g.48gb"
            and labels.get("nvidia.com/mig.strategy") == "single"
            and (n.status.allocatable or {}).get("nvidia.com/gpu") == "2"
            and any(t.key == TAINT["key"] for t in n.spec.taints or [])
        )

    wait_for(resliced, timeout=60, desc=f"{NODE} tainted, single-strategy MIG with 2 slices")
    try:
        yield NODE
    finally:
        _set_taints(api, [])
        testbed.set_mig(NODE, None)
        wait_for(
            lambda: (
                (_node(api).metadata.labels or {}).get("nvidia.com/gpu.product") == TARGET.gpu
                and (_node(api).status.allocatable or {}).get("nvidia.com/gpu") == "1"
            ),
            timeout=60,
            desc=f"{NODE} back to one whole GH200",
        )
        api.close()


@pytest.fixture(scope="module")
def env(testbed: Any, gpu_node: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorEnv]:
    tag = secrets.token_hex(3)
    e = OperatorEnv(
        testbed, tmp_path_factory.mktemp("real-cluster"), [f"rc-{tag}"], image_pull_secrets=[PULL_SECRET]
    )
    core: Any = client.CoreV1Api(e.api)
    for ns in (e.build_ns, *e.tenants):  # as the platform team creates it in each namespace
        core.create_namespaced_secret(
            ns,
            {
                "metadata": {"name": PULL_SECRET},
                "type": "kubernetes.io/dockerconfigjson",
                "stringData": {".dockerconfigjson": '{"auths": {"registry.example.com": {"auth": "eDp5"}}}'},
            },
        )
    e.start()
    try:
        yield e
    finally:
        e.close()


def _pod_of_job(env: OperatorEnv, ns: str, job: str) -> Any:
    def done() -> Any:
        pods = env.pods(ns, f"job-name={job}")
        return pods[0] if pods else None

    return wait_for(done, timeout=60, desc=f"a pod of Job {ns}/{job}")


def _tolerates_gpu_taint_and_pulls_with_the_secret(pod: Any) -> None:
    spec = pod.spec
    tolerations = [
        {"key": t.key, "operator": t.operator, "effect": t.effect}
        for t in spec.tolerations or []
        if t.key == TAINT["key"]
    ]
    assert tolerations == [GPU_TOLERATION], spec.tolerations
    assert [s.name for s in spec.image_pull_secrets or []] == [PULL_SECRET]


def test_a_tainted_single_strategy_mig_node_gets_its_build_verify_and_runtime_pods(env: OperatorEnv) -> None:
    (ns,) = env.tenants
    digest = hashlib.sha256(ns.encode()).hexdigest()
    name = f"m-{digest[:12]}"
    sha = tiny_model(env.models_dir / f"{name}.onnx", seed=int(digest[:8], 16))
    env.apply(
        engine_manifest(
            "sliced", sha, [{"gpu": TARGET.gpu, "mig": TARGET.mig}], model=f"pvc://models/{name}.onnx"
        ),
        ns,
    )
    eng = env.wait_true("trtengines", ns, "sliced", timeout=240)
    assert [t["name"] for t in eng["status"]["targets"]] == [TARGET.name]

    # The build: on the tainted node, selected by GFD's single-strategy label, one nvidia.com/gpu.
    (job,) = [j for j in env.jobs() if (j.metadata.labels or {}).get(LABEL_TARGET) == TARGET.name]
    build = _pod_of_job(env, env.build_ns, job.metadata.name)
    assert build.spec.node_name == NODE
    assert build.spec.node_selector["nvidia.com/gpu.product"] == "NVIDIA-GH200-480GB-MIG-3g.48gb"
    assert build.spec.containers[0].resources.limits["nvidia.com/gpu"] == "1"
    _tolerates_gpu_taint_and_pulls_with_the_secret(build)

    # The verify Job, in the tenant's namespace (the builder image, pulled there with the secret).
    verify = env.pods(ns, f"{APP_COMPONENT}={COMPONENT_VERIFIER}")
    assert verify, "no verify pod in the tenant namespace"
    assert verify[0].status.phase == "Succeeded"
    _tolerates_gpu_taint_and_pulls_with_the_secret(verify[0])

    # Served: the runtime pod on the node, with the image that loads a non-version-compatible engine.
    env.apply(deployment_manifest("sliced", "sliced"), ns)
    env.wait_true("inferencedeployments", ns, "sliced", timeout=240)
    (runtime,) = env.pods(ns, f"{APP_COMPONENT}={COMPONENT_RUNTIME}")
    assert runtime.spec.node_name == NODE
    assert runtime.spec.containers[0].image == images.RUNTIME_FULL.reference()
    assert runtime.spec.containers[0].resources.limits["nvidia.com/gpu"] == "1"
    _tolerates_gpu_taint_and_pulls_with_the_secret(runtime)
