"""`trtforge build`: build, validate and publish the engine of one model for one GPU target.

The last stdout line, and the termination-message file, is one JSON object: the result (key, uri,
sha256, sizeBytes, backend, backendVersion, computeCapability, buildSeconds, cacheHit, accuracy)
or the error (``{"error": ..., "reason": ...}``); see :mod:`trtforge.contract.build_result` for the
fields and the exit codes.
"""

from __future__ import annotations

import argparse
from typing import Any

EPILOG = """\
shapes are written 1x3x224x224; a profile entry is INPUT:MIN:OPT:MAX and an input named again
starts the next optimization profile. Model URIs: pvc://claim/path, s3://bucket/key, https://...,
file:///path or a path. Exit codes: 0 built or found in the store; 1 unexpected error; 2 bad
arguments; 80 store unavailable; 81 corrupt store entry not rebuilt; 82 GPU mismatch; 90 model
fetch failed; 91 model sha256 mismatch; 92 invalid model; 93 invalid profile; 94 backend
unavailable; 95 build failed; 96 validation failed; 97 timeout.
"""


def register(sub: Any) -> None:
    p = sub.add_parser(
        "build",
        help="build, validate and publish an engine for one GPU target",
        description=__doc__,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", required=True, help="model URI: pvc://, s3://, https://, file:// or a path")
    p.add_argument(
        "--sha256",
        default=None,
        help="pin the model's sha256 (64 hex); also allows a cache hit without fetching the model",
    )
    p.add_argument("--gpu", required=True, help="target GPU product (nvidia.com/gpu.product), or 'cpu'")
    p.add_argument("--mig", default=None, help="MIG profile of the target, e.g. 1g.18gb")
    p.add_argument("--precision", default="fp16", choices=["fp32", "fp16", "bf16", "int8", "fp8", "auto"])
    p.add_argument(
        "--profile",
        action="append",
        nargs="+",
        default=[],
        metavar="INPUT:MIN:OPT:MAX",
        help="shape range of an input (repeatable)",
    )
    p.add_argument(
        "--optimization-level",
        "--opt-level",
        dest="opt_level",
        type=int,
        default=3,
        help="builder optimization level 0-5 (default 3)",
    )
    p.add_argument("--workspace", default=None, help="workspace memory limit, e.g. 4Gi or 1073741824")
    p.add_argument(
        "--hardware-compatibility", default="none", choices=["none", "sameComputeCapability", "amperePlus"]
    )
    p.add_argument("--version-compatible", action="store_true", help="build for later TensorRT versions too")
    p.add_argument(
        "--strip-weights", action="store_true", help="weight-stripped plan, refitted from the ONNX"
    )
    p.add_argument(
        "--no-timing-cache",
        dest="timing_cache",
        action="store_false",
        help="neither load nor save the timing cache",
    )
    p.add_argument("--timeout", type=float, default=None, metavar="S", help="give up after S seconds")
    p.add_argument("--samples", type=int, default=None, help="validation samples (default 4)")
    p.add_argument("--rtol", type=float, default=None, help="relative tolerance (default per precision)")
    p.add_argument("--atol", type=float, default=None, help="absolute tolerance (default per precision)")
    p.add_argument("--seed", type=int, default=0, help="seed of the validation samples")
    p.add_argument("--backend", default="auto", choices=["auto", "tensorrt", "onnxruntime"])
    p.add_argument(
        "--rebuild",
        action="store_true",
        help="build even when the store has the key, and replace it (after a GPU fault)",
    )
    p.add_argument(
        "--staged-model",
        action="store_true",
        help="read the model from the store's staging area (models/<--sha256>/), where the engine "
        "broker put it after verifying the tenant's copy; --model then only names its source",
    )
    p.add_argument(
        "--cache-scope",
        default="",
        help="cache scope of the requesting namespace ('' shared, ns:<namespace>, group:<name>); "
        "part of the store key",
    )
    p.add_argument("--workdir", default=None, help="scratch directory (default: the system temp dir)")
    p.add_argument(
        "--request-key",
        default=None,
        help="the operator's request key: file the engine under requests/<key>.json in the store",
    )
    p.add_argument(
        "--store", required=True, help="engine store: pvc://claim/path, s3://bucket/prefix or a path"
    )
    p.set_defaults(func=handle)


def _request(args: argparse.Namespace) -> Any:
    from pathlib import Path

    from pydantic import ValidationError

    from trtforge.contract.gpu import GPUTarget
    from trtforge_builder.errors import BuildError
    from trtforge_builder.request import (
        DEFAULT_SAMPLES,
        BuildRequest,
        make_build_config,
        parse_profiles,
        parse_quantity,
    )

    entries = [e for group in args.profile for e in group]
    build = make_build_config(
        precision=args.precision,
        profiles=parse_profiles(entries),
        optimization_level=args.opt_level,
        workspace_bytes=parse_quantity(args.workspace) if args.workspace is not None else None,
        hardware_compatibility=args.hardware_compatibility,
        version_compatible=args.version_compatible,
        strip_weights=args.strip_weights,
    )
    try:
        target = GPUTarget(gpu=args.gpu, mig=args.mig)
        return BuildRequest(
            model_uri=args.model,
            model_sha256=args.sha256.lower() if args.sha256 else None,
            target=target,
            build=build,
            store_uri=args.store,
            backend=args.backend,
            timing_cache=args.timing_cache,
            timeout_s=args.timeout,
            samples=args.samples if args.samples is not None else DEFAULT_SAMPLES,
            rtol=args.rtol,
            atol=args.atol,
            seed=args.seed,
            rebuild=args.rebuild,
            staged_model=args.staged_model,
            cache_scope=args.cache_scope,
            workdir=Path(args.workdir) if args.workdir else None,
            request_key=args.request_key.lower() if args.request_key else None,
        )
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        flag = {
            "model_sha256": "--sha256",
            "request_key": "--request-key",
            "mig": "--mig",
            "gpu": "--gpu",
            "samples": "--samples",
            "rtol": "--rtol",
            "atol": "--atol",
            "cache_scope": "--cache-scope",
        }.get(loc, loc)
        raise BuildError(
            f"{flag}: {err['msg'].removeprefix('Value error, ')}", "InvalidArgument", step="parse-arguments"
        ) from e


def _emit(line: str) -> None:
    from trtforge.contract.termination import termination_log_path

    path = termination_log_path()
    if path is not None:
        try:
            with open(path, "w") as f:
                f.write(line + "\n")
        except OSError as e:
            import sys

            print(f"could not write the termination message to {path}: {e}", file=sys.stderr)
    print(line, flush=True)


def _start_watchdog(timeout_s: float, steps: Any) -> None:
    """After `timeout_s`, report Timeout and exit, even inside a long native call (a TensorRT build).

    Publishing is atomic, so exiting at any point leaves nothing half-visible in the store.
    """
    import logging
    import os
    import threading

    from trtforge.contract.build_result import BUILD_EXIT_CODES, BuildFailure

    def fire() -> None:
        step = steps.current or "start"
        msg = f"the build ran past --timeout {timeout_s:g}s (in step {step}); nothing was published"
        logging.getLogger("trtforge_builder").error(msg)
        _emit(
            BuildFailure(
                error=msg, reason="Timeout", exit_code=BUILD_EXIT_CODES["Timeout"], step=step
            ).to_line()
        )
        os._exit(BUILD_EXIT_CODES["Timeout"])

    t = threading.Timer(timeout_s, fire)
    t.daemon = True
    t.start()


def handle(args: argparse.Namespace) -> int:
    import logging

    from trtforge.contract.build_result import BUILD_EXIT_CODES, BuildFailure
    from trtforge.logs import fields
    from trtforge_builder.errors import BuildError
    from trtforge_builder.pipeline import run_build
    from trtforge_builder.progress import Steps

    log = logging.getLogger("trtforge_builder")
    steps = Steps()
    try:
        req = _request(args)
        if req.timeout_s:
            _start_watchdog(req.timeout_s, steps)
        result = run_build(req, steps=steps)
    except BuildError as e:
        log.error(str(e), extra=fields(reason=e.reason, step=e.step))
        _emit(e.failure().to_line())
        return e.exit_code
    except KeyboardInterrupt:
        _emit(BuildFailure(error="interrupted", reason="Error", exit_code=130, step=steps.current).to_line())
        return 130
    except Exception as e:  # a bug: keep the traceback in the log, one line in the message
        log.exception("unexpected error in step %s", steps.current)
        first = str(e).splitlines()[0] if str(e) else ""
        msg = f"unexpected {type(e).__name__} in step {steps.current}: {first}"
        _emit(
            BuildFailure(
                error=msg, reason="Error", exit_code=BUILD_EXIT_CODES["Error"], step=steps.current
            ).to_line()
        )
        return BUILD_EXIT_CODES["Error"]
    log.info(
        "cache hit" if result.cache_hit else "engine ready",
        extra=fields(key=result.key, uri=result.uri, seconds=result.total_seconds),
    )
    _emit(result.to_line())
    return 0
