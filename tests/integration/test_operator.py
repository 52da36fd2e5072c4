"""The operator on the test bed: `trtforge operator` as a subprocess, scoped to this module's namespaces.

Builds land on the right emulated GPU node types (full H100, arm64 GH200, a B200 MIG slice), engines
reach the store, the same key from another namespace builds nothing, status is written only on
change, a bad build says why and stalls, deletion cleans up, and a SIGKILLed operator converges.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from kubernetes import client
from trtforge_dev.localdev import (
    OperatorEnv,
    condition,
    delete_with_cleanup,
    deployment_manifest,
    engine_manifest,
    tiny_model,
)
from trtforge_dev.testbed.wait import wait_for
from trtforge_operator.labels import REQUESTER_PREFIX

pytestmark = [pytest.mark.integration, pytest.mark.long]

H100 = "NVIDIA-H100-80GB-HBM3"
GH200 = "NVIDIA-GH200-480GB"
B200 = "NVIDIA-B200"
TARGETS = [{"gpu": H100}, {"gpu": GH200}, {"gpu": B200, "mig": "1g.23gb"}]
ONE_TARGET = [{"gpu": H100}]
# Tenant namespaces the module's operator watches; each test takes two that no other test touches.
NAMESPACE_POOL = 20


@pytest.fixture(scope="module")
def env(testbed: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorEnv]:
    tag = secrets.token_hex(3)
    e = OperatorEnv(
        testbed,
        tmp_path_factory.mktemp("operator"),
        [f"op-{i}-{tag}" for i in range(NAMESPACE_POOL)],
        cache_group=f"g-{tag}",  # one cache group: the namespaces share engines (docs/security.md)
        # Resyncs every 5 s: test_status_is_written_only_when_it_changes waits out a full pass of both
        # loops (the test bed's default, 15 s, made it the module's longest test).
        resync_seconds=5,
        engine_resync_seconds=5,
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
def tenants(env: OperatorEnv, free_namespaces: list[str]) -> Iterator[tuple[str, str]]:
    """Two watched namespaces of this test's own: nothing another test made is in them. Afterwards
    what the test made there is deleted and its runtime pods are gone, so their GPUs are free again
    (the GH200 node has one)."""
    assert len(free_namespaces) >= 2, "more tests than namespaces: raise NAMESPACE_POOL"
    pair = free_namespaces.pop(0), free_namespaces.pop(0)
    yield pair
    co: Any = client.CustomObjectsApi(env.api)
    for ns in pair:
        for plural in ("inferencedeployments", "trtengines"):
            for o in co.list_namespaced_custom_object("trtforge.io", "v1alpha1", ns, plural)["items"]:
                delete_with_cleanup(env.api, ns, plural, o["metadata"]["name"])
    wait_for(
        lambda: not any(env.pods(ns, "app.kubernetes.io/component=runtime") for ns in pair),
        timeout=120,
        desc=f"runtime pods in {pair} gone",
    )


@dataclass(frozen=True)
class Model:
    uri: str
    sha256: str
    path: Path


@pytest.fixture
def model(env: OperatorEnv, request: pytest.FixtureRequest) -> Model:
    """A model of this test's own (its weights seeded by the test's name), so its engine keys are too."""
    name = request.node.name.replace("_", "-")[:40]
    seed = int.from_bytes(hashlib.sha256(request.node.nodeid.encode()).digest()[:4], "big")
    path = env.models_dir / f"{name}.onnx"
    return Model(f"pvc://models/{name}.onnx", tiny_model(path, seed=seed), path)


def engine(name: str, m: Model, targets: list[dict[str, str]], **builder: Any) -> dict[str, Any]:
    manifest = engine_manifest(name, m.sha256, targets, model=m.uri)
    if builder:
        manifest["spec"]["builder"] = builder
    return manifest


def jobs_of(env: OperatorEnv, namespace: str) -> list[Any]:
    """Build Jobs that name a requester in `namespace` (the build namespace is shared by all tests)."""
    prefix = f"{namespace}/"
    return [
        j
        for j in env.jobs()
        if any(
            k.startswith(REQUESTER_PREFIX) and v.startswith(prefix)
            for k, v in (j.metadata.annotations or {}).items()
        )
    ]


def ready_engine(
    env: OperatorEnv, ns: str, name: str, m: Model, targets: list[dict[str, str]]
) -> dict[str, Any]:
    env.apply(engine(name, m, targets), ns)
    return env.wait_true("trtengines", ns, name, timeout=240)


def _build_pods(env: OperatorEnv) -> dict[str, Any]:
    return {
        p.metadata.labels.get("job-name"): p
        for p in env.pods(env.build_ns, "app.kubernetes.io/component=builder")
    }


def test_build_per_gpu_type_then_serve(env: OperatorEnv, tenants: tuple[str, str], model: Model) -> None:
    ns = tenants[0]
    t0 = time.monotonic()
    env.apply(engine("tiny", model, TARGETS), ns)
    eng = env.wait_true("trtengines", ns, "tiny", timeout=240)
    ready_s = time.monotonic() - t0
    targets = {t["name"]: t for t in eng["status"]["targets"]}
    assert eng["status"]["readyTargets"] == "3/3", eng["status"]
    assert len(jobs_of(env, ns)) == 3
    pods = _build_pods(env)
    for t in targets.values():
        assert t["phase"] == "Ready" and t["cacheHit"] is False and len(t["engineKey"]) == 64
        assert (env.store_dir / "engines" / t["engineKey"] / "manifest.json").is_file()
        pod = pods[t["jobName"]]
        labels = env.node_labels(pod.spec.node_name)
        assert labels["nvidia.com/gpu.product"] == t["gpu"], (t, pod.spec.node_name)
        if t["gpu"] == GH200:
            assert labels["kubernetes.io/arch"] == "arm64"
        if t.get("mig"):
            assert pod.spec.node_name == "gpu-b200-mig-0"
            assert pod.spec.containers[0].resources.limits["nvidia.com/mig-1g.23gb"] == "1"
    print(f"\nTRTEngine Ready with 3 targets in {ready_s:.1f}s")
    assert "trtforge.io/finalizer" in eng["metadata"]["finalizers"]
    core: Any = client.CoreV1Api(env.api)

    def reasons() -> set[str]:
        evs = core.list_namespaced_event(ns, field_selector="involvedObject.name=tiny").items
        return {e.reason for e in evs}

    wait_for(lambda: {"BuildStarted", "EngineReady"} <= reasons(), timeout=30, desc="Events on transitions")

    t1 = time.monotonic()
    env.apply(deployment_manifest("tiny", "tiny", replicas=3), ns)  # one pod per target
    infd = env.wait_true("inferencedeployments", ns, "tiny", timeout=180)
    print(f"InferenceDeployment Ready in {time.monotonic() - t1:.1f}s")
    assert infd["status"]["ready"] == "3/3"
    runtime = env.pods(ns, "app.kubernetes.io/component=runtime")
    assert len(runtime) == 3
    for p in runtime:
        target = targets[p.metadata.labels["trtforge.io/target"]]
        assert env.node_labels(p.spec.node_name)["nvidia.com/gpu.product"] == target["gpu"]
        assert p.metadata.annotations["trtforge.io/engine-key"] == target["engineKey"]
    _infer(runtime[0].status.pod_ip, model.path)


def _infer(pod_ip: str, model: Path) -> None:
    import onnxruntime as ort
    import tritonclient.http as httpclient

    x = np.random.default_rng(7).standard_normal((1, 16)).astype(np.float32)
    c = httpclient.InferenceServerClient(f"{pod_ip}:8000")
    inp = httpclient.InferInput("x", [1, 16], "FP32")
    inp.set_data_from_numpy(x, binary_data=True)
    res = c.infer("tiny", [inp], outputs=[httpclient.InferRequestedOutput("y", binary_data=True)])
    got = res.as_numpy("y")
    ref = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)


def test_same_key_in_another_namespace_of_the_group_pays_a_verify_not_a_build(
    env: OperatorEnv, tenants: tuple[str, str], model: Model
) -> None:
    a, b = tenants
    ready_engine(env, a, "tiny", model, TARGETS)
    before = {j.metadata.name for j in env.jobs()}
    env.apply(engine("tiny-copy", model, TARGETS), b)
    eng = env.wait_true("trtengines", b, "tiny-copy", timeout=120)
    assert all(t["cacheHit"] is True and t["phase"] == "Ready" for t in eng["status"]["targets"])
    assert {j.metadata.name for j in env.jobs()} == before
    assert eng["status"]["model"]["sha256"] == model.sha256
    batch: Any = client.BatchV1Api(env.api)
    verify = batch.list_namespaced_job(b, label_selector="app.kubernetes.io/component=verifier").items
    assert len(verify) == 1 and verify[0].status.succeeded == 1


def _reconciles(env: OperatorEnv) -> dict[str, float]:
    """The operator's reconcile counters by kind, read from its /metrics."""
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{env.config['metrics_port']}/metrics", timeout=10) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("trtforge_reconciles_total{"):
            kind = line.split('kind="', 1)[1].split('"', 1)[0]
            out[kind] = out.get(kind, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def test_status_is_written_only_when_it_changes(
    env: OperatorEnv, tenants: tuple[str, str], model: Model
) -> None:
    ns = tenants[0]
    ready_engine(env, ns, "tiny", model, ONE_TARGET)
    env.apply(deployment_manifest("tiny", "tiny"), ns)
    env.wait_true("inferencedeployments", ns, "tiny", timeout=180)
    rv = {
        p: env.get(p, ns, "tiny")["metadata"]["resourceVersion"]
        for p in ("trtengines", "inferencedeployments")
    }
    # Every watched object is reconciled again on each resync: wait until both kinds have had more
    # reconciles than there are objects in the whole module, so ours were among them.
    start = _reconciles(env)
    co: Any = client.CustomObjectsApi(env.api)
    total = sum(
        len(co.list_namespaced_custom_object("trtforge.io", "v1alpha1", n, p)["items"])
        for n in env.tenants
        for p in ("trtengines", "inferencedeployments")
    )
    wait_for(
        lambda: all(_reconciles(env).get(k, 0) - start.get(k, 0) > total for k in ("trte", "infd")),
        timeout=4 * max(env.config["resync_seconds"], env.config["engine_resync_seconds"]) + 60,
        desc="a full resync pass of both loops",
    )
    after = {p: env.get(p, ns, "tiny")["metadata"]["resourceVersion"] for p in rv}
    assert after == rv


def test_broker_serves_engines_only_to_namespaces_that_deploy_them(
    env: OperatorEnv, tenants: tuple[str, str], model: Model
) -> None:
    """TokenReview on a projected service-account token, then the namespace's InferenceDeployments."""
    import urllib.error
    import urllib.request

    a, b = tenants
    key = ready_engine(env, a, "tiny", model, ONE_TARGET)["status"]["targets"][0]["engineKey"]
    env.apply(deployment_manifest("tiny", "tiny"), a)
    ready_engine(env, b, "tiny", model, ONE_TARGET)  # the same key, but nothing deployed in b
    core: Any = client.CoreV1Api(env.api)
    url = f"{env.config['broker']['url']}/engines/{key}/manifest.json"

    def get(ns: str | None) -> int:
        req = urllib.request.Request(url)
        if ns is not None:
            tok = core.create_namespaced_service_account_token(
                "default", ns, {"spec": {"audiences": ["trtforge-broker"], "expirationSeconds": 600}}
            )
            req.add_header("Authorization", f"Bearer {tok.status.token}")
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return int(r.status)
        except urllib.error.HTTPError as e:
            return int(e.code)

    wait_for(lambda: get(a) == 200, timeout=60, desc="the broker serving a's deployed engine")
    assert get(b) == 403  # a TRTEngine with the same key, but nothing deployed there
    assert get(None) == 401
    # Liveness and metrics of the operator process.
    with urllib.request.urlopen(f"http://127.0.0.1:{env.config['liveness_port']}/healthz", timeout=10) as r:
        assert r.status == 200
    with urllib.request.urlopen(f"http://127.0.0.1:{env.config['metrics_port']}/metrics", timeout=10) as r:
        text = r.read().decode()
    assert "trtforge_build_jobs_created_total" in text and "trtforge_broker_requests_total" in text


def test_a_spec_change_builds_new_engines_and_rolls_out_without_a_gap(
    env: OperatorEnv, tenants: tuple[str, str], model: Model
) -> None:
    """New key → new Job → Deployments roll to it; maxUnavailable 0 keeps the old pods serving meanwhile."""
    import threading

    ns, other = tenants
    apps: Any = client.AppsV1Api(env.api)
    # The GH200 node has one GPU: no room to surge there, so serve only H100 and the MIG slice.
    ready_engine(env, ns, "tiny", model, TARGETS)
    env.apply(
        deployment_manifest(
            "tiny", "tiny", replicas=2, targets=[{"gpu": H100}, {"gpu": B200, "mig": "1g.23gb"}]
        ),
        ns,
    )
    env.wait_true("inferencedeployments", ns, "tiny", timeout=180)
    assert len(apps.list_namespaced_deployment(ns).items) == 2
    old = {t["name"]: t["engineKey"] for t in env.get("trtengines", ns, "tiny")["status"]["targets"]}
    low: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            deps = apps.list_namespaced_deployment(ns).items
            low.append(min((d.status.available_replicas or 0) for d in deps))
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        env.apply(engine("tiny", model, TARGETS, optimizationLevel=2), ns)

        def rolled() -> bool:
            eng = env.get("trtengines", ns, "tiny")
            if eng["status"].get("observedGeneration") != 2 or eng["status"].get("readyTargets") != "3/3":
                return False
            new = {t["name"]: t["engineKey"] for t in eng["status"]["targets"]}
            infd = env.get("inferencedeployments", ns, "tiny")
            served = {t["name"]: t.get("engineKey") for t in infd["status"].get("targets", [])}
            ready = any(c["type"] == "Ready" and c["status"] == "True" for c in infd["status"]["conditions"])
            return ready and all(served[k] == new[k] != old[k] for k in served)

        wait_for(rolled, timeout=180, desc="the new engines built and rolled out")
    finally:
        stop.set()
        sampler.join(timeout=5)
    assert low and min(low) >= 1, "a Deployment had no available pod during the rollout"
    keys = {
        p.metadata.annotations["trtforge.io/engine-key"]
        for p in env.pods(ns, "app.kubernetes.io/component=runtime")
        if not p.metadata.deletion_timestamp
    }
    assert keys and not keys & set(old.values())
    # Another namespace asking for the changed engine: a cache hit on the new keys, no new Job.
    jobs_before = {j.metadata.name for j in env.jobs()}
    env.apply(engine("tiny-copy", model, TARGETS, optimizationLevel=2), other)
    copy = env.wait_true("trtengines", other, "tiny-copy", timeout=60)
    assert {t["engineKey"] for t in copy["status"]["targets"]} == {
        t["engineKey"] for t in env.get("trtengines", ns, "tiny")["status"]["targets"]
    }
    assert {j.metadata.name for j in env.jobs()} == jobs_before


def test_a_wrong_pin_says_why_and_stalls_before_any_build(
    env: OperatorEnv, tenants: tuple[str, str], model: Model
) -> None:
    ns = tenants[0]
    env.apply(engine_manifest("wrong-pin", "0" * 64, [{"gpu": H100}], model=model.uri), ns)
    eng = env.wait_true("trtengines", ns, "wrong-pin", cond="Stalled", timeout=120)
    stalled = condition(eng, "Stalled")
    assert stalled is not None and stalled["reason"] == "ModelVerifyFailed"
    assert "ModelIntegrity" in stalled["message"] and "sha256" in stalled["message"]
    assert "\n" not in stalled["message"]
    (t,) = eng["status"]["targets"]
    assert t["phase"] == "Failed" and not t.get("attempts")
    assert not jobs_of(env, ns)  # the verify step caught it: no build


def test_deletion_cleans_up_children_but_keeps_shared_jobs(
    env: OperatorEnv, tenants: tuple[str, str], model: Model
) -> None:
    a, b = tenants
    # Two engines asking for the same builds share the Jobs: each claims them while it waits on them.
    # A quota of no pods holds the builds until both have claimed (an engine already in the store
    # claims no Job), then the builds run.
    quota = {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "hold-builds"}}
    env.apply({**quota, "spec": {"hard": {"pods": "0"}}}, env.build_ns)
    try:
        env.apply(engine("tiny", model, TARGETS), a)
        env.apply(engine("tiny-copy", model, TARGETS), b)

        def both_claimed() -> bool:
            mine = {j.metadata.name for j in jobs_of(env, a)}
            return bool(mine) and mine == {j.metadata.name for j in jobs_of(env, b)}

        wait_for(both_claimed, timeout=120, desc="both engines claim the same build Jobs")
    finally:
        env.tb.kubectl("delete", "resourcequota", "hold-builds", "-n", env.build_ns, check=False)
    for j in jobs_of(env, a):  # a Job update syncs it now, not after the Job controller's backoff
        env.tb.kubectl("annotate", "job", j.metadata.name, "-n", env.build_ns, "test/resync=1", "--overwrite")
    env.wait_true("trtengines", a, "tiny", timeout=240)
    env.wait_true("trtengines", b, "tiny-copy", timeout=240)
    env.apply(deployment_manifest("tiny", "tiny"), a)
    env.apply(engine_manifest("wrong-pin", "0" * 64, [{"gpu": H100}], model=model.uri), b)
    env.wait_true("trtengines", b, "wrong-pin", cond="Stalled", timeout=120)
    env.wait_true("inferencedeployments", a, "tiny", timeout=180)
    # The Jobs the first namespace's engine still uses (its current keys) must survive.
    shared = {t["jobName"] for t in env.get("trtengines", a, "tiny")["status"]["targets"]}
    assert shared <= {j.metadata.name for j in jobs_of(env, b)}, "b's engine never claimed a's Jobs"
    delete_with_cleanup(env.api, b, "trtengines", "tiny-copy")
    delete_with_cleanup(env.api, b, "trtengines", "wrong-pin")
    co: Any = client.CustomObjectsApi(env.api)
    wait_for(
        lambda: not co.list_namespaced_custom_object("trtforge.io", "v1alpha1", b, "trtengines")["items"],
        timeout=30,
        desc="engines in the second namespace deleted",
    )
    wait_for(lambda: not jobs_of(env, b), timeout=30, desc="b's requester annotations removed")
    names = {j.metadata.name for j in env.jobs()}
    assert shared <= names, (shared, names)  # still used by the first namespace's engine
    delete_with_cleanup(env.api, a, "inferencedeployments", "tiny")
    apps: Any = client.AppsV1Api(env.api)
    wait_for(
        lambda: not apps.list_namespaced_deployment(a).items, timeout=30, desc="runtime Deployments deleted"
    )
    delete_with_cleanup(env.api, a, "trtengines", "tiny")
    wait_for(
        lambda: not shared & {j.metadata.name for j in env.jobs()},
        timeout=30,
        desc="build Jobs deleted with their last requester",
    )
    # The engines stay in the store: it is a cache shared by every namespace.
    assert list((env.store_dir / "engines").glob("*/manifest.json"))


def test_operator_killed_mid_build_converges_with_one_job_per_key(
    env: OperatorEnv, tenants: tuple[str, str], model: Model
) -> None:
    ns = tenants[0]
    env.apply(engine("restart", model, TARGETS), ns)
    wait_for(lambda: len(jobs_of(env, ns)) >= 1, timeout=60, interval=0.05, desc="the first build Job")
    env.op.kill()  # SIGKILL right after the first Job appeared: the rest is unknown to the operator
    env.op.start()
    wait_for(lambda: len(jobs_of(env, ns)) >= 2, timeout=60, interval=0.05, desc="more build Jobs")
    env.op.kill()  # and once more while builds run
    env.op.start()
    eng = env.wait_true("trtengines", ns, "restart", timeout=240)
    jobs = jobs_of(env, ns)
    # One Job per request key (what the operator asked for; the engine key is the builder's answer).
    keys = [j.metadata.annotations["trtforge.io/request-digest"] for j in jobs]
    assert len(jobs) == 3 and len(set(keys)) == 3, [j.metadata.name for j in jobs]
    assert not any(j.metadata.name.endswith("-a2") for j in jobs)
    assert {t["requestKey"] for t in eng["status"]["targets"]} == set(keys)
    assert len({t["engineKey"] for t in eng["status"]["targets"]}) == 3
