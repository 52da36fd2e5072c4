"""Engine GC on the test bed: with GC on, an engine nothing references leaves the store; one still
referenced by a TRTEngine stays, however many GC passes run."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import pytest
from trtforge_dev.localdev import OperatorEnv, delete_with_cleanup, engine_manifest, tiny_model
from trtforge_dev.testbed.wait import wait_for

pytestmark = pytest.mark.integration

TARGETS = [{"gpu": "NVIDIA-H100-80GB-HBM3"}]


@pytest.fixture(scope="module")
def env(testbed: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorEnv]:
    e = OperatorEnv(
        testbed,
        tmp_path_factory.mktemp("gc"),
        [f"gc-{secrets.token_hex(3)}"],
        gc={"enabled": True, "interval_seconds": 1, "min_age_seconds": 0},
    )
    e.start()
    try:
        yield e
    finally:
        e.close()


def test_unreferenced_engines_are_collected_referenced_ones_stay(env: OperatorEnv) -> None:
    (ns,) = env.tenants
    keys: dict[str, str] = {}
    for name, seed in (("kept", 11), ("dropped", 12)):
        sha = tiny_model(env.models_dir / f"{name}.onnx", seed=seed)
        env.apply(engine_manifest(name, sha, TARGETS, model=f"pvc://models/{name}.onnx"), ns)
    for name in ("kept", "dropped"):
        eng = env.wait_true("trtengines", ns, name, timeout=180)
        (t,) = eng["status"]["targets"]
        keys[name] = t["engineKey"]

    def manifest(name: str) -> bool:
        return (env.store_dir / "engines" / keys[name] / "manifest.json").exists()

    assert manifest("kept") and manifest("dropped")
    delete_with_cleanup(env.api, ns, "trtengines", "dropped")
    dropped = env.store_dir / "engines" / keys["dropped"]
    # The GC deletes the manifest first (the engine stops existing), then the files: wait for the end.
    wait_for(lambda: not dropped.exists(), timeout=60, desc="the unreferenced engine collected")
    assert not manifest("dropped")
    assert manifest("kept")  # passes ran every second meanwhile; the referenced engine stays
