"""What a tenant with `edit` in its own namespace writes is not believed (issue 63), on the test bed:

- A pod labelled as the tenant's runtime pod, pinned to the node under another tenant's runtime pod,
  that exits with a GPUFault termination message (Xid 79, a made-up GPU uuid): the operator records
  no fault, deletes nothing, starts no rebuild, and says why in a FaultIgnored Event.
- A field put in the wrong place (`spec.maxSizeBytes` instead of `spec.model.maxSizeBytes`), sent by
  `kubectl apply --validate=false` (or any client that does not check the published OpenAPI), which
  Kubernetes 1.20 prunes without a word: the TRTEngine's UnknownFields condition names it and the
  field meant.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client
from trtforge_dev.localdev import OperatorEnv, condition, deployment_manifest, engine_manifest, tiny_model
from trtforge_dev.testbed.wait import wait_for

pytestmark = pytest.mark.integration

H100 = "NVIDIA-H100-80GB-HBM3"


@pytest.fixture(scope="module")
def env(testbed: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorEnv]:
    tag = secrets.token_hex(3)
    e = OperatorEnv(testbed, tmp_path_factory.mktemp("forgery"), [f"forge-{i}-{tag}" for i in range(3)])
    e.start()
    try:
        yield e
    finally:
        e.close()


def serving(env: OperatorEnv, ns: str, name: str) -> Any:
    """A Ready TRTEngine and InferenceDeployment `name` in `ns` (a model of its own); its runtime pod."""
    sha = tiny_model(env.models_dir / f"{ns}.onnx", seed=int(secrets.token_hex(2), 16))
    env.apply(engine_manifest(name, sha, [{"gpu": H100}], model=f"pvc://models/{ns}.onnx"), ns)
    env.apply(deployment_manifest(name, name), ns)
    env.wait_true("trtengines", ns, name, timeout=240)
    env.wait_true("inferencedeployments", ns, name, timeout=240)
    (pod,) = env.pods(ns, "app.kubernetes.io/component=runtime")
    return pod


def test_a_forged_gpu_fault_from_a_tenant_made_pod_is_ignored_with_an_event(env: OperatorEnv) -> None:
    a, b = env.tenants[0], env.tenants[1]
    pod_a = serving(env, a, "mine")
    pod_b = serving(env, b, "victim")
    node_b = pod_b.spec.node_name
    core: Any = client.CoreV1Api(env.api)
    batch: Any = client.BatchV1Api(env.api)
    builds_before = {j.metadata.name for j in env.jobs()}
    labels = {k: v for k, v in pod_a.metadata.labels.items() if k != "pod-template-hash"}
    message = json.dumps({"reason": "GPUFault", "message": "Xid 79", "xid": 79, "gpu": "GPU-made-up-0000"})
    forged = {
        "apiVersion": "v1",
        "kind": "Pod",
        # A's runtime labels, but not its ReplicaSet's pod-template-hash: that ReplicaSet would adopt
        # the pod and, one pod over its count, delete one (tests/unit/test_fault_trust.py has the
        # adopted pod that does not run the template).
        "metadata": {"name": "forged-fault", "namespace": a, "labels": labels},
        "spec": {
            "nodeName": node_b,  # straight onto the node under B's runtime pod
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "serve",
                    "image": "trtforge-runtime",
                    "command": ["sh", "-c", f"printf '%s\\n' '{message}' > /dev/termination-log; exit 86"],
                }
            ],
        },
    }
    core.create_namespaced_pod(a, forged)

    def outcome() -> str:
        """'recorded' once A's status holds a fault of the forged pod; 'ignored' once the Event says why."""
        faults = (env.get("inferencedeployments", a, "mine").get("status") or {}).get("faults") or []
        if any(f.get("pod") == "forged-fault" for f in faults):
            return "recorded"
        events = core.list_namespaced_event(a, field_selector="involvedObject.name=mine").items
        return (
            "ignored"
            if any(e.reason == "FaultIgnored" and "forged-fault" in (e.message or "") for e in events)
            else ""
        )

    got = wait_for(outcome, timeout=120, desc="the operator's answer to the forged fault")
    assert got == "ignored", "the forged fault was recorded in A's status"
    events = core.list_namespaced_event(a, field_selector="involvedObject.name=mine").items
    ignored = next(e for e in events if e.reason == "FaultIgnored")
    assert "no pod of the operator's runtime Deployments" in ignored.message
    # Nothing acted on it: the pod is still there, no rebuild of anyone's engine, B untouched.
    assert core.read_namespaced_pod("forged-fault", a).metadata.deletion_timestamp is None
    assert not {j.metadata.name for j in env.jobs()} - builds_before
    assert not (env.get("inferencedeployments", b, "victim").get("status") or {}).get("faults")
    assert not [j for j in batch.list_namespaced_job(a).items if "rebuild" in j.metadata.name]


def kubectl_apply(env: OperatorEnv, ns: str, obj: dict[str, Any], *flags: str) -> Any:
    return env.tb.kubectl("apply", *flags, "-n", ns, "-f", "-", input=yaml.safe_dump(obj), check=False)


def test_a_misplaced_field_is_named_in_a_condition(env: OperatorEnv, tmp_path: Any) -> None:
    ns = env.tenants[2]
    sha = tiny_model(env.models_dir / f"{ns}.onnx", seed=7)
    e = engine_manifest("limits", sha, [{"gpu": H100}], model=f"pvc://models/{ns}.onnx")
    e["spec"]["maxSizeBytes"] = 1000  # meant as spec.model.maxSizeBytes
    # kubectl 1.20 checks fields against the OpenAPI the apiserver publishes for the CRD, once it has
    # published it; with that check off (--validate=false, or any other client) the apiserver takes
    # the object and prunes the field. Client-side apply keeps what was sent in last-applied.
    checked = kubectl_apply(env, ns, e)
    assert checked.returncode == 0 or 'unknown field "maxSizeBytes"' in checked.stderr, checked.stderr
    sent = kubectl_apply(env, ns, e, "--validate=false")
    assert sent.returncode == 0, sent.stderr

    def named() -> dict[str, Any] | None:
        return condition(env.get("trtengines", ns, "limits"), "UnknownFields")

    c = wait_for(named, timeout=120, desc="the UnknownFields condition")
    assert c["status"] == "True" and c["reason"] == "FieldsPruned", c
    assert "spec.maxSizeBytes (did you mean spec.model.maxSizeBytes?)" in c["message"], c
    assert "maxSizeBytes" not in env.get("trtengines", ns, "limits")["spec"]  # pruned, as 1.20 does
    # Put where it belongs, the condition clears.
    del e["spec"]["maxSizeBytes"]
    e["spec"]["model"]["maxSizeBytes"] = 1 << 30
    fixed = kubectl_apply(env, ns, e)
    assert fixed.returncode == 0, fixed.stderr

    def cleared() -> dict[str, Any] | None:
        got = condition(env.get("trtengines", ns, "limits"), "UnknownFields")
        return got if got and got["status"] == "False" else None

    wait_for(cleared, timeout=120, desc="the UnknownFields condition cleared")
