"""Scaling an InferenceDeployment on the test bed: its scale subresource, the HPAs the operator owns,
and an operator that never writes the replicas an HPA owns.

- `kubectl scale inferencedeployment/x --replicas=3` makes 3 Ready pods, and the scale subresource
  reads them back (the test bed's kubectl is 1.20: `kubectl get --subresource` needs 1.24, so it is
  read with `kubectl get --raw .../scale`);
- with `spec.autoscaling` the operator's HPA is accepted by the apiserver (autoscaling/v2beta2 on
  1.20, chosen from discovery), targets the target's Deployment and is deleted with its
  InferenceDeployment;
- a rollout while an autoscaler owns the replicas keeps the Deployment's count: sampled all along, its
  `spec.replicas` never goes back to the InferenceDeployment's `spec.replicas`;
- the real loop: the test bed's custom metrics API (trtforge_dev.testbed.metrics_adapter) serves the
  runtime pods' own /metrics, a steady load on one pod makes the real HPA controller scale the target
  to maxReplicas (the new pods serve), a rollout at that count keeps it, and without load it comes
  back to minReplicas; the Deployment's replicas take no value the HPA's rescale Events do not
  account for;
- an HPA of the user's own on the InferenceDeployment scales it through the scale subresource;
- bad autoscaling input is refused: by the schema (unknown metric, minReplicas 0, no maxReplicas),
  and on 1.20, without CEL, minReplicas > maxReplicas by the operator (Ready=False InvalidSpec).
"""

from __future__ import annotations

import json
import secrets
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import urllib3
from kubernetes import client
from kubernetes.client.rest import ApiException
from trtforge_dev.localdev import (
    OperatorEnv,
    delete_with_cleanup,
    deployment_manifest,
)
from trtforge_dev.testbed.wait import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.long]

H100 = "NVIDIA-H100-80GB-HBM3"
RUNTIME = "app.kubernetes.io/component=runtime"
AUTO = {"minReplicas": 1, "maxReplicas": 3, "metric": "RequestsInFlight", "targetValue": 4}


@pytest.fixture(scope="module")
def env(testbed: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorEnv]:
    tag = secrets.token_hex(3)
    e = OperatorEnv(testbed, tmp_path_factory.mktemp("autoscale"), [f"as-{i}-{tag}" for i in range(6)])
    e.start()
    try:
        yield e
    finally:
        e.close()


@pytest.fixture
def ns(env: OperatorEnv, request: pytest.FixtureRequest) -> Iterator[str]:
    """A watched namespace of this test's own, with a Ready one-target engine `tiny` of its own model."""
    assert len(env.tenants) > 1, "more tests than namespaces: the last is the schema tests' own"
    with env.tenant_with_tiny_engine(request.node.nodeid, H100) as n:
        yield n


def _ready_pods(env: OperatorEnv, ns: str) -> list[Any]:
    return [
        p
        for p in env.pods(ns, RUNTIME)
        if p.metadata.deletion_timestamp is None
        and any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])
    ]


def test_kubectl_scale_makes_ready_pods_and_the_scale_subresource_reads_them_back(
    env: OperatorEnv, ns: str
) -> None:
    env.apply(deployment_manifest("x", "tiny", replicas=1), ns)
    env.wait_true("inferencedeployments", ns, "x", timeout=180)
    env.tb.kubectl("scale", "-n", ns, "inferencedeployment/x", "--replicas=3")
    wait_for(
        lambda: len(_ready_pods(env, ns)) == 3 and len(env.pods(ns, RUNTIME)) == 3,
        timeout=240,
        desc="3 Ready runtime pods",
    )
    infd = env.wait_true("inferencedeployments", ns, "x", timeout=120)
    assert infd["spec"]["replicas"] == 3 and infd["status"]["ready"] == "3/3"

    def scale() -> dict[str, Any]:
        path = f"/apis/trtforge.io/v1alpha1/namespaces/{ns}/inferencedeployments/x/scale"
        return dict(json.loads(env.tb.kubectl("get", "--raw", path).stdout))

    s = wait_for(
        lambda: (lambda s: s if s["status"].get("replicas") == 3 else None)(scale()),
        timeout=60,
        desc="the scale subresource's status.replicas at 3",
    )
    assert s["kind"] == "Scale" and s["spec"]["replicas"] == 3
    selector = s["status"]["selector"]
    assert {p.metadata.name for p in env.pods(ns, selector)} == {
        p.metadata.name for p in _ready_pods(env, ns)
    }
    # printer columns: desired and current replicas
    table = env.tb.kubectl("get", "-n", ns, "inferencedeployment", "x").stdout
    header, row = table.splitlines()[:2]
    cols = dict(zip(header.split(), row.split(), strict=False))
    assert (cols["DESIRED"], cols["CURRENT"], cols["READY"]) == ("3", "3", "3/3")
    # and down again
    env.tb.kubectl("scale", "-n", ns, "inferencedeployment/x", "--replicas=1")
    wait_for(lambda: len(env.pods(ns, RUNTIME)) == 1, timeout=120, desc="back to 1 runtime pod")


