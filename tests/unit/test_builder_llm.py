"""The LLM forge's pure parts: llama.cpp output parsing and tuning choices, the test-bed type
mapping, the quantize/tune command lines; and the ModelOpt backend's decisions, which are CONTRACT
tests (what the GPU path would call and check), not a run of ModelOpt or TensorRT-LLM."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from trtforge_builder.llm import modelopt
from trtforge_builder.llm.llamacpp import (
    TESTBED_GGUF_TYPE,
    BenchRow,
    LlamaCppError,
    LlamaCppTools,
    bench_rows,
    best_settings,
    gguf_type_for,
    parse_perplexity,
)
from trtforge_builder.llm.quantize import AccuracyGateFailed, evaluation_text, figures, quantize_threads
from trtforge_builder.llm.tune import bench_threads, thread_candidates

from trtforge.contract.llm import Calibration, PerplexityGate, Recipe
from trtforge.contract.llm.result import QuantizeFailure, llama_cpp_version
from trtforge.cpus import affinity, cgroup_cpu_limit, effective_cpus

PPL_LOG = """
perplexity: calculating perplexity over 9 chunks, n_ctx=128, batch_size=128, n_seq=1
[1]14.2315,[2]17.9934,[3]16.0021,[4]15.8870,[5]16.1201,[6]15.9902,[7]16.3011,[8]16.1187,[9]16.0577,
Final estimate: PPL = 16.0577 +/- 1.23456
"""


def test_perplexity_is_read_from_the_final_estimate() -> None:
    assert parse_perplexity(PPL_LOG) == pytest.approx(16.0577)
    with pytest.raises(LlamaCppError, match="no final estimate"):
        parse_perplexity("[1]14.2315,[2]17.9934")


def test_bench_json_rows_and_the_best_settings() -> None:
    raw = json.dumps(
        [
            {"n_threads": 1, "n_batch": 64, "n_ubatch": 64, "n_prompt": 64, "n_gen": 0, "avg_ts": 300.0},
            {"n_threads": 2, "n_batch": 64, "n_ubatch": 64, "n_prompt": 64, "n_gen": 0, "avg_ts": 550.0},
            {"n_threads": 2, "n_batch": 256, "n_ubatch": 256, "n_prompt": 64, "n_gen": 0, "avg_ts": 550.0},
            {"n_threads": 1, "n_batch": 64, "n_ubatch": 64, "n_prompt": 0, "n_gen": 16, "avg_ts": 80.0},
            {"n_threads": 2, "n_batch": 64, "n_ubatch": 64, "n_prompt": 0, "n_gen": 16, "avg_ts": 61.5},
        ]
    )
    rows = bench_rows(raw)
    assert rows[0] == BenchRow(
        threads=1, batch=64, ubatch=64, prompt_tokens=64, gen_tokens=0, tokens_per_second=300.0
    )
    settings, measured = best_settings(rows)
    # generation decides threads (1 beat 2 here); prompt processing decides batch, ties to the smaller
    assert settings == {"threads": 1, "batch_size": 64, "ubatch_size": 64}
    assert measured["tg:threads=2,batch=64,ubatch=64"] == 61.5 and len(measured) == 5
    with pytest.raises(LlamaCppError, match="no generation"):
        best_settings(rows[:3])
    with pytest.raises(LlamaCppError, match="no JSON"):
        bench_rows("error: unknown argument")


def test_thread_candidates_double_up_to_the_cores() -> None:
    assert thread_candidates(1) == [1]
    assert thread_candidates(2) == [1, 2]
    assert thread_candidates(6) == [1, 2, 4, 6]
    assert thread_candidates(16) == [1, 2, 4, 8, 16]


def test_the_tune_steps_threads_are_capped_by_the_jobs_cpu_limit(tmp_path: Path) -> None:
    """A fake cgroup folder as the input: a 4-CPU limit on a 64-core node benches up to 4 threads;
    a 1-CPU limit here benches 1 thread whatever this machine's affinity."""
    (tmp_path / "cpu.max").write_text("400000 100000\n")
    assert thread_candidates(effective_cpus(64, cgroup_cpu_limit(tmp_path))) == [1, 2, 4]
    (tmp_path / "cpu.max").write_text("100000 100000\n")
    assert bench_threads(cgroup_root=tmp_path) == [1]
    assert bench_threads(8, cgroup_root=tmp_path) == [1, 2, 4, 8]  # --threads wins
    (tmp_path / "cpu.max").write_text("max 100000\n")  # no limit: the affinity
    assert bench_threads(cgroup_root=tmp_path) == thread_candidates(len(affinity()))


