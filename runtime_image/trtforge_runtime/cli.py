"""`trtforge serve`: serve one engine from the store over the Open Inference Protocol (v2).

Exit codes and the termination message: :mod:`trtforge.contract.termination`.
"""

from __future__ import annotations

import argparse
from typing import Any

from trtforge_runtime.lifecycle import event_loop

# How long the CLI waits for the warm start to check the manifest (and, from a store that downloads,
# for the download) before it imports the server anyway (a slow store must not keep the ports
# closed): trtforge_runtime.lifecycle.warmstart.import_backend_library.
MANIFEST_WAIT_S = 2.0
# An instance thread back from a batch waits at most this long for the GIL held by a busy event
# loop (docs/design.md, "Adapting to load": the GIL between batches).
DEFAULT_SWITCH_INTERVAL_US = 500


def _positive(v: str) -> int:
    n = int(v)
    if n < 1:
        raise argparse.ArgumentTypeError(f"{v} must be at least 1")
    return n


def _non_negative(v: str) -> int:
    n = int(v)
    if n < 0:
        raise argparse.ArgumentTypeError(f"{v} must be 0 or more")
    return n


def _workers(v: str) -> int | None:
    """`--workers`: a number, or auto (None: one per 4 usable CPUs, trtforge_runtime.lifecycle.cpus)."""
    if v == "auto":
        return None
    try:
        return _positive(v)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{v!r} is neither auto nor a number") from e


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "serve",
        help="serve an engine over the KServe Open Inference Protocol (v2)",
        description=__doc__,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "--store",
        required=True,
        metavar="STORE_URI",
        help="engine store: pvc://claim/path, /abs/path, file://, s3://bucket/prefix, http(s):// broker",
    )
    p.add_argument("--engine", required=True, metavar="KEY", help="engine key (64 hex characters)")
    p.add_argument(
        "--model-name", default=None, help="model name in the v2 API (default: the model file's stem)"
    )
    p.add_argument("--host", default="0.0.0.0", help="address to listen on")
    p.add_argument("--port", type=_non_negative, default=8000, help="HTTP port (0: any free port)")
    grpc = p.add_mutually_exclusive_group()
    grpc.add_argument(
        "--grpc-port",
        type=_non_negative,
        default=8001,
        help="port of the v2 gRPC protocol (inference.GRPCInferenceService; 0: any free port)",
    )
    grpc.add_argument("--no-grpc", action="store_true", help="serve HTTP only")
    p.add_argument(
        "--cache-dir",
        default="/var/cache/trtforge",
        help="where the verified engine is kept across container restarts (the pod's volume)",
    )
    p.add_argument(
        "--max-batch-size",
        type=_positive,
        default=None,
        help="cap on rows per batch (default: the engine profile's max batch)",
    )
    p.add_argument(
        "--no-learned-batch-cap",
        action="store_true",
        help="batch up to --max-batch-size always (by default the pool's batch cap starts at 2 and"
        " climbs while bigger batches compute each row faster, learned from its own batch timings)",
    )
    p.add_argument(
        "--max-queue-delay-us",
        type=_non_negative,
        default=0,
        help="how long a partly filled batch waits for more requests",
    )
    p.add_argument(
        "--instances",
        type=_positive,
        default=None,
        help="execution instances (parallel batches); default: one per CPU for ONNX Runtime, 1 for TensorRT",
    )
    p.add_argument(
        "--workers",
        type=_workers,
        default="auto",
        help="runtime processes on the same ports (SO_REUSEPORT), each on its share of the CPUs: "
        "per-request work spread over several event loops and GILs, for many cores. auto: one per 4 "
        "CPUs the pod may use (its affinity capped by its CPU limit), 1 with --port 0 or --grpc-port 0",
    )
    p.add_argument(
        "--worker-cpus",
        choices=("split", "shared"),
        default="split",
        help="with several workers: split (each pinned to its share of the CPUs) or shared (none "
        "pinned, each sized for every CPU, so a worker holding more connections uses idle CPUs)",
    )
    p.add_argument(
        "--no-solo",
        action="store_true",
        help="no solo instance (by default a request that arrives alone runs on a session with every "
        "CPU's threads, when the instances split the CPUs)",
    )
    p.add_argument(
        "--max-queue",
        type=_positive,
        default=256,
        help="requests that may wait for an instance; more are refused with 503",
    )
    p.add_argument(
        "--max-request-bytes",
        type=_positive,
        default=64 << 20,
        help="largest request body, as sent and after decompression (413)",
    )
    p.add_argument(
        "--max-json-bytes",
        type=_positive,
        default=8 << 20,
        help="largest JSON part of a request (413; also capped by the model's largest valid request)",
    )
    p.add_argument(
        "--max-body-memory",
        type=_positive,
        default=None,
        help="bytes of request bodies held at once, over all requests (default: 2x --max-request-bytes)",
    )
    p.add_argument(
        "--idle-timeout",
        type=float,
        default=30.0,
        help="seconds a connection may go without a complete request head (after opening or its last answer)",
    )
    p.add_argument(
        "--body-timeout", type=float, default=60.0, help="seconds a request body may take to arrive (408)"
    )
    p.add_argument(
        "--grpc-message-timeout",
        type=float,
        default=60.0,
        help="seconds a gRPC call's request message may take to arrive whole (DEADLINE_EXCEEDED, and"
        " the call's slot is freed)",
    )
    p.add_argument(
        "--max-connections",
        type=_positive,
        default=1024,
        help="open HTTP connections; past it, health probes are answered and others get 503",
    )
    p.add_argument(
        "--drain-timeout", type=float, default=30.0, help="seconds to drain in-flight requests on SIGTERM"
    )
    p.add_argument(
        "--event-loop",
        choices=event_loop.CHOICES,
        default=event_loop.DEFAULT,
        help="the event loop of each worker: asyncio (the standard library's) or uvloop (needs the "
        "trtforge-runtime[uvloop] extra); docs/benchmarks.md measures both",
    )
    p.add_argument(
        "--gil-switch-interval-us",
        type=_positive,
        default=DEFAULT_SWITCH_INTERVAL_US,
        help="how long one thread may keep the GIL once another asks for it (Python's own default is"
        " 5000): each instance's thread needs it after every batch, while the event loop is busy",
    )
    p.set_defaults(func=handle)