def _hpas(env: OperatorEnv, ns: str) -> list[dict[str, Any]]:
    co: Any = client.CustomObjectsApi(env.api)
    items = co.list_namespaced_custom_object("autoscaling", "v2beta2", ns, "horizontalpodautoscalers")[
        "items"
    ]
    return list(items)


def test_the_operators_hpa_targets_the_deployment_keeps_its_count_through_a_rollout_and_goes_with_it(
    env: OperatorEnv, ns: str
) -> None:
    apps: Any = client.AppsV1Api(env.api)
    env.apply(deployment_manifest("x", "tiny", replicas=1, autoscaling=AUTO), ns)
    infd = env.wait_true("inferencedeployments", ns, "x", timeout=180)
    (target,) = infd["status"]["targets"]
    dname = target["deploymentName"]
    (hpa,) = wait_for(lambda: _hpas(env, ns) or None, timeout=60, desc="the operator's HPA")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": dname}
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (1, 3)
    assert hpa["spec"]["metrics"][0]["pods"]["metric"]["name"] == "trtforge_runtime_requests_in_flight"
    (owner,) = hpa["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"]) == ("InferenceDeployment", infd["metadata"]["uid"])
    dep = apps.read_namespaced_deployment(dname, ns)
    assert (
        dep.metadata.labels["trtforge.io/target"]
        == target["name"]
        == hpa["metadata"]["labels"]["trtforge.io/target"]
    )
    wait_for(
        lambda: (
            env.get("inferencedeployments", ns, "x")["status"]["targets"][0].get("autoscaler")
            == hpa["metadata"]["name"]
        ),
        timeout=60,
        desc="the status names the HPA",
    )

    # What the HPA does when its metric says so, done here by hand (the test bed serves no custom
    # metrics API in this test): 2 replicas, within [1, 3], which the HPA controller leaves alone.
    apps.patch_namespaced_deployment_scale(dname, ns, {"spec": {"replicas": 2}})
    wait_for(lambda: len(_ready_pods(env, ns)) == 2, timeout=240, desc="2 Ready pods")
    seen: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            try:
                seen.append(int(apps.read_namespaced_deployment(dname, ns).spec.replicas))
            except ApiException:
                pass
            stop.wait(0.5)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        # a new pod template (and spec.replicas raised to 3 on the way): the operator replaces the
        # Deployment, which rolls out at the count it has
        co: Any = client.CustomObjectsApi(env.api)
        co.patch_namespaced_custom_object(
            "trtforge.io",
            "v1alpha1",
            ns,
            "inferencedeployments",
            "x",
            {"spec": {"replicas": 3, "runtime": {"env": [{"name": "ROLLOUT", "value": "1"}]}}},
        )

        def rolled() -> bool:
            d = apps.read_namespaced_deployment(dname, ns)
            env_names = {e.name for e in d.spec.template.spec.containers[0].env or []}
            st = d.status
            return (
                "ROLLOUT" in env_names
                and (st.observed_generation or 0) >= d.metadata.generation
                and st.updated_replicas == d.spec.replicas
                and st.replicas == d.spec.replicas
                and st.ready_replicas == d.spec.replicas
            )

        wait_for(rolled, timeout=300, desc="the rollout to the new template done")
        env.wait_true("inferencedeployments", ns, "x", timeout=120)
    finally:
        stop.set()
        sampler.join()
    assert seen and set(seen) == {2}, f"the Deployment's replicas moved: {seen}"
    assert len(_ready_pods(env, ns)) == 2
    status = env.get("inferencedeployments", ns, "x")["status"]
    assert (status["desiredReplicas"], status["replicas"]) == (2, 2)

    delete_with_cleanup(env.api, ns, "inferencedeployments", "x")
    wait_for(lambda: not _hpas(env, ns), timeout=60, desc="the HPA deleted with its InferenceDeployment")
    wait_for(lambda: not apps.list_namespaced_deployment(ns).items, timeout=60, desc="Deployments gone")


