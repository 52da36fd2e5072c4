"""A store claim that cannot bind, on the test bed: the claim asks for ReadWriteMany from a StorageClass
that no provisioner serves, so it stays Pending, and every TRTEngine's StoreReady condition says so,
naming the claim, the StorageClass, the access mode and the binder's Event. A PersistentVolume made
for the claim binds it; the condition clears and the engine builds and becomes Ready."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from trtforge_dev.localdev import OperatorEnv, condition, engine_manifest, tiny_model
from trtforge_dev.testbed.wait import wait_for

pytestmark = pytest.mark.integration

SUFFIX = secrets.token_hex(3)
CLAIM = f"store-{SUFFIX}"
STORAGE_CLASS = f"no-provisioner-{SUFFIX}"  # no such StorageClass: nothing provisions the claim


@pytest.fixture(scope="module")
def env(testbed: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorEnv]:
    e = OperatorEnv(
        testbed, tmp_path_factory.mktemp("store-claim"), [f"claim-{SUFFIX}"], store_uri=f"pvc://{CLAIM}/"
    )
    core: Any = client.CoreV1Api(e.api)
    core.create_namespaced_persistent_volume_claim(
        e.build_ns,
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": CLAIM},
            "spec": {
                "accessModes": ["ReadWriteMany"],
                "storageClassName": STORAGE_CLASS,
                "resources": {"requests": {"storage": "10Gi"}},
            },
        },
    )
    e.start()
    try:
        yield e
    finally:
        e.close()


def _store_ready(env: OperatorEnv, ns: str, name: str, status: str) -> dict[str, Any] | None:
    c = condition(env.get("trtengines", ns, name), "StoreReady")
    return c if c is not None and c.get("status") == status else None


def test_a_claim_that_cannot_bind_says_so_then_clears_once_bound(env: OperatorEnv) -> None:
    (ns,) = env.tenants
    sha = tiny_model(env.models_dir / "claim.onnx", seed=61)
    env.apply(
        engine_manifest("claim", sha, [{"gpu": "NVIDIA-H100-80GB-HBM3"}], model="pvc://models/claim.onnx"), ns
    )

    def pending_with_event() -> dict[str, Any] | None:
        c = _store_ready(env, ns, "claim", "False")
        return c if c is not None and "ProvisioningFailed" in c.get("message", "") else None

    try:
        cond = wait_for(
            pending_with_event,
            timeout=120,
            desc="StoreReady=False with the binder's Event",
            ignore=(ApiException,),
        )
    except TimeoutError as e:
        raise AssertionError(f"{e}\n--- operator log tail:\n{env.op.tail()}") from e
    assert cond is not None
    assert cond["reason"] == "StoreClaimPending"
    for part in (f"{env.build_ns}/{CLAIM}", f'StorageClass "{STORAGE_CLASS}"', "ReadWriteMany", "s3://"):
        assert part in cond["message"], (part, cond["message"])
    ready = condition(env.get("trtengines", ns, "claim"), "Ready")
    assert ready is not None and ready["status"] == "False" and ready["reason"] == "StoreClaimPending"
    assert not [j for j in env.jobs() if j.metadata.namespace == env.build_ns], (
        "no build before the claim binds"
    )

    # What a platform team does: a ReadWriteMany volume for the claim (here the directory the
    # operator's own view of the store reads, so the build it starts next is seen).
    pv = f"{CLAIM}-{env.build_ns}"[:63]
    env.pvs.append(pv)
    client.CoreV1Api(env.api).create_persistent_volume(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": pv},
            "spec": {
                "capacity": {"storage": "10Gi"},
                "accessModes": ["ReadWriteMany"],
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": STORAGE_CLASS,
                "hostPath": {"path": str(env.store_dir), "type": "Directory"},
                "claimRef": {"namespace": env.build_ns, "name": CLAIM},
            },
        }
    )
    try:
        up = wait_for(
            lambda: _store_ready(env, ns, "claim", "True"),
            timeout=120,
            desc="StoreReady=True",
            ignore=(ApiException,),
        )
    except TimeoutError as e:
        raise AssertionError(f"{e}\n--- operator log tail:\n{env.op.tail()}") from e
    assert up is not None and up["reason"] == "StoreClaimBound"
    env.wait_true("trtengines", ns, "claim", timeout=240)
