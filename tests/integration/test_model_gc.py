"""GC of the verify side of the store on the test bed (issue 52): with GC on, the staged model and the
possession record of a TRTEngine that is gone leave the store; those a TRTEngine still names stay,
however many passes run."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import pytest
from trtforge_dev.localdev import OperatorEnv, delete_with_cleanup, engine_manifest, tiny_model
from trtforge_dev.testbed.wait import wait_for

from trtforge.contract.possession import possession_path, source_fingerprint, staged_model_path

pytestmark = pytest.mark.integration

TARGETS = [{"gpu": "NVIDIA-H100-80GB-HBM3"}]


@pytest.fixture(scope="module")
def env(testbed: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorEnv]:
    e = OperatorEnv(
        testbed,
        tmp_path_factory.mktemp("model-gc"),
        [f"mgc-{secrets.token_hex(3)}"],
        gc={"enabled": True, "interval_seconds": 1, "min_age_seconds": 0},
    )
    e.start()
    try:
        yield e
    finally:
        e.close()


def test_the_model_and_proof_of_a_gone_trtengine_are_collected_the_others_stay(env: OperatorEnv) -> None:
    (ns,) = env.tenants
    files: dict[str, tuple[str, str]] = {}
    for name, seed in (("kept", 21), ("dropped", 22)):
        uri = f"pvc://models/{name}.onnx"
        sha = tiny_model(env.models_dir / f"{name}.onnx", seed=seed)
        env.apply(engine_manifest(name, None, TARGETS, model=uri), ns)  # unpinned: verified, staged
        files[name] = (staged_model_path(sha), possession_path(ns, source_fingerprint(uri, None, None)))
    for name in ("kept", "dropped"):
        env.wait_true("trtengines", ns, name, timeout=180)

    def present(name: str) -> list[bool]:
        return [(env.store_dir / p).exists() for p in files[name]]

    assert present("kept") == present("dropped") == [True, True]
    delete_with_cleanup(env.api, ns, "trtengines", "dropped")
    # Records younger than the clock-skew allowance stay a pass or two: wait for the end.
    wait_for(
        lambda: present("dropped") == [False, False], timeout=180, desc="the gone engine's model collected"
    )
    assert present("kept") == [True, True]  # passes ran every second meanwhile
