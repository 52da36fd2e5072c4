"""`trtforge serve-llm`: verify an LLM's artefacts, check the tuning record, start its server and
supervise it (probes and metrics on --probe-port; the OpenAI API on the server's own --port).

Exit codes and the termination message: :mod:`trtforge.contract.termination`.
"""

from __future__ import annotations

import argparse
import os
from typing import Any


def _port(v: str) -> int:
    n = int(v)
    if not 0 <= n < 65536:
        raise argparse.ArgumentTypeError(f"{v} is not a port number")
    return n


def _nonnegative(v: str) -> int:
    n = int(v)
    if n < 0:
        raise argparse.ArgumentTypeError(f"{v} is negative")
    return n


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "serve-llm",
        help="serve an LLM: verify its artefacts, start llama-server or trtllm-serve, supervise it",
        description=__doc__,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "--server", choices=("llama.cpp", "trtllm-serve"), default="llama.cpp", help="the LLM server"
    )
    src = p.add_mutually_exclusive_group()  # one of them on rank 0 (checked in handle)
    src.add_argument("--checkpoint", metavar="KEY", help="the quantized checkpoint's key in --store")
    src.add_argument(
        "--model", metavar="PATH", help="a local GGUF, unverified (hand use and benchmarks only)"
    )
    p.add_argument("--store", metavar="STORE_URI", help="store URI (as `trtforge serve`); with --checkpoint")
    p.add_argument(
        "--tuning", metavar="KEY", help="the tuning record's key in --store, checked against this pod"
    )
    p.add_argument("--cache-dir", default="/var/cache/trtforge", help="where the verified files are kept")
    p.add_argument("--model-name", default=None, help="the model's name in the OpenAI API and the metrics")
    p.add_argument("--host", default="0.0.0.0", help="address of the server and the probe port")
    p.add_argument("--port", type=_port, default=8080, help="the server's own (OpenAI API) port")
    p.add_argument("--probe-port", type=_port, default=8000, help="probes and /metrics (0: any free port)")
    p.add_argument("--server-binary", default=None, help="the server's executable (default: found on PATH)")
    p.add_argument("--ctx-size", type=int, default=2048, help="llama.cpp: context size")
    p.add_argument("--parallel", type=int, default=4, help="llama.cpp: slots (requests decoded together)")
    p.add_argument(
        "--threads", type=int, default=None, help="llama.cpp: threads, unless the tuning record sets them"
    )
    p.add_argument("--gpu-layers", type=int, default=None, help="llama.cpp CUDA build: layers on the GPU")
    p.add_argument(
        "--host-cache-bytes",
        type=_nonnegative,
        default=0,
        help="trtllm-serve: each rank's KV-cache host tier in bytes (kv_cache_config.host_cache_size; "
        'GH200: Grace memory, docs/llm.md "GH200"); 0: none',
    )
    p.add_argument("--canary-prompt", default=None, help="with --model: the canary prompt")
    p.add_argument(
        "--golden-tokens", default=None, help="with --model: the golden token ids, comma-separated"
    )
    p.add_argument(
        "--unavailable-grace",
        type=float,
        default=30.0,
        help="seconds of 503 or silence before liveness fails",
    )
    p.add_argument(
        "--start-limit", type=float, default=600.0, help="seconds the server may take to become healthy"
    )
    p.add_argument(
        "--tensor-parallel", type=int, default=1, help="trtllm-serve: tensor-parallel ranks (--tp_size)"
    )
    p.add_argument(
        "--pipeline-parallel", type=int, default=1, help="trtllm-serve: pipeline-parallel ranks (--pp_size)"
    )
    g = p.add_argument_group('rank groups (llama.cpp RPC or mpirun; docs/llm.md "Groups")')
    g.add_argument(
        "--rank",
        type=int,
        default=0,
        help="this pod's rank: 0 leads; others run ggml-rpc-server (llama.cpp) or host mpirun's ranks",
    )
    g.add_argument("--world-size", type=int, default=1, help="ranks in the group")
    g.add_argument(
        "--worker",
        action="append",
        default=[],
        metavar="HOST:RANK_PORT:PROBE_PORT",
        help="rank 0: a worker rank (ranks 1.. in order), its rank port and its supervisor's probe port",
    )
    g.add_argument(
        "--lws",
        action="store_true",
        help="take --rank, --world-size and the workers from a LeaderWorkerSet's LWS_* variables "
        "(workers' rank and probe ports: --rank-port and --probe-port)",
    )
    g.add_argument("--rank-port", type=_port, default=50052, help="a worker: the rank port (ggml-rpc-server)")
    g.add_argument(
        "--gpus-per-rank",
        type=int,
        default=0,
        help="trtllm-serve groups: GPUs (MPI processes) of each pod; 0: tensor x pipeline / --world-size",
    )
    g.add_argument(
        "--namespace",
        default=os.environ.get("POD_NAMESPACE", ""),
        help="trtllm-serve groups: the pods' namespace, for trtforge rank-exec (default: $POD_NAMESPACE)",
    )
    g.add_argument(
        "--rank-container",
        default="serve",
        help="trtllm-serve groups: the worker pods' container for rank-exec",
    )
    g.add_argument(
        "--rank-unreachable-grace",
        type=float,
        default=2.0,
        help="rank 0: seconds a worker's supervisor may be silent before its rank counts as gone",
    )
    g.add_argument(
        "--rank-loss-linger",
        type=float,
        default=5.0,
        help="rank 0: seconds a torn-down group keeps reporting the lost rank before the pod ends",
    )
    p.add_argument("server_args", nargs=argparse.REMAINDER, help="after --: further arguments for the server")
    p.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    import asyncio
    import logging

    from trtforge.contract.termination import TerminationMessage, write_termination_message
    from trtforge_runtime.errors import Refusal
    from trtforge_runtime.llm import plans, prepare, probes, ranks
    from trtforge_runtime.llm.group import LeaderSupervisor
    from trtforge_runtime.llm.supervisor import Supervisor

    log = logging.getLogger("trtforge_runtime.llm")
    extra = [a for a in args.server_args if a != "--"]
    if args.lws:
        import os

        try:
            placed = ranks.from_lws(os.environ, args.rank_port, args.probe_port)
        except ValueError as e:
            log.error(str(e))
            return 2
        args.rank, args.world_size = placed.rank, placed.world_size
        args.worker = [f"{w.host}:{w.rank_port}:{w.probe_port}" for w in placed.workers]
    if args.rank != 0:
        return _handle_worker(args)
    try:
        if args.checkpoint is None and args.model is None:
            raise ValueError("one of --checkpoint or --model is required on rank 0")
        workers = ranks.workers_from_args(args.world_size, args.worker)
        plan, probe = prepare.plan_from_args(args, extra)
        if workers and args.server == "trtllm-serve":
            plan = plans.mpirun_plan(args, plan, workers)  # the ranks meet through mpirun
    except Refusal as e:
        log.error(e.message)
        msg = TerminationMessage(reason=e.reason, message=e.message, engine_key=args.checkpoint)
        write_termination_message(msg)
        return msg.exit_code
    except ValueError as e:  # a bad argument: one line, usage exit
        log.error(str(e))
        return 2
    policy = probes.Policy(args.unavailable_grace, args.start_limit)
    sup: Supervisor
    if workers:
        if args.server == "llama.cpp":
            plan.argv += ["--rpc", ranks.rpc_argument(workers)]
        group_policy = ranks.GroupPolicy(args.start_limit, args.rank_unreachable_grace)
        sup = LeaderSupervisor(
            plan, policy, args.host, args.probe_port, workers, group_policy, args.rank_loss_linger
        )
    else:
        sup = Supervisor(plan, policy, args.host, args.probe_port)
    monitor = prepare.start_fault_monitor(probe, sup, args.checkpoint or "")
    try:
        msg = asyncio.run(sup.run())
    finally:
        if monitor is not None:
            monitor.stop()
    if msg.reason != "Completed":
        log.error(msg.message)
    write_termination_message(msg)
    return msg.exit_code