def test_the_schema_refuses_bad_autoscaling(env: OperatorEnv) -> None:
    """On 1.20 the schema's own checks (no CEL): an unknown metric, minReplicas below 1."""
    ns = env.tenants[-1]
    for auto, words in (
        ({**AUTO, "metric": "GPUUtilization"}, ["spec.autoscaling.metric", "RequestsInFlight"]),
        ({**AUTO, "minReplicas": 0}, ["spec.autoscaling.minReplicas", "greater than or equal to 1"]),
        (
            {"minReplicas": 1, "metric": "QueueDepth", "targetValue": 2},
            ["spec.autoscaling.maxReplicas", "Required"],
        ),
    ):
        r = env.tb.kubectl(
            "apply",
            "--validate=false",  # the apiserver's answer, not kubectl's own check of the schema
            "-n",
            ns,
            "-f",
            "-",
            input=json.dumps(deployment_manifest("bad", "tiny", autoscaling=auto)),
            check=False,
        )
        out = r.stdout + r.stderr
        assert r.returncode != 0, out
        for w in words:
            assert w in out, out
    co: Any = client.CustomObjectsApi(env.api)
    assert (
        co.list_namespaced_custom_object("trtforge.io", "v1alpha1", ns, "inferencedeployments")["items"] == []
    )


def test_min_above_max_on_1_20_is_refused_by_the_operator_naming_the_field(env: OperatorEnv) -> None:
    """No CEL on 1.20: the spec gets in, and the operator says Ready=False InvalidSpec, naming why."""
    ns = env.tenants[-1]
    env.apply(
        deployment_manifest("minmax", "tiny", autoscaling={**AUTO, "minReplicas": 3, "maxReplicas": 2}), ns
    )

    def invalid() -> dict[str, Any] | None:
        conds = (env.get("inferencedeployments", ns, "minmax").get("status") or {}).get("conditions") or []
        ready = next((c for c in conds if c["type"] == "Ready"), None)
        return ready if ready and ready["reason"] == "InvalidSpec" else None

    ready = wait_for(invalid, timeout=60, desc="Ready=False InvalidSpec")
    assert "spec.autoscaling" in ready["message"]
    assert "minReplicas (3) must not be greater than maxReplicas (2)" in ready["message"]
    assert not _hpas(env, ns)
    delete_with_cleanup(env.api, ns, "inferencedeployments", "minmax")


# ------------------------------------------------------------------------------ the scaling loop


@pytest.fixture(scope="module")
def custom_metrics(env: OperatorEnv) -> Iterator[None]:
    """The test bed's custom metrics API (trtforge_dev.testbed.metrics_adapter), registered as an
    aggregated API, serving the runtime pods' own /metrics; removed afterwards."""
    from trtforge_dev.testbed import metrics_adapter

    with metrics_adapter.registered(env.tb, env.api):
        yield


def _infer(ip: str, model: str, port: int = 8000) -> bool:
    """One KServe v2 inference; True when answered 200."""
    import http.client

    body = json.dumps({"inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32", "data": [0.5] * 16}]})
    try:
        c = http.client.HTTPConnection(ip, port, timeout=10)
        c.request("POST", f"/v2/models/{model}/infer", body, {"Content-Type": "application/json"})
        r = c.getresponse()
        r.read()
        c.close()
        return r.status == 200
    except OSError:
        return False


