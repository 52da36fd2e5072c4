"""The server's command line and environment as a :class:`ServerPlan`: llama-server on a GGUF, or
trtllm-serve on a checkpoint folder."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import socket
from collections.abc import Sequence
from pathlib import Path

from trtforge.contract.llm import GoldenTokens
from trtforge_runtime.llm import llama_server, mpi_launch, ranks, trtllm_serve
from trtforge_runtime.llm.server_metrics import ServerKind
from trtforge_runtime.llm.supervisor import ServerPlan


def _binary(args: argparse.Namespace, default: str) -> str:
    found = args.server_binary or shutil.which(default)
    if not found or not Path(found).exists():
        raise ValueError(
            f"--server-binary: {args.server_binary or default!r} not found (give the server's path)"
        )
    return str(found)


def llama_plan(
    args: argparse.Namespace,
    extra: list[str],
    model: Path,
    name: str,
    canary: GoldenTokens | None,
    tuning: tuple[str, ...] = (),
) -> ServerPlan:
    if args.server != "llama.cpp":
        raise ValueError(f"--server {args.server}: a GGUF is served by llama.cpp")
    for flag, value in (
        ("--tensor-parallel", getattr(args, "tensor_parallel", 1)),
        ("--pipeline-parallel", getattr(args, "pipeline_parallel", 1)),
    ):
        if value != 1:
            raise ValueError(
                f"{flag} {value}: llama.cpp splits a model over a group's ranks by --rpc, not this"
            )
    if getattr(args, "host_cache_bytes", 0):
        raise ValueError("--host-cache-bytes: the KV cache's host tier is trtllm-serve's; llama.cpp has none")
    a = llama_server.LlamaServerArgs(
        model=model,
        port=args.port,
        host=args.host,
        alias=name,
        ctx_size=args.ctx_size,
        parallel=args.parallel,
        threads=args.threads,
        tuning=tuning,
        gpu_layers=args.gpu_layers,
        extra=tuple(extra),
    )
    argv = llama_server.argv(a, _binary(args, llama_server.COMMAND))
    return ServerPlan(ServerKind.LLAMA_CPP, argv, args.port, name, canary, host=_reach(args.host))


def trtllm_plan(
    args: argparse.Namespace,
    checkpoint_dir: Path,
    name: str,
    canary: GoldenTokens | None,
    tuning_cache: Path | None,
) -> ServerPlan:
    """trtllm-serve on a verified HF checkpoint folder, with its verified autotuner cache and its
    ``--config`` file (JSON, which is YAML) turning on the Prometheus route autoscaling reads and
    sizing the KV cache's host tier (``--host-cache-bytes``)."""
    options = trtllm_serve.llm_api_options(host_cache_bytes=getattr(args, "host_cache_bytes", 0))
    config = Path(args.cache_dir) / "trtllm-serve-config.yaml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(json.dumps(options))
    a = trtllm_serve.TrtllmServeArgs(
        model_dir=checkpoint_dir,
        port=args.port,
        host=args.host,
        tensor_parallel=getattr(args, "tensor_parallel", 1),
        pipeline_parallel=getattr(args, "pipeline_parallel", 1),
        config_path=config,
    )
    argv = trtllm_serve.argv(a)
    argv[0] = _binary(args, trtllm_serve.COMMAND)
    env = trtllm_serve.environment(tuning_cache)
    return ServerPlan(ServerKind.TRTLLM, argv, args.port, name, canary, env=env, host=_reach(args.host))


def mpirun_plan(args: argparse.Namespace, plan: ServerPlan, workers: Sequence[ranks.Worker]) -> ServerPlan:
    """A trtllm-serve plan run across the group: the same server line under mpirun and
    trtllm-llmapi-launch, this pod first (its host name, as mpirun knows itself), the workers as
    the leader reaches them, the plan's own variables passed to every rank. ValueError naming the flag."""
    per_rank = args.gpus_per_rank or (args.tensor_parallel * args.pipeline_parallel) // max(
        1, args.world_size
    )
    group = mpi_launch.MpiGroup(
        leader_host=socket.gethostname().split(".", 1)[0],
        worker_hosts=tuple(w.host for w in sorted(workers, key=lambda w: w.rank)),
        gpus_per_rank=per_rank,
        tensor=args.tensor_parallel,
        pipeline=args.pipeline_parallel,
        namespace=args.namespace,
        container=args.rank_container,
    )
    argv = mpi_launch.mpirun_argv(group, plan.argv, export=plan.env, as_root=os.geteuid() == 0)
    return dataclasses.replace(plan, argv=argv)


def _reach(host: str) -> str:
    """Where the supervisor reaches a server listening on `host`."""
    return "127.0.0.1" if host in ("0.0.0.0", "", "::") else host