def _handle_worker(args: argparse.Namespace) -> int:
    """A worker rank: ``ggml-rpc-server`` on --rank-port under a supervisor that answers probes."""
    import asyncio
    import logging
    import shutil

    from trtforge.contract.gpu_probe import GPUProbeError, probe_from_env
    from trtforge.contract.termination import TerminationMessage, write_termination_message
    from trtforge_runtime.llm.group import RPC_SERVER, WorkerSupervisor, rpc_server_argv
    from trtforge_runtime.llm.prepare import start_fault_monitor

    log = logging.getLogger("trtforge_runtime.llm")
    if not 0 < args.rank < args.world_size:
        log.error(f"--rank {args.rank}: expected 0 to --world-size - 1 ({args.world_size - 1})")
        return 2
    if args.server != "llama.cpp":
        return _handle_mpi_worker(args)
    binary = args.server_binary or shutil.which(RPC_SERVER)
    if not binary:
        log.error(f"--server-binary: {RPC_SERVER!r} not found (give its path)")
        return 2
    try:
        argv = rpc_server_argv(binary, args.host, args.rank_port, args.threads)
    except ValueError as e:
        log.error(str(e))
        return 2
    try:
        probe = probe_from_env()
    except GPUProbeError as e:
        msg = TerminationMessage(reason="GPUMismatch", message=f"GPU probe: {e}")
        log.error(msg.message)
        write_termination_message(msg)
        return msg.exit_code
    sup = WorkerSupervisor(argv, args.rank, args.rank_port, args.host, args.probe_port)
    monitor = start_fault_monitor(probe, sup, f"rank {args.rank}")  # an Xid here ends the rank too
    try:
        msg = asyncio.run(sup.run())
    finally:
        if monitor is not None:
            monitor.stop()
    if msg.reason != "Completed":
        log.error(msg.message)
    write_termination_message(msg)
    return msg.exit_code


def _handle_mpi_worker(args: argparse.Namespace) -> int:
    """A trtllm-serve worker rank: fetch and verify what the leader's mpirun line names, at the same
    paths, then answer probes until stopped (mpirun starts this rank's MPI processes here)."""
    import asyncio
    import logging

    from trtforge.contract.termination import TerminationMessage, write_termination_message
    from trtforge_runtime.errors import Refusal
    from trtforge_runtime.llm import prepare
    from trtforge_runtime.llm.mpi_worker import MpiWorkerSupervisor

    log = logging.getLogger("trtforge_runtime.llm")
    try:
        if args.checkpoint is None:
            raise ValueError("--checkpoint: a trtllm-serve worker rank verifies the leader's checkpoint")
        _, probe = prepare.plan_from_args(args, [])
    except Refusal as e:
        log.error(e.message)
        msg = TerminationMessage(reason=e.reason, message=e.message, engine_key=args.checkpoint)
        write_termination_message(msg)
        return msg.exit_code
    except ValueError as e:
        log.error(str(e))
        return 2
    sup = MpiWorkerSupervisor(args.rank, args.host, args.probe_port)
    monitor = prepare.start_fault_monitor(probe, sup, f"rank {args.rank}")
    try:
        msg = asyncio.run(sup.run())
    finally:
        if monitor is not None:
            monitor.stop()
    write_termination_message(msg)
    return msg.exit_code
