"""The GPU backend of the quantize step: NVIDIA ModelOpt PTQ, exported as a Hugging Face checkpoint
that TensorRT-LLM's PyTorch backend loads directly (docs/llm.md).

Written for real but NOT run here: no GPU, no ModelOpt, no torch on the test bed. The decisions
(which ModelOpt config, which calibration, what the export must contain) are pure functions with
contract tests; `quantize_with_modelopt` is the thin layer that applies them, importing ModelOpt,
torch and transformers only when called. API names are those of ModelOpt's own PTQ example
(``examples/llm_ptq/hf_ptq.py``): ``mtq.quantize(model, config, forward_loop)``, then
``modelopt.torch.export.export_hf_checkpoint(model, export_dir=...)``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtforge.contract.llm.recipe import Calibration, Recipe

# The ModelOpt config each recipe quantizes with (attributes of modelopt.torch.quantization); BF16
# is not quantized, only exported as BF16.
MODELOPT_CONFIG: dict[Recipe, str | None] = {
    Recipe.BF16: None,
    Recipe.FP8: "FP8_DEFAULT_CFG",
    Recipe.NVFP4: "NVFP4_DEFAULT_CFG",
    Recipe.INT4_AWQ: "INT4_AWQ_CFG",
    Recipe.W4A8_AWQ: "W4A8_AWQ_BETA_CFG",
}
# What `hf_quant_config.json` names as `quantization.quant_algo` after the export.
QUANT_ALGO: dict[Recipe, str | None] = {
    Recipe.BF16: None,
    Recipe.FP8: "FP8",
    Recipe.NVFP4: "NVFP4",
    Recipe.INT4_AWQ: "W4A16_AWQ",
    Recipe.W4A8_AWQ: "W4A8_AWQ",
}
HF_QUANT_CONFIG = "hf_quant_config.json"


@dataclass(frozen=True)
class ModelOptPlan:
    """Everything the quantize Job decides before it touches a GPU."""

    recipe: Recipe
    config_name: str | None  # None: no quantization (bf16 export)
    calibrate: bool
    dataset: str
    samples: int
    sequence_length: int
    batch_size: int
    export_dtype: str  # the dtype of unquantized layers in the export


def plan(recipe: Recipe, calibration: Calibration, gpu_memory_mib: int) -> ModelOptPlan:
    """The ModelOpt run for a recipe: calibration only where the recipe has activation or AWQ scales
    to fit; the batch sized so a sequence-length batch of activations stays small beside the weights."""
    config = MODELOPT_CONFIG[recipe]
    tokens_budget = max(1, gpu_memory_mib // 40) * 64  # ~1.6k tokens per GiB of GPU memory
    batch = max(1, min(calibration.samples, tokens_budget // calibration.sequence_length))
    return ModelOptPlan(
        recipe=recipe,
        config_name=config,
        calibrate=config is not None,
        dataset=calibration.dataset,
        samples=calibration.samples,
        sequence_length=calibration.sequence_length,
        batch_size=batch,
        export_dtype="bfloat16",
    )


def export_problems(export_dir: Path, recipe: Recipe) -> list[str]:
    """What an export folder lacks to be the recipe's checkpoint (empty: it is one)."""
    problems = []
    if not (export_dir / "config.json").is_file():
        problems.append("config.json is missing")
    if not list(export_dir.glob("*.safetensors")):
        problems.append("no *.safetensors weights")
    want = QUANT_ALGO[recipe]
    qc = export_dir / HF_QUANT_CONFIG
    if want is not None:
        if not qc.is_file():
            problems.append(f"{HF_QUANT_CONFIG} is missing")
        else:
            try:
                algo = json.loads(qc.read_text())["quantization"]["quant_algo"]
            except (ValueError, KeyError, TypeError) as e:
                problems.append(f"{HF_QUANT_CONFIG} has no quantization.quant_algo ({e})")
            else:
                if algo != want:
                    problems.append(f"{HF_QUANT_CONFIG} says quant_algo {algo}, expected {want}")
    return problems


def quantize_with_modelopt(source_dir: Path, export_dir: Path, p: ModelOptPlan) -> None:  # pragma: no cover
    """Load the source checkpoint on the GPU, calibrate and quantize it, export it. Needs a GPU image
    with nvidia-modelopt, torch and transformers; never run on the test bed."""
    import modelopt.torch.quantization as mtq  # type: ignore[import-not-found]
    import torch  # type: ignore[import-not-found]
    from modelopt.torch.export import export_hf_checkpoint  # type: ignore[import-not-found]
    from modelopt.torch.utils.dataset_utils import (  # type: ignore[import-not-found]
        create_forward_loop,
        get_dataset_dataloader,
    )
    from transformers import AutoModelForCausalLM, AutoTokenizer  # type: ignore[import-not-found]

    model: Any = AutoModelForCausalLM.from_pretrained(
        source_dir, torch_dtype=torch.bfloat16, device_map="cuda"
    )
    if p.config_name is not None:
        tokenizer = AutoTokenizer.from_pretrained(source_dir)
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        loader = get_dataset_dataloader(
            dataset_name=p.dataset,
            tokenizer=tokenizer,
            batch_size=p.batch_size,
            num_samples=p.samples,
            max_sample_length=p.sequence_length,
            device=model.device,
        )
        mtq.quantize(model, getattr(mtq, p.config_name), forward_loop=create_forward_loop(dataloader=loader))
    with torch.inference_mode():
        export_hf_checkpoint(model, export_dir=str(export_dir))
    problems = export_problems(export_dir, p.recipe)
    if problems:
        raise RuntimeError(
            f"ModelOpt's export in {export_dir} is not a {p.recipe} checkpoint: {'; '.join(problems)}"
        )


def tuning_env(cache_path: Path) -> dict[str, str]:
    """The environment that makes TensorRT-LLM's autotuner write (and later read) its cache there."""
    return {"TLLM_AUTOTUNER_CACHE_PATH": str(cache_path)}
