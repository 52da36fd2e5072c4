"""Finished build Jobs on the test bed: once every requester has recorded a Job's result and its TTL
has run, the operator deletes it; the engine stays Ready with the same status (no write)."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from typing import Any

import pytest
from trtforge_dev.localdev import OperatorEnv, engine_manifest, tiny_model
from trtforge_dev.testbed.wait import wait_for

pytestmark = pytest.mark.integration

TARGETS = [{"gpu": "NVIDIA-H100-80GB-HBM3"}, {"gpu": "NVIDIA-GH200-480GB"}]


@pytest.fixture(scope="module")
def env(testbed: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorEnv]:
    e = OperatorEnv(
        testbed,
        tmp_path_factory.mktemp("job-ttl"),
        [f"ttl-{secrets.token_hex(3)}"],
        build={"finished_job_ttl_seconds": 1},
    )
    e.start()
    try:
        yield e
    finally:
        e.close()


def test_a_recorded_build_job_goes_after_its_ttl_and_the_engine_stays_as_it_was(env: OperatorEnv) -> None:
    (ns,) = env.tenants
    sha = tiny_model(env.models_dir / "ttl.onnx", seed=21)
    env.apply(engine_manifest("ttl", sha, TARGETS, model="pvc://models/ttl.onnx"), ns)
    eng = env.wait_true("trtengines", ns, "ttl", timeout=240)
    names = {t["jobName"] for t in eng["status"]["targets"]}
    assert names and all(t["reason"] == "Built" for t in eng["status"]["targets"])

    def gone() -> bool:
        return not names & {j.metadata.name for j in env.jobs() if not j.metadata.deletion_timestamp}

    wait_for(gone, timeout=90, desc="the finished build Jobs deleted after their TTL")
    time.sleep(3)  # the Job deletions' watch events have woken the engine; it has reconciled
    after = env.get("trtengines", ns, "ttl")
    # The same status: the targets keep their Job names, attempts and Built (no write, no churn).
    assert after["status"] == eng["status"]
