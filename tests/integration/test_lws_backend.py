"""The `lws` group backend against the test bed's real apiserver (Kubernetes 1.20) with the real
LeaderWorkerSet CRD from kubernetes-sigs/lws (manifests/lws-leaderworkersets-crd.SOURCE), unchanged:
the apiserver accepts the CRD and the rendered object, keeps every field the operator sets (a field
its schema lacked would be pruned), refuses a bad one by its schema, and the readiness read from the
`Available` condition follows the status that LeaderWorkerSet's controller writes. No LWS controller
runs on the test bed, so no pods come of it; the status is written here as that controller would."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from trtforge_dev.testbed.handle import TestBed
from trtforge_operator.apply import lws

from tests.integration import lws_crd as lws_crd_install

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def lws_crd(testbed: TestBed) -> Iterator[None]:
    lws_crd_install.install(testbed)
    try:
        yield
    finally:
        lws_crd_install.remove(testbed)


def _pod_spec(args: list[str]) -> dict[str, Any]:
    return {
        "containers": [
            {
                "name": "runtime",
                "image": "trtforge-runtime:dev",
                "args": ["serve-llm", "--lws", *args],
                "ports": [{"name": "http", "containerPort": 8000}, {"name": "rank", "containerPort": 50052}],
                "readinessProbe": {"httpGet": {"path": "/v2/health/ready", "port": "http"}},
                "livenessProbe": {"httpGet": {"path": "/v2/health/live", "port": "http"}},
                "resources": {"limits": {"nvidia.com/gpu": "8"}},
            }
        ],
        "terminationGracePeriodSeconds": 30,
    }


def _workload(namespace: str, ranks: int = 2) -> lws.GroupWorkload:
    return lws.GroupWorkload(
        name="llama-mn",
        namespace=namespace,
        groups=2,
        ranks=ranks,
        leader=_pod_spec(["--checkpoint", "k"]),
        worker=_pod_spec([]),
        labels={"trtforge.io/inferencedeployment": "llama"},
    )


def test_the_apiserver_accepts_the_real_crd_and_the_rendered_leaderworkerset(
    testbed: TestBed, namespace: str, lws_crd: None
) -> None:
    with testbed.api_client() as api:
        co: Any = client.CustomObjectsApi(api)
        args = (lws.GROUP, lws.VERSION, namespace, lws.PLURAL)
        expected = lws.render(_workload(namespace))
        co.create_namespaced_custom_object(*args, expected)
        live = co.get_namespaced_custom_object(*args, "llama-mn")
        # Nothing the operator set was pruned or changed; the server's defaults do not count as a change.
        assert not lws.needs_update(expected, live), live["spec"]
        tmpl = live["spec"]["leaderWorkerTemplate"]
        assert (tmpl["size"], tmpl["restartPolicy"]) == (2, "RecreateGroupOnPodRestart")
        assert live["spec"]["startupPolicy"] == "LeaderCreated"
        rolling = live["spec"]["rolloutStrategy"]["rollingUpdateConfiguration"]
        assert rolling == {"maxSurge": 0, "maxUnavailable": 1, "partition": 0}  # partition: the CRD's default
        assert lws.readiness(live) == lws.Readiness(
            False, "Progressing", "the LeaderWorkerSet has no Available condition yet"
        )

        # A group of another size is a change; the update lands on the live resourceVersion.
        bigger = lws.render(_workload(namespace, ranks=4))
        assert lws.needs_update(bigger, live)
        co.replace_namespaced_custom_object(*args, "llama-mn", lws.update_body(bigger, live))
        live = co.get_namespaced_custom_object(*args, "llama-mn")
        assert not lws.needs_update(bigger, live) and live["spec"]["leaderWorkerTemplate"]["size"] == 4

        # The status LeaderWorkerSet's controller writes, through the status subresource.
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        cond = {
            "type": "Available",
            "status": "True",
            "reason": "AllGroupsReady",
            "message": "All replicas are ready",
            "lastTransitionTime": now,
        }
        status = {
            "conditions": [cond],
            "observedGeneration": live["metadata"]["generation"],
            "readyReplicas": 2,
            "replicas": 2,
            "updatedReplicas": 2,
            "hpaPodSelector": "leaderworkerset.sigs.k8s.io/name=llama-mn",
        }
        live = co.patch_namespaced_custom_object_status(*args, "llama-mn", {"status": status})
        assert lws.readiness(live) == lws.Readiness(True, "AllGroupsReady", "All replicas are ready")
        cond["status"], cond["reason"] = "False", "GroupsNotReady"
        live = co.patch_namespaced_custom_object_status(*args, "llama-mn", {"status": status})
        assert not lws.readiness(live).ready and lws.readiness(live).reason == "GroupsNotReady"


def test_the_crds_schema_refuses_a_bad_restart_policy(
    testbed: TestBed, namespace: str, lws_crd: None
) -> None:
    bad = lws.render(_workload(namespace))
    bad["spec"]["leaderWorkerTemplate"]["restartPolicy"] = "RestartNothing"
    with testbed.api_client() as api:
        co: Any = client.CustomObjectsApi(api)
        with pytest.raises(ApiException) as e:
            co.create_namespaced_custom_object(lws.GROUP, lws.VERSION, namespace, lws.PLURAL, bad)
    assert e.value.status == 422 and "restartPolicy" in str(e.value.body), e.value.body


def test_the_apiserver_accepts_the_rank_port_policy(testbed: TestBed, namespace: str) -> None:
    """Accepted as rendered (the test bed has no CNI that enforces NetworkPolicy: that another pod is
    refused is not shown here)."""
    from trtforge_operator.apply.group_network import rank_port_policy

    body = rank_port_policy("llama-g0", namespace, [8000, 8080])
    with testbed.api_client() as api:
        net: Any = client.NetworkingV1Api(api)
        net.create_namespaced_network_policy(namespace, body)
        live = api.sanitize_for_serialization(net.read_namespaced_network_policy("llama-g0-ranks", namespace))
    assert lws.derivative(body["spec"], live["spec"]), live["spec"]
