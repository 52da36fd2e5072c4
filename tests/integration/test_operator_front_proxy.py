"""`front_proxy.enabled` on the test bed: the operator renders HAProxy into a runtime pod, writes its
ConfigMap beside the Deployment, and the pod serves HTTP and gRPC through the sidecar (the emulated
kubelet runs each container's command as a local process, with the ConfigMap mounted where the
sidecar reads it). Needs Debian's haproxy (`make deps`)."""

from __future__ import annotations

import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from kubernetes import client
from trtforge_dev.localdev import (
    OperatorEnv,
    delete_with_cleanup,
    deployment_manifest,
    engine_manifest,
    tiny_model,
)
from trtforge_dev.testbed.wait import wait_for
from trtforge_operator.apply.front_proxy import CONFIG_KEY, INTERNAL_PORT_OFFSET, SIDECAR, configmap_name

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        shutil.which("haproxy") is None,
        reason="no haproxy binary: `make deps` (and so `make test`) installs Debian's haproxy (APT_PACKAGES)",
    ),
]

H100 = "NVIDIA-H100-80GB-HBM3"


@pytest.fixture(scope="module")
def env(testbed: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorEnv]:
    e = OperatorEnv(
        testbed,
        tmp_path_factory.mktemp("operator-front-proxy"),
        [f"fp-{secrets.token_hex(3)}"],
        front_proxy={"enabled": True, "image": "haproxy:2.6"},
    )
    e.start()
    try:
        yield e
    finally:
        e.close()


def test_a_runtime_pod_serves_through_its_front_proxy(env: OperatorEnv) -> None:
    (ns,) = env.tenants
    path = env.models_dir / "tiny-fp.onnx"
    sha = tiny_model(path, seed=63)
    env.apply(engine_manifest("tiny", sha, [{"gpu": H100}], model="pvc://models/tiny-fp.onnx"), ns)
    env.wait_true("trtengines", ns, "tiny", timeout=240)
    env.apply(deployment_manifest("tiny", "tiny", replicas=1), ns)
    env.wait_true("inferencedeployments", ns, "tiny", timeout=180)

    (pod,) = env.pods(ns, "app.kubernetes.io/component=runtime")
    assert [c.name for c in pod.spec.containers] == ["serve", SIDECAR]
    serve = pod.spec.containers[0]
    cmd = serve.command or serve.args
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1"
    assert cmd[cmd.index("--port") + 1] == str(8000 + INTERNAL_PORT_OFFSET)
    apps: Any = client.AppsV1Api(env.api)
    (dep,) = apps.list_namespaced_deployment(ns, label_selector="app.kubernetes.io/component=runtime").items
    cm = client.CoreV1Api(env.api).read_namespaced_config_map(configmap_name(dep.metadata.name), ns)
    assert "frontend grpc" in cm.data[CONFIG_KEY]
    assert cm.metadata.owner_references[0].kind == "InferenceDeployment"

    # Served on the pod's address through HAProxy, over both protocols.
    _infer_http(pod.status.pod_ip, path)
    _infer_grpc(pod.status.pod_ip, path)

    # The ConfigMap is owned by the InferenceDeployment: it goes with it.
    delete_with_cleanup(env.api, ns, "inferencedeployments", "tiny")
    core: Any = client.CoreV1Api(env.api)
    wait_for(
        lambda: (
            not core.list_namespaced_config_map(ns, field_selector=f"metadata.name={cm.metadata.name}").items
        ),
        timeout=120,
        desc="the front proxy's ConfigMap gone with its InferenceDeployment",
    )


def _input() -> np.ndarray:
    return np.random.default_rng(7).standard_normal((1, 16)).astype(np.float32)


def _reference(model: Path, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    out: np.ndarray = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )[0]
    return out


def _infer_http(pod_ip: str, model: Path) -> None:
    import tritonclient.http as httpclient

    x = _input()
    c = httpclient.InferenceServerClient(f"{pod_ip}:8000")
    inp = httpclient.InferInput("x", [1, 16], "FP32")
    inp.set_data_from_numpy(x, binary_data=True)
    got = c.infer("tiny", [inp]).as_numpy("y")
    np.testing.assert_allclose(got, _reference(model, x), rtol=1e-4, atol=1e-5)


def _infer_grpc(pod_ip: str, model: Path) -> None:
    import tritonclient.grpc as grpcclient

    x = _input()
    c = grpcclient.InferenceServerClient(f"{pod_ip}:8001")
    try:
        inp = grpcclient.InferInput("x", [1, 16], "FP32")
        inp.set_data_from_numpy(x)
        got = c.infer("tiny", [inp], client_timeout=30).as_numpy("y")
    finally:
        c.close()
    np.testing.assert_allclose(got, _reference(model, x), rtol=1e-4, atol=1e-5)
