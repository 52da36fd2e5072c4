"""The engine broker as its own component (issue 14): two `trtforge broker` replicas, the operator
apart. Serving never waits for the operator, a replica killed mid-download costs a retry through the
other (never a corrupt engine), and tenant isolation holds through the standalone brokers.

Real processes on the test bed: the brokers check real TokenReviews, runtime pods are real
`trtforge serve` processes fetching through the brokers' endpoint list (no Service IPs here).
"""

from __future__ import annotations

import re
import secrets
import shutil
import signal
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from trtforge_dev.localdev import OperatorEnv, deployment_manifest, engine_manifest
from trtforge_dev.testbed.wait import wait_for

from tests.modelzoo import light_model, sha256_of

pytestmark = [pytest.mark.integration, pytest.mark.slow]
H100 = "NVIDIA-H100-80GB-HBM3"
RATE = 2 << 20  # bytes/s per download: the ~5 MB engine takes a few seconds, time to kill a replica


@pytest.fixture(scope="module")
def env(testbed: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorEnv]:
    tag = secrets.token_hex(3)
    e = OperatorEnv(
        testbed,
        tmp_path_factory.mktemp("broker-ha"),
        [f"ha-a-{tag}", f"ha-b-{tag}"],
        brokers=2,
        broker={"max_bytes_per_second": RATE},
    )
    shutil.copyfile(light_model("squeezenet"), e.models_dir / "squeezenet.onnx")
    e.start()
    try:
        yield e
    finally:
        e.close()


def _runtime_pods(env: OperatorEnv, ns: str) -> list[Any]:
    return env.pods(ns, "app.kubernetes.io/component=runtime")


def _ready(p: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in (p.status.conditions or []))


def _serving(env: OperatorEnv) -> str:
    """Namespace A serves squeezenet through the brokers (Ready once)."""
    ns = env.tenants[0]
    sha = sha256_of(env.models_dir / "squeezenet.onnx")
    env.apply(
        engine_manifest("sq", sha, [{"gpu": H100}], model="pvc://models/squeezenet.onnx", precision="fp16"),
        ns,
    )
    env.wait_true("trtengines", ns, "sq", timeout=300)
    env.apply(deployment_manifest("sq", "sq"), ns)
    env.wait_true("inferencedeployments", ns, "sq", timeout=300)
    return ns


@pytest.fixture(scope="module")
def serving(env: OperatorEnv) -> str:
    return _serving(env)


def _new_pod_ready(env: OperatorEnv, ns: str, old: set[str], timeout: float = 180) -> Any:
    def ready() -> Any:
        pods = [p for p in _runtime_pods(env, ns) if p.metadata.name not in old]
        return next((p for p in pods if _ready(p)), None)

    return wait_for(ready, timeout=timeout, desc=f"a new runtime pod Ready in {ns}")


def test_with_the_operator_down_a_new_runtime_pod_fetches_through_the_brokers(
    env: OperatorEnv, serving: str
) -> None:
    ns = serving
    (old,) = _runtime_pods(env, ns)
    env.op.kill()  # every operator replica gone
    try:
        core: Any = client.CoreV1Api(env.api)
        core.delete_namespaced_pod(old.metadata.name, ns)  # its ReplicaSet makes a new one
        new = _new_pod_ready(env, ns, {old.metadata.name})
        assert not env.op.alive()
        log = env.tb.kubectl("logs", "-n", ns, new.metadata.name, check=False).stdout
        assert "fetched" in log, log[-2000:]
    finally:
        env.op.start()


def test_a_broker_replica_killed_mid_download_costs_a_retry_not_a_corrupt_engine(
    env: OperatorEnv, serving: str
) -> None:
    ns = serving
    first, second = env.brokers
    old = {p.metadata.name for p in _runtime_pods(env, ns)}
    marks = [b.log.stat().st_size for b in env.brokers]
    core: Any = client.CoreV1Api(env.api)
    for name in old:
        core.delete_namespaced_pod(name, ns)

    def streaming() -> bool:
        text = first.log.read_text(errors="replace")[marks[0] :]
        return bool(re.search(r"broker streaming engines/[0-9a-f]{64}/model-", text))

    wait_for(streaming, timeout=120, desc="the first broker streaming the engine to the new pod")
    assert first.proc is not None
    first.proc.send_signal(signal.SIGKILL)  # the replica dies mid-download
    first.proc.wait(timeout=10)
    try:
        new = _new_pod_ready(env, ns, old)
        log = env.tb.kubectl("logs", "-n", ns, new.metadata.name, check=False).stdout
        assert "broke midway" in log, log[-3000:]
        served = second.log.read_text(errors="replace")[marks[1] :]
        assert re.search(r"broker served engines/[0-9a-f]{64}/model-", served), served[-2000:]
        restarts = sum(c.restart_count for c in new.status.container_statuses or [])
        assert restarts == 0, "the retry happened inside the fetch, not by a container restart"
    finally:
        first.start()


def test_tenant_isolation_holds_through_the_standalone_brokers(env: OperatorEnv, serving: str) -> None:
    a, b = env.tenants
    key = env.get("trtengines", a, "sq")["status"]["targets"][0]["engineKey"]
    core: Any = client.CoreV1Api(env.api)

    def get(ns: str, endpoint: str) -> int:
        tok = core.create_namespaced_service_account_token(
            "default", ns, {"spec": {"audiences": ["trtforge-broker"], "expirationSeconds": 600}}
        )
        req = urllib.request.Request(f"{endpoint}/engines/{key}/manifest.json")
        req.add_header("Authorization", f"Bearer {tok.status.token}")
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return int(r.status)
        except urllib.error.HTTPError as e:
            return int(e.code)

    for endpoint in env.config["broker"]["endpoints"]:
        wait_for(  # the replica killed above is back: wait until it listens
            lambda ep=endpoint: get(a, ep) == 200,
            timeout=60,
            desc=f"{endpoint} serving A",
            ignore=(urllib.error.URLError,),
        )
        assert get(b, endpoint) == 403  # only A references (and proved) this engine
