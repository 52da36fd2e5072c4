"""Nothing a tenant writes in its own namespace reaches another tenant's builds (issue 52), on the test
bed: Jobs dressed as the operator's in a tenant namespace hold no build slot, and a rebuild annotation
naming another tenant's engine creates nothing, while a real GPU fault still gets its rebuild; one
naming the TRTEngine's own target rebuilds that engine and nothing else.

Two tenant namespaces, A (the hostile one) and B, in no shared cache group: their engine keys differ.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from trtforge_dev.localdev import OperatorEnv, condition, deployment_manifest, engine_manifest, tiny_model
from trtforge_dev.testbed.wait import wait_for

pytestmark = pytest.mark.integration

H100 = "NVIDIA-H100-80GB-HBM3"
TARGETS = [{"gpu": H100}]
SQUATTERS = 4


@pytest.fixture(scope="module")
def env(testbed: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorEnv]:
    tag = secrets.token_hex(3)
    e = OperatorEnv(
        testbed,
        tmp_path_factory.mktemp("trust"),
        [f"trust-{i}-{tag}" for i in range(6)],
        # The limits of the report: four per namespace, eight in all.
        build={"max_concurrent": 8, "max_concurrent_per_namespace": SQUATTERS},
    )
    e.start()
    try:
        yield e
    finally:
        e.close()


@pytest.fixture(scope="module")
def free_namespaces(env: OperatorEnv) -> list[str]:
    return list(env.tenants)


@pytest.fixture
def tenants(free_namespaces: list[str]) -> tuple[str, str]:
    """(A, B): two watched namespaces of this test's own."""
    return free_namespaces.pop(0), free_namespaces.pop(0)


def model(env: OperatorEnv, name: str) -> tuple[str, str]:
    """A model of its own (weights seeded by `name`): (uri, sha256)."""
    seed = int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "big")
    return f"pvc://models/{name}.onnx", tiny_model(env.models_dir / f"{name}.onnx", seed=seed)


def engine(name: str, m: tuple[str, str]) -> dict[str, Any]:
    return engine_manifest(name, m[1], TARGETS, model=m[0])


def squatting_job(name: str, victim_ns: str) -> dict[str, Any]:
    """A Job a tenant with `edit` can create in its own namespace, labelled as the operator's build
    Jobs are and naming another namespace as its requester; its pod can never be scheduled."""
    labels = {
        "app.kubernetes.io/name": "trtforge",
        "app.kubernetes.io/managed-by": "trtforge-operator",
        "app.kubernetes.io/component": "builder",
        "trtforge.io/requester-namespace": victim_ns,
        "trtforge.io/build-kind": "build",
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {"trtforge.io/created-for": f"{victim_ns}/victim"},
        },
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "restartPolicy": "Never",
                    "nodeSelector": {"trtforge.io/nowhere": "true"},
                    "containers": [{"name": "squat", "image": "busybox", "command": ["sleep", "3600"]}],
                },
            },
        },
    }


def target_of(env: OperatorEnv, ns: str, name: str) -> dict[str, Any] | None:
    targets = (env.get("trtengines", ns, name).get("status") or {}).get("targets") or []
    return targets[0] if targets else None


def build_jobs_for_key(env: OperatorEnv, key: str) -> list[Any]:
    return [j for j in env.jobs() if (j.metadata.labels or {}).get("trtforge.io/build-id") == key[:20]]


def test_jobs_dressed_as_ours_in_a_tenant_namespace_hold_no_build_slot(
    env: OperatorEnv, tenants: tuple[str, str]
) -> None:
    a, b = tenants
    batch: Any = client.BatchV1Api(env.api)
    for i in range(SQUATTERS):
        batch.create_namespaced_job(a, squatting_job(f"trtforge-build-squat{i}", b))

    def squatting() -> bool:
        pods = env.pods(a, "app.kubernetes.io/component=builder")
        return len(pods) == SQUATTERS and all(p.status.phase == "Pending" for p in pods)

    wait_for(squatting, timeout=60, desc=f"{SQUATTERS} squatting Jobs' pods Pending in {a}")

    env.apply(engine("victim", model(env, f"slots-{b}")), b)

    def decided() -> Any:
        t = target_of(env, b, "victim")
        if t is None:
            return None
        return t if t.get("reason") == "Queued" or t.get("jobName") else None

    first: dict[str, Any] = wait_for(decided, timeout=180, desc=f"{b}/victim queued or building")
    assert first.get("reason") != "Queued", (
        f"tenant {a}'s Jobs took tenant {b}'s build slots: {first.get('message')}"
    )
    ready = env.wait_true("trtengines", b, "victim", timeout=240)
    (t,) = ready["status"]["targets"]
    (job,) = [j for j in env.jobs() if j.metadata.name == t["jobName"]]
    assert job.metadata.namespace == env.build_ns and job.status.succeeded == 1
    # The squatters are still there, unscheduled, and still hold nothing.
    assert len(batch.list_namespaced_job(a).items) == SQUATTERS


