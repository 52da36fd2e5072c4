"""The engine broker as its own component (issue 14), installed from the chart's rendered manifests
(trtforge_dev.chart_operator): the broker Deployment's two replicas, the operator's two apart. Serving never
waits for the operator, a broker replica killed mid-download costs a retry (never a corrupt engine),
and tenant isolation holds through each broker replica.

Real processes on the test bed: the broker pods run `trtforge broker` as the chart renders it, under
their own ServiceAccount, and check real TokenReviews; runtime pods are real `trtforge serve`
processes fetching through the broker Service (a local forwarder to the ready broker pods, as
kube-proxy would be: the test bed has no Service IPs).
"""

from __future__ import annotations

import re
import shutil
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from trtforge_dev import localdev
from trtforge_dev.chart_operator import BROKER, FULLNAME, RELEASE, ChartOperator
from trtforge_dev.localdev import deployment_manifest, engine_manifest, is_true
from trtforge_dev.modelzoo import light_model, sha256_of
from trtforge_dev.testbed.wait import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]
H100 = "NVIDIA-H100-80GB-HBM3"
RATE = 2 << 20  # bytes/s per download: the ~5 MB engine takes a few seconds, time to kill a replica
STREAMING = re.compile(r"broker streaming engines/[0-9a-f]{64}/model-")
SERVED = re.compile(r"broker served engines/[0-9a-f]{64}/model-")


@pytest.fixture(scope="module")
def ha(testbed: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChartOperator]:
    op = ChartOperator(
        testbed, tmp_path_factory.mktemp("broker-ha"), values={"broker": {"maxBytesPerSecond": RATE}}
    )
    try:
        op.install()
        op.wait_ready()
        shutil.copyfile(light_model("squeezenet"), op.models_dir / "squeezenet.onnx")
        yield op
    finally:
        op.close()


def _runtime_pods(ha: ChartOperator) -> list[Any]:
    sel = "app.kubernetes.io/component=runtime"
    return [
        p
        for p in ha.core.list_namespaced_pod(ha.tenant, label_selector=sel).items
        if not p.metadata.deletion_timestamp
    ]


def _ready(p: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in (p.status.conditions or []))


@pytest.fixture(scope="module")
def serving(ha: ChartOperator) -> str:
    """The tenant serves squeezenet through the brokers (Ready once); its engine key."""
    sha = sha256_of(ha.models_dir / "squeezenet.onnx")
    ha.apply_obj(
        engine_manifest("sq", sha, [{"gpu": H100}], model="pvc://models/squeezenet.onnx", precision="fp16")
    )
    eng = wait_for(
        lambda: e if is_true(e := ha.get("trtengines", "sq"), "Ready") else None,
        timeout=300,
        desc="sq built",
    )
    ha.apply_obj(deployment_manifest("sq", "sq"))
    wait_for(lambda: is_true(ha.get("inferencedeployments", "sq"), "Ready"), timeout=300, desc="sq serving")
    return str(eng["status"]["targets"][0]["engineKey"])


def _new_pod_ready(ha: ChartOperator, old: set[str], timeout: float = 180) -> Any:
    def ready() -> Any:
        pods = [p for p in _runtime_pods(ha) if p.metadata.name not in old]
        return next((p for p in pods if _ready(p)), None)

    return wait_for(ready, timeout=timeout, desc=f"a new runtime pod Ready in {ha.tenant}")


def _broker_log(ha: ChartOperator, pod: str) -> str:
    return ha.tb.pod_log(ha.ns, pod, BROKER)


def _restarts(ha: ChartOperator, pod: str) -> int:
    p = ha.core.read_namespaced_pod(pod, ha.ns)
    return sum(c.restart_count for c in p.status.container_statuses or [])


def test_the_chart_runs_the_broker_apart_under_its_own_account(ha: ChartOperator) -> None:
    brokers, operators = ha.pods(component=BROKER), ha.pods()
    assert len(brokers) == 2 and all(_ready(p) for p in brokers)
    assert {p.spec.service_account_name for p in brokers} == {f"{FULLNAME}-broker"}
    assert {p.spec.service_account_name for p in operators} == {FULLNAME}
    ports = {port.name for p in operators for c in p.spec.containers for port in c.ports or []}
    assert "broker" not in ports  # the operator serves no engines
    svc = ha.core.read_namespaced_service(f"{FULLNAME}-broker", ha.ns)
    assert svc.spec.selector["app.kubernetes.io/component"] == BROKER


