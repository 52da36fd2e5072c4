"""GC on the test bed: with GC on, an engine nothing references leaves the store, and so do the staged
model and possession record of a TRTEngine that is gone; what a TRTEngine still references stays,
however many GC passes run. Each test uses TRTEngines and models of its own."""

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
        tmp_path_factory.mktemp("gc"),
        [f"gc-{secrets.token_hex(3)}"],
        # One host, one clock: a skew allowance of 5 s rather than 60 lets a gone engine's
        # possession record go as soon as its TRTEngine is gone.
        gc={"enabled": True, "interval_seconds": 1, "min_age_seconds": 0, "clock_skew_seconds": 5},
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


def test_the_model_and_proof_of_a_gone_trtengine_are_collected_the_others_stay(env: OperatorEnv) -> None:
    (ns,) = env.tenants
    files: dict[str, tuple[str, str]] = {}
    for name, seed in (("model-kept", 21), ("model-dropped", 22)):
        uri = f"pvc://models/{name}.onnx"
        sha = tiny_model(env.models_dir / f"{name}.onnx", seed=seed)
        env.apply(engine_manifest(name, None, TARGETS, model=uri), ns)  # unpinned: verified, staged
        files[name] = (staged_model_path(sha), possession_path(ns, source_fingerprint(uri, None, None)))
    for name in ("model-kept", "model-dropped"):
        env.wait_true("trtengines", ns, name, timeout=180)

    def present(name: str) -> list[bool]:
        return [(env.store_dir / p).exists() for p in files[name]]

    assert present("model-kept") == present("model-dropped") == [True, True]
    delete_with_cleanup(env.api, ns, "trtengines", "model-dropped")
    # Records younger than the clock-skew allowance stay a pass or a few: wait for the end.
    wait_for(
        lambda: present("model-dropped") == [False, False],
        timeout=180,
        desc="the gone engine's model collected",
    )
    assert present("model-kept") == [True, True]  # passes ran every second meanwhile
