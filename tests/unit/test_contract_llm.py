"""The LLM contract: recipe-by-GPU and weights-fit rules, artefact manifests and keys, tuning checks."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tests.llm_artefacts import checkpoint_manifest
from trtforge.contract.gpu import GPUTarget, known_identity
from trtforge.contract.llm import (
    ArtefactFile,
    ArtefactFormat,
    ArtefactKind,
    ArtefactManifest,
    Backend,
    Calibration,
    MismatchReason,
    Parallelism,
    PerplexityGate,
    QuantizationSpec,
    Recipe,
    RefusalReason,
    SourceRef,
    TuningRecord,
    artefact_dir,
    checkpoint_key,
    file_path,
    folder_digest,
    golden_request,
    manifest_path,
    recipe_refusal,
    target_refusal,
    tuning_key,
    tuning_mismatch,
    weights_refusal,
)
from trtforge.contract.llm.recipe import format_parameters, parse_parameters

H100 = known_identity(GPUTarget(gpu="NVIDIA-H100-80GB-HBM3"))
A100 = known_identity(GPUTarget(gpu="NVIDIA-A100-SXM4-80GB"))
B200 = known_identity(GPUTarget(gpu="NVIDIA-B200"))
CPU = known_identity(GPUTarget(gpu="cpu"))
D1, D2 = "a" * 64, "b" * 64


# --- recipe by compute capability ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("recipe", "gpu", "refused"),
    [
        (Recipe.NVFP4, H100, True),
        (Recipe.NVFP4, B200, False),
        (Recipe.FP8, A100, True),
        (Recipe.FP8, H100, False),
        (Recipe.W4A8_AWQ, A100, True),
        (Recipe.W4A8_AWQ, H100, False),
        (Recipe.INT4_AWQ, A100, False),
        (Recipe.BF16, A100, False),
    ],
)
def test_recipe_by_compute_capability(recipe: Recipe, gpu: object, refused: bool) -> None:
    assert isinstance(gpu, type(H100))
    got = recipe_refusal(recipe, gpu.compute_capability, Backend.TENSORRT_LLM)
    assert (got is not None) == refused
    if got is not None:
        assert got.reason is RefusalReason.COMPUTE_CAPABILITY
        assert gpu.compute_capability in got.message and str(recipe) in got.message


def test_nvfp4_on_hopper_names_blackwell_and_fp8_on_ampere_names_ada() -> None:
    nvfp4 = recipe_refusal(Recipe.NVFP4, "9.0", Backend.LLAMA_CPP)
    assert nvfp4 is not None and "10.0 (Blackwell)" in nvfp4.message and "9.0" in nvfp4.message
    fp8 = recipe_refusal(Recipe.FP8, (8, 0), Backend.TENSORRT_LLM)
    assert fp8 is not None and "8.9 (Ada)" in fp8.message
    assert recipe_refusal(Recipe.FP8, "8.9", Backend.TENSORRT_LLM) is None  # Ada itself
    assert recipe_refusal(Recipe.FP8, "12.0", Backend.TENSORRT_LLM) is None  # and later


def test_a_cpu_target_runs_any_recipe_on_llama_cpp_but_none_on_tensorrt_llm() -> None:
    for recipe in Recipe:
        assert recipe_refusal(recipe, CPU.compute_capability, Backend.LLAMA_CPP) is None
        got = recipe_refusal(recipe, CPU.compute_capability, Backend.TENSORRT_LLM)
        assert got is not None and got.reason is RefusalReason.CPU_TARGET


# --- weights fit ------------------------------------------------------------------------------------


def test_70b_bf16_does_not_fit_one_h100_but_fits_over_tp4() -> None:
    params = parse_parameters("70B")
    one = weights_refusal(params, Recipe.BF16, Parallelism(), H100.memory_mib)
    assert one is not None and one.reason is RefusalReason.WEIGHTS_DO_NOT_FIT
    assert "70B" in one.message and "tp1pp1" in one.message and str(H100.memory_mib) in one.message
    assert weights_refusal(params, Recipe.BF16, Parallelism(tensor=4), H100.memory_mib) is None
    assert weights_refusal(params, Recipe.BF16, Parallelism(tensor=2, pipeline=2), H100.memory_mib) is None


def test_fp8_halves_what_bf16_needs() -> None:
    params = parse_parameters("40B")  # 80 GB at bf16, 40 GB at fp8
    assert weights_refusal(params, Recipe.BF16, Parallelism(), H100.memory_mib) is not None
    assert weights_refusal(params, Recipe.FP8, Parallelism(), H100.memory_mib) is None


def test_a_mig_slice_is_judged_by_its_own_memory_and_unknown_memory_is_refused() -> None:
    slice_ = known_identity(GPUTarget(gpu="NVIDIA-H200", mig="1g.18gb"))
    got = target_refusal(Recipe.BF16, parse_parameters("8B"), Parallelism(), slice_, Backend.TENSORRT_LLM)
    assert got is not None and got.reason is RefusalReason.WEIGHTS_DO_NOT_FIT
    unknown = weights_refusal(10, Recipe.BF16, Parallelism(), 0)
    assert unknown is not None and unknown.reason is RefusalReason.MEMORY_UNKNOWN


def test_target_refusal_checks_the_recipe_first_and_skips_the_fit_without_a_size() -> None:
    got = target_refusal(Recipe.NVFP4, parse_parameters("405B"), Parallelism(), H100, Backend.TENSORRT_LLM)
    assert got is not None and got.reason is RefusalReason.COMPUTE_CAPABILITY
    assert target_refusal(Recipe.FP8, None, Parallelism(), H100, Backend.TENSORRT_LLM) is None
    assert target_refusal(Recipe.FP8, parse_parameters("405B"), Parallelism(), CPU, Backend.LLAMA_CPP) is None


def test_parameter_counts_parse_and_print() -> None:
    assert parse_parameters("135M") == 135_000_000
    assert parse_parameters("70.6b") == 70_600_000_000
    assert parse_parameters(42) == 42
    assert format_parameters(8_030_000_000) == "8.03B"
    for bad in ("eight", "8X", "0", ""):
        with pytest.raises(ValueError, match="parameter count"):
            parse_parameters(bad)


def test_parallelism_and_calibration_bounds() -> None:
    assert Parallelism(tensor=2, pipeline=4).mapping == "tp2pp4"
    assert Parallelism(tensor=2, pipeline=4).world_size == 8
    with pytest.raises(ValidationError, match="tensor"):
        Parallelism(tensor=0)
    cal = Calibration.model_validate({"dataset": "cnn_dailymail", "samples": 64, "sequenceLength": 256})
    assert cal.sequence_length == 256
    with pytest.raises(ValidationError, match="samples"):
        Calibration(samples=0)


def test_quantization_spec_defaults_to_a_one_percent_bound_and_checks_gguf_types() -> None:
    spec = QuantizationSpec(recipe=Recipe.FP8)
    assert spec.max_perplexity_increase == 0.01
    assert QuantizationSpec.model_validate({"recipe": "bf16", "ggufType": "Q2_K"}).gguf_type == "Q2_K"
    with pytest.raises(ValidationError, match="ggufType"):
        QuantizationSpec.model_validate({"recipe": "bf16", "ggufType": "q2 k; rm"})
    with pytest.raises(ValidationError, match="recipe"):
        QuantizationSpec.model_validate({"recipe": "int3"})


# --- keys ---------------------------------------------------------------------------------------------


def test_checkpoint_key_depends_on_source_recipe_calibration_backend_and_type_not_parallelism() -> None:
    base = checkpoint_key(D1, Recipe.FP8, Calibration(), Backend.TENSORRT_LLM)
    assert base == checkpoint_key(D1, Recipe.FP8, Calibration(), Backend.TENSORRT_LLM)
    others = {
        checkpoint_key(D2, Recipe.FP8, Calibration(), Backend.TENSORRT_LLM),
        checkpoint_key(D1, Recipe.NVFP4, Calibration(), Backend.TENSORRT_LLM),
        checkpoint_key(D1, Recipe.FP8, Calibration(samples=64), Backend.TENSORRT_LLM),
        checkpoint_key(D1, Recipe.FP8, Calibration(), Backend.LLAMA_CPP),
        checkpoint_key(D1, Recipe.FP8, Calibration(), Backend.TENSORRT_LLM, "Q2_K"),
    }
    assert base not in others and len(others) == 5
    with pytest.raises(ValueError, match="64 lowercase hex"):
        checkpoint_key("sha256:abc", Recipe.FP8, Calibration(), Backend.TENSORRT_LLM)


def test_tuning_key_depends_on_gpu_mig_mapping_version_and_checkpoint() -> None:
    def key(**kw: object) -> str:
        args: dict[str, object] = {
            "gpu_product": "NVIDIA-H100-80GB-HBM3", "mig_profile": None, "parallelism": Parallelism(),
            "backend": Backend.TENSORRT_LLM, "backend_version": "1.2.1", "checkpoint": D1,
        }  # fmt: skip
        args.update(kw)
        return tuning_key(**args)  # type: ignore[arg-type]

    base = key()
    assert base == key(mig_profile="full")
    variants = [
        key(gpu_product="NVIDIA-H200"),
        key(mig_profile="1g.10gb"),
        key(parallelism=Parallelism(tensor=2)),
        key(backend_version="1.2.0"),
        key(checkpoint=D2),
        key(backend=Backend.LLAMA_CPP),
    ]
    assert base not in variants and len(set(variants)) == len(variants)


# --- manifests -------------------------------------------------------------------------------------


def _checkpoint(files: list[ArtefactFile]) -> ArtefactManifest:
    return checkpoint_manifest(
        D1,
        SourceRef(uri="file:///m.gguf", digest=D2),
        files,
        upload="0123456789abcdef",
        backend_version="0.3.36",
        recipe=Recipe.FP8,
        quantized_type="Q8_0",
    )


def test_manifest_round_trips_and_lists_each_file_once() -> None:
    files = [
        ArtefactFile(path="model.gguf", size=3, sha256=D2),
        ArtefactFile(path="sub/x.json", size=1, sha256=D1),
    ]
    m = _checkpoint(files)
    back = ArtefactManifest.from_json(m.to_json())
    assert back == m and back.total_bytes == 4 and back.file("sub/x.json").size == 1
    assert '"schema": "trtforge.io/llm-artefact/v1"' in m.to_json()
    with pytest.raises(ValidationError, match=r"listed twice: model\.gguf"):
        _checkpoint([*files, files[0]])
    with pytest.raises(KeyError, match="nope"):
        m.file("nope")


@pytest.mark.parametrize("bad", ["/etc/passwd", "../x", "a/../b", "a//b", "./a", "a\\b", "", "manifest.json"])
def test_manifest_refuses_a_file_path_outside_the_artefact(bad: str) -> None:
    with pytest.raises(ValidationError, match="artefact file path"):
        ArtefactFile(path=bad, size=0, sha256=D1)


def test_a_checkpoint_manifest_needs_its_record_and_a_tuning_manifest_its_own() -> None:
    with pytest.raises(ValidationError, match="checkpoint record"):
        ArtefactManifest(
            kind=ArtefactKind.CHECKPOINT, key=D1, format=ArtefactFormat.GGUF, backend=Backend.LLAMA_CPP,
            backend_version="0.3.36", upload="0" * 16, files=[],
        )  # fmt: skip
    with pytest.raises(ValidationError, match="tuning record"):
        ArtefactManifest(
            kind=ArtefactKind.TUNING_CACHE, key=D1, format=ArtefactFormat.TUNING_RECORD,
            backend=Backend.LLAMA_CPP, backend_version="0.3.36", upload="0" * 16, files=[],
        )  # fmt: skip


def test_layout_and_folder_digest() -> None:
    assert artefact_dir(ArtefactKind.CHECKPOINT, D1) == f"checkpoints/{D1}"
    assert manifest_path(ArtefactKind.TUNING_CACHE, D1) == f"tuning/{D1}/manifest.json"
    assert artefact_dir(ArtefactKind.RANK_ENGINES, D1).startswith("rank-engines/")
    with pytest.raises(ValueError, match="64 lowercase hex"):
        artefact_dir(ArtefactKind.CHECKPOINT, "../x")
    assert (
        file_path(ArtefactKind.CHECKPOINT, D1, "0" * 16, "a/b.gguf")
        == f"checkpoints/{D1}/{'0' * 16}/a/b.gguf"
    )
    with pytest.raises(ValueError, match="upload id"):
        file_path(ArtefactKind.CHECKPOINT, D1, "../..", "a")
    with pytest.raises(ValueError, match="artefact file path"):
        file_path(ArtefactKind.CHECKPOINT, D1, "0" * 16, "../a")
    a = ArtefactFile(path="a", size=1, sha256=D1)
    b = ArtefactFile(path="b", size=1, sha256=D2)
    assert folder_digest([a, b]) == folder_digest([b, a])
    assert folder_digest([a, b]) != folder_digest([a, ArtefactFile(path="b", size=1, sha256=D1)])


def test_perplexity_gate_passes_within_the_bound_only() -> None:
    def gate(result: float) -> PerplexityGate:
        return PerplexityGate(
            evaluation_text="e.txt",
            evaluation_sha256=D1,
            context=128,
            source=10.0,
            result=result,
            max_increase=0.01,
        )

    assert gate(10.05).passed and gate(9.0).passed
    assert not gate(10.2).passed
    text = gate(10.2).describe()
    assert "10.2000" in text and "10.0000" in text and "+2.00%" in text and "1.00%" in text


def test_golden_request_is_greedy_and_returns_token_ids() -> None:
    body = golden_request("Paris is", 8)
    assert body["temperature"] == 0.0 and body["top_k"] == 1 and body["n_predict"] == 8
    assert body["return_tokens"] is True and body["cache_prompt"] is False


# --- tuning records ----------------------------------------------------------------------------------


def _record(**kw: object) -> TuningRecord:
    args: dict[str, object] = {
        "backend": Backend.TENSORRT_LLM, "backend_version": "1.2.1", "gpu_product": "NVIDIA-H100-80GB-HBM3",
        "checkpoint_key": D1,
    }  # fmt: skip
    args.update(kw)
    return TuningRecord.model_validate(args)


def test_a_matching_tuning_record_is_accepted() -> None:
    assert tuning_mismatch(_record(), H100, "1.2.1") is None
    assert tuning_mismatch(_record(), H100, "1.2.1", Backend.TENSORRT_LLM, Parallelism()) is None


@pytest.mark.parametrize(
    ("record", "gpu", "version", "reason", "words"),
    [
        ({}, H100, "1.3.0", MismatchReason.VERSION, ["1.2.1", "1.3.0"]),
        (
            {},
            known_identity(GPUTarget(gpu="NVIDIA-H200")),
            "1.2.1",
            MismatchReason.GPU_PRODUCT,
            ["NVIDIA-H200"],
        ),
        (
            {},
            known_identity(GPUTarget(gpu="NVIDIA-H100-80GB-HBM3", mig="1g.10gb")),
            "1.2.1",
            MismatchReason.MIG_PROFILE,
            ["full", "1g.10gb"],
        ),
    ],
)
def test_a_tuning_record_for_another_version_or_gpu_is_refused_with_why(
    record: dict[str, object], gpu: object, version: str, reason: MismatchReason, words: list[str]
) -> None:
    assert isinstance(gpu, type(H100))
    got = tuning_mismatch(_record(**record), gpu, version)
    assert got is not None and got.reason is reason
    for w in words:
        assert w in got.message


def test_a_tuning_record_for_another_backend_or_mapping_is_refused() -> None:
    got = tuning_mismatch(_record(), H100, "1.2.1", pod_backend=Backend.LLAMA_CPP)
    assert got is not None and got.reason is MismatchReason.BACKEND
    got = tuning_mismatch(_record(), H100, "1.2.1", pod_parallelism=Parallelism(tensor=2))
    assert got is not None and got.reason is MismatchReason.MAPPING and "tp2pp1" in got.message


def test_a_llama_cpp_tuning_record_becomes_llama_server_flags() -> None:
    from trtforge.contract.llm import llama_server_args

    rec = _record(backend=Backend.LLAMA_CPP, settings={"ubatch_size": 64, "threads": 2, "batch_size": 256})
    assert llama_server_args(rec) == ["--threads", "2", "--batch-size", "256", "--ubatch-size", "64"]
    with pytest.raises(ValueError, match="flash_attn are not known"):
        llama_server_args(_record(backend=Backend.LLAMA_CPP, settings={"flash_attn": "on"}))
    with pytest.raises(ValueError, match="no llama-server flags"):
        llama_server_args(_record())


def test_golden_mismatch_says_where_the_canary_parts_from_the_record() -> None:
    from trtforge.contract.llm import GoldenTokens, golden_mismatch

    g = GoldenTokens(prompt="Paris is", n_predict=3, tokens=[5, 6, 7], text=" a city")
    assert golden_mismatch(g, [5, 6, 7]) is None
    assert golden_mismatch(g, [5, 9, 7]) == (
        "the canary's token 1 is 9; the checkpoint recorded 6 (greedy, 3 tokens of 'Paris is')"
    )
    got = golden_mismatch(g, [5, 6])
    assert got is not None and "gave 2 tokens" in got
