"""The mpirun path of a TensorRT-LLM rank group, pure: the leader's ``mpirun ... trtllm-llmapi-launch
trtllm-serve ...`` and the command that starts OpenMPI's daemon in a worker pod without an sshd
(docs/llm.md §"Groups"). Nothing here runs a process.

What it is written against:

- ``trtllm-llmapi-launch`` (github.com/NVIDIA/TensorRT-LLM ``tensorrt_llm/llmapi/trtllm-llmapi-launch``
  @ cbe4c0aed8b53848575ca3c1c6f50d33aa9da174): each MPI process reads its rank from
  ``OMPI_COMM_WORLD_RANK``; rank 0 runs the command it is given (``trtllm-serve``) with the MPI
  variables removed, next to ``tensorrt_llm.llmapi.mgmn_leader_node``; every other rank runs
  ``mgmn_worker_node``. The MPI world is the model's: tensor x pipeline processes, one per GPU
  (``examples/llm-api/llm_mgmn_trtllm_serve.sh``: "the number of MPI processes should be the same as
  the model world size"), and ``trtllm-serve`` gets the whole ``--tp_size``/``--pp_size``.
- OpenMPI 4.1.4 (Debian's ``openmpi-bin``; the NGC TensorRT-LLM images carry a 4.1 line too):
  ``-np``, ``--host HOST:SLOTS,...``, ``--map-by slot`` (each host's slots in order, so MPI rank 0 is
  on the first host, the leader), ``--bind-to none``, ``-x NAME`` (exports NAME's value from
  mpirun's environment), ``--allow-run-as-root``, ``--mca plm_rsh_agent "CMD ARGS"`` (called as
  ``CMD ARGS HOST ORTED-WORDS...``: HOST short, its domain stripped; the daemon's command as shell
  words, quotes included) and ``--mca plm_rsh_no_tree_spawn 1`` (mpirun starts every daemon itself,
  so only the leader needs the agent's rights). tests/unit/test_llm_mpi_launch.py records a real
  mpirun's call of its agent where one is installed.
- No sshd: as kubernetes-sigs/lws's TensorRT-LLM example (``docs/examples/tensorrt-llm``: its
  ``kubessh`` agent and a Role with ``pods/exec``), the agent is ``kubectl exec POD -- /bin/sh -c
  "ORTED-WORDS"``, here behind ``trtforge rank-exec``, which runs it for the group's own worker pods
  only. A worker pod runs nothing of MPI until the daemon is started in it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

MPIRUN = "mpirun"
LAUNCHER = "trtllm-llmapi-launch"
RANK_EXEC = ("trtforge", "rank-exec")  # the agent's command (trtforge_runtime.llm.rank_exec)
KUBECTL = "kubectl"
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")  # a DNS-1123 label: pod, namespace, container


@dataclass(frozen=True)
class MpiHost:
    """A pod as mpirun sees it: its host name and its slots (MPI processes: one per GPU)."""

    host: str
    slots: int


@dataclass(frozen=True)
class MpiGroup:
    """What the leader's mpirun needs: the leader's own host name (as `hostname` says, so mpirun
    starts its processes itself), the workers' host names (pod.subdomain) in rank order, the GPUs of
    each pod, the mapping, and where the agent execs (the worker pods' namespace and container)."""

    leader_host: str
    worker_hosts: tuple[str, ...]
    gpus_per_rank: int
    tensor: int
    pipeline: int
    namespace: str
    container: str

    @property
    def world_size(self) -> int:
        return self.tensor * self.pipeline

    def hosts(self) -> list[MpiHost]:
        """Every pod with its slots, the leader first (MPI rank 0 runs trtllm-serve there)."""
        return [MpiHost(h, self.gpus_per_rank) for h in (self.leader_host, *self.worker_hosts)]

    def worker_pods(self) -> list[str]:
        """The worker pods the agent may exec in: the first label of each host (mpirun strips the rest)."""
        return [h.split(".", 1)[0] for h in self.worker_hosts]


def check_group(g: MpiGroup) -> None:
    """ValueError naming the serve-llm flag when the group and the mapping do not agree."""
    if g.tensor < 1 or g.pipeline < 1:
        raise ValueError(
            f"--tensor-parallel {g.tensor} x --pipeline-parallel {g.pipeline}: both must be at least 1"
        )
    if g.gpus_per_rank < 1:
        raise ValueError(f"--gpus-per-rank {g.gpus_per_rank}: must be at least 1")
    pods = 1 + len(g.worker_hosts)
    if pods == 1:
        raise ValueError("--world-size 1: one pod runs trtllm-serve itself (its --tp_size), without mpirun")
    if pods * g.gpus_per_rank != g.world_size:
        raise ValueError(
            f"--world-size {pods} pods x --gpus-per-rank {g.gpus_per_rank} = {pods * g.gpus_per_rank} "
            f"MPI processes, but --tensor-parallel {g.tensor} x --pipeline-parallel {g.pipeline} = "
            f"{g.world_size}: trtllm-llmapi-launch needs exactly one MPI process per GPU of the mapping"
        )
    for flag, value in (("--namespace", g.namespace), ("--container", g.container)):
        if not _NAME.match(value):
            raise ValueError(f"{flag} {value!r}: expected a Kubernetes name (lowercase letters, digits, '-')")
    names = [g.leader_host.split(".", 1)[0], *g.worker_pods()]
    for name in names:
        if not _NAME.match(name):
            raise ValueError(f"--worker host {name!r}: expected a pod name, optionally .<subdomain>")
    if len(set(names)) != len(names):
        raise ValueError(f"--worker: the group's pods must differ, got {names}")


def rsh_agent(g: MpiGroup, agent: Sequence[str] = RANK_EXEC) -> str:
    """``plm_rsh_agent``'s value: `trtforge rank-exec` bound to the group's worker pods (OpenMPI splits
    it on spaces, and ``:`` separates alternatives, so neither may appear inside an argument)."""
    pods = ",".join(g.worker_pods())
    words = [*agent, "--namespace", g.namespace, "--container", g.container, "--pods", pods]
    for w in words:
        if not w or " " in w or ":" in w:
            raise ValueError(f"rank-exec agent word {w!r}: OpenMPI splits plm_rsh_agent on spaces and ':'")
    return " ".join(words)


def mpirun_argv(
    g: MpiGroup,
    serve_argv: Sequence[str],
    export: Iterable[str] = (),
    as_root: bool = False,
    mpirun: str = MPIRUN,
    agent: Sequence[str] = RANK_EXEC,
) -> list[str]:
    """The leader's command: `serve_argv` (trtllm-serve's own command line, with the whole mapping)
    under trtllm-llmapi-launch on every GPU of the group; `export` names variables mpirun passes on
    (their values from its own environment). ValueError naming the flag on a bad combination."""
    check_group(g)
    if not serve_argv:
        raise ValueError("--server trtllm-serve: no server command line to launch")
    _check_mapping(serve_argv, g)
    out = [mpirun]
    if as_root:
        out.append("--allow-run-as-root")
    out += ["-np", str(g.world_size), "--host", ",".join(f"{h.host}:{h.slots}" for h in g.hosts())]
    out += ["--map-by", "slot", "--bind-to", "none"]
    out += ["--mca", "plm_rsh_agent", rsh_agent(g, agent), "--mca", "plm_rsh_no_tree_spawn", "1"]
    for name in sorted(set(export)):
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise ValueError(f"exported variable {name!r}: not an environment variable name")
        out += ["-x", name]
    return [*out, LAUNCHER, *serve_argv]


def _check_mapping(serve_argv: Sequence[str], g: MpiGroup) -> None:
    for flag, want in (("--tp_size", g.tensor), ("--pp_size", g.pipeline)):
        i = serve_argv.index(flag) if flag in serve_argv else -1
        got = serve_argv[i + 1] if 0 <= i < len(serve_argv) - 1 else "1"  # serve.py's default is 1
        if got != str(want):
            raise ValueError(
                f"trtllm-serve {flag} {got}: the group's mapping is {want} "
                "(trtllm-serve takes the whole mapping across nodes)"
            )


@dataclass(frozen=True)
class RankExec:
    """`trtforge rank-exec`'s arguments: where it may exec, and the call mpirun made."""

    namespace: str
    container: str
    pods: frozenset[str]
    host: str
    words: tuple[str, ...]


def rank_exec_argv(r: RankExec, kubectl: str = KUBECTL) -> list[str]:
    """``kubectl exec`` into the group's worker pod named by `host` (short, as mpirun passes it), the
    daemon's words joined for the pod's shell (they carry shell quoting: ``"env"``,
    ``"1;tcp://..."``). ValueError naming the argument for a pod outside the group or no command."""
    pod = r.host.split(".", 1)[0]
    if pod not in r.pods:
        raise ValueError(
            f"host {r.host!r}: not one of the group's worker pods (--pods {','.join(sorted(r.pods))})"
        )
    if not r.words or not " ".join(r.words).strip():
        raise ValueError(f"host {r.host!r}: no command to run")
    return [
        kubectl,
        "exec",
        pod,
        "-n",
        r.namespace,
        "-c",
        r.container,
        "--",
        "/bin/sh",
        "-c",
        " ".join(r.words),
    ]
