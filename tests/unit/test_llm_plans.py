"""The server plans of trtforge_runtime.llm.plans: what the supervisor would start."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import yaml
from trtforge_runtime.llm import plans
from trtforge_runtime.llm.server_metrics import ServerKind


def _args(tmp_path: Path, binary: Path, **kw: object) -> argparse.Namespace:
    base: dict[str, object] = {
        "server": "trtllm-serve", "port": 8080, "host": "0.0.0.0", "server_binary": str(binary),
        "cache_dir": str(tmp_path / "cache"), "ctx_size": 2048, "parallel": 4, "threads": None,
        "gpu_layers": None,
    }  # fmt: skip
    return argparse.Namespace(**{**base, **kw})


@pytest.fixture
def binary(tmp_path: Path) -> Path:
    b = tmp_path / "bin" / "server"
    b.parent.mkdir()
    b.write_text("#!/bin/sh\n")
    b.chmod(0o755)
    return b


def test_trtllm_plan_turns_on_the_prometheus_route_and_the_tuning_cache(tmp_path: Path, binary: Path) -> None:
    plan = plans.trtllm_plan(
        _args(tmp_path, binary), tmp_path / "ckpt", "m", None, tmp_path / "autotuner.cache"
    )
    assert plan.kind is ServerKind.TRTLLM and plan.host == "127.0.0.1"
    assert plan.argv[:2] == [str(binary), str(tmp_path / "ckpt")]
    config = Path(plan.argv[plan.argv.index("--config") + 1])
    assert yaml.safe_load(config.read_text()) == {"return_perf_metrics": True}
    assert json.loads(config.read_text()) == {"return_perf_metrics": True}
    assert plan.env == {"TLLM_AUTOTUNER_CACHE_PATH": str(tmp_path / "autotuner.cache")}


def test_llama_plan_refuses_another_server_and_a_missing_binary(tmp_path: Path, binary: Path) -> None:
    with pytest.raises(ValueError, match=r"served by llama\.cpp"):
        plans.llama_plan(_args(tmp_path, binary), [], tmp_path / "m.gguf", "m", None)
    missing = _args(tmp_path, tmp_path / "nope", server="llama.cpp")
    with pytest.raises(ValueError, match="--server-binary"):
        plans.llama_plan(missing, [], tmp_path / "m.gguf", "m", None)


def test_trtllm_plan_passes_the_host_cache_size_into_the_servers_config(tmp_path: Path, binary: Path) -> None:
    """A contract check of the file trtllm-serve would read (--config), not a run."""
    plan = plans.trtllm_plan(
        _args(tmp_path, binary, host_cache_bytes=3 << 30), tmp_path / "ckpt", "m", None, None
    )
    config = Path(plan.argv[plan.argv.index("--config") + 1])
    assert yaml.safe_load(config.read_text()) == {
        "return_perf_metrics": True,
        "kv_cache_config": {"host_cache_size": 3 << 30},
    }
    llama = _args(tmp_path, binary, server="llama.cpp", host_cache_bytes=1 << 30)
    with pytest.raises(ValueError, match="--host-cache-bytes"):
        plans.llama_plan(llama, [], tmp_path / "m.gguf", "m", None)


def test_a_trtllm_group_leader_runs_the_same_server_line_under_mpirun(tmp_path: Path, binary: Path) -> None:
    """A contract check of the leader's command line (trtforge_runtime.llm.mpi_launch), not a run."""
    import os
    import socket

    from trtforge_runtime.llm import mpi_launch
    from trtforge_runtime.llm.ranks import Worker

    args = _args(
        tmp_path, binary, tensor_parallel=4, pipeline_parallel=1, world_size=2, gpus_per_rank=0,
        namespace="team-a", rank_container="serve",
    )  # fmt: skip
    single = plans.trtllm_plan(args, tmp_path / "ckpt", "m", None, tmp_path / "autotuner.cache")
    workers = [Worker(1, "chat-g0-1.chat-g0", 50052, 8000)]
    plan = plans.mpirun_plan(args, single, workers)
    launch = plan.argv.index(mpi_launch.LAUNCHER)
    assert plan.argv[launch + 1 :] == single.argv  # --tp_size 4 across both pods
    assert plan.argv[plan.argv.index("--tp_size", launch) + 1] == "4"
    head = plan.argv[:launch]
    assert head[0] == "mpirun" and head[head.index("-np") + 1] == "4"
    me = socket.gethostname().split(".", 1)[0]
    assert head[head.index("--host") + 1] == f"{me}:2,chat-g0-1.chat-g0:2"  # 4 GPUs over 2 pods
    assert head[head.index("-x") + 1] == "TLLM_AUTOTUNER_CACHE_PATH"
    assert ("--allow-run-as-root" in head) is (os.geteuid() == 0)
    assert plan.env == single.env and plan.port == single.port
    with pytest.raises(ValueError, match="--namespace"):
        plans.mpirun_plan(_args(tmp_path, binary, **{**vars(args), "namespace": ""}), single, workers)
    odd = _args(tmp_path, binary, **{**vars(args), "gpus_per_rank": 3})
    with pytest.raises(ValueError, match="--gpus-per-rank 3"):
        plans.mpirun_plan(odd, single, workers)


def test_llama_plan_refuses_a_trtllm_mapping_by_flag(tmp_path: Path, binary: Path) -> None:
    llama = _args(tmp_path, binary, server="llama.cpp", tensor_parallel=2)
    with pytest.raises(ValueError, match="--tensor-parallel 2"):
        plans.llama_plan(llama, [], tmp_path / "m.gguf", "m", None)