def _rescales(env: OperatorEnv, ns: str, hpa: str) -> dict[int, int]:
    """How many times the HPA controller set each size: its SuccessfulRescale Events say
    "New size: N; reason: ..." (repeats of one message are counted in the Event)."""
    core: Any = client.CoreV1Api(env.api)
    evs = core.list_namespaced_event(ns, field_selector=f"involvedObject.name={hpa}").items
    out: dict[int, int] = {}
    for e in evs:
        if e.reason == "SuccessfulRescale":
            n = int(e.message.split("New size: ", 1)[1].split(";", 1)[0])
            out[n] = out.get(n, 0) + (e.count or 1)
    return out


def test_load_scales_up_to_max_and_back_to_min_and_only_the_hpa_sets_replicas(
    env: OperatorEnv, ns: str, custom_metrics: None
) -> None:
    apps: Any = client.AppsV1Api(env.api)
    # The request rate: steady under a steady load, whatever the pod's speed (the in-flight count of
    # a model this small is mostly 0 between requests).
    auto = {"minReplicas": 1, "maxReplicas": 3, "metric": "RequestRate", "targetValue": "2"}
    # spec.replicas 2: the count the operator creates the Deployment with, and one the HPA has no
    # reason to set (it goes from no load to 3, then to 1); a reset by the operator would show as 2.
    env.apply(deployment_manifest("x", "tiny", replicas=2, autoscaling=auto), ns)
    infd = env.wait_true("inferencedeployments", ns, "x", timeout=180)
    dname = infd["status"]["targets"][0]["deploymentName"]
    wait_for(lambda: _hpas(env, ns) or None, timeout=60, desc="the operator's HPA")

    seen: list[int] = []
    stop_sampling, stop_load = threading.Event(), threading.Event()
    answered = [0]

    def sample() -> None:  # the Deployment's replicas, every second
        while not stop_sampling.is_set():
            try:
                seen.append(int(apps.read_namespaced_deployment(dname, ns).spec.replicas))
            except (ApiException, OSError, urllib3.exceptions.HTTPError):
                pass
            stop_sampling.wait(1.0)

    def load() -> None:  # a steady stream to one pod (another once it is gone), ~30 per second
        ip = ""
        while not stop_load.wait(0.03):
            if not ip:
                pods = _ready_pods(env, ns)
                ip = pods[0].status.pod_ip if pods else ""
                if not ip:
                    stop_load.wait(0.5)
                    continue
            if _infer(ip, "x"):
                answered[0] += 1
            else:
                ip = ""

    threads = [threading.Thread(target=sample, daemon=True)]
    threads += [threading.Thread(target=load, daemon=True)]
    for t in threads:
        t.start()
    try:

        def at_max() -> bool:
            d = apps.read_namespaced_deployment(dname, ns)
            return d.spec.replicas == 3 and len(_ready_pods(env, ns)) == 3

        wait_for(at_max, timeout=400, desc="the HPA scaled the target to maxReplicas with 3 Ready pods")
        for p in _ready_pods(env, ns):  # the new pods serve
            assert _infer(p.status.pod_ip, "x"), p.metadata.name

        # a rollout while the HPA holds 3: the Deployment keeps 3 (surge on top)
        co: Any = client.CustomObjectsApi(env.api)
        co.patch_namespaced_custom_object(
            "trtforge.io",
            "v1alpha1",
            ns,
            "inferencedeployments",
            "x",
            {"spec": {"runtime": {"env": [{"name": "ROLLOUT", "value": "1"}]}}},
        )

        def rolled() -> bool:
            d = apps.read_namespaced_deployment(dname, ns)
            names = {e.name for e in d.spec.template.spec.containers[0].env or []}
            st = d.status
            return (
                "ROLLOUT" in names
                and (st.observed_generation or 0) >= d.metadata.generation
                and st.updated_replicas == st.replicas == st.ready_replicas == d.spec.replicas == 3
            )

        wait_for(rolled, timeout=400, desc="the rollout done at 3 replicas")
        stop_load.set()
        assert answered[0] > 0
        wait_for(
            lambda: apps.read_namespaced_deployment(dname, ns).spec.replicas == 1,
            timeout=400,
            desc="the HPA scaled the target back to minReplicas once the load stopped",
        )
        wait_for(lambda: len(env.pods(ns, RUNTIME)) == 1, timeout=120, desc="one runtime pod left")
    finally:
        stop_load.set()
        stop_sampling.set()
        for t in threads:
            t.join()
    seen.append(int(apps.read_namespaced_deployment(dname, ns).spec.replicas))  # and one last time
    sizes = _rescales(env, ns, dname)
    runs = _runs(seen)
    assert {3, 1} <= set(sizes), (sizes, runs)
    # The Deployment's replicas: the operator's 2 until the HPA first set one, then only what the
    # HPA set, and no more often than it set it (a write of the operator's would be one more).
    assert seen and seen[0] in {2, *sizes}, runs
    first = next(i for i, v in enumerate(seen) if v != 2)
    assert set(seen[first:]) <= set(sizes), (runs, sizes)
    changes: dict[int, int] = {}
    for i in range(first, len(seen)):
        if i == first or seen[i] != seen[i - 1]:
            changes[seen[i]] = changes.get(seen[i], 0) + 1
    assert all(n <= sizes[v] for v, n in changes.items()), (runs, sizes)
    assert 3 in seen[first:] and seen[-1] == 1, (runs, sizes)