def test_the_quantize_steps_threads_are_capped_by_the_jobs_cpu_limit(tmp_path: Path) -> None:
    (tmp_path / "cpu.max").write_text("100000 100000\n")
    assert quantize_threads(cgroup_root=tmp_path) == 1
    assert quantize_threads(3, cgroup_root=tmp_path) == 3  # --threads wins
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert quantize_threads(cgroup_root=tmp_path) == len(affinity())


def test_every_recipe_has_a_test_bed_type_and_an_override_wins() -> None:
    assert set(TESTBED_GGUF_TYPE) == set(Recipe)
    assert gguf_type_for(Recipe.FP8, None) == "Q8_0"
    assert gguf_type_for(Recipe.FP8, "Q2_K") == "Q2_K"


def test_llama_cpp_version_from_its_version_output() -> None:
    assert llama_cpp_version("version: 7260 (2fa51c19)\nbuilt with GNU 12.2.0") == "b7260-2fa51c19"
    assert llama_cpp_version("version: 0 (unknown)\nbuilt with GNU 12.2.0 for Linux x86_64") == "b0-unknown"
    out = "version: 0.5.0-dev (build 0, commit unknown)\nbuilt with GNU 12.2.0 for Linux x86_64"
    assert llama_cpp_version(out) == "0.5.0-dev-b0-unknown"
    assert llama_cpp_version("version: 0.6.1 (build 8012, commit 1a2b3c4d)") == "0.6.1-b8012-1a2b3c4d"
    with pytest.raises(ValueError, match="no 'version"):
        llama_cpp_version("usage: llama-quantize ...")


def test_a_missing_tool_is_named(tmp_path: Path) -> None:
    with pytest.raises(LlamaCppError, match=r"llama-quantize is not in .*--llama-bin-dir"):
        LlamaCppTools(tmp_path).tool("llama-quantize")


def test_the_evaluation_text_ships_with_the_builder(tmp_path: Path) -> None:
    path, sha = evaluation_text(tmp_path)
    text = path.read_text()
    assert 4000 < len(text.encode()) < 16000 and text.isascii()
    assert len(sha) == 64


def test_the_accuracy_gate_failure_carries_both_figures() -> None:
    gate = PerplexityGate(
        evaluation_text="evaluation.txt", evaluation_sha256="a" * 64, context=128, source=16.0, result=21.0,
        max_increase=0.01,
    )  # fmt: skip
    e = AccuracyGateFailed(gate)
    assert e.reason == "ValidationFailed" and e.exit_code == 96
    assert "21.0000" in str(e) and "16.0000" in str(e) and "nothing was published" in str(e)
    failure = QuantizeFailure(**e.failure().model_dump(), perplexity=figures(gate))
    line = json.loads(failure.to_line())
    assert line["reason"] == "ValidationFailed"
    assert line["perplexity"] == {"source": 16.0, "result": 21.0, "increase": 0.3125, "maxIncrease": 0.01}


def _cli(*args: str) -> tuple[int, dict[str, object]]:
    r = subprocess.run(
        [sys.executable, "-m", "trtforge.cli", *args], capture_output=True, text=True, timeout=120
    )
    return r.returncode, json.loads(r.stdout.strip().splitlines()[-1])


def test_the_command_lines_refuse_bad_arguments_with_a_json_line(tmp_path: Path) -> None:
    rc, out = _cli("tune", "--checkpoint", "nope", "--gpu", "cpu", "--store", str(tmp_path))
    assert rc == 2 and out["reason"] == "InvalidArgument" and "--checkpoint" in str(out["error"])
    rc, out = _cli(
        "tune", "--checkpoint", "a" * 64, "--gpu", "cpu", "--repetitions", "0", "--store", str(tmp_path)
    )
    assert rc == 2 and "--repetitions 0" in str(out["error"])
    rc, out = _cli(
        "quantize", "--source", str(tmp_path / "m.gguf"), "--recipe", "fp8", "--gguf-type", "q2 k",
        "--store", str(tmp_path),
    )  # fmt: skip
    assert rc == 2 and "ggufType" in str(out["error"])
    rc, out = _cli(
        "quantize", "--source", "x", "--recipe", "fp8", "--perplexity-chunks", "-1", "--store", str(tmp_path)
    )
    assert rc == 2 and "--perplexity-chunks -1" in str(out["error"])
    rc, out = _cli(
        "quantize", "--source", "x", "--recipe", "fp8", "--backend", "tensorrt-llm", "--store", str(tmp_path)
    )
    assert rc == 94 and out["reason"] == "BackendUnavailable" and "ModelOpt" in str(out["error"])


