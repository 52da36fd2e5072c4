"""The mpirun path of TensorRT-LLM rank groups (trtforge_runtime.llm.mpi_launch, rank_exec).

These tests check a contract, not a run of TensorRT-LLM: the argument names of trtllm-serve and
trtllm-llmapi-launch are those of TensorRT-LLM's source at the commits the module names. OpenMPI's
side is checked against a real mpirun where one is installed (Debian's openmpi-bin 4.1.4): it starts
a second daemon through `rank-exec`, with a stand-in for kubectl that runs the daemon on this machine
and stand-ins for trtllm-llmapi-launch and trtllm-serve that report their MPI rank.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from trtforge_runtime.llm import mpi_launch as m
from trtforge_runtime.llm import rank_exec
from trtforge_runtime.llm import trtllm_serve as t


def group(**kw: object) -> m.MpiGroup:
    base: dict[str, object] = {
        "leader_host": "chat-g0-0",
        "worker_hosts": ("chat-g0-1.chat-g0",),
        "gpus_per_rank": 4,
        "tensor": 8,
        "pipeline": 1,
        "namespace": "team-a",
        "container": "server",
    }
    return m.MpiGroup(**{**base, **kw})  # type: ignore[arg-type]


def serve(tp: int = 8, pp: int = 1) -> list[str]:
    return t.argv(
        t.TrtllmServeArgs(model_dir=Path("/ckpt"), port=8080, tensor_parallel=tp, pipeline_parallel=pp)
    )


def test_contract_the_leaders_mpirun_line() -> None:
    argv = m.mpirun_argv(group(), serve(), export=["TLLM_AUTOTUNER_CACHE_PATH"])
    launch = argv.index(m.LAUNCHER)
    assert argv[launch + 1 :] == serve()  # trtllm-serve as is, the whole mapping (--tp_size 8)
    assert argv[:launch] == [
        "mpirun",
        "-np", "8",  # tensor x pipeline: one MPI process per GPU
        "--host", "chat-g0-0:4,chat-g0-1.chat-g0:4",  # the leader first: MPI rank 0 serves there
        "--map-by", "slot",
        "--bind-to", "none",
        "--mca", "plm_rsh_agent",
        "trtforge rank-exec --namespace team-a --container server --pods chat-g0-1",
        "--mca", "plm_rsh_no_tree_spawn", "1",
        "-x", "TLLM_AUTOTUNER_CACHE_PATH",
    ]  # fmt: skip
    assert m.mpirun_argv(group(), serve(), as_root=True)[1] == "--allow-run-as-root"
    four = group(worker_hosts=("g-1.g", "g-2.g", "g-3.g"), gpus_per_rank=2, tensor=4, pipeline=2)
    argv = m.mpirun_argv(four, serve(4, 2))
    assert argv[argv.index("--host") + 1] == "chat-g0-0:2,g-1.g:2,g-2.g:2,g-3.g:2"
    assert argv[argv.index("-np") + 1] == "8"


@pytest.mark.parametrize(
    ("g", "serve_argv", "named"),
    [
        (group(gpus_per_rank=2), serve(), "--gpus-per-rank 2"),  # 2 pods x 2 GPUs is not tp8
        (group(tensor=4), serve(4), "--tensor-parallel 4"),
        (group(worker_hosts=()), serve(), "--world-size 1"),
        (group(gpus_per_rank=0), serve(), "--gpus-per-rank 0"),
        (group(tensor=0), serve(), "--tensor-parallel 0"),
        (group(), serve(tp=4, pp=2), "--tp_size 4"),  # trtllm-serve must get the group's mapping
        (group(), [], "--server trtllm-serve"),
        (group(), ["/opt/bin/trtllm-serve", "/ckpt"], "--tp_size 1"),  # unset: serve.py's default, 1
        (group(namespace="Team_A"), serve(), "--namespace"),
        (group(container="a:b"), serve(), "--container"),
        (group(worker_hosts=("chat-g0-0.chat-g0",)), serve(), "must differ"),
        (group(worker_hosts=("-bad.g",)), serve(), "--worker host"),
    ],
)
def test_bad_combinations_are_refused_naming_the_flag(
    g: m.MpiGroup, serve_argv: list[str], named: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(named)):
        m.mpirun_argv(g, serve_argv)


def test_an_exported_name_must_be_a_variable_and_agent_words_survive_openmpis_split() -> None:
    with pytest.raises(ValueError, match="not an environment variable"):
        m.mpirun_argv(group(), serve(), export=["A=B"])
    with pytest.raises(ValueError, match="plm_rsh_agent"):
        m.rsh_agent(group(), agent=["/opt/my tools/trtforge", "rank-exec"])


def test_rank_exec_runs_the_daemon_in_a_worker_pod_of_the_group_only() -> None:
    r = m.RankExec(
        "team-a", "server", frozenset({"chat-g0-1"}), "chat-g0-1", (" orted", "-mca", "ess", '"env"')
    )
    assert m.rank_exec_argv(r) == [
        "kubectl", "exec", "chat-g0-1", "-n", "team-a", "-c", "server", "--", "/bin/sh", "-c",
        ' orted -mca ess "env"',
    ]  # fmt: skip
    other = m.RankExec("team-a", "server", frozenset({"chat-g0-1"}), "db-0", (" orted",))
    with pytest.raises(ValueError, match=r"--pods chat-g0-1"):
        m.rank_exec_argv(other)
    with pytest.raises(ValueError, match="no command"):
        m.rank_exec_argv(m.RankExec("team-a", "server", frozenset({"chat-g0-1"}), "chat-g0-1", (" ",)))


def test_rank_exec_cli_refuses_a_foreign_pod_with_usage_exit(capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    args = rank_exec._parser(argparse.ArgumentParser()).parse_args(
        [
            "--namespace",
            "team-a",
            "--container",
            "server",
            "--pods",
            "chat-g0-1",
            "db-0",
            " orted",
            "-mca",
            "x",
        ]
    )
    assert args.words == [" orted", "-mca", "x"]  # OpenMPI's own flags stay the daemon's
    assert rank_exec.handle(args) == 2
    assert "not one of the group's worker pods" in capsys.readouterr().err


def _script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="no mpirun here (Debian: openmpi-bin)")
def test_contract_a_real_mpirun_starts_the_workers_daemon_through_rank_exec(tmp_path: Path) -> None:
    leader = socket.gethostname().split(".", 1)[0].lower()
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", leader):
        pytest.skip(f"this host's name {leader!r} is not a pod name")
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    log = tmp_path / "kubectl.log"
    # kubectl exec POD -n NS -c C -- /bin/sh -c WORDS: recorded, then WORDS run on this machine.
    kubectl = _script(bin_ / "kubectl", f'echo "$@" >> {log}\nshift 7\nexec "$@"\n')
    _script(bin_ / m.LAUNCHER, 'exec "$@"\n')  # stands in: rank 0 and the others all run the command
    out = tmp_path / "ranks"
    out.mkdir()
    _script(
        bin_ / "trtllm-serve",
        f'echo "$OMPI_COMM_WORLD_SIZE $TLLM_AUTOTUNER_CACHE_PATH" > {out}/$OMPI_COMM_WORLD_RANK\n',
    )
    g = group(leader_host=leader, worker_hosts=("chat-g0-1.chat-g0",), gpus_per_rank=1, tensor=2)
    agent = [sys.executable, "-m", "trtforge_runtime.llm.rank_exec", "--kubectl", str(kubectl)]
    argv = m.mpirun_argv(
        g, serve(tp=2), export=["TLLM_AUTOTUNER_CACHE_PATH"], as_root=os.geteuid() == 0, agent=agent
    )
    env = {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "TLLM_AUTOTUNER_CACHE_PATH": "/tuning/x"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    done = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert {p.name: p.read_text().split() for p in out.iterdir()} == {
        "0": ["2", "/tuning/x"],
        "1": ["2", "/tuning/x"],
    }
    (call,) = log.read_text().splitlines()  # one daemon, for the one worker pod; the leader's runs locally
    assert call.startswith("exec chat-g0-1 -n team-a -c server -- /bin/sh -c ") and "orted" in call