def _refuse(engine_key: str, message: str) -> int:
    """Log the error, write the termination message, and return its exit code."""
    import logging

    from trtforge.contract.termination import TerminationMessage, write_termination_message

    logging.getLogger("trtforge_runtime").error(message)
    msg = TerminationMessage(reason="Error", message=message, engine_key=engine_key)
    write_termination_message(msg)
    return msg.exit_code


def handle(args: argparse.Namespace) -> int:
    import logging
    import os
    import sys
    from pathlib import Path

    from trtforge_runtime.lifecycle import cpus

    try:
        event_loop.check(args.event_loop)
    except event_loop.EventLoopUnavailable as e:
        logging.getLogger("trtforge_runtime").error(str(e))
        return 2
    any_port = args.port == 0 or (args.grpc_port == 0 and not args.no_grpc)
    if args.workers is None:  # auto
        args.workers = 1 if any_port else cpus.auto_workers(cpus.usable_cpus())
    if args.workers > 1:
        # Only the supervisor imports it (subprocess, tempfile): a worker, or a runtime on its own,
        # begins the pre-hash without them (docs/design.md, "Runtime cold start").
        from trtforge_runtime.lifecycle import workers

        log = logging.getLogger("trtforge_runtime")
        if any_port:
            log.error(
                "--workers shares its ports among the workers: give --port and --grpc-port numbers, not 0"
            )
            return 2
        try:
            return workers.supervise(sys.argv[1:], args.workers, args.worker_cpus == "shared")
        except ValueError as e:  # more workers than CPUs
            log.error(f"--workers {args.workers}: {e}")
            return 2
    cpus.pin_worker()
    sys.setswitchinterval(args.gil_switch_interval_us / 1e6)
    # No garbage collection while start-up imports and loads; the runtime turns it back on once it
    # serves (trtforge_runtime.lifecycle.startup_gc).
    from trtforge_runtime.lifecycle import startup_gc

    startup_gc.pause()

    # Before anything heavy: a store on a mounted volume starts hashing the engine in place on a
    # thread of its own while the imports below hold the GIL (trtforge_runtime.lifecycle.prehash).
    from trtforge_runtime.lifecycle import prehash

    prehash.begin(args.store, args.engine, Path(args.cache_dir))
    # Then, for an ONNX Runtime engine there, its library, and its session opened on a thread from
    # the pre-hashed file once it matches the raw manifest's sha256, while pydantic, the contract and
    # the server import; the backend takes it only for the verified manifest
    # (trtforge_runtime.lifecycle.preload).
    from trtforge_runtime.lifecycle import preload

    preload.begin(args.instances)

    from trtforge.contract import layout
    from trtforge.contract.gpu_probe import GPUProbeError, probe_from_env, probe_identity
    from trtforge.store import open_store
    from trtforge.store.base import StoreError

    try:
        layout.engine_dir(args.engine)
        probe = probe_from_env()
        store = open_store(args.store)
    except (ValueError, GPUProbeError, StoreError) as e:
        return _refuse(args.engine, str(e))

    # The engine is fetched, verified, loaded and canary-checked on a thread while the modules below
    # import; the runtime collects the results (trtforge_runtime.lifecycle.warmstart says what is kept
    # checked, and the order: what the hash needs before it, the engine's library while it hashes, the server
    # while the session builds; docs/design.md, "Runtime cold start").
    import trtforge_runtime.lifecycle.fetch  # noqa: F401 (what the thread needs first: imported here, not there)
    from trtforge_runtime.lifecycle import warmstart
    from trtforge_runtime.lifecycle.identity import check_identity

    warmstart.begin(
        store,
        args.engine,
        Path(args.cache_dir),
        args.instances,
        check=lambda manifest: check_identity(manifest, probe_identity(probe)),
        canary_for=(args.model_name, args.max_batch_size),
    )
    warmstart.import_backend_library(MANIFEST_WAIT_S)

    from trtforge_runtime.lifecycle.runtime import Runtime
    from trtforge_runtime.lifecycle.workers import WORKER_INDEX_ENV
    from trtforge_runtime.settings import Settings

    settings = Settings(
        store_uri=args.store,
        engine_key=args.engine,
        model_name=args.model_name,
        host=args.host,
        port=args.port,
        cache_dir=Path(args.cache_dir),
        max_batch_size=args.max_batch_size,
        max_queue_delay_us=args.max_queue_delay_us,
        learn_batch_cap=not args.no_learned_batch_cap,
        instances=args.instances,
        solo=not args.no_solo,
        max_queue=args.max_queue,
        max_request_bytes=args.max_request_bytes,
        drain_timeout_s=args.drain_timeout,
        max_json_bytes=args.max_json_bytes,
        max_body_memory=args.max_body_memory,
        idle_timeout_s=args.idle_timeout,
        body_timeout_s=args.body_timeout,
        grpc_message_timeout_s=args.grpc_message_timeout,
        max_connections=args.max_connections,
        grpc_port=None if args.no_grpc else args.grpc_port,
        reuse_port=os.environ.get("TRTFORGE_REUSE_PORT") == "1",
        listen_when_ready=os.environ.get(WORKER_INDEX_ENV, "0") != "0",
    )
    return event_loop.run(Runtime(settings, store, probe).run(), args.event_loop)
