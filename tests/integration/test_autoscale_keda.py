"""`spec.autoscaling.provider: KEDA` on the test bed: the operator's KEDA ScaledObject, and what happens
where KEDA is not installed.

KEDA's controller does not run here; its ScaledObject CRD does (a minimal stand-in of its schema,
tests/integration/manifests/keda-scaledobjects-crd.yaml), which is what the operator needs and what
the apiserver checks the operator's objects against.

- without the CRD, an InferenceDeployment asking for KEDA gets Autoscaling=False (reason
  KedaNotInstalled, naming spec.autoscaling.provider, what is missing and what to do), no HPA is made in
  its place, and its Deployment keeps spec.replicas' split;
- installed later, the CRD is found without restarting the operator (discovery is looked up again when
  a pass wants what the last look did not find): the ScaledObject comes;
- with the CRD: one ScaledObject per target Deployment, accepted by the apiserver with every field the
  operator writes, targeting that Deployment, owned by the InferenceDeployment, and no HPA;
- switching provider to HPA deletes the ScaledObject and makes the HPA; switching back does the reverse;
- deleted with its InferenceDeployment by the controller-manager's garbage collector (its
  ownerReference), with the operator stopped so that its own cleanup plays no part.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from trtforge_dev.localdev import (
    OperatorEnv,
    condition,
    deployment_manifest,
)
from trtforge_dev.testbed.wait import wait_for

pytestmark = pytest.mark.integration

H100 = "NVIDIA-H100-80GB-HBM3"
CRD = Path(__file__).parent / "manifests" / "keda-scaledobjects-crd.yaml"
CRD_NAME = "scaledobjects.keda.sh"
PROM = "http://prometheus.monitoring.svc:9090"
KEDA = {"provider": "KEDA", "minReplicas": 1, "maxReplicas": 3, "metric": "QueueDepth", "targetValue": "500m"}
HPA = {**KEDA, "provider": "HPA"}


@pytest.fixture(scope="module")
def env(testbed: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorEnv]:
    tag = secrets.token_hex(3)
    e = OperatorEnv(
        testbed,
        tmp_path_factory.mktemp("keda"),
        [f"keda-{i}-{tag}" for i in range(4)],
        autoscaling={"keda_prometheus_address": PROM, "miss_retry_seconds": 1},
        resync_seconds=5,
    )
    e.start()
    try:
        yield e
    finally:
        e.close()
        _remove_crd(e)


def _crd_served(env: OperatorEnv) -> bool:
    try:
        res = client.CustomObjectsApi(env.api).get_api_resources("keda.sh", "v1alpha1")
    except ApiException as e:
        if e.status == 404:
            return False
        raise
    return any(r.name == "scaledobjects" for r in res.resources or [])


def _remove_crd(env: OperatorEnv) -> None:
    env.tb.kubectl("delete", "crd", CRD_NAME, "--ignore-not-found", "--wait=true")
    wait_for(lambda: not _crd_served(env), timeout=60, desc="KEDA's ScaledObject no longer served")


def _established(env: OperatorEnv) -> bool:
    established = 'jsonpath={.status.conditions[?(@.type=="Established")].status}'
    r = env.tb.kubectl("get", "crd", CRD_NAME, "-o", established, check=False)
    return r.returncode == 0 and r.stdout.strip() == "True"


def _install_crd(env: OperatorEnv) -> None:
    env.tb.kubectl("apply", "-f", str(CRD))
    # Polled, not `kubectl wait`: kubectl 1.20 fails at once on a CRD that has no conditions yet.
    wait_for(lambda: _established(env), timeout=60, desc="KEDA's ScaledObject CRD Established")
    wait_for(lambda: _crd_served(env), timeout=60, desc="KEDA's ScaledObject served")


@pytest.fixture
def keda_crd(env: OperatorEnv) -> None:
    """KEDA's ScaledObject CRD installed (left for the module's end: deleting it deletes every
    ScaledObject, which is not what a test should see)."""
    _install_crd(env)


@pytest.fixture
def ns(env: OperatorEnv, request: pytest.FixtureRequest) -> Iterator[str]:
    """A watched namespace of this test's own, with a Ready one-target engine `tiny` of its own model."""
    with env.tenant_with_tiny_engine(request.node.nodeid, H100) as n:
        yield n


def _scaled_objects(env: OperatorEnv, ns: str) -> list[dict[str, Any]]:
    if not _crd_served(env):
        return []
    co: Any = client.CustomObjectsApi(env.api)
    return list(co.list_namespaced_custom_object("keda.sh", "v1alpha1", ns, "scaledobjects")["items"])


