"""`trtforge serve-llm`: verify an LLM's artefacts, check the tuning record, start its server and
supervise it (probes and metrics on --probe-port; the OpenAI API on the server's own --port).

Exit codes and the termination message: :mod:`trtforge.contract.termination`.
"""

from __future__ import annotations

import argparse
from typing import Any


def _port(v: str) -> int:
    n = int(v)
    if not 0 <= n < 65536:
        raise argparse.ArgumentTypeError(f"{v} is not a port number")
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
    src = p.add_mutually_exclusive_group(required=True)
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
    p.add_argument("server_args", nargs=argparse.REMAINDER, help="after --: further arguments for the server")
    p.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    import asyncio
    import logging

    from trtforge.contract.termination import TerminationMessage, write_termination_message
    from trtforge_runtime.errors import Refusal
    from trtforge_runtime.llm import prepare, probes
    from trtforge_runtime.llm.supervisor import Supervisor

    log = logging.getLogger("trtforge_runtime.llm")
    extra = [a for a in args.server_args if a != "--"]
    try:
        plan, probe = prepare.plan_from_args(args, extra)
    except Refusal as e:
        log.error(e.message)
        msg = TerminationMessage(reason=e.reason, message=e.message, engine_key=args.checkpoint)
        write_termination_message(msg)
        return msg.exit_code
    except ValueError as e:  # a bad argument: one line, usage exit
        log.error(str(e))
        return 2
    sup = Supervisor(
        plan, probes.Policy(args.unavailable_grace, args.start_limit), args.host, args.probe_port
    )
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
