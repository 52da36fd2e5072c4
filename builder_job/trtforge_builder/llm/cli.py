"""`trtforge quantize` and `trtforge tune`: the LLM forge steps a Job runs (docs/llm.md).

The last stdout line, and the termination message, is one JSON object: a QuantizeResult / TuneResult
or a failure (``{"error", "reason", "exitCode"}``; the accuracy gate's refusal also carries
``perplexity`` with both figures). Exit codes are those of ``trtforge build``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

BACKENDS = ["llama.cpp", "tensorrt-llm"]
RECIPES = ["bf16", "fp8", "nvfp4", "int4_awq", "w4a8_awq"]


def register_quantize(sub: Any) -> None:
    p = sub.add_parser(
        "quantize",
        help="quantize an LLM to a recipe, gate it on perplexity and publish the checkpoint",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--source", required=True, help="the source: a GGUF file (pvc://, s3://, https://, a path)"
    )
    p.add_argument("--sha256", default=None, help="pin the source's sha256 (64 hex)")
    p.add_argument("--recipe", required=True, choices=RECIPES)
    p.add_argument("--gguf-type", default=None, help="llama.cpp only: write this type instead (e.g. Q2_K)")
    p.add_argument("--calibration-dataset", default="cnn_dailymail")
    p.add_argument("--calibration-samples", type=int, default=512)
    p.add_argument("--calibration-sequence-length", type=int, default=512)
    p.add_argument(
        "--max-perplexity-increase", type=float, default=0.01, help="a fraction (default 0.01: 1%%)"
    )
    p.add_argument(
        "--perplexity-chunks",
        type=int,
        default=0,
        help="evaluate the gate on the first N chunks of the evaluation text (default 0: all of it)",
    )
    p.add_argument("--canary-prompt", default=None)
    p.add_argument("--canary-tokens", type=int, default=None)
    _common(p)
    p.set_defaults(func=handle_quantize)


def register_tune(sub: Any) -> None:
    p = sub.add_parser(
        "tune",
        help="measure the best serving settings of a checkpoint on this target and publish them",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--checkpoint", required=True, help="the checkpoint key (64 hex)")
    p.add_argument("--gpu", required=True, help="target GPU product (nvidia.com/gpu.product), or 'cpu'")
    p.add_argument("--mig", default=None)
    p.add_argument("--tensor", type=int, default=1)
    p.add_argument("--pipeline", type=int, default=1)
    p.add_argument(
        "--rebuild",
        action="store_true",
        help="measure again and replace the stored record even when the store has its key "
        "(after a GPU fault: the operator's re-tune Job)",
    )
    p.add_argument("--repetitions", type=int, default=2, help="llama-bench runs of each setting (default 2)")
    _common(p)
    p.set_defaults(func=handle_tune)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", required=True, help="store URI: pvc://, s3://, file:// or a path")
    p.add_argument("--backend", default="llama.cpp", choices=BACKENDS)
    p.add_argument(
        "--threads",
        type=int,
        default=0,
        help="CPU threads (default: the CPUs this Job may use, its affinity capped by its CPU limit)",
    )
    p.add_argument("--llama-bin-dir", default=None, help="where llama-quantize & co. are (default: PATH)")


def _emit(line: str) -> None:
    from trtforge_builder.cli import _emit as emit

    emit(line)


def _run(fn: Any, build_request: Any) -> int:
    import logging

    from pydantic import ValidationError

    from trtforge.contract.build_result import BUILD_EXIT_CODES
    from trtforge.contract.llm.result import QuantizeFailure
    from trtforge_builder.errors import BuildError
    from trtforge_builder.llm.quantize import AccuracyGateFailed, figures

    log = logging.getLogger("trtforge_builder")
    try:
        req = build_request()
    except (ValidationError, ValueError) as e:
        msg = " ".join(str(e).split())
        _emit(QuantizeFailure(error=msg, reason="InvalidArgument", exit_code=2).to_line())
        return 2
    try:
        result = fn(req)
    except BuildError as e:
        log.error(str(e))
        failure = QuantizeFailure(**e.failure().model_dump())
        if isinstance(e, AccuracyGateFailed):
            failure.perplexity = figures(e.gate)
        _emit(failure.to_line())
        return e.exit_code
    except Exception as e:  # a bug: the traceback in the log, one line in the message
        log.exception("unexpected error")
        first = str(e).splitlines()[0] if str(e) else ""
        code = BUILD_EXIT_CODES["Error"]
        _emit(
            QuantizeFailure(
                error=f"unexpected {type(e).__name__}: {first}", reason="Error", exit_code=code
            ).to_line()
        )
        return code
    _emit(result.to_line())
    return 0


def handle_quantize(args: argparse.Namespace) -> int:
    from trtforge.contract.llm.recipe import Backend, Calibration, QuantizationSpec, Recipe
    from trtforge_builder.llm.quantize import (
        DEFAULT_CANARY_PROMPT,
        DEFAULT_CANARY_TOKENS,
        QuantizeRequest,
        run_quantize,
    )

    def request() -> QuantizeRequest:
        if args.perplexity_chunks < 0:
            raise ValueError(f"--perplexity-chunks {args.perplexity_chunks} is negative: 0 (all) or more")
        spec = QuantizationSpec(
            recipe=Recipe(args.recipe),
            calibration=Calibration(
                dataset=args.calibration_dataset,
                samples=args.calibration_samples,
                sequence_length=args.calibration_sequence_length,
            ),
            gguf_type=args.gguf_type,
            max_perplexity_increase=args.max_perplexity_increase,
        )
        return QuantizeRequest(
            source_uri=args.source,
            store_uri=args.store,
            recipe=spec.recipe,
            calibration=spec.calibration,
            backend=Backend(args.backend),
            source_sha256=args.sha256,
            gguf_type=spec.gguf_type,
            max_perplexity_increase=spec.max_perplexity_increase,
            canary_prompt=args.canary_prompt or DEFAULT_CANARY_PROMPT,
            canary_tokens=args.canary_tokens or DEFAULT_CANARY_TOKENS,
            perplexity_chunks=args.perplexity_chunks,
            threads=args.threads,
            llama_bin_dir=Path(args.llama_bin_dir) if args.llama_bin_dir else None,
        )

    return _run(run_quantize, request)


def handle_tune(args: argparse.Namespace) -> int:
    from trtforge.contract.llm.artefact import HEX64
    from trtforge.contract.llm.recipe import Backend, Parallelism
    from trtforge_builder.llm.tune import TuneRequest, run_tune

    def request() -> TuneRequest:
        if not HEX64.match(args.checkpoint):
            raise ValueError(f"--checkpoint {args.checkpoint!r} is not a checkpoint key (64 lowercase hex)")
        if args.repetitions < 1:
            raise ValueError(f"--repetitions {args.repetitions} is below 1")
        return TuneRequest(
            store_uri=args.store,
            checkpoint_key=args.checkpoint,
            gpu=args.gpu,
            mig=args.mig,
            parallelism=Parallelism(tensor=args.tensor, pipeline=args.pipeline),
            backend=Backend(args.backend),
            cpus=args.threads,
            repetitions=args.repetitions,
            llama_bin_dir=Path(args.llama_bin_dir) if args.llama_bin_dir else None,
            rebuild=args.rebuild,
        )

    return _run(run_tune, request)