def _hpas(env: OperatorEnv, ns: str) -> list[Any]:
    auto: Any = client.AutoscalingV1Api(env.api)
    return list(auto.list_namespaced_horizontal_pod_autoscaler(ns).items)


def _autoscaling(env: OperatorEnv, ns: str, name: str) -> dict[str, Any] | None:
    return condition(env.get("inferencedeployments", ns, name), "Autoscaling")


def _set_autoscaling(env: OperatorEnv, ns: str, name: str, auto: dict[str, Any]) -> None:
    co: Any = client.CustomObjectsApi(env.api)
    co.patch_namespaced_custom_object(
        "trtforge.io", "v1alpha1", ns, "inferencedeployments", name, {"spec": {"autoscaling": auto}}
    )


def _wait(env: OperatorEnv, check: Any, *, timeout: float, desc: str) -> Any:
    """wait_for, with the operator's log tail in the failure."""
    try:
        return wait_for(check, timeout=timeout, desc=desc)
    except TimeoutError as e:
        raise AssertionError(f"{e}\n--- operator log tail:\n{env.op.tail(120)}") from e


def test_keda_asked_for_without_its_crd_says_so_and_makes_no_hpa_then_comes_once_installed(
    env: OperatorEnv, ns: str
) -> None:
    _remove_crd(env)
    apps: Any = client.AppsV1Api(env.api)
    env.apply(deployment_manifest("x", "tiny", replicas=2, autoscaling=KEDA), ns)
    cond = _wait(
        env,
        lambda: (c := _autoscaling(env, ns, "x")) and c["status"] == "False" and c,
        timeout=180,
        desc="Autoscaling=False",
    )
    assert cond["reason"] == "KedaNotInstalled", cond
    for words in ("spec.autoscaling.provider", "scaledobjects.keda.sh", "install KEDA", "provider: HPA"):
        assert words in cond["message"], cond["message"]
    infd = env.wait_true("inferencedeployments", ns, "x", timeout=240)  # it serves, at the split
    (target,) = infd["status"]["targets"]
    assert "autoscaler" not in target and "scaledobjects.keda.sh" in target["message"]
    assert apps.read_namespaced_deployment(target["deploymentName"], ns).spec.replicas == 2
    assert _hpas(env, ns) == []  # no HPA in KEDA's place

    # KEDA installed now: found without a restart, and the ScaledObject comes
    _install_crd(env)
    (so,) = _wait(env, lambda: _scaled_objects(env, ns) or None, timeout=120, desc="the ScaledObject")
    assert so["spec"]["scaleTargetRef"]["name"] == target["deploymentName"]
    cond = _wait(
        env,
        lambda: (c := _autoscaling(env, ns, "x")) and c["status"] == "True" and c,
        timeout=60,
        desc="Autoscaling=True",
    )
    assert cond["reason"] == "AutoscalersInPlace" and "ScaledObject" in cond["message"]
    assert _hpas(env, ns) == []


def test_the_operators_scaled_object_targets_the_deployment_and_switches_with_the_provider(
    env: OperatorEnv, ns: str, keda_crd: None
) -> None:
    apps: Any = client.AppsV1Api(env.api)
    env.apply(deployment_manifest("x", "tiny", replicas=1, autoscaling=KEDA), ns)
    infd = env.wait_true("inferencedeployments", ns, "x", timeout=240)
    (target,) = infd["status"]["targets"]
    dname = target["deploymentName"]
    (so,) = _wait(env, lambda: _scaled_objects(env, ns) or None, timeout=60, desc="the ScaledObject")
    # accepted by the apiserver with every field the operator writes (none pruned)
    assert so["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": dname}
    assert (so["spec"]["minReplicaCount"], so["spec"]["maxReplicaCount"]) == (1, 3)
    (trigger,) = so["spec"]["triggers"]
    assert (trigger["type"], trigger["metricType"]) == ("prometheus", "AverageValue")
    assert trigger["metadata"] == {
        "serverAddress": PROM,
        "query": f'sum(trtforge_runtime_queue_depth{{namespace="{ns}",pod=~"{dname}-[a-z0-9]+-[a-z0-9]+"}})',
        "threshold": "0.5",
    }
    (owner,) = so["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"], owner["controller"]) == (
        "InferenceDeployment",
        infd["metadata"]["uid"],
        True,
    )
    dep = apps.read_namespaced_deployment(dname, ns)
    assert (
        dep.metadata.labels["trtforge.io/target"]
        == target["name"]
        == so["metadata"]["labels"]["trtforge.io/target"]
    )
    # the query's pod pattern takes exactly this Deployment's pods
    import re

    pattern = re.search(r'pod=~"([^"]+)"', trigger["metadata"]["query"]).group(1)  # type: ignore[union-attr]
    pods = env.pods(ns, "app.kubernetes.io/component=runtime")
    assert pods and all(re.fullmatch(pattern, p.metadata.name) for p in pods)
    assert _hpas(env, ns) == []
    _wait(
        env,
        lambda: (
            env.get("inferencedeployments", ns, "x")["status"]["targets"][0].get("autoscalerKind")
            == "ScaledObject"
        ),
        timeout=60,
        desc="the status names the ScaledObject",
    )

    # provider HPA: the ScaledObject goes, the HPA comes, on the same Deployment
    _set_autoscaling(env, ns, "x", HPA)
    (hpa,) = _wait(
        env,
        lambda: (h := _hpas(env, ns)) and not _scaled_objects(env, ns) and h,
        timeout=120,
        desc="the HPA in place of the ScaledObject",
    )
    assert hpa.spec.scale_target_ref.name == dname
    assert [o.kind for o in hpa.metadata.owner_references] == ["InferenceDeployment"]
    # and back
    _set_autoscaling(env, ns, "x", KEDA)
    _wait(
        env,
        lambda: not _hpas(env, ns) and len(_scaled_objects(env, ns)) == 1,
        timeout=120,
        desc="the ScaledObject in place of the HPA",
    )