def test_a_forged_rebuild_request_for_another_tenants_engine_creates_nothing_and_a_real_fault_still_rebuilds(
    env: OperatorEnv, tenants: tuple[str, str], testbed: Any
) -> None:
    a, b = tenants
    env.apply(engine("victim", model(env, f"rebuild-{b}")), b)
    env.apply(deployment_manifest("victim", "victim"), b)
    env.apply(engine("mine", model(env, f"rebuild-{a}")), a)
    env.wait_true("trtengines", a, "mine", timeout=240)
    env.wait_true("trtengines", b, "victim", timeout=240)
    env.wait_true("inferencedeployments", b, "victim", timeout=240)
    before = env.get("trtengines", b, "victim")["status"]
    (tb,) = before["targets"]
    key_b = tb["engineKey"]
    jobs_b = {j.metadata.name for j in build_jobs_for_key(env, key_b)}
    core: Any = client.CoreV1Api(env.api)
    h100_nodes = sorted(
        str(n.metadata.name)
        for n in core.list_node().items
        if (n.metadata.labels or {}).get("nvidia.com/gpu.product") == H100
    )

    # A asks, on its own TRTEngine, for a rebuild of B's engine that avoids every H100 node.
    forged = {
        "requester": f"{a}/mine",
        "target": tb["name"],
        "engine_key": key_b,
        "fault": "deadbeef",
        "avoid_nodes": h100_nodes,
    }
    annotation = "rebuild.trtforge.io/forged"
    testbed.kubectl("annotate", "trte", "mine", "-n", a, f"{annotation}={json.dumps(forged)}", "--overwrite")

    def answered() -> str:
        """'job' once any new Job of B's key exists; 'refused' once A's engine says why it refused."""
        if {j.metadata.name for j in build_jobs_for_key(env, key_b)} - jobs_b:
            return "job"
        c = condition(env.get("trtengines", a, "mine"), "RebuildRequests")
        return "refused" if c and c.get("status") == "False" else ""

    outcome = wait_for(answered, timeout=120, desc=f"the operator's answer to {a}'s forged rebuild request")
    new_jobs = {j.metadata.name for j in build_jobs_for_key(env, key_b)} - jobs_b
    assert outcome == "refused" and not new_jobs, f"a Job for {b}'s engine: {sorted(new_jobs)}"
    refused = condition(env.get("trtengines", a, "mine"), "RebuildRequests")
    assert refused is not None and refused["reason"] == "RebuildRequestRefused"
    assert annotation in refused["message"] and "one of this TRTEngine's targets" in refused["message"]

    def warned() -> bool:
        return any(
            e.reason == "RebuildRequestRefused" and annotation in (e.message or "")
            for e in core.list_namespaced_event(a, field_selector="involvedObject.name=mine").items
        )

    wait_for(warned, timeout=30, desc=f"a RebuildRequestRefused Event on {a}/mine")
    assert env.get("trtengines", b, "victim")["status"] == before, f"{b}'s status changed"

    # A real GPU fault under B's serving pod gets its rebuild, of B's key, off the faulty node.
    (pod,) = env.pods(b, "app.kubernetes.io/component=runtime")
    victim_node = pod.spec.node_name
    testbed.fault(victim_node, xid=79)
    try:

        def rebuild_job() -> Any:
            new = [
                j
                for j in build_jobs_for_key(env, key_b)
                if j.metadata.name not in jobs_b
                and (j.metadata.labels or {}).get("trtforge.io/build-kind") == "rebuild"
            ]
            return new[0] if new else None

        rb = wait_for(rebuild_job, timeout=120, desc=f"a rebuild Job for {b}'s engine after the fault")
        ann = rb.metadata.annotations or {}
        assert (
            ann.get("trtforge.io/engine-key") == key_b and ann.get("trtforge.io/created-for") == f"{b}/victim"
        )
        assert ann.get("trtforge.io/rebuild-cause") == "fault"
        terms = (
            rb.spec.template.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution
        )
        avoided = {v for term in terms.node_selector_terms for f in term.match_fields or [] for v in f.values}
        assert avoided == {victim_node}, "the nodes to avoid are the fault's, not the forged request's"

        def recovered() -> bool:
            obj = env.get("inferencedeployments", b, "victim")
            fs = [f for f in (obj.get("status") or {}).get("faults") or [] if f.get("node") == victim_node]
            return bool(fs and fs[-1].get("recoveredSeconds") is not None)

        wait_for(recovered, timeout=300, desc=f"{b}/victim recovered from the fault")
    finally:
        testbed.heal(victim_node)
    assert not {j.metadata.name for j in build_jobs_for_key(env, key_b)} - jobs_b - {rb.metadata.name}


def test_a_rebuild_annotation_naming_its_own_target_rebuilds_that_engine_only(
    env: OperatorEnv, tenants: tuple[str, str], testbed: Any
) -> None:
    a, b = tenants
    env.apply(engine("mine", model(env, f"ask-{a}")), a)
    env.apply(engine("other", model(env, f"ask-{b}")), b)
    (ta,) = env.wait_true("trtengines", a, "mine", timeout=240)["status"]["targets"]
    (tb,) = env.wait_true("trtengines", b, "other", timeout=240)["status"]["targets"]
    jobs_b = {j.metadata.name for j in build_jobs_for_key(env, tb["engineKey"])}
    testbed.kubectl("annotate", "trte", "mine", "-n", a, f"rebuild.trtforge.io/again={ta['name']}")

    def asked() -> Any:
        new = [j for j in build_jobs_for_key(env, ta["engineKey"]) if "-rq" in (j.metadata.name or "")]
        return new[0] if new and new[0].status.succeeded == 1 else None

    rq = wait_for(asked, timeout=180, desc=f"the rebuild {a} asked for, finished")
    ann = rq.metadata.annotations or {}
    assert (
        ann.get("trtforge.io/rebuild-cause") == "asked" and ann.get("trtforge.io/created-for") == f"{a}/mine"
    )
    assert rq.spec.template.spec.affinity is None, "no node is avoided: the operator observed no fault"
    assert condition(env.get("trtengines", a, "mine"), "RebuildRequests") is None, "nothing refused"
    assert {j.metadata.name for j in build_jobs_for_key(env, tb["engineKey"])} == jobs_b