# --- the ModelOpt / TensorRT-LLM backend: contract tests, not a run ------------------------------------


def test_contract_each_recipe_names_modelopts_config_and_export_algo() -> None:
    """ModelOpt's config names (modelopt.torch.quantization) and the quant_algo its HF export writes."""
    assert set(modelopt.MODELOPT_CONFIG) == set(Recipe) == set(modelopt.QUANT_ALGO)
    assert modelopt.MODELOPT_CONFIG[Recipe.FP8] == "FP8_DEFAULT_CFG"
    assert modelopt.MODELOPT_CONFIG[Recipe.NVFP4] == "NVFP4_DEFAULT_CFG"
    assert modelopt.MODELOPT_CONFIG[Recipe.INT4_AWQ] == "INT4_AWQ_CFG"
    assert modelopt.MODELOPT_CONFIG[Recipe.W4A8_AWQ] == "W4A8_AWQ_BETA_CFG"
    assert modelopt.MODELOPT_CONFIG[Recipe.BF16] is None and modelopt.QUANT_ALGO[Recipe.BF16] is None


def test_contract_the_plan_calibrates_only_quantized_recipes_and_bounds_the_batch() -> None:
    cal = Calibration(dataset="cnn_dailymail", samples=512, sequence_length=2048)
    fp8 = modelopt.plan(Recipe.FP8, cal, gpu_memory_mib=81559)
    assert fp8.calibrate and fp8.config_name == "FP8_DEFAULT_CFG" and fp8.samples == 512
    assert 1 <= fp8.batch_size <= 512
    small = modelopt.plan(Recipe.FP8, cal, gpu_memory_mib=10240)
    assert small.batch_size <= fp8.batch_size
    assert not modelopt.plan(Recipe.BF16, cal, gpu_memory_mib=81559).calibrate


def test_contract_an_export_needs_config_weights_and_the_recipes_quant_algo(tmp_path: Path) -> None:
    d = tmp_path / "export"
    d.mkdir()
    assert set(modelopt.export_problems(d, Recipe.FP8)) == {
        "config.json is missing", "no *.safetensors weights", "hf_quant_config.json is missing",
    }  # fmt: skip
    (d / "config.json").write_text("{}")
    (d / "model.safetensors").write_bytes(b"\0")
    (d / "hf_quant_config.json").write_text(json.dumps({"quantization": {"quant_algo": "NVFP4"}}))
    assert modelopt.export_problems(d, Recipe.FP8) == [
        "hf_quant_config.json says quant_algo NVFP4, expected FP8"
    ]
    assert modelopt.export_problems(d, Recipe.NVFP4) == []
    assert modelopt.export_problems(d, Recipe.BF16) == []
    assert modelopt.tuning_env(tmp_path / "a.cache") == {
        "TLLM_AUTOTUNER_CACHE_PATH": str(tmp_path / "a.cache")
    }


def test_results_and_failures_round_trip_through_the_termination_message() -> None:
    from trtforge.contract.llm.result import QuantizeResult, TuneResult, parse_llm_message

    q = QuantizeResult(
        checkpoint_key="a" * 64, manifest_uri="s3://b/checkpoints/x/manifest.json", backend="llama.cpp",
        backend_version="0.5.0-dev-b0-unknown", recipe=Recipe.FP8, quantized_type="Q8_0", size_bytes=1,
        cache_hit=False, seconds=1.5,
    )  # fmt: skip
    assert '"schema":"trtforge.io/quantize-result/v1"' in q.to_line() and '"checkpointKey"' in q.to_line()
    assert parse_llm_message("log line\n" + q.to_line()) == q
    t = TuneResult(
        tuning_key="b" * 64, manifest_uri="m", checkpoint_key="a" * 64, backend="llama.cpp",
        backend_version="v", gpu="cpu", mapping="tp1pp1", settings={"threads": 2}, cache_hit=True,
        seconds=0.1,
    )  # fmt: skip
    assert parse_llm_message(t.to_line()) == t
    f = QuantizeFailure(error="gate", reason="ValidationFailed", exit_code=96)
    got = parse_llm_message(f.to_line())
    assert isinstance(got, QuantizeFailure) and got.reason == "ValidationFailed"
    assert parse_llm_message("") is None and parse_llm_message("not json") is None
    assert parse_llm_message('{"schema": "other"}') is None
