"""Weights fit without a hint (issue 66): the quantize step counts the checkpoint's tensors from its own
headers (a GGUF's through the `gguf` package, a safetensors file's JSON header) and records them in the
manifest; the plan refuses a target whose memory the published weights do not fit at its mapping,
before its tune Job, with the target, the weight bytes and the GPU memory in the condition."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from trtforge_builder.llm.weights import (
    Weights,
    WeightsError,
    checkpoint_weights,
    gguf_weights,
    safetensors_weights,
)
from trtforge_operator.api import get_condition
from trtforge_operator.planning.engine import plan_engine_pass
from trtforge_operator.planning.llm_policies import checkpoint_fit

from tests.unit.test_planning_engine import CFG
from tests.unit.test_planning_llm_engine import H100, SHA, created, engine, observe, status_of
from trtforge.contract.gpu import GPUTarget, known_identity
from trtforge.contract.llm import (
    ArtefactFile,
    ArtefactFormat,
    ArtefactKind,
    ArtefactManifest,
    Backend,
    Calibration,
    CheckpointInfo,
    Parallelism,
    Recipe,
    RefusalReason,
    SourceRef,
    checkpoint_fit_refusal,
)

GiB = 1 << 30
GH200 = "NVIDIA-GH200-480GB"  # 97871 MiB: 90 GiB of weights fit it, not an H100's 81559
H100_TARGET = GPUTarget(gpu=H100)


def test_a_gguf_checkpoints_tensors_are_counted_from_its_header(tmp_path: Path) -> None:
    import gguf

    path = tmp_path / "model.gguf"
    w = gguf.GGUFWriter(path, "llama")
    w.add_tensor("token_embd.weight", np.zeros((32, 8), dtype=np.float16))  # 256 elements, 512 bytes
    w.add_tensor("output_norm.weight", np.zeros((8,), dtype=np.float32))  # 8 elements, 32 bytes
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert gguf_weights(path) == Weights(parameters=264, bytes=544)
    assert checkpoint_weights(tmp_path, "model.gguf") == Weights(264, 544)
    (tmp_path / "bad.gguf").write_bytes(b"not a gguf at all, just text")
    with pytest.raises(WeightsError, match=r"bad\.gguf"):
        gguf_weights(tmp_path / "bad.gguf")


def _safetensors(path: Path, tensors: dict[str, Any]) -> None:
    header = json.dumps(tensors).encode()
    size = max((t["data_offsets"][1] for k, t in tensors.items() if k != "__metadata__"), default=0)
    path.write_bytes(struct.pack("<Q", len(header)) + header + bytes(size))


def test_a_hugging_face_folders_tensors_are_counted_from_the_safetensors_headers(tmp_path: Path) -> None:
    _safetensors(
        tmp_path / "model-00001-of-00002.safetensors",
        {
            "__metadata__": {"format": "pt"},
            "a": {"dtype": "BF16", "shape": [4, 8], "data_offsets": [0, 64]},
            "a_scale": {"dtype": "F32", "shape": [], "data_offsets": [64, 68]},  # a scalar: one element
        },
    )
    _safetensors(
        tmp_path / "model-00002-of-00002.safetensors",
        {"b": {"dtype": "F8_E4M3", "shape": [16, 16], "data_offsets": [0, 256]}},
    )
    (tmp_path / "config.json").write_text("{}")
    assert safetensors_weights(tmp_path / "model-00002-of-00002.safetensors") == Weights(256, 256)
    assert checkpoint_weights(tmp_path, "config.json") == Weights(32 + 1 + 256, 68 + 256)
    _safetensors(tmp_path / "broken.safetensors", {"c": {"dtype": "BF16", "data_offsets": [0, 2]}})
    with pytest.raises(WeightsError, match="tensor 'c'"):
        safetensors_weights(tmp_path / "broken.safetensors")
    with pytest.raises(WeightsError, match=r"no \.safetensors"):
        checkpoint_weights(tmp_path / "config.json", "config.json")


def test_the_fit_of_published_weights_per_gpu_and_mapping() -> None:
    h100 = known_identity(H100_TARGET)
    ok = checkpoint_fit_refusal(70 * GiB, Parallelism(), h100.memory_mib)
    assert ok is None
    big = checkpoint_fit_refusal(140 * GiB, Parallelism(), h100.memory_mib)
    assert big is not None and big.reason is RefusalReason.WEIGHTS_DO_NOT_FIT
    assert str(140 * GiB) in big.message and f"{h100.memory_mib} MiB" in big.message
    assert checkpoint_fit_refusal(140 * GiB, Parallelism(tensor=2), h100.memory_mib) is None
    unknown = checkpoint_fit_refusal(GiB, Parallelism(), 0)
    assert unknown is not None and unknown.reason is RefusalReason.MEMORY_UNKNOWN
    # a CPU target has no GPU memory to fit; the refusal names the target
    assert checkpoint_fit(GPUTarget(gpu="cpu"), None, Parallelism(), 10**15).refusal is None
    named = checkpoint_fit(H100_TARGET, h100, Parallelism(), 140 * GiB).refusal
    assert named is not None and named.message.startswith(f"target {H100_TARGET}:")
    slice_ = h100.model_copy(update={"mig_profile": "1g.10gb", "memory_mib": 9856})
    assert checkpoint_fit(H100_TARGET, slice_, Parallelism(), 9 * GiB).refusal is not None


def _manifest(ckey: str, weight_bytes: int | None, file_bytes: int) -> ArtefactManifest:
    return ArtefactManifest(
        kind=ArtefactKind.CHECKPOINT,
        key=ckey,
        format=ArtefactFormat.GGUF,
        backend=Backend.LLAMA_CPP,
        backend_version="v",
        upload="0" * 16,
        files=[ArtefactFile(path="model.gguf", size=file_bytes, sha256="1" * 64)],
        checkpoint=CheckpointInfo(
            source=SourceRef(uri="pvc://models/m.gguf", digest=SHA),
            recipe=Recipe.BF16,
            calibration=Calibration(),
            quantized_type="BF16",
            model_file="model.gguf",
            parameters=70_000_000_000 if weight_bytes else None,
            weight_bytes=weight_bytes,
        ),
    )


def test_a_published_checkpoint_too_big_for_a_target_refuses_it_before_its_tune_job() -> None:
    targets = [{"gpu": "cpu"}, {"gpu": H100}, {"gpu": GH200}]
    e = engine("bf16", targets)  # no spec.llm.parameters: nothing is known before the quantize step
    first = plan_engine_pass(observe(e), CFG)
    assert [j["spec"]["template"]["spec"]["containers"][0]["command"][1] for j in created(first)] == [
        "quantize"
    ]
    ckey = status_of(first).checkpoint.checkpoint_key
    plan = plan_engine_pass(observe(e, checkpoint=_manifest(ckey, 90 * GiB, 91 * GiB)), CFG)
    st = status_of(plan)
    by_mapping = {(t.gpu, t.mapping): t for t in st.targets}
    refused = by_mapping[(H100, "tp1pp1")]
    assert (refused.phase, refused.reason) == ("Failed", "WeightsDoNotFit")
    assert H100 in refused.message and str(90 * GiB) in refused.message and "81559 MiB" in refused.message
    tunes = created(plan)  # the cpu and GH200 targets tune; the refused target does not
    assert sorted(j["metadata"]["labels"]["trtforge.io/target"] for j in tunes) == ["cpu", "gh200-480gb"]
    stalled = get_condition(st.conditions, "Stalled")
    assert (
        stalled.status == "True" and stalled.reason == "WeightsDoNotFit" and str(90 * GiB) in stalled.message
    )


def test_a_manifest_without_a_weights_record_is_checked_by_its_files_size() -> None:
    e = engine("bf16", [{"gpu": H100}])
    ckey = status_of(plan_engine_pass(observe(e), CFG)).checkpoint.checkpoint_key
    plan = plan_engine_pass(observe(e, checkpoint=_manifest(ckey, None, 90 * GiB)), CFG)
    (t,) = status_of(plan).targets
    assert (t.phase, t.reason) == ("Failed", "WeightsDoNotFit") and str(90 * GiB) in t.message
    assert created(plan) == []
    small = plan_engine_pass(observe(e, checkpoint=_manifest(ckey, None, GiB)), CFG)
    assert [j["spec"]["template"]["spec"]["containers"][0]["command"][1] for j in created(small)] == ["tune"]
