"""The whole engine lifecycle on the test bed, from the shipped examples: build per GPU type (a full H100
and a B200 MIG slice), serve, infer with tritonclient, a GPU fault (Xid 79) → pods move to a healthy
node of the same type, the engine is rebuilt and the InferenceDeployment is Ready again with the time
to recover recorded; with rebuildOnGPUFault false the pods move but nothing is rebuilt.
"""

from __future__ import annotations

import json
import secrets
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from trtforge_dev.localdev import OperatorEnv
from trtforge_dev.modelzoo import light_model
from trtforge_dev.testbed.wait import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.long]

H100 = "NVIDIA-H100-80GB-HBM3"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def env(testbed: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorEnv]:
    tag = secrets.token_hex(3)
    # A short suspect-node TTL so a healed node serves again within the test.
    e = OperatorEnv(
        testbed, tmp_path_factory.mktemp("e2e"), [f"e2e-{tag}"], faults={"suspect_node_ttl_seconds": 20}
    )
    shutil.copyfile(light_model("squeezenet"), e.models_dir / "squeezenet.onnx")
    e.start()
    try:
        yield e
    finally:
        e.close()


def _time(fault: dict[str, Any]) -> float:
    import datetime as dt

    return dt.datetime.fromisoformat(fault["time"].replace("Z", "+00:00")).timestamp()


def _after(fault: dict[str, Any], t: float) -> bool:
    return _time(fault) >= t


def _h100_pods(env: OperatorEnv, ns: str) -> list[Any]:
    return [
        p
        for p in env.pods(ns, "trtforge.io/target=h100-80gb-hbm3")
        if not p.metadata.deletion_timestamp and p.status.phase == "Running"
    ]


def _infer(pod_ip: str, model: Path) -> None:
    import onnxruntime as ort
    import tritonclient.http as httpclient

    x = np.random.default_rng(3).standard_normal((1, 3, 224, 224)).astype(np.float32)
    c = httpclient.InferenceServerClient(f"{pod_ip}:8000")
    assert c.is_model_ready("squeezenet")
    inp = httpclient.InferInput("data_0", [1, 3, 224, 224], "FP32")
    inp.set_data_from_numpy(x, binary_data=True)
    res = c.infer("squeezenet", [inp])
    out = res.get_response()["outputs"][0]["name"]
    got = res.as_numpy(out)
    ref = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run([out], {"data_0": x})[0]
    np.testing.assert_allclose(got, ref, rtol=2e-2, atol=2e-3)


