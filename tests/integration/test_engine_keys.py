"""Engine keys by construction, on the test bed (issue 11).

The operator names builds by what it asked for (the request key) and never predicts a backend
version; the builder reports the engine it really made. How a new builder image is stood in for: the
test bed ignores images, so the operator's ``builder_image`` changes (that is what the request key
holds) and build pods get ``TRTFORGE_TESTBED_BACKEND_VERSION`` through the operator's ``build.env``;
the emulated kubelet honours that variable by making the pod's ONNX Runtime report that version
(trtforge_dev.testbed.kubelet.podspec.image_stand_in), as an image with another backend build would.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client
from trtforge_dev.localdev import OperatorEnv, deployment_manifest, engine_manifest, tiny_model
from trtforge_dev.testbed.kubelet.podspec import BACKEND_VERSION_ENV
from trtforge_dev.testbed.wait import wait_for

from trtforge.contract.engine_key import RequestRecord
from trtforge.contract.manifest import Manifest

pytestmark = pytest.mark.integration

H100 = "NVIDIA-H100-80GB-HBM3"
B200 = "NVIDIA-B200"
TARGETS = [{"gpu": H100}, {"gpu": B200, "mig": "1g.23gb"}]
UNSEEN = "9.9.9-never-seen"  # no part of the operator knows this version
IMAGE_B = "ghcr.io/trtforge/builder:image-b"
VERSION_B = "1.99.0-image-b"


def _new_image(image: str, version: str) -> dict[str, Any]:
    return {"builder_image": image, "build": {"env": {BACKEND_VERSION_ENV: version}}}


@pytest.fixture(scope="module")
def env(testbed: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorEnv]:
    tag = secrets.token_hex(3)
    e = OperatorEnv(
        testbed,
        tmp_path_factory.mktemp("keys"),
        [f"keys-a-{tag}", f"keys-b-{tag}"],
        # One cache group: under the default sharing policy (`groups`) only namespaces the platform
        # team labelled together share engines, and the second tenant's cache hit is what is shown.
        cache_group=f"keys-{tag}",
        **_new_image("ghcr.io/trtforge/builder:unseen", UNSEEN),
    )
    e.start()
    try:
        yield e
    finally:
        e.close()


def _restart_with(env: OperatorEnv, **changes: Any) -> None:
    """Stop the operator, change its config file, start it again (as a Helm upgrade would)."""
    env.op.stop()
    cfg = yaml.safe_load(env.config_path.read_text())
    for k, v in changes.items():
        cfg[k] = {**cfg[k], **v} if isinstance(v, dict) and isinstance(cfg.get(k), dict) else v
    env.config_path.write_text(yaml.safe_dump(cfg))
    env.config = cfg
    env.op.start()


def _jobs_per_target(env: OperatorEnv) -> dict[str, int]:
    out: dict[str, int] = {}
    for j in env.jobs():
        if j.metadata.labels.get("trtforge.io/build-kind") == "build":
            t = j.metadata.labels["trtforge.io/target"]
            out[t] = out.get(t, 0) + 1
    return out


def test_a_builder_with_an_unseen_backend_version_converges_in_one_build(env: OperatorEnv) -> None:
    ns = env.tenants[0]
    sha = tiny_model(env.models_dir / "tiny.onnx", seed=3)
    env.apply(engine_manifest("tiny", sha, TARGETS), ns)
    eng = env.wait_true("trtengines", ns, "tiny", timeout=240)
    assert eng["status"]["readyTargets"] == "2/2"
    assert _jobs_per_target(env) == {"h100-80gb-hbm3": 1, "b200-mig-1g-23gb": 1}  # exactly one each
    for t in eng["status"]["targets"]:
        assert t["backendVersion"] == UNSEEN and t["cacheHit"] is False
        m = Manifest.from_json((env.store_dir / "engines" / t["engineKey"] / "manifest.json").read_text())
        assert m.backend_version == UNSEEN
        filed = RequestRecord.from_json((env.store_dir / "requests" / f"{t['requestKey']}.json").read_text())
        assert filed.engine_key == t["engineKey"] and filed.backend_version == UNSEEN
    # Another namespace asks the same: the request index answers, no Job, even with the Jobs gone.
    batch: Any = client.BatchV1Api(env.api)
    for j in env.jobs():
        batch.delete_namespaced_job(j.metadata.name, env.build_ns, propagation_policy="Background")
    wait_for(lambda: not env.jobs(), timeout=60, desc="build Jobs deleted")
    env.apply(engine_manifest("tiny-copy", sha, TARGETS), env.tenants[1])
    # Ready after the second tenant's verify step (its own claim, its own namespace), never a build.
    copy = env.wait_true("trtengines", env.tenants[1], "tiny-copy", timeout=180)
    assert all(t["cacheHit"] is True for t in copy["status"]["targets"])
    assert {t["engineKey"] for t in copy["status"]["targets"]} == {
        t["engineKey"] for t in eng["status"]["targets"]
    }
    assert env.jobs() == []


def test_a_new_builder_image_rebuilds_once_per_target_and_rolls_out_behind_the_canary(
    env: OperatorEnv,
) -> None:
    ns = env.tenants[0]
    apps: Any = client.AppsV1Api(env.api)
    core: Any = client.CoreV1Api(env.api)
    env.apply(deployment_manifest("tiny", "tiny", replicas=len(TARGETS)), ns)  # one pod per target
    env.wait_true("inferencedeployments", ns, "tiny", timeout=180)
    old = {t["name"]: t["engineKey"] for t in env.get("trtengines", ns, "tiny")["status"]["targets"]}
    jobs_before = {j.metadata.name for j in env.jobs()}
    low: list[int] = []
    stop = threading.Event()

    def sample() -> None:  # the old engine must keep serving: never a Deployment without a pod
        while not stop.is_set():
            deps = apps.list_namespaced_deployment(ns).items
            low.append(min((d.status.available_replicas or 0) for d in deps) if deps else 0)
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        _restart_with(env, **_new_image(IMAGE_B, VERSION_B))

        def rolled() -> bool:
            eng = env.get("trtengines", ns, "tiny")
            new = {t["name"]: t for t in eng["status"]["targets"]}
            if any(
                t.get("backendVersion") != VERSION_B or t.get("reason") == "Updating" for t in new.values()
            ):
                return False
            infd = env.get("inferencedeployments", ns, "tiny")
            served = {t["name"]: t.get("engineKey") for t in infd["status"].get("targets", [])}
            ready = any(c["type"] == "Ready" and c["status"] == "True" for c in infd["status"]["conditions"])
            return ready and all(served[k] == new[k]["engineKey"] != old[k] for k in served)

        wait_for(rolled, timeout=240, desc="the new image's engines built and rolled out")
    finally:
        stop.set()
        sampler.join(timeout=5)
    assert low and min(low) >= 1, "a Deployment had no available pod while the new engines built and rolled"
    new_jobs = [j for j in env.jobs() if j.metadata.name not in jobs_before]
    per_target: dict[str, int] = {}
    for j in new_jobs:
        t = j.metadata.labels["trtforge.io/target"]
        per_target[t] = per_target.get(t, 0) + 1
    assert per_target == {"h100-80gb-hbm3": 1, "b200-mig-1g-23gb": 1}, per_target  # one rebuild each
    evs = core.list_namespaced_event(ns, field_selector="involvedObject.name=tiny").items
    assert "EngineUpdating" in {e.reason for e in evs}  # Ready on the old engine while building
    served = {
        p.metadata.annotations["trtforge.io/engine-key"]
        for p in env.pods(ns, "app.kubernetes.io/component=runtime")
        if not p.metadata.deletion_timestamp
    }
    assert served and not served & set(old.values())
    # The new pods passed their canary before Ready (the runtime replays it at start-up).
    logs = "".join(
        core.read_namespaced_pod_log(p.metadata.name, ns)
        for p in env.pods(ns, "app.kubernetes.io/component=runtime")
        if not p.metadata.deletion_timestamp
    )
    assert "canary" in logs.lower(), logs[-2000:]
    print("\nrollout to the new builder image:", json.dumps(per_target))
