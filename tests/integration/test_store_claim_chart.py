"""The chart on the test bed with a store claim that cannot bind (its StorageClass has no provisioner):
the broker pods that mount the claim stay Pending, the operator, which mounts none, runs and says why
on the TRTEngine (StoreReady=False naming the claim and the StorageClass). A PersistentVolume made for
the claim binds it: the brokers start, the condition clears, and the engine is built and verified with
the operator reading and writing the store through the brokers as its own ServiceAccount."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from trtforge_dev.chart_operator import BROKER, FULLNAME, ChartOperator
from trtforge_dev.localdev import condition, engine_manifest, is_true, tiny_model
from trtforge_dev.testbed.wait import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

STORAGE_CLASS = f"no-provisioner-{secrets.token_hex(3)}"
CLAIM = f"{FULLNAME}-engines"


def _ready(p: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in (p.status.conditions or []))


@pytest.fixture(scope="module")
def release(testbed: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChartOperator]:
    op = ChartOperator(
        testbed,
        tmp_path_factory.mktemp("store-claim-chart"),
        values={
            "operator": {"replicas": 1},
            "store": {"pvc": {"storageClassName": STORAGE_CLASS, "size": "1Gi"}},
        },
    )
    pv = f"{CLAIM}-{op.ns}"[:63]
    try:
        op.install()
        yield op
    finally:
        op.close()
        try:
            client.CoreV1Api(op.api).delete_persistent_volume(pv)
        except ApiException:
            pass


def test_the_operator_runs_says_why_the_claim_does_not_bind_and_goes_on_once_it_does(
    release: ChartOperator,
) -> None:
    op = release
    wait_for(
        lambda: [p for p in op.pods() if _ready(p)] and op.holder(),
        timeout=180,
        desc="the operator ready and leading while the store's claim is Pending",
    )
    brokers = op.pods(component=BROKER)
    assert brokers and not any(_ready(p) for p in brokers), "the brokers mount the claim: they wait for it"

    sha = tiny_model(op.models_dir / "claim.onnx", seed=62)
    op.apply_obj(
        engine_manifest("claim", sha, [{"gpu": "NVIDIA-H100-80GB-HBM3"}], model="pvc://models/claim.onnx")
    )

    def store_ready(status: str) -> dict[str, Any] | None:
        c = condition(op.get("trtengines", "claim"), "StoreReady")
        return c if c is not None and c.get("status") == status else None

    cond = wait_for(
        lambda: store_ready("False"), timeout=120, desc="StoreReady=False", ignore=(ApiException,)
    )
    assert cond is not None and cond["reason"] == "StoreClaimPending"
    for part in (f"{op.ns}/{CLAIM}", f'StorageClass "{STORAGE_CLASS}"', "ReadWriteMany"):
        assert part in cond["message"], (part, cond["message"])

    # The platform team's fix: a ReadWriteMany volume for the claim.
    store_dir = op.workdir / "store"
    store_dir.mkdir()
    client.CoreV1Api(op.api).create_persistent_volume(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": f"{CLAIM}-{op.ns}"[:63]},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteMany"],
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": STORAGE_CLASS,
                "hostPath": {"path": str(store_dir), "type": "Directory"},
                "claimRef": {"namespace": op.ns, "name": CLAIM},
            },
        }
    )
    up = wait_for(lambda: store_ready("True"), timeout=180, desc="StoreReady=True", ignore=(ApiException,))
    assert up is not None and up["reason"] == "StoreClaimBound"
    wait_for(
        lambda: is_true(op.get("trtengines", "claim"), "Ready"),
        timeout=300,
        desc="the engine verified, built and Ready through the brokers",
        ignore=(ApiException,),
    )
    assert list(store_dir.rglob("engines/*/manifest.json")), "the engine is in the claim's volume"