def test_examples_build_serve_and_recover_from_a_gpu_fault(env: OperatorEnv, testbed: Any) -> None:
    ns = env.tenants[0]
    t0 = time.monotonic()
    env.apply((EXAMPLES / "trtengine-squeezenet.yaml").read_text(), ns)
    eng = env.wait_true("trtengines", ns, "squeezenet", timeout=300)
    engine_ready_s = time.monotonic() - t0
    build_pods = {
        p.metadata.labels["job-name"]: p
        for p in env.pods(env.build_ns, "app.kubernetes.io/component=builder")
    }
    for t in eng["status"]["targets"]:
        node = build_pods[t["jobName"]].spec.node_name
        assert env.node_labels(node)["nvidia.com/gpu.product"] == t["gpu"]
        if t.get("mig"):
            assert node == "gpu-b200-mig-0"
    env.apply((EXAMPLES / "inferencedeployment-squeezenet.yaml").read_text(), ns)
    infd = env.wait_true("inferencedeployments", ns, "squeezenet", timeout=300)
    serving_s = time.monotonic() - t0
    assert infd["status"]["ready"] == "3/3"
    for p in env.pods(ns, "app.kubernetes.io/component=runtime"):
        t = next(x for x in eng["status"]["targets"] if x["name"] == p.metadata.labels["trtforge.io/target"])
        assert env.node_labels(p.spec.node_name)["nvidia.com/gpu.product"] == t["gpu"]
    _infer(_h100_pods(env, ns)[0].status.pod_ip, env.models_dir / "squeezenet.onnx")
    print(f"\nengine Ready {engine_ready_s:.1f}s after apply; serving 3/3 {serving_s:.1f}s after apply")

    # --- a GPU fault on a node serving an H100 pod
    victim = _h100_pods(env, ns)[0].spec.node_name
    rebuilds_before = [j for j in env.jobs() if j.metadata.labels.get("trtforge.io/build-kind") == "rebuild"]
    first_injected = time.time() - 1
    testbed.fault(victim, xid=79)
    try:

        def recovered() -> dict[str, Any] | None:
            obj = env.get("inferencedeployments", ns, "squeezenet")
            faults = (obj.get("status") or {}).get("faults") or []
            done = [
                f
                for f in faults
                if f.get("node") == victim
                and f.get("recoveredSeconds") is not None
                and _after(f, first_injected)
            ]
            ready = any(c["type"] == "Ready" and c["status"] == "True" for c in obj["status"]["conditions"])
            return obj if done and ready else None

        obj = wait_for(recovered, timeout=300, desc="InferenceDeployment Ready again after the fault")
    finally:
        testbed.heal(victim)
    fault = next(f for f in obj["status"]["faults"] if f["node"] == victim and _after(f, first_injected))
    print(f"fault on {victim}: {fault}")
    assert fault["action"] == "PodMovedAndRebuild" and fault["target"] == "h100-80gb-hbm3"
    assert all(p.spec.node_name != victim for p in _h100_pods(env, ns))
    assert {env.node_labels(p.spec.node_name)["nvidia.com/gpu.product"] for p in _h100_pods(env, ns)} == {
        H100
    }
    rebuilds = [j for j in env.jobs() if j.metadata.labels.get("trtforge.io/build-kind") == "rebuild"]
    assert len(rebuilds) == len(rebuilds_before) + 1
    (rb,) = [j for j in rebuilds if j not in rebuilds_before]
    assert rb.status.succeeded == 1
    rb_pod = next(p for p in env.pods(env.build_ns, f"job-name={rb.metadata.name}"))
    assert rb_pod.spec.node_name != victim
    _infer(_h100_pods(env, ns)[0].status.pod_ip, env.models_dir / "squeezenet.onnx")

    # --- rebuildOnGPUFault: false: the pods move, no rebuild
    ttl = env.config["faults"]["suspect_node_ttl_seconds"]

    def settled() -> bool:
        from kubernetes import client

        apps: Any = client.AppsV1Api(env.api)
        dep = apps.read_namespaced_deployment("squeezenet-h100-80gb-hbm3", ns)
        obj = env.get("inferencedeployments", ns, "squeezenet")
        # the healed node is trusted again once every fault recorded is older than the suspect TTL
        trusted = time.time() > max(_time(f) for f in obj["status"]["faults"]) + ttl + 1
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in obj["status"]["conditions"])
        return trusted and ready and not (dep.metadata.annotations or {}).get("trtforge.io/avoid-nodes")

    wait_for(settled, timeout=180, desc="the healed node allowed again and Ready")
    patch = {"spec": {"faultPolicy": {"rebuildOnGPUFault": False}}}
    testbed.kubectl("patch", "infd", "squeezenet", "-n", ns, "--type=merge", "-p", json.dumps(patch))
    wait_for(
        lambda: env.get("inferencedeployments", ns, "squeezenet")["status"]["observedGeneration"] == 2,
        timeout=30,
        desc="the new fault policy observed",
    )
    second = _h100_pods(env, ns)[0].spec.node_name
    jobs_before = {j.metadata.name for j in env.jobs()}
    injected = time.time() - 1
    testbed.fault(second, xid=79)
    try:

        def recovered2() -> bool:
            obj = env.get("inferencedeployments", ns, "squeezenet")
            fs = [f for f in obj["status"]["faults"] if f.get("node") == second and _after(f, injected)]
            ready = any(c["type"] == "Ready" and c["status"] == "True" for c in obj["status"]["conditions"])
            return bool(fs and fs[-1].get("recoveredSeconds") is not None and ready)

        wait_for(recovered2, timeout=300, desc="Ready again after the second fault")
    finally:
        testbed.heal(second)
    obj = env.get("inferencedeployments", ns, "squeezenet")
    f2 = [f for f in obj["status"]["faults"] if f["node"] == second and _after(f, injected)][-1]
    assert f2["action"] == "PodMovedRebuildDisabled"
    assert {j.metadata.name for j in env.jobs()} == jobs_before
    assert all(p.spec.node_name != second for p in _h100_pods(env, ns))
