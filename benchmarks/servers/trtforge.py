"""trtforge serve: the engine that ``trtforge build --gpu cpu --precision fp32`` published for the model,
served from a local store with the setting's instances, threads, max batch and queue delay."""

from __future__ import annotations

import functools
import os
from pathlib import Path

from benchmarks.common import CACHE, TRTFORGE, cmd_output, serve_cmd
from benchmarks.engines import ensure_engine, store_dir
from benchmarks.servers import Kind, Launch, Model, Setting


def launch(model: Model, s: Setting, http_port: int, grpc_port: int, work: Path) -> Launch:
    store = store_dir(model.name)
    key, _publisher = ensure_engine(model.file, store)
    cache = CACHE / "serve-cache" / f"{model.name}-{http_port}"
    cmd = serve_cmd(
        str(store),
        key,
        model.name,
        http_port,
        cache,
        "--instances",
        str(s.instances),
        "--max-batch-size",
        str(s.max_batch),
        "--max-queue-delay-us",
        str(s.queue_delay_us),
    )
    protocols: tuple[str, ...] = ("http",)
    if grpc_supported():
        cmd += ["--grpc-port", str(grpc_port)]
        protocols = ("http", "grpc")
    env = {"TRTFORGE_GPU_PROBE": "none", "TRTFORGE_ORT_THREADS": str(s.threads)}
    return Launch(cmd, env, http_port, grpc_port if len(protocols) > 1 else None, protocols, [cache])


@functools.cache
def grpc_supported() -> bool:
    """Whether this tree's ``trtforge serve`` has a gRPC port."""
    return "--grpc-port" in cmd_output([*TRTFORGE, "serve", "--help"])


def version() -> dict[str, str]:
    """The commit of the trtforge that serves: ``$BENCH_TRTFORGE_COMMIT`` where ``$BENCH_TRTFORGE``
    runs another tree's (benchmarks.common), else this tree's."""
    return {
        "trtforge": os.environ.get("BENCH_TRTFORGE_COMMIT")
        or cmd_output(["git", "rev-parse", "--short", "HEAD"])
    }


def setting(cores: int) -> Setting:
    """One single-thread instance per core, batches of up to 32 with no queue delay; with several
    instances the runtime also keeps its solo session (on by default) for a request that arrives
    alone, and the label says so."""
    return Setting(cores, 1, 32, 0, "+ solo session" if cores > 1 else "")


KIND = Kind("trtforge", "trtforge serve", setting, launch, version)