def test_the_scaled_object_is_deleted_with_its_inferencedeployment_by_the_garbage_collector(
    env: OperatorEnv, ns: str, keda_crd: None
) -> None:
    co: Any = client.CustomObjectsApi(env.api)
    apps: Any = client.AppsV1Api(env.api)
    env.apply(deployment_manifest("x", "tiny", replicas=1, autoscaling=KEDA), ns)
    env.wait_true("inferencedeployments", ns, "x", timeout=240)
    (so,) = _wait(env, lambda: _scaled_objects(env, ns) or None, timeout=60, desc="the ScaledObject")
    # The operator stopped, its finalizer taken off by hand: only the ownerReference is left to act.
    env.op.stop()
    try:
        co.delete_namespaced_custom_object("trtforge.io", "v1alpha1", ns, "inferencedeployments", "x")
        co.patch_namespaced_custom_object(
            "trtforge.io", "v1alpha1", ns, "inferencedeployments", "x", {"metadata": {"finalizers": None}}
        )
        wait_for(
            lambda: not _scaled_objects(env, ns),
            timeout=180,
            desc=f"ScaledObject {so['metadata']['name']} collected with its InferenceDeployment",
        )
        _wait(
            env, lambda: not apps.list_namespaced_deployment(ns).items, timeout=120, desc="Deployments gone"
        )
    finally:
        env.op.start()


def test_discovery_looks_again_when_a_pass_wants_what_it_did_not_find(env: OperatorEnv) -> None:
    """The operator's discovery of the autoscaling APIs against the real apiserver: kept while fresh,
    looked up again once a wanted API was missing for miss_retry seconds, after the TTL, and at once
    after a write was refused with 404."""
    import asyncio

    from trtforge_operator.api import Autoscaling
    from trtforge_operator.autoscaling_discovery import AutoscalingDiscovery
    from trtforge_operator.config import AutoscalingSettings
    from trtforge_operator.kube import Kube
    from trtforge_operator.planning.autoscaling import AutoscalingApis, HpaApi

    keda = [Autoscaling.model_validate(KEDA)]
    hpa_only = [Autoscaling.model_validate(HPA)]
    d = AutoscalingDiscovery(
        Kube(env.api), AutoscalingSettings(discovery_ttl_seconds=300, miss_retry_seconds=10)
    )
    run = asyncio.run
    _remove_crd(env)
    assert run(d.current(keda, now=1000.0)) == AutoscalingApis(HpaApi.V2BETA2, keda=False)  # 1.20
    _install_crd(env)
    assert not run(d.current(keda, now=1005.0)).keda  # looked 5 s ago: kept
    assert not run(d.current(hpa_only, now=1200.0)).keda  # nothing missing for HPA: kept within the TTL
    assert run(d.current(keda, now=1011.0)).keda  # missing for 11 s: looked again, found
    _remove_crd(env)
    assert run(d.current(hpa_only, now=1100.0)).keda  # kept
    d.write_refused()
    assert not run(d.current(hpa_only, now=1101.0)).keda  # a 404 on a write: looked again at once
    _install_crd(env)
    assert not run(d.current(hpa_only, now=1200.0)).keda
    assert run(d.current(hpa_only, now=1401.0)).keda  # past the TTL