def _runs(values: list[int]) -> str:
    """``2x12 3x40 1x9``: the samples as runs of equal values."""
    out: list[list[int]] = []
    for v in values:
        if out and out[-1][0] == v:
            out[-1][1] += 1
        else:
            out.append([v, 1])
    return " ".join(f"{v}x{n}" for v, n in out)


def test_an_hpa_of_your_own_scales_the_inferencedeployment_through_its_scale_subresource(
    env: OperatorEnv, ns: str, custom_metrics: None
) -> None:
    """No spec.autoscaling: a user's HPA targets the InferenceDeployment itself, reads its pods through
    status.selector and writes spec.replicas, which the operator turns into pods."""
    apps: Any = client.AppsV1Api(env.api)
    env.apply(deployment_manifest("x", "tiny", replicas=1), ns)
    infd = env.wait_true("inferencedeployments", ns, "x", timeout=180)
    dname = infd["status"]["targets"][0]["deploymentName"]
    hpa = {
        "apiVersion": "autoscaling/v2beta2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "mine"},
        "spec": {
            "scaleTargetRef": {
                "apiVersion": "trtforge.io/v1alpha1",
                "kind": "InferenceDeployment",
                "name": "x",
            },
            "minReplicas": 1,
            "maxReplicas": 2,
            "metrics": [
                {
                    "type": "Pods",
                    "pods": {
                        "metric": {"name": "trtforge_runtime_requests_per_second"},
                        "target": {"type": "AverageValue", "averageValue": "2"},
                    },
                }
            ],
        },
    }
    env.apply(hpa, ns)
    stop = threading.Event()

    def load() -> None:
        ip = ""
        while not stop.wait(0.03):
            if not ip:
                pods = _ready_pods(env, ns)
                ip = pods[0].status.pod_ip if pods else ""
                continue
            if not _infer(ip, "x"):
                ip = ""

    t = threading.Thread(target=load, daemon=True)
    t.start()
    try:
        wait_for(
            lambda: (
                env.get("inferencedeployments", ns, "x")["spec"]["replicas"] == 2
                and apps.read_namespaced_deployment(dname, ns).spec.replicas == 2
                and len(_ready_pods(env, ns)) == 2
            ),
            timeout=400,
            desc="the HPA set spec.replicas to 2 and 2 pods are Ready",
        )
    finally:
        stop.set()
        t.join()
    assert _rescales(env, ns, "mine").get(2)
    env.tb.kubectl("delete", "hpa", "mine", "-n", ns)
