"""`trtforge rank-exec`: OpenMPI's remote launcher for a TensorRT-LLM rank group without an sshd.

mpirun (on the leader) calls it as ``trtforge rank-exec --namespace NS --container C --pods P1,P2 HOST
ORTED-WORDS...``; it runs ``kubectl exec`` into HOST's pod, which must be one of the group's worker
pods (decisions: :mod:`trtforge_runtime.llm.mpi_launch`). kubectl must be on PATH (or --kubectl),
and the pod's service account may create ``pods/exec`` on the group's worker pods only.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from trtforge_runtime.llm import mpi_launch


def _parser(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--namespace", required=True, help="the group's namespace")
    p.add_argument("--container", required=True, help="the worker pods' container that runs the ranks")
    p.add_argument("--pods", required=True, help="the group's worker pods, comma-separated: the only ones")
    p.add_argument("--kubectl", default=mpi_launch.KUBECTL, help="the kubectl binary")
    p.add_argument("host", help="the host mpirun names (a worker pod, its domain stripped)")
    p.add_argument("words", nargs=argparse.REMAINDER, help="the daemon's command, as shell words")
    return p


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "rank-exec",
        help="OpenMPI's plm_rsh_agent for rank groups: kubectl exec into one of the group's worker pods",
        description=__doc__,
    )
    _parser(p).set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    r = mpi_launch.RankExec(
        namespace=args.namespace,
        container=args.container,
        pods=frozenset(p for p in args.pods.split(",") if p),
        host=args.host,
        words=tuple(args.words),
    )
    try:
        argv = mpi_launch.rank_exec_argv(r, args.kubectl)
    except ValueError as e:
        print(f"trtforge rank-exec: {e}", file=sys.stderr)
        return 2
    os.execvp(argv[0], argv)  # mpirun starts the daemon with --daemonize: the exec returns once it runs


if (
    __name__ == "__main__"
):  # `python -m trtforge_runtime.llm.rank_exec ...` (tests, images without the entry point)
    sys.exit(handle(_parser(argparse.ArgumentParser(prog="rank-exec")).parse_args()))