def test_with_the_operator_down_a_new_runtime_pod_fetches_through_the_brokers(
    ha: ChartOperator, serving: str
) -> None:
    apps: Any = client.AppsV1Api(ha.api)
    (old,) = _runtime_pods(ha)
    apps.patch_namespaced_deployment_scale(FULLNAME, ha.ns, {"spec": {"replicas": 0}})
    try:
        sel = f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component=operator"
        wait_for(
            lambda: not ha.core.list_namespaced_pod(ha.ns, label_selector=sel).items,
            timeout=120,
            desc="every operator replica gone",
        )
        ha.core.delete_namespaced_pod(old.metadata.name, ha.tenant)  # its ReplicaSet makes a new one
        new = _new_pod_ready(ha, {old.metadata.name})
        assert not ha.core.list_namespaced_pod(ha.ns, label_selector=sel).items, "no operator ran"
        log = ha.tb.kubectl("logs", "-n", ha.tenant, new.metadata.name, check=False).stdout
        assert "fetched" in log, log[-2000:]
    finally:
        apps.patch_namespaced_deployment_scale(FULLNAME, ha.ns, {"spec": {"replicas": 2}})
        ha.wait_ready()


def test_a_broker_replica_killed_mid_download_costs_a_retry_not_a_corrupt_engine(
    ha: ChartOperator, serving: str
) -> None:
    brokers = [p.metadata.name for p in ha.pods(component=BROKER)]
    marks = {b: len(_broker_log(ha, b)) for b in brokers}
    old = {p.metadata.name for p in _runtime_pods(ha)}
    for name in old:
        ha.core.delete_namespaced_pod(name, ha.tenant)

    def streaming() -> str | None:
        return next((b for b in brokers if STREAMING.search(_broker_log(ha, b)[marks[b] :])), None)

    victim = wait_for(
        streaming, timeout=120, interval=0.1, desc="a broker streaming the engine to the new pod"
    )
    restarted = _restarts(ha, victim)
    ha.kill_container(victim)  # the replica dies mid-download (the kubelet restarts it)
    new = _new_pod_ready(ha, old)
    log = ha.tb.kubectl("logs", "-n", ha.tenant, new.metadata.name, check=False).stdout
    assert "broke midway" in log, log[-3000:]
    # Who served the rest: the other replica (its log from the mark on) or the victim's restarted
    # container (its whole current log, once the kubelet has restarted it).
    wait_for(lambda: _restarts(ha, victim) > restarted, timeout=60, desc=f"{victim} restarted")
    served_by = [b for b in brokers if SERVED.search(_broker_log(ha, b)[0 if b == victim else marks[b] :])]
    print(f"\nbroker {victim} SIGKILLed mid-download; the rest was served by {served_by}")
    assert served_by, "no broker replica finished the download"
    restarts = sum(c.restart_count for c in new.status.container_statuses or [])
    assert restarts == 0, "the retry happened inside the fetch, not by a container restart"


def test_tenant_isolation_holds_through_each_broker_replica(ha: ChartOperator, serving: str) -> None:
    key = serving
    other = f"{ha.tenant}-b"
    localdev.ensure_namespace(ha.api, other)
    try:
        wait_for(
            lambda: ha.core.read_namespaced_service_account("default", other),
            timeout=60,
            desc=f"the default ServiceAccount of {other}",
            ignore=(ApiException,),
        )

        def get(ns: str, endpoint: str) -> int:
            tok = ha.core.create_namespaced_service_account_token(
                "default", ns, {"spec": {"audiences": ["trtforge-broker"], "expirationSeconds": 600}}
            )
            req = urllib.request.Request(f"{endpoint}/engines/{key}/manifest.json")
            req.add_header("Authorization", f"Bearer {tok.status.token}")
            try:
                with urllib.request.urlopen(req, timeout=30) as r:
                    return int(r.status)
            except urllib.error.HTTPError as e:
                return int(e.code)

        ha.wait_ready()  # the replica killed above is back
        endpoints = [
            f"http://{p.status.pod_ip}:{port.container_port}"
            for p in ha.pods(component=BROKER)
            for c in p.spec.containers
            for port in c.ports or []
            if port.name == "broker"
        ]
        assert len(endpoints) == 2
        for endpoint in endpoints:
            wait_for(
                lambda ep=endpoint: get(ha.tenant, ep) == 200,
                timeout=60,
                desc=f"{endpoint} serving {ha.tenant}",
                ignore=(urllib.error.URLError,),
            )
            assert get(other, endpoint) == 403  # only the first tenant references (and proved) it
    finally:
        ha.core.delete_namespace(other)
